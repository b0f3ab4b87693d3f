"""A compact decoder forward over a transformers model's own weights, in the style of gpt-fast's `model.py`.

Why it exists: a SmolLM2 step streams 538 MB of fp32 weights, a few tens of milliseconds at this machine's
bandwidth, but a transformers forward adds a fixed cost per call (dozens of small modules per layer,
mask and position bookkeeping, a cache object per layer) that is as large as the step itself for a
135M-parameter model, and larger still for its int8 draft. The price of speculation (k draft steps plus
one verify of k + 1) is then a property of that overhead, not of the hardware. `CompactLM` computes the
same function with few tensor operations per layer:

- one fused QKV and, for Llama, one fused gate/up projection (the weights are concatenated once and the
  transformers module's own parameters are rebound to views of the fused tensors: one copy in memory);
- rotary embeddings from a table built once, applied to queries and keys together;
- K/V written in place into the request's growing buffer (`rakv.runtime.kernels.GrowingLayer`), attention by
  `scaled_dot_product_attention` over the buffer's view, a causal mask only when several new tokens;
- logits only for the rows asked for;
- several requests' new tokens in one pass (`forward_rows`): every projection runs once over all rows
  (one pass over the weights for the whole batch), attention runs per request over its own K/V.

Which GEMM runs for a handful of rows on the CPU is `rakv.runtime.kernels.linear`'s choice (measured there). The int8
draft (`int8_draft`) is the target with weight-only int8 projections, one scale per output row, fp32
activations (rakv.runtime.kernels.linear_int8): a quarter of the target's bytes per step. A dynamic-quantised
transformers module (`torch.ao` int8, as `kernels=stock` loads it) also runs here, with its own kernels. transformers stays the loader and the reference (`kernels=stock`); the
tests hold the two within fp32 tolerance and to the same greedy output.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import SKINNY_MAX_ROWS, linear, linear_int8, skinny


def _dense_weight(module) -> torch.Tensor | None:
    """The [out, in] fp32 weight of a plain Linear or GPT-2 Conv1D (as a view: Conv1D stores [in, out])."""
    from transformers.pytorch_utils import Conv1D

    if type(module) is torch.nn.Linear:
        return module.weight
    if type(module) is Conv1D:
        return module.weight.t()
    return None


@dataclass
class Dense:
    """y = x W^T + b with W [out, in] contiguous, through the CPU's fastest path for the row count."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, small: bool) -> torch.Tensor:
        return linear(x, self.weight, self.bias, small)


@dataclass
class Int8Weight:
    """Weight-only int8 with one symmetric scale per output row; activations stay fp32."""

    weight: torch.Tensor  # int8 [out, in]
    scale: torch.Tensor  # fp32 [out]
    bias: torch.Tensor | None = None

    @classmethod
    def of(cls, dense: Dense) -> "Int8Weight":
        w = dense.weight.detach()
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(w.dtype).tiny)
        return cls(torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous(), scale.float(),
                   dense.bias)

    def __call__(self, x: torch.Tensor, small: bool) -> torch.Tensor:
        return linear_int8(x, self.weight, self.scale, self.bias, small)


@dataclass
class Int8Dynamic:
    """A dynamic-quantised Linear's packed weights: int8 weights, activations quantised per call (fbgemm)."""

    packed: object

    def __call__(self, x: torch.Tensor, small: bool) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)


def _fused(modules: list) -> Dense | list:
    """One Dense over the concatenated outputs of `modules` when all are fp32 Linears / Conv1Ds; otherwise
    (quantised layers) their own kernels, unfused. The modules' parameters become views of the fused weight."""
    weights = [_dense_weight(m) for m in modules]
    if any(w is None for w in weights):
        return [_projection(m) for m in modules]
    fused = torch.cat([w.detach() for w in weights]).contiguous()
    biases = [m.bias for m in modules]
    bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
    start = 0
    for module, weight in zip(modules, weights):
        rows = weight.shape[0]
        view = fused[start:start + rows]
        # rebinding keeps the transformers module usable and drops its own copy of the weight
        module.weight = torch.nn.Parameter(view if type(module) is torch.nn.Linear else view.t(), requires_grad=False)
        if bias is not None:
            module.bias = torch.nn.Parameter(bias[start:start + rows], requires_grad=False)
        start += rows
    return Dense(fused, bias)


def _projection(module):
    weight = _dense_weight(module)
    if weight is not None:
        return Dense(weight.detach() if weight.is_contiguous() else _owned_contiguous(module), module.bias)
    packed = getattr(module, "_packed_params", None)
    if packed is not None:
        return Int8Dynamic(packed._packed_params)
    raise RakvError(f"compact kernels: no projection for {type(module).__name__}")


def _owned_contiguous(module) -> torch.Tensor:
    """A Conv1D's weight transposed to [out, in] once; the module keeps a transposed view of it."""
    weight = module.weight.detach().t().contiguous()
    module.weight = torch.nn.Parameter(weight.t(), requires_grad=False)
    return weight


def _apply(projection, x: torch.Tensor, small: bool) -> torch.Tensor:
    if isinstance(projection, list):
        return torch.cat([p(x, small) for p in projection], dim=-1)
    return projection(x, small)


@dataclass
class Block:
    """One transformer layer's weights as the compact forward uses them."""

    norm_in: tuple  # (weight, bias or None)
    qkv: object  # Dense, or a list of projections concatenated along the output
    out: object
    norm_mlp: tuple
    up: object  # Llama: gate and up fused; GPT-2: c_fc
    down: object


@dataclass
class Segment:
    """One request's part of a batched forward: its new tokens, its K/V cache, how many logits rows it needs."""

    ids: torch.Tensor  # [n] token ids
    cache: object  # DynamicCache with GrowingLayer layers (rakv.runtime.kernels.new_kv_cache)
    keep: int = 1  # logits of the last `keep` new tokens; 0 = all
    # the kernels its rows run through on the CPU: True = the 1-16-row C++ kernels, False = MKL and torch's vector
    # ops; None = by its row count. A chunk of a long prefill says False: its rows then run as they would in one
    # whole prefill, so chunking changes no projection (rakv.runtime.decoding.forward_rows groups segments by this)
    small: bool | None = None

    @property
    def runs_small(self) -> bool:
        return self.small if self.small is not None else int(self.ids.shape[0]) <= SKINNY_MAX_ROWS


class CompactLM:
    """The forward of a Llama-family (SmolLM2) or GPT-2 causal LM, built from the loaded transformers module."""

    def __init__(self, module: torch.nn.Module):
        config = module.config
        self.config = config
        kind = config.model_type
        if kind == "llama":
            self._init_llama(module)
        elif kind == "gpt2":
            self._init_gpt2(module)
        else:
            raise RakvError(f"compact kernels support llama and gpt2 models, not {kind}")
        self.kind = kind
        lm_head = module.get_output_embeddings()
        self.lm_head = _projection(lm_head)
        self._rakv_compact = self  # rakv.runtime.kernels.compact_of: a compact-only model runs itself

    def projection_tensors(self) -> list[torch.Tensor]:
        """Every tensor a one-token step reads whole: projections, output head, norms (not the embedding table,
        of which a step reads one row, nor the rotary tables)."""
        out = []
        for projection in [p for b in self.blocks for p in (b.qkv, b.out, b.up, b.down)] + [self.lm_head]:
            for part in projection if isinstance(projection, list) else [projection]:
                out += [t for t in vars(part).values() if isinstance(t, torch.Tensor)]
        norms = [t for b in self.blocks for t in (*b.norm_in, *b.norm_mlp)] + list(self.norm_out)
        return out + [t for t in norms if t is not None]

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor this model holds (shared ones included)."""
        extra = [self.embed, self.positions] + ([self.cos, self.sin_signed] if self.kind == "llama" else [])
        return self.projection_tensors() + [t for t in extra if t is not None]

    def int8_draft(self) -> "CompactLM":
        """This model with every projection (and the output head) in weight-only int8, one scale per output row;
        the embedding, norms and rotary tables are shared with this model, not copied."""
        assert all(isinstance(p, Dense) for b in self.blocks for p in (b.qkv, b.out, b.up, b.down)), \
            "int8_draft quantises an fp32 compact model"
        draft = copy.copy(self)
        draft.blocks = [replace(b, qkv=Int8Weight.of(b.qkv), out=Int8Weight.of(b.out), up=Int8Weight.of(b.up),
                                down=Int8Weight.of(b.down)) for b in self.blocks]
        draft.lm_head = Int8Weight.of(self.lm_head)
        draft._rakv_compact = draft
        return draft

    def _init_llama(self, module) -> None:
        cfg = module.config
        if cfg.hidden_act != "silu" or getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
            raise RakvError("compact kernels: this Llama variant (activation or biases) is not supported")
        rope = cfg.rope_parameters or {}
        if rope.get("rope_type", "default") != "default":
            raise RakvError(f"compact kernels: rope type {rope.get('rope_type')} is not supported")
        model = module.model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.embed = model.embed_tokens.weight
        self.positions = None
        self.blocks = []
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.blocks.append(Block(
                norm_in=(layer.input_layernorm.weight, None),
                qkv=_fused([attn.q_proj, attn.k_proj, attn.v_proj]),
                out=_projection(attn.o_proj),
                norm_mlp=(layer.post_attention_layernorm.weight, None),
                up=_fused([mlp.gate_proj, mlp.up_proj]),
                down=_projection(mlp.down_proj)))
        self.norm_out = (model.norm.weight, None)
        # the rotary table of LlamaRotaryEmbedding (default type), for every position of the context
        inv_freq = model.rotary_emb.inv_freq.float()
        positions = torch.arange(cfg.max_position_embeddings, device=inv_freq.device).float()
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        half = self.head_dim // 2
        self.cos = emb.cos().to(self.embed.dtype)
        sin = emb.sin().to(self.embed.dtype)
        # rotate_half(x) * sin == roll(x, half) * [-sin_low, sin_high]: one roll instead of two slices and a cat
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        self.scale = self.head_dim ** -0.5

    def _init_gpt2(self, module) -> None:
        cfg = module.config
        if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh") or cfg.scale_attn_by_inverse_layer_idx \
                or cfg.reorder_and_upcast_attn or not cfg.scale_attn_weights:
            raise RakvError("compact kernels: this GPT-2 variant (activation or attention scaling) is not supported")
        model = module.transformer
        self.heads = self.kv_heads = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.eps = cfg.layer_norm_epsilon
        self.embed = model.wte.weight
        self.positions = model.wpe.weight
        self.blocks = [Block(norm_in=(block.ln_1.weight, block.ln_1.bias), qkv=_projection(block.attn.c_attn),
                             out=_projection(block.attn.c_proj), norm_mlp=(block.ln_2.weight, block.ln_2.bias),
                             up=_projection(block.mlp.c_fc), down=_projection(block.mlp.c_proj))
                       for block in model.h]
        self.norm_out = (model.ln_f.weight, model.ln_f.bias)
        self.scale = self.head_dim ** -0.5

    def _norm(self, x: torch.Tensor, weights: tuple, small: bool) -> torch.Tensor:
        weight, bias = weights
        if self.kind == "llama":
            if small:  # decode; prefill: torch's vector ops
                return skinny().rms_norm(x, weight, self.eps)
            return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))  # LlamaRMSNorm's order
        return F.layer_norm(x, (x.shape[-1],), weight, bias, self.eps)

    def _mlp(self, block: Block, x: torch.Tensor, small: bool) -> torch.Tensor:
        up = _apply(block.up, x, small)
        if self.kind == "llama":
            if small:
                return _apply(block.down, skinny().silu_mul(up), small)
            gate, up = up.chunk(2, dim=-1)
            return _apply(block.down, F.silu(gate) * up, small)
        return _apply(block.down, F.gelu(up, approximate="tanh"), small)

    def __call__(self, ids: torch.Tensor, cache, keep: int = 0) -> torch.Tensor:
        """One request: ids [n] new tokens appended to `cache`; fp32 logits [keep or n, vocab]."""
        return self.forward_rows([Segment(ids, cache, keep)])[0]

    def forward_rows(self, segments: list[Segment], small: bool | None = None) -> list[torch.Tensor]:
        """Several requests' new tokens in one pass over the weights; each segment's logits [keep or n, vocab].

        `small`: run every row through the 1-16-row C++ kernels (True; at most 16 rows) or through MKL and
        torch's vector ops (False); None: by the total row count. Off the CPU, plain torch either way."""
        lengths = [int(s.ids.shape[0]) for s in segments]
        starts = [s.cache.get_seq_length() for s in segments]
        assert all(n > 0 for n in lengths), "every segment of a batched forward needs at least one new token"
        ids = torch.cat([s.ids for s in segments]) if len(segments) > 1 else segments[0].ids
        device = ids.device
        position = torch.cat([torch.arange(p, p + n, device=device) for p, n in zip(starts, lengths)])
        limit = self.cos.shape[0] if self.kind == "llama" else self.positions.shape[0]
        assert int(position[-1]) < limit and max(p + n for p, n in zip(starts, lengths)) <= limit, \
            f"position beyond the model's context of {limit} tokens"
        x = F.embedding(ids, self.embed)
        # few rows on the CPU (decode, verify, a batch of decodes): the C++ kernels; more: torch's vector ops
        if small is None:
            small = len(ids) <= SKINNY_MAX_ROWS
        assert not small or len(ids) <= SKINNY_MAX_ROWS, f"the C++ kernels take at most {SKINNY_MAX_ROWS} rows"
        small = small and device.type == "cpu"
        if self.kind == "llama":
            cos, sin = self.cos[position], self.sin_signed[position]
            if not small:
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        else:
            x = x + F.embedding(position, self.positions)
        masks = [None if n == 1 or small else
                 (torch.arange(p + n, device=device)[None, :] <= torch.arange(p, p + n, device=device)[:, None])
                 for p, n in zip(starts, lengths)]
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        half = self.head_dim // 2
        for index, block in enumerate(self.blocks):
            qkv = _apply(block.qkv, self._norm(x, block.norm_in, small), small)  # [T, (H + 2 KV) hd]
            total = qkv.shape[0]
            qk = qkv[:, :q_width + kv_width].view(total, self.heads + self.kv_heads, self.head_dim)
            if self.kind == "llama" and small:
                skinny().rope_(qk, cos, sin)  # in place, inside qkv
            elif self.kind == "llama":
                qk = qk * cos + qk.roll(half, dims=-1) * sin
            q, k = qk[:, :self.heads], qk[:, self.heads:]
            v = qkv[:, q_width + kv_width:].view(total, self.kv_heads, self.head_dim)
            outputs, row = [], 0
            for segment, n, mask in zip(segments, lengths, masks):
                # [1, heads, n, hd] views, as transformers' caches hold K/V
                keys, values = segment.cache.layers[index].update(k[row:row + n].transpose(0, 1).unsqueeze(0),
                                                                  v[row:row + n].transpose(0, 1).unsqueeze(0))
                if small:
                    outputs.append(skinny().attend(q[row:row + n], keys, values, self.scale))
                else:
                    attended = F.scaled_dot_product_attention(
                        q[row:row + n].transpose(0, 1).unsqueeze(0), keys, values, attn_mask=mask, scale=self.scale,
                        enable_gqa=self.heads != self.kv_heads)
                    outputs.append(attended[0].transpose(0, 1).reshape(n, q_width))
                row += n
            attended = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
            x = x + _apply(block.out, attended, small)
            x = x + self._mlp(block, self._norm(x, block.norm_mlp, small), small)
        logits, row = [], 0
        kept = []
        for segment, n in zip(segments, lengths):
            keep = n if segment.keep in (0, None) else min(segment.keep, n)
            kept.append((row + n - keep, row + n))
            row += n
        rows = torch.cat([x[a:b] for a, b in kept]) if len(kept) > 1 else x[kept[0][0]:kept[0][1]]
        # the head's path goes by its own row count (a prefill keeps one row): as a request alone computes it
        head_small = device.type == "cpu" and rows.shape[0] <= SKINNY_MAX_ROWS
        out = _apply(self.lm_head, self._norm(rows, self.norm_out, head_small), head_small).float()
        row = 0
        for a, b in kept:
            logits.append(out[row:row + b - a])
            row += b - a
        return logits
