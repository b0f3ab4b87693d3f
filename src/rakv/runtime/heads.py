"""Learned heads over the target's last hidden state (Medusa-1 style) and the proposer that drafts with them.

Head i (i = 1..n) reads the target's last hidden state h_t (the final norm's output, what the output head reads) and
predicts the token t+1+i: one residual block r_i = SiLU(W_i h_t + U_i e(x_t+1) + b_i) + h_t, then the target's own
output head restricted to a candidate vocabulary (the V tokens the target emitted most often in the training
continuations) plus a learned bias per candidate. The target's head row gives token t+1 (the round's bonus or
correction token), so after a verify the heads propose the k tokens after it from the hidden state that produced it
and, with `token` (EAGLE's observation: the feature alone leaves open which token was drawn from it), from that
token's input embedding e(x_t+1) too: the proposal is a few small matrix products, one of them over V rows instead of
the whole vocabulary (docs/heads.md: the cost argument).

Only W, b and the candidate bias are trained (rakv.experiments.heads: self-distillation on the target's greedy
continuations); the projection is read from the target at load time, so a trained set is a few MB and is tied to
its target by fingerprint. A trained set is two files in one folder (`rakv.runtime.run_layout.HeadsLayout`): a typed
record with its provenance (`HeadsRecord`) and the tensors (torch.save, fp16). The proposer keeps one thing per
request: the target's last hidden states of the latest verify, rolled back with the round, so it is rollback-safe
and has nothing for the prefix store to keep.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from rakv.runtime import kernels
from rakv.runtime.decoding import Proposer, Sampling, probabilities
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import optional, read_record, write_record
from rakv.runtime.kernels import compact_of
from rakv.runtime.run_layout import HeadsLayout

FORMAT = 1  # part of the key: a set trained by another version of the training is another set
PROPOSAL = "packed-gemm"  # how the proposal is computed (PackedHeads): part of the calibration key


@dataclass(frozen=True)
class HeadsSettings:
    """What a set of heads is trained from and how (conf/heads/*.yaml; every field is part of the set's key)."""

    pair: str = "smollm2"
    heads: int = 4  # candidates one proposal can offer
    vocab: int = 4096  # candidate vocabulary: at most this many of the continuations' most frequent tokens
    dataset: str = "wikitext2"
    split: str = "validation"  # the bundled WikiText-2 has test (held out for the measurements) and validation
    source: str = "bundled"
    prompts: int = 48  # paragraphs whose greedy continuations are training data (0: none)
    prompt_tokens: int = 48  # each paragraph's first tokens are the prompt
    new_tokens: int = 64  # greedy continuation length per prompt
    paragraphs: int = 0  # further paragraphs read teacher-forced: one prefill each, the target's argmax as labels
    paragraph_tokens: int = 256  # each such paragraph's first tokens at most
    consistent: bool = True  # teacher-forced labels only where the text agrees with the target's greedy choices
    holdout: float = 0.1  # share of the prompts held out for the record's per-head accuracy
    epochs: int = 6
    batch: int = 256
    lr: float = 2e-3
    weight_decay: float = 0.0
    keep_best: bool = False  # keep the epoch with the best mean held-out agreement (early stopping), not the last
    token: bool = False  # the heads also read the embedding of the token h_t produced (U_i e(x_t+1)); False: Medusa-1
    seed: int = 0

    def __post_init__(self):
        if self.heads < 1 or self.vocab < 2 or self.new_tokens < self.heads + 2:
            raise RakvError("heads settings: need heads >= 1, vocab >= 2 and new_tokens >= heads + 2")
        if self.prompts < 0 or self.paragraphs < 0 or self.prompts + self.paragraphs < 2:
            raise RakvError("heads settings: need prompts >= 0, paragraphs >= 0 and prompts + paragraphs >= 2")
        if self.paragraph_tokens < self.heads + 2:
            raise RakvError("heads settings: need paragraph_tokens >= heads + 2")
        if not 0.0 < self.holdout < 1.0 or self.epochs < 1 or self.batch < 1 or self.lr <= 0:
            raise RakvError("heads settings: need 0 < holdout < 1, epochs >= 1, batch >= 1 and lr > 0")


@dataclass(frozen=True)
class HeadsRecord:
    """A trained set's provenance, beside its tensors: what it was trained from, by which commit, how it went."""

    key: str  # digest of (format, target fingerprint, data digest, settings): the cache's and the folder's name
    settings: HeadsSettings
    target: dict[str, str]  # the target's fingerprint (rakv.runtime.models.Fingerprint) less its kernels
    data_digest: str  # of the prompts' token ids
    commit: str  # the repository's commit that trained it
    positions: int  # training positions (hidden states with at least one label)
    vocab_size: int  # candidates actually kept (<= settings.vocab)
    coverage: float  # share of the training labels inside the candidate vocabulary
    loss_curve: list[list[float]]  # per epoch, each head's mean training loss
    holdout_accuracy: list[float]  # each head's top-1 agreement with the target's greedy token, held-out text
    train_seconds: float  # wall time of generation and training (the machine's load not controlled)
    best_epoch: int = 0  # the epoch whose weights were kept (the best mean held-out agreement; 0: not recorded)
    texts: str = optional()  # where the texts came from (data_origin); sets trained before it was recorded lack it


def data_origin(settings: HeadsSettings) -> str:
    """Where a set's texts come from, for its record: each dataset with its source and split, the bundled Python
    library named by the interpreter that holds it (its content is in the data digest, its version here)."""
    origins = []
    for name in settings.dataset.split("+"):
        if name == "python":
            origins.append(f"python: the Python {platform.python_version()} standard library"
                           if settings.source == "bundled" else f"python: {settings.source}")
        else:
            origins.append(f"{name}: {settings.source} {settings.split}")
    return "; ".join(origins)


def target_identity(pair) -> dict:
    """The target's fingerprint as the heads depend on it (the kernels that compute it do not change the weights)."""
    identity = asdict(pair.target.fingerprint)
    identity.pop("kernels", None)
    return identity


def heads_key(pair, settings: HeadsSettings, data_digest: str) -> str:
    blob = json.dumps({"format": FORMAT, "target": target_identity(pair), "data": data_digest,
                       "settings": asdict(settings)}, sort_keys=True).encode()
    return hashlib.blake2b(blob, digest_size=10).hexdigest()


def output_rows(module: torch.nn.Module, vocab: torch.Tensor) -> torch.Tensor:
    """The target's output-head rows of the `vocab` tokens, [V, hidden] fp32 (the compact forward's packed head or
    the transformers module's)."""
    compact = compact_of(module)
    if compact is not None:
        return compact.lm_head.embed(vocab).float().contiguous()
    return module.get_output_embeddings().weight.detach()[vocab].float().contiguous()


def input_rows(module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The target's input embeddings of token ids, [len(ids), hidden] fp32 (the compact forward's or the module's)."""
    compact = compact_of(module)
    if compact is not None:
        return compact.embed(ids).float()
    return module.get_input_embeddings()(ids).detach().float()


def head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, vocab_bias: torch.Tensor,
                rows: torch.Tensor, token: torch.Tensor | None = None,
                token_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Every head's candidate logits [B, n, V] from hidden states [B, d] (and, for heads that read it, the embedding
    [B, d] of the token each hidden state produced): SiLU(W_i h + U_i e + b_i) + h, then the rows."""
    n, d, _ = weight.shape
    inner = F.linear(hidden, weight.reshape(n * d, d), bias.reshape(n * d))
    if token_weight is not None:
        inner = inner + F.linear(token, token_weight.reshape(n * d, d))
    return F.linear(F.silu(inner.view(-1, n, d)) + hidden[:, None, :], rows) + vocab_bias


@dataclass
class PackedHeads:
    """The proposal's two products in the layout of the engine's own GEMM (rakv.runtime.kernels.pack; CPU, compact
    kernels): per head [W_i | U_i] over [h, e], then the candidate rows. A proposal is all weight traffic (about 20 MB
    at fp32 for four heads over 4,096 rows against a few MFLOP), and torch's products of one to four rows streamed
    it at a fraction of the machine's bandwidth where the engine's panel GEMM streams the target's weights at it
    (scripts/bench_heads.py before and after: docs/heads.md, "The proposal through the packed GEMM"). The same
    function as `head_logits`, summed in another order (fp32 rounding)."""

    inner: list[torch.Tensor]  # per head, [W_i | U_i] (or W_i alone: Medusa-1) packed
    bias: torch.Tensor  # [n, d]
    rows: torch.Tensor  # the candidate rows packed
    vocab_bias: torch.Tensor  # [n, V]
    hidden_size: int
    candidates: int  # V

    @classmethod
    def of(cls, weight, bias, vocab_bias, rows, token_weight=None) -> PackedHeads:
        inner = [kernels.pack(w if token_weight is None else torch.cat([w, u], dim=1).contiguous())
                 for w, u in zip(weight, token_weight if token_weight is not None else weight)]
        return cls(inner, bias, kernels.pack(rows), vocab_bias, int(weight.shape[1]), int(rows.shape[0]))

    def logits(self, hidden: torch.Tensor, embedded: torch.Tensor | None, n: int) -> torch.Tensor:
        h = hidden.reshape(1, -1).float().contiguous()
        x = h if embedded is None else torch.cat([h, embedded.reshape(1, -1)], dim=1)
        inner = torch.cat([kernels.linear(x, self.inner[i], self.hidden_size, self.bias[i]) for i in range(n)])
        return kernels.linear(F.silu(inner) + h, self.rows, self.candidates) + self.vocab_bias[:n]


@dataclass
class Heads:
    """A trained set on its target: the heads' weights and the target's output rows of their vocabulary."""

    weight: torch.Tensor  # [n, d, d]
    bias: torch.Tensor  # [n, d]
    vocab_bias: torch.Tensor  # [n, V]
    vocab: torch.Tensor  # [V] token ids
    rows: torch.Tensor  # [V, d] the target's output-head rows of `vocab`
    vocab_size: int  # the target's whole vocabulary
    record: HeadsRecord | None = None
    token_weight: torch.Tensor | None = None  # [n, d, d] U_i over the produced token's embedding (None: Medusa-1)
    embed: object = None  # token ids -> the target's input embeddings [m, d] (heads with a token_weight)
    packed: PackedHeads | None = None  # the proposal's products for the engine's GEMM (`on_kernels_of`)

    @property
    def count(self) -> int:
        return int(self.weight.shape[0])

    def logits(self, hidden: torch.Tensor, n: int, token: int | None = None) -> torch.Tensor:
        """The first n heads' candidate logits [n, V] from one hidden state [d] and the token it produced (read
        only by heads with a token_weight)."""
        embedded = None
        if self.token_weight is not None:
            if token is None:
                raise RakvError("heads: these heads read the token their hidden state produced; none was given")
            embedded = self.embed(torch.tensor([token], dtype=torch.long, device=self.vocab.device))
        if self.packed is not None:
            return self.packed.logits(hidden, embedded, n)
        return head_logits(hidden.reshape(1, -1).float(), self.weight[:n], self.bias[:n], self.vocab_bias[:n],
                           self.rows, embedded, None if self.token_weight is None else self.token_weight[:n])[0]

    def on_kernels_of(self, module: torch.nn.Module) -> Heads:
        """These heads proposing through the engine's packed GEMM where the target runs on the compact kernels on
        the CPU (`PackedHeads`); as they are otherwise (torch's products: the stock kernels, another device)."""
        if compact_of(module) is not None and self.weight.device.type == "cpu":
            self.packed = PackedHeads.of(self.weight, self.bias, self.vocab_bias, self.rows, self.token_weight)
        return self

    def state(self) -> dict[str, torch.Tensor]:
        """What is saved (fp16 weights: half the bytes; they are computed with in fp32)."""
        state = {"weight": self.weight.half(), "bias": self.bias.half(), "vocab_bias": self.vocab_bias.half(),
                 "vocab": self.vocab.clone()}
        if self.token_weight is not None:
            state["token_weight"] = self.token_weight.half()
        return state

    @classmethod
    def on_target(cls, module: torch.nn.Module, state: dict, vocab_size: int, record: HeadsRecord | None = None,
                  device: torch.device | str = "cpu") -> Heads:
        vocab = state["vocab"].to(device=device, dtype=torch.long)
        weight = state["weight"].to(device=device, dtype=torch.float32).contiguous()
        if weight.dim() != 3 or weight.shape[1] != weight.shape[2]:
            raise RakvError("heads: the weight tensor is not [heads, hidden, hidden]")
        rows = output_rows(module, vocab).to(device)
        if rows.shape[1] != weight.shape[1]:
            raise RakvError(f"heads: trained for hidden size {weight.shape[1]}, the target has {rows.shape[1]}")
        token_weight = state.get("token_weight")
        if token_weight is not None:
            token_weight = token_weight.to(device=device, dtype=torch.float32).contiguous()
            if token_weight.shape != weight.shape:
                raise RakvError("heads: the token weight tensor is not [heads, hidden, hidden]")
        return cls(weight, state["bias"].to(device=device, dtype=torch.float32).contiguous(),
                   state["vocab_bias"].to(device=device, dtype=torch.float32).contiguous(), vocab, rows, vocab_size,
                   record, token_weight, lambda ids: input_rows(module, ids)).on_kernels_of(module)


def save_heads(heads: Heads, record: HeadsRecord, layout: HeadsLayout) -> None:
    """The tensors and then the record (a folder with a record is complete)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    tmp = layout.tensors.with_suffix(".tmp")
    torch.save(heads.state(), tmp)
    tmp.replace(layout.tensors)
    write_record(record, layout.record)


def read_heads_record(layout: HeadsLayout) -> HeadsRecord:
    return read_record(HeadsRecord, layout.record, when_missing=f"no trained heads in {layout.root}")


def load_heads(pair, layout: HeadsLayout) -> Heads:
    """The set in `layout` on `pair`'s target; refused (RakvError) when it was trained for another target."""
    record = read_heads_record(layout)
    if record.target != target_identity(pair):
        raise RakvError(f"the heads in {layout.root} were trained for another target than pair '{pair.name}'s; "
                        f"retrain them: ./reproduce.sh stages=heads heads={pair.name}")
    try:
        state = torch.load(layout.tensors, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as exc:
        raise RakvError(f"cannot read {layout.tensors}: {exc}") from None
    return Heads.on_target(pair.target.module, state, pair.vocab_size, record, pair.device)


def shipped_heads_key(pair_name: str) -> str | None:
    """The key of the set shipped for a pair (None: none shipped, or a record of an older format)."""
    layout = HeadsLayout.shipped(pair_name)
    if not layout.record.exists():
        return None
    try:
        return read_heads_record(layout).key
    except RakvError:
        return None


_LOADED: dict[tuple[int, Path], tuple[object, Heads]] = {}


def shipped_heads(pair) -> Heads:
    """The heads the repository ships for `pair` (data/heads/<pair>/), loaded once per loaded target."""
    layout = HeadsLayout.shipped(pair.name)
    slot = (id(pair.target.module), layout.root)
    held = _LOADED.get(slot)
    if held is None or held[0] is not pair.target.module:
        if not layout.record.exists():
            raise RakvError(f"no trained heads for pair '{pair.name}' ({layout.root}); train them with "
                            f"./reproduce.sh stages=heads heads={pair.name}")
        held = (pair.target.module, load_heads(pair, layout))
        _LOADED[slot] = held
    return held[1]


@dataclass
class HeadsProposer(Proposer):
    """Drafts k tokens from the target's last hidden state with the learned heads (one per candidate position)."""

    name: ClassVar[str] = "heads"
    needs_target_hidden: ClassVar[bool] = True
    acceptance_by_position: ClassVar[bool] = True  # head i's acceptance falls with i: priced per position

    heads: Heads
    hidden: torch.Tensor | None = None  # the target's last hidden states of the latest verify, [rows, d] ...
    first: int = 0  # ... from this context position on (rolled back with the round)
    offered: list[int] = field(default_factory=list)  # the last proposal, for the tests

    @classmethod
    def for_pair(cls, pair) -> HeadsProposer:
        return cls(shipped_heads(pair))

    @classmethod
    def max_candidates(cls, pair) -> int:
        """The most candidates a round offers: one per head (rakv.runtime.controller.ProposerChoice's `max_k`)."""
        return shipped_heads(pair).count

    @classmethod
    def calibration_identity(cls, pair_name: str) -> dict:
        # a retrained set is another proposer: a table priced with the old set's acceptance is stale; and one priced
        # before the proposal ran through the engine's GEMM (PackedHeads) has the old proposal's cost
        return {"heads": shipped_heads_key(pair_name), "proposal": PROPOSAL}

    def start(self, context, kv=None):
        self.reset()

    def resume(self, context, kv=None):
        self.reset()

    def reset(self) -> None:
        self.hidden, self.first = None, 0

    def observe_target_hidden(self, first_position: int, hidden: torch.Tensor) -> None:
        self.hidden, self.first = hidden, first_position

    def rollback(self, confirmed_length: int) -> None:
        """Keep the hidden states of confirmed positions only (that of position p depends on tokens 0..p)."""
        if self.hidden is not None:
            keep = confirmed_length - self.first
            self.hidden = self.hidden[:max(keep, 0)] if keep > 0 else None

    def hidden_at(self, position: int) -> torch.Tensor | None:
        if self.hidden is None or not self.first <= position < self.first + self.hidden.shape[0]:
            return None
        return self.hidden[position - self.first]

    def propose(self, context, k, sampling: Sampling, generator):
        """Up to min(k, heads) candidates after the context's last token, read from the hidden state that produced
        it (position len - 2) and that token; none before the first verify has given one (a request's first round)."""
        hidden = self.hidden_at(len(context) - 2)
        n = min(k, self.heads.count)
        if hidden is None or n <= 0:
            self.offered = []
            return [], None
        logits = self.heads.logits(hidden, n, int(context[-1]))
        if sampling.greedy:
            tokens = self.heads.vocab[logits.argmax(-1)].tolist()
            self.offered = tokens
            return tokens, None
        full = logits.new_full((n, self.heads.vocab_size), float("-inf"))
        full[:, self.heads.vocab] = logits
        dists = probabilities(full, sampling)
        tokens = [int(torch.multinomial(dist, 1, generator=generator)) for dist in dists]
        self.offered = tokens
        return tokens, dists
