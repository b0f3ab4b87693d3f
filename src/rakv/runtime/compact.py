"""A compact decoder forward over a transformers model's own weights, in the style of gpt-fast's `model.py`.

Why it exists: a SmolLM2 step streams 538 MB of fp32 weights, a few tens of milliseconds at this machine's
bandwidth, but a transformers forward adds a fixed cost per call (dozens of small modules per layer, mask and
position bookkeeping, a cache object per layer) that is as large as the step itself for a 135M-parameter model,
and larger still for its int8 draft. The price of speculation (k draft steps plus one verify of k + 1) and of
batching is then a property of that overhead, not of the hardware. `CompactLM` computes the same function with a
few kernel calls per layer (rakv.runtime.kernels; on the CPU the batch-invariant C++ of kernels.cpp, where every
layer of a step runs in one call, `kernels.forward_blocks`, the same kernels in the same order):

- one fused QKV and, for Llama, one fused gate/up projection, packed once into the GEMM's panels; the packed
  tensors replace the transformers module's weights (one copy), so that module no longer runs a forward itself
  (it says so); a tied output head doubles as the embedding table;
- the residual adds in the GEMM's epilogue; rotary embeddings from a table built once, applied inside attention;
- several requests' new tokens in one pass (`forward_rows`): every projection runs once over all rows (one pass
  over the weights for the whole batch), and one attention call per layer writes every segment's K/V into its
  growing buffer (rakv.runtime.kernels.GrowingLayer) and attends each row over its own request's positions;
- logits only for the rows asked for.

The architecture's differences (Llama: RMSNorm, RoPE, SiLU-gated MLP; GPT-2: LayerNorm, learned positions, GELU,
biases) are data chosen once at load (`Norm`, `Rotary`, the activation), not branches in the forward. The int8 draft
(`int8_draft`) is the target with int8 projections, one scale per output row, whose inputs are quantised to int8
per row and multiplied with integer dot products (rakv.runtime.kernels.linear_int8): a quarter of the target's
bytes per step, and a quarter of its arithmetic where the CPU has VNNI. A target at `precision: int8 | q4_1`
(`at_precision`) streams int8 or the GGUF's Q4_1 / Q8_0 blocks instead (docs/engine.md, "Precision"). transformers
stays the reference
(`kernels=stock`); the tests hold the two within fp32 tolerance and to the same greedy output. A CompactLM is built
from a transformers module or, with no module at all, from its packed tensors (`state` / `from_state`): SmolLM2's
come straight from its GGUF or from the packed file a previous process wrote (rakv.runtime.gguf_weights).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from rakv.runtime import kernels
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import COMPACT_ATTR, effective_mode, kernels_of, on_cpu


@dataclass
class Linear:
    """y = x W^T (+ b): fp32, its weight packed for the CPU GEMM (rakv.runtime.kernels.pack) or [out, in] elsewhere;
    or int8 (`int8`), one scale per output row, with the integer GEMM's packing and row sums (CPU only); or in a
    GGUF's blocks (`blocks` names the format, q4_1 or q8_0: rakv.runtime.kernels.pack_blocks; CPU only)."""

    weight: torch.Tensor
    out_features: int
    in_features: int
    bias: torch.Tensor | None = None
    scale: torch.Tensor | None = None  # int8: per output (padded to the panels)
    colsum: torch.Tensor | None = None  # int8: the integer row sums of the packed weight
    blocks: str | None = None  # a block-quantised weight's format (rakv.runtime.kernels.BLOCK_FORMATS)

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        """From a dense [out, in] fp32 weight (packed on the CPU; the caller drops the dense one)."""
        weight = weight.detach()
        packed = kernels.pack(weight) if on_cpu(weight) else weight.contiguous()
        return cls(packed, weight.shape[0], weight.shape[1], None if bias is None else bias.detach().contiguous())

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.blocks is not None:
            return kernels.linear_blocks(x, self.weight, self.blocks, self.out_features, self.bias, residual)
        if self.scale is not None:
            return kernels.linear_int8(x, self.weight, self.colsum, self.out_features, self.scale, self.bias,
                                       residual)
        return kernels.linear(x, self.weight, self.out_features, self.bias, residual)

    def dense(self) -> torch.Tensor:
        """The [out, in] fp32 weight this computes with (int8 or blocks dequantised): for quantising and the tests."""
        if self.blocks is not None:
            return kernels.unpack_blocks(self.weight, self.blocks, self.out_features)
        if self.scale is not None:
            quantised = kernels.unpack_int8(self.weight, self.out_features, self.in_features)
            return quantised.float() * self.scale[:self.out_features, None]
        return kernels.unpack(self.weight, self.out_features) if on_cpu(self.weight) else self.weight

    def int8(self) -> Linear:
        """int8 weights with one symmetric scale per output row; the CPU GEMM quantises each row of its input to
        int8 as well (kernels.linear_int8). CPU only: the int8 draft's numerics are free (its proposals are
        verified), and this is a quarter of the target's bytes and an integer dot product's arithmetic."""
        if not on_cpu(self.weight):
            raise RakvError("the int8 projections run on the CPU only")
        w = self.dense()
        # max |w| as max(max w, -min w), rounding and clamping in place: the same numbers with two fewer copies of
        # the weight at the loading peak (the tied head's is 113 MB); `w` itself may be a view of the panels
        scale = (torch.maximum(w.amax(dim=1), -w.amin(dim=1)) / 127.0).clamp_min(torch.finfo(w.dtype).tiny)
        quantised = (w / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        packed, colsum = kernels.pack_int8(quantised)
        padded = torch.cat([scale, scale.new_ones(-len(scale) % kernels.PANEL)]).float().contiguous()
        return Linear(packed, self.out_features, self.in_features, self.bias, padded, colsum)

    def in_blocks(self, fmt: str) -> Linear:
        """This projection's weights quantised to the GGUF block format `fmt` (q4_1 or q8_0, by gguf's reference
        quantiser: rakv.runtime.kernels.quantise_blocks) and packed for kernels.cpp's gemm_q; the bias stays fp32.
        For a model that does not ship blocks of its own (SmolLM2's come as they are in its GGUF:
        rakv.runtime.gguf_weights.block_linears). CPU only."""
        if not on_cpu(self.weight):
            raise RakvError("the block-quantised projections run on the CPU only")
        packed = kernels.pack_blocks(kernels.quantise_blocks(self.dense(), fmt), fmt)
        return Linear(packed, self.out_features, self.in_features, self.bias, blocks=fmt)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the weight (a tied output head serves as the embedding table)."""
        if self.blocks is not None:
            return kernels.unpack_blocks(self.weight, self.blocks, self.out_features, ids)
        if on_cpu(self.weight):
            return kernels.panel_rows(self.weight, ids)
        return torch.nn.functional.embedding(ids, self.weight)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.weight, self.bias, self.scale, self.colsum) if t is not None]


@dataclass
class Norm:
    """RMSNorm (bias None) or LayerNorm of each row."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return kernels.rms_norm(x, self.weight, self.eps)
        return kernels.layer_norm(x, self.weight, self.bias, self.eps)


@dataclass
class Rotary:
    """LlamaRotaryEmbedding's (default type) table for every position of the context."""

    cos: torch.Tensor  # [positions, head_dim]
    sin_signed: torch.Tensor  # sin with its first half negated: rotate_half(x) * sin == roll(x, half) * sin_signed

    @classmethod
    def of(cls, inv_freq: torch.Tensor, positions: int, dtype: torch.dtype) -> Rotary:
        freqs = torch.arange(positions, device=inv_freq.device).float()[:, None] * inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        half = emb.shape[-1] // 2
        sin = emb.sin().to(dtype)
        return cls(emb.cos().to(dtype), torch.cat((-sin[:, :half], sin[:, half:]), dim=-1))


@dataclass
class Block:
    """One transformer layer's weights as the compact forward uses them."""

    norm_in: Norm
    qkv: Linear
    out: Linear
    norm_mlp: Norm
    up: Linear  # Llama: gate and up fused; GPT-2: c_fc
    down: Linear


@dataclass
class Segment:
    """One request's part of a batched forward: its new tokens, its K/V cache, how many logits rows it needs."""

    ids: torch.Tensor  # [n] token ids
    cache: object  # DynamicCache with GrowingLayer layers (rakv.runtime.kernels.new_kv_cache)
    keep: int = 1  # logits of the last `keep` new tokens; 0 = all


def _dense_weight(module) -> torch.Tensor | None:
    """The [out, in] fp32 weight of a plain Linear or GPT-2 Conv1D (a view: Conv1D stores [in, out])."""
    from transformers.pytorch_utils import Conv1D

    if type(module) is torch.nn.Linear:
        return module.weight
    if type(module) is Conv1D:
        return module.weight.t()
    return None


def _linear(modules: list) -> Linear:
    """One Linear over the concatenated outputs of `modules` (fp32 Linears or Conv1Ds), whose dense weights are then
    dropped: the packed weight replaces them (one copy in memory, and no second copy while loading)."""
    weights = [_dense_weight(m) for m in modules]
    if any(w is None for w in weights):
        kinds = ", ".join(sorted({type(m).__name__ for m in modules}))
        raise RakvError(f"compact kernels: no projection for {kinds} (a quantised model?); use kernels=stock")
    weight = torch.cat([w.detach() for w in weights]) if len(weights) > 1 else weights[0]
    biases = [m.bias for m in modules]
    bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
    linear = Linear.of(weight, bias)
    del weight, weights
    _release(modules)
    return linear


def _state_linear(state: dict[str, torch.Tensor], name: str) -> Linear | None:
    """The Linear `CompactLM.state` wrote under `name`, or None."""
    if f"{name}.weight" not in state:
        return None
    out, inner = (int(v) for v in state[f"{name}.shape"])
    fmt = state.get(f"{name}.blocks")
    blocks = None if fmt is None else next(k for k, v in kernels.BLOCK_FORMATS.items() if v[0] == int(fmt))
    return Linear(state[f"{name}.weight"], out, inner, state.get(f"{name}.bias"), state.get(f"{name}.scale"),
                  state.get(f"{name}.colsum"), blocks)


def _release(modules: list) -> None:
    for module in modules:
        module.weight = torch.nn.Parameter(module.weight.new_empty(0), requires_grad=False)


def _refuse_own_forward(module: torch.nn.Module) -> None:
    """A transformers module whose weights were packed refuses a forward of its own (instead of failing on empty
    weights somewhere inside)."""

    def refuse(*_):
        raise RakvError("this model's weights were packed for kernels=compact (rakv.runtime.compact); run it through "
                        "rakv.runtime.decoding.forward, or load it with kernels=stock for transformers' forward")

    module.register_forward_pre_hook(refuse)


class CompactLM:
    """The forward of a Llama-family (SmolLM2) or GPT-2 causal LM, built from the loaded transformers module."""

    def __init__(self, module: torch.nn.Module):
        self.config = config = module.config
        head = module.get_output_embeddings()
        embedding = module.get_input_embeddings()
        tied = head.weight is embedding.weight or head.weight.data_ptr() == embedding.weight.data_ptr()
        self.rotary, self.positions = None, None
        eps = self._configure(config)
        if config.model_type == "llama":
            self._init_llama(module, eps)
        else:
            self._init_gpt2(module, eps)
        # a tied head is the embedding table (rows gathered from its panels); an untied embedding stays as it is
        self.embed_table = None if tied else embedding.weight.detach()
        self.lm_head = _linear([head])
        self.embedding = self.lm_head if tied else None
        if tied:
            _release([embedding])
        _refuse_own_forward(module)
        setattr(self, COMPACT_ATTR, self)  # rakv.runtime.kernels.compact_of: a compact-only model runs itself

    def _configure(self, cfg) -> float:
        """The shape and functions `cfg` asks for (heads, head size, activation), or RakvError for an architecture
        the compact forward does not compute; returns the norms' epsilon."""
        if cfg.model_type == "llama":
            if cfg.hidden_act != "silu" or getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
                raise RakvError("compact kernels: this Llama variant (activation or biases) is not supported")
            rope = cfg.rope_parameters or {}
            if rope.get("rope_type", "default") != "default":
                raise RakvError(f"compact kernels: rope type {rope.get('rope_type')} is not supported")
            self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
            self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            self.activation: Callable = kernels.silu_mul
            eps = cfg.rms_norm_eps
        elif cfg.model_type == "gpt2":
            if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh") or cfg.scale_attn_by_inverse_layer_idx \
                    or cfg.reorder_and_upcast_attn or not cfg.scale_attn_weights:
                raise RakvError("compact kernels: this GPT-2 variant (activation or attention scaling) is not "
                                "supported")
            self.heads = self.kv_heads = cfg.n_head
            self.head_dim = cfg.n_embd // cfg.n_head
            self.activation = kernels.gelu
            eps = cfg.layer_norm_epsilon
        else:
            raise RakvError(f"compact kernels support llama and gpt2 models, not {cfg.model_type}")
        self._check_head_dim()
        self.scale = self.head_dim ** -0.5
        self._fused = None  # kernels.cpp's blocks (CPU), made on first use: _native_blocks
        return eps

    def _init_llama(self, module, eps: float) -> None:
        cfg, model = module.config, module.model
        self.blocks = []
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.blocks.append(Block(
                norm_in=Norm(layer.input_layernorm.weight, None, eps),
                qkv=_linear([attn.q_proj, attn.k_proj, attn.v_proj]), out=_linear([attn.o_proj]),
                norm_mlp=Norm(layer.post_attention_layernorm.weight, None, eps),
                up=_linear([mlp.gate_proj, mlp.up_proj]), down=_linear([mlp.down_proj])))
        self.norm_out = Norm(model.norm.weight, None, eps)
        self.rotary = Rotary.of(model.rotary_emb.inv_freq, cfg.max_position_embeddings, model.norm.weight.dtype)
        self.context = cfg.max_position_embeddings

    def _init_gpt2(self, module, eps: float) -> None:
        model = module.transformer
        self.positions = model.wpe.weight
        self.blocks = [Block(norm_in=Norm(b.ln_1.weight, b.ln_1.bias, eps), qkv=_linear([b.attn.c_attn]),
                             out=_linear([b.attn.c_proj]), norm_mlp=Norm(b.ln_2.weight, b.ln_2.bias, eps),
                             up=_linear([b.mlp.c_fc]), down=_linear([b.mlp.c_proj]))
                       for b in model.h]
        self.norm_out = Norm(model.ln_f.weight, model.ln_f.bias, eps)
        self.context = self.positions.shape[0]

    def state(self) -> dict[str, torch.Tensor]:
        """Every tensor of this model by name (a projection's shape as a tensor [out, in]), from which `from_state`
        rebuilds it with its config: what rakv.runtime.gguf_weights builds from a GGUF and keeps on disk. A tensor
        two entries share (a tied head and the embedding, the int8 draft's fp32 embedding) is one storage."""
        state = {}
        linears = {"lm_head": self.lm_head, "embedding": self.embedding}
        norms = {"norm_out": self.norm_out}
        for i, b in enumerate(self.blocks):
            linears |= {f"blocks.{i}.{name}": getattr(b, name) for name in ("qkv", "out", "up", "down")}
            norms |= {f"blocks.{i}.norm_in": b.norm_in, f"blocks.{i}.norm_mlp": b.norm_mlp}
        for name, p in linears.items():
            if p is not None:
                fields = {"weight": p.weight, "bias": p.bias, "scale": p.scale, "colsum": p.colsum,
                          "shape": torch.tensor([p.out_features, p.in_features]),
                          "blocks": None if p.blocks is None else torch.tensor(kernels.BLOCK_FORMATS[p.blocks][0])}
                state |= {f"{name}.{key}": t for key, t in fields.items() if t is not None}
        for name, n in norms.items():
            state |= {f"{name}.{key}": t for key, t in (("weight", n.weight), ("bias", n.bias)) if t is not None}
        rotary = {"rotary.cos": self.rotary.cos, "rotary.sin_signed": self.rotary.sin_signed} if self.rotary else {}
        extra = {"embed_table": self.embed_table, "positions": self.positions} | rotary
        return state | {name: t.detach() if isinstance(t, torch.nn.Parameter) else t
                        for name, t in extra.items() if t is not None}

    @classmethod
    def from_state(cls, config, state: dict[str, torch.Tensor]) -> CompactLM:
        """The model `state()` describes, over those very tensors (none copied: memory-mapped ones stay mapped)."""
        self = cls.__new__(cls)
        self.config = config
        eps = self._configure(config)

        def linear(name):
            return _state_linear(state, name)

        def norm(name):
            return Norm(state[f"{name}.weight"], state.get(f"{name}.bias"), eps)

        layers = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
        self.blocks = [Block(norm(f"blocks.{i}.norm_in"), linear(f"blocks.{i}.qkv"), linear(f"blocks.{i}.out"),
                             norm(f"blocks.{i}.norm_mlp"), linear(f"blocks.{i}.up"), linear(f"blocks.{i}.down"))
                       for i in range(layers)]
        self.norm_out, self.lm_head = norm("norm_out"), linear("lm_head")
        embedding = linear("embedding")
        tied = embedding is not None and embedding.weight.data_ptr() == self.lm_head.weight.data_ptr()
        self.embedding = self.lm_head if tied else embedding  # one Linear for a tied head, as __init__ makes
        self.embed_table, self.positions = state.get("embed_table"), state.get("positions")
        self.rotary = Rotary(state["rotary.cos"], state["rotary.sin_signed"]) if "rotary.cos" in state else None
        self.context = self.positions.shape[0] if self.positions is not None else config.max_position_embeddings
        setattr(self, COMPACT_ATTR, self)
        return self

    def _check_head_dim(self) -> None:
        if self.head_dim % 8 or self.head_dim > 256:  # what kernels.cpp's attention takes
            raise RakvError(f"compact kernels: head size {self.head_dim} is not a multiple of 8 up to 256; "
                            "use kernels=stock")

    def projections(self) -> list[Linear]:
        return [p for b in self.blocks for p in (b.qkv, b.out, b.up, b.down)] + [self.lm_head]

    def projection_tensors(self) -> list[torch.Tensor]:
        """Every tensor a one-token step reads whole: projections, output head, norms (not the embedding table,
        of which a step reads one row, nor the position tables)."""
        norms = [n for b in self.blocks for n in (b.norm_in, b.norm_mlp)] + [self.norm_out]
        return ([t for p in self.projections() for t in p.tensors()]
                + [t for n in norms for t in (n.weight, n.bias) if t is not None])

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor this model holds (shared ones included)."""
        extra = [self.embed_table, self.positions] + ([self.rotary.cos, self.rotary.sin_signed] if self.rotary else [])
        return self.projection_tensors() + [t for t in extra if t is not None]

    def int8_draft(self, state: dict[str, torch.Tensor] | None = None) -> CompactLM:
        """This model with every projection (and the output head) in int8 (`Linear.int8`), one scale per output row;
        the embedding (the fp32 head's panels when tied), norms and rotary tables are shared, not copied.
        `state`: a draft's `state()` kept from an earlier quantisation (rakv.runtime.gguf_weights), whose int8
        projections are taken as they are instead of quantising again."""

        def int8(name: str, linear: Linear) -> Linear:
            return linear.int8() if state is None else _state_linear(state, name)

        draft = copy.copy(self)
        draft.blocks = [replace(b, qkv=int8(f"blocks.{i}.qkv", b.qkv), out=int8(f"blocks.{i}.out", b.out),
                                up=int8(f"blocks.{i}.up", b.up), down=int8(f"blocks.{i}.down", b.down))
                        for i, b in enumerate(self.blocks)]
        draft.lm_head = int8("lm_head", self.lm_head)
        draft._fused = None
        draft._rakv_compact = draft
        return draft

    def at_precision(self, precision: str, blocks: dict[str, Linear] | None = None) -> CompactLM:
        """This model at `precision` (rakv.runtime.models.PRECISIONS); norms, rotary tables and a separate embedding
        table shared, not copied. fp32: itself. int8: `int8_draft` (per-output int8 weights, each row of the input
        quantised to int8, exact integer sums). q4_1: the projections in Q4_1 blocks and the output head (with the
        embedding when tied) in Q8_0, as SmolLM2's shipped GGUF holds them; `blocks`: such Linears by state name
        (`blocks.{i}.qkv`, ..., `lm_head`) taken as they are (the file's own blocks), the others quantised here
        (`Linear.in_blocks`). Every precision's GEMM is batch-invariant (kernels.cpp)."""
        if precision == "fp32":
            return self
        if precision == "int8":
            return self.int8_draft()
        if precision != "q4_1":
            raise RakvError(f"unknown precision '{precision}'; choose one of: fp32, int8, q4_1")
        given = blocks or {}

        def quantised(name: str, linear: Linear, fmt: str) -> Linear:
            return given[name] if name in given else linear.in_blocks(fmt)

        model = copy.copy(self)
        model.blocks = [replace(b, **{part: quantised(f"blocks.{i}.{part}", getattr(b, part), "q4_1")
                                      for part in ("qkv", "out", "up", "down")})
                        for i, b in enumerate(self.blocks)]
        model.lm_head = quantised("lm_head", self.lm_head, "q8_0")
        if self.embedding is self.lm_head:
            model.embedding = model.lm_head
        model._fused = None
        model._rakv_compact = model
        return model

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            return self.embedding.embed(ids)
        return torch.nn.functional.embedding(ids, self.embed_table)

    def __call__(self, ids: torch.Tensor, cache, keep: int = 0, return_hidden: bool = False):
        """One request: ids [n] new tokens appended to `cache`; fp32 logits [keep or n, vocab] (and, with
        `return_hidden`, the last hidden states of the same rows)."""
        out = self.forward_rows([Segment(ids, cache, keep)], return_hidden)
        return (out[0][0], out[1][0]) if return_hidden else out[0]

    def _block(self, block: Block, x: torch.Tensor, layers: list, starts: list[int], lengths: list[int],
               rotary) -> torch.Tensor:
        """One layer over every row (plain torch off the CPU; kernels.cpp's Block.forward is this on the CPU)."""
        qkv = block.qkv(block.norm_in(x))  # [T, (H + 2 KV) head_dim]
        attended = kernels.attention(qkv, layers, starts, lengths, self.heads, self.kv_heads, self.scale, rotary)
        x = block.out(attended, residual=x)
        return block.down(self.activation(block.up(block.norm_mlp(x))), residual=x)

    def _native_blocks(self) -> list:
        """This model's blocks as kernels.cpp's, made on first use (rakv.runtime.kernels.native_blocks)."""
        if self._fused is None:
            self._fused = kernels.native_blocks(self.blocks, self.activation is kernels.silu_mul, self.heads,
                                                self.kv_heads, self.scale)
        return self._fused

    def forward_rows(self, segments: list[Segment], return_hidden: bool = False):
        """Several requests' new tokens in one pass over the weights; each segment's logits [keep or n, vocab].

        On the CPU every row is computed as it would be alone (batch-invariant kernels): a request's logits do not
        depend on the other segments, on how its prefill is chunked, or on how many rows it verifies.
        `return_hidden`: also each segment's last hidden states for the same rows ([keep or n, hidden], the final
        norm's output, which the output head reads: logits = lm_head(hidden)), as (logits, hidden); for a proposer
        that drafts from them (rakv.runtime.proposers.Proposer.needs_target_hidden). No extra work otherwise."""
        lengths = [int(s.ids.shape[0]) for s in segments]
        starts = [s.cache.get_seq_length() for s in segments]
        assert all(n > 0 for n in lengths), "every segment of a batched forward needs at least one new token"
        assert max(p + n for p, n in zip(starts, lengths)) <= self.context, \
            f"position beyond the model's context of {self.context} tokens"
        ids = torch.cat([s.ids for s in segments]) if len(segments) > 1 else segments[0].ids
        device = ids.device
        position = torch.cat([torch.arange(p, p + n, device=device) for p, n in zip(starts, lengths)])
        x = self.embed(ids)
        if self.positions is not None:
            x = x + self.positions[position]
        rotary = (self.rotary.cos[position], self.rotary.sin_signed[position]) if self.rotary is not None else None
        layers = [[s.cache.layers[index] for s in segments] for index in range(len(self.blocks))]
        for these in layers:
            for layer, n in zip(these, lengths):
                layer.extend(n, self.kv_heads, self.head_dim, x)
        if on_cpu(x):  # every layer in one call (kernels.forward_blocks): the same kernels, the same bits
            x = kernels.forward_blocks(self._native_blocks(), x, layers, starts, lengths, rotary)
        else:
            for block, these in zip(self.blocks, layers):
                x = self._block(block, x, these, starts, lengths, rotary)
        kept, row = [], 0
        for segment, n in zip(segments, lengths):
            keep = n if segment.keep in (0, None) else min(segment.keep, n)
            kept.append((row + n - keep, row + n))
            row += n
        rows = torch.cat([x[a:b] for a, b in kept]) if len(kept) > 1 else x[kept[0][0]:kept[0][1]]
        normed = self.norm_out(rows)
        out = self.lm_head(normed).float()
        logits, hidden, row = [], [], 0
        for a, b in kept:
            logits.append(out[row:row + b - a])
            if return_hidden:
                hidden.append(normed[row:row + b - a])
            row += b - a
        return (logits, hidden) if return_hidden else logits


def apply_kernels(module: torch.nn.Module, mode: str, device: torch.device) -> str:
    """Prepare `module` (already on `device`, in eval mode) for `mode`; returns the mode that runs. Compact: a
    CompactLM over the module's weights, found again by rakv.runtime.kernels.compact_of."""
    mode = effective_mode(mode, device)
    if mode == "compact" and kernels_of(module) != "compact":
        with torch.no_grad():
            setattr(module, COMPACT_ATTR, CompactLM(module))
    return kernels_of(module)
