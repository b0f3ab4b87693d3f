"""Decode loops: target-only (AR) and speculative with rollback (paper/main.tex, Method: "Speculative decoding").

In the style of gpt-fast: a `forward` that runs a model over new tokens with its KV cache, a
plain decode step, and one speculative round (propose k, verify k+1 in one target forward,
accept, crop). The loops record per-phase time; every clock read synchronises the device first.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

import torch
from transformers import DynamicCache

from rakv.runtime.compact import Segment
from rakv.runtime.kernels import compact_of
from rakv.runtime.verification import CONTROL_RULES, VERIFY_RULES, Verdict, probabilities, verify

if TYPE_CHECKING:
    from rakv.runtime.depth import RoundDepth


@dataclass(frozen=True)
class Sampling:
    """Greedy, or temperature / top-p sampling from a seeded stream (the metadata: rakv generate's and rakv serve's
    flags, rakv.runtime.flags)."""

    temperature: float = field(default=0.0, metadata={"help": "0 = greedy"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling: the smallest set of tokens whose "
                                                        "probability reaches it"})
    seed: int = field(default=0, metadata={"help": "of the sampling stream"})
    verify: str = field(default="token", metadata={
        "help": "how a sampled round verifies its candidates: 'token' (token-wise rejection sampling) or 'block' "
                "(the block judged jointly; rakv.runtime.verification)", "choices": VERIFY_RULES})

    def __post_init__(self):
        rules = VERIFY_RULES + CONTROL_RULES
        assert self.verify in rules, f"verify must be one of {rules}, not {self.verify!r}"

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Proposer(Protocol):
    """What the decode loops, the engine, the serving loop and the cost side need of a proposer (declared here, where
    the loops that call it are; the proposers and their registry are rakv.runtime.proposers). The class data says
    what this kind of proposer implies elsewhere; the proposers subclass the protocol for its defaults (a model-free
    proposer that always offers candidates and keeps no state)."""

    name: ClassVar[str]  # the configuration's proposer name (data: calibration keys, file names, results)
    # a draft model with K/V of its own: its bytes per position, its part of a store entry, its prefill and steps in
    # the cost tables, its warm-up in the study (rakv.experiments.study.reset_store)
    has_draft_model: ClassVar[bool] = False
    # each candidate costs one step of the proposer (batched across requests), rather than one proposal per round
    # whatever k (rakv.serving.batchcost.BatchCost.propose_s, and what its calibration measures)
    pays_per_candidate: ClassVar[bool] = False
    # `start` takes its own K/V for the context's first positions from the prefix store (`state_for` gives them)
    reuses_stored_state: ClassVar[bool] = False
    # a round may offer no candidate (no match found): the match rate the acceptance tracker learns applies
    may_offer_none: ClassVar[bool] = False
    # offers candidates before the round's depth is chosen at no cost, with a `match_class` (rakv.runtime.depth): a
    # per-round depth applies (rakv.runtime.controller.Controller.round_depth)
    has_match_classes: ClassVar[bool] = False
    # model-free and deterministic: a fresh instance replays greedy rounds over a known output without speculating
    # (rakv.serving.replay.lookup_rounds), so a request that ran none still tells its acceptance
    replays_rounds: ClassVar[bool] = False
    # drafts from the target's last hidden states: given them after every verify (`observe_target_hidden`)
    needs_target_hidden: ClassVar[bool] = False

    @classmethod
    def calibration_identity(cls, pair_name: str) -> dict:
        """What else a calibration table of this proposer on `pair_name` is keyed by (rakv.runtime.calibration.
        calibration_key): nothing beyond its name, unless its behaviour comes from a file (the learned heads)."""
        return {}

    def start(self, context: list[int], kv=None) -> None:
        """Begin a request whose confirmed context is `context` (a draft model prefills here; `kv`: its K/V for
        the context's first positions, from the prefix store, so that it prefills only the rest)."""

    def propose(self, context: list[int], k: int, sampling: Sampling,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        """Up to k candidates following `context`, and their proposal distributions [n, vocab] or None."""

    def rollback(self, confirmed_length: int) -> None:
        """Withdraw any state beyond the first `confirmed_length` context tokens."""

    def resume(self, context: list[int], kv=None) -> None:
        """Like `start` but without feeding anything yet: hold `kv` (its K/V for the context's first positions, from
        the store) and let the next proposal feed the rest (the serving executor batches that feed)."""

    def reset(self) -> None:
        """Forget any state: the next proposal starts from the whole context (the serving executor, at a request's
        first round, when its state did not come from the store)."""

    def state_for(self, token_ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Its own K/V (per layer (keys, values)) when it holds them for `token_ids`' positions, to store beside the
        target's (rakv.runtime.cache.DraftPart); None: nothing to store."""
        return None

    def observe_target_hidden(self, first_position: int, hidden: torch.Tensor) -> None:
        """The target's last hidden states (what its output head reads, [rows, hidden]) of a verify forward, for the
        context positions from `first_position` on; rejected rows included (`rollback` then withdraws them).
        Called only when `needs_target_hidden`."""

    @classmethod
    def for_pair(cls, pair) -> Proposer:
        """A fresh proposer for one request on a model pair (rakv.runtime.models.ModelPair)."""
        return cls()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class PhaseTimer:
    """Accumulates wall time per phase; reads the clock only after the device has finished its work."""

    device: torch.device
    seconds: dict = field(default_factory=lambda: defaultdict(float))

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str):
        start = self.now()
        try:
            yield
        finally:
            self.seconds[name] += self.now() - start


def forward(model: torch.nn.Module, ids: torch.Tensor, cache: DynamicCache, keep: int = 0,
            return_hidden: bool = False):
    """Run `model` over `ids` [1, n] appending to `cache`; returns fp32 logits [n or keep, vocab]; with
    `return_hidden`, (logits, the last hidden states of the same rows: what the output head reads)."""
    compact = compact_of(model)
    if compact is not None:
        return compact(ids[0], cache, keep, return_hidden)
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep, output_hidden_states=return_hidden)
    if return_hidden:
        return out.logits[0].float(), out.hidden_states[-1][0, -out.logits.shape[1]:]
    return out.logits[0].float()


def forward_rows(model: torch.nn.Module, segments: list[Segment], return_hidden: bool = False):
    """Several requests' new tokens, each appended to its own cache; each segment's fp32 logits [keep or n, vocab]
    (with `return_hidden`, (logits, hidden states) per segment as lists: see rakv.runtime.compact.CompactLM).

    Under `compact` kernels (rakv.runtime.compact) one pass over the weights for all of them, whose kernels compute
    every row as it would be computed alone (batch-invariant on the CPU): a request's logits are the same bits alone
    or in any batch, and whatever chunks its prefill was cut into; under `stock`, one forward per request."""
    compact = compact_of(model)
    if compact is not None:
        return compact.forward_rows(segments, return_hidden)
    outs = [forward(model, s.ids.unsqueeze(0), s.cache, s.keep, return_hidden) for s in segments]
    return ([o[0] for o in outs], [o[1] for o in outs]) if return_hidden else outs


def cache_nbytes(cache) -> int:
    """Bytes of K/V a cache holds (its positions, not any spare capacity); 0 for no cache."""
    if cache is None:
        return 0
    return sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
               for layer in cache.layers if getattr(layer, "keys", None) is not None)


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Roll a cache back to its first `length` positions."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def select_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    if sampling.greedy:
        return int(logits.argmax())
    return int(torch.multinomial(probabilities(logits, sampling), 1, generator=generator))


@dataclass
class DecodeState:
    """Confirmed output of one request and what the loops count about it."""

    max_new_tokens: int
    eos_token_id: int | None
    ignore_eos: bool
    on_token: Callable[[int], None] | None = None
    tokens: list[int] = field(default_factory=list)
    round_log: list[tuple[int, int]] = field(default_factory=list)  # (proposed, accepted) per speculative round
    # per round of round_log, each verified candidate's token-wise acceptance probability given the round reached it
    # (rakv.runtime.verification.Verdict.closed_form): what the measured acceptance is checked against
    closed_form_log: list[tuple[float, ...]] = field(default_factory=list)
    # over the sampled rounds, the (token-wise, block) expected accepted candidates given each round's draft
    # (rakv.runtime.verification.expected_accepted), whichever rule ran
    expected_accepted: tuple[float, float] = (0.0, 0.0)
    finished: bool = False
    empty_rounds: int = 0  # rounds whose proposer offered no candidate (prompt lookup without a match, or the budget)
    plain_rounds: int = 0  # rounds whose candidates a per-round depth (rakv.runtime.depth) chose not to verify
    peak_kv_bytes: int = 0  # most K/V held at once: the target's cache plus the proposer's (rejected positions too)

    def note_memory(self, cache, proposer: Proposer | None = None) -> None:
        held = cache_nbytes(cache) + cache_nbytes(getattr(proposer, "cache", None))
        self.peak_kv_bytes = max(self.peak_kv_bytes, held)

    @property
    def rounds(self) -> int:
        return len(self.round_log)

    @property
    def proposed(self) -> int:
        return sum(p for p, _ in self.round_log)

    @property
    def accepted(self) -> int:
        return sum(a for _, a in self.round_log)

    @property
    def rejections(self) -> int:
        """Rounds that ended at a rejected candidate (the rest accepted all and earned a bonus token)."""
        return sum(a < p for p, a in self.round_log)

    def record_round(self, verified: int, accepted: int, offered: bool, closed_form: tuple[float, ...] = (),
                     expected: tuple[float, float] = ()) -> None:
        """Count one speculative round: `verified` candidates of which `accepted` passed (`closed_form`: their
        acceptance probabilities, `expected`: both rules' expected accepted count given the draft;
        rakv.runtime.verification.Verdict); a round that verified none either had candidates a per-round depth
        declined (`offered`) or none at all."""
        if verified:
            self.round_log.append((verified, accepted))
            self.closed_form_log.append(tuple(closed_form))
            if expected:
                self.expected_accepted = (self.expected_accepted[0] + expected[0],
                                          self.expected_accepted[1] + expected[1])
        elif offered:
            self.plain_rounds += 1
        else:
            self.empty_rounds += 1

    def confirmable(self, new_tokens: list[int]) -> int:
        """How many of `new_tokens` `emit` would confirm: up to the budget or an end-of-sequence (which is kept)."""
        if self.finished:
            return 0
        room = self.max_new_tokens - len(self.tokens)
        for n, token in enumerate(new_tokens[:room], 1):
            if not self.ignore_eos and self.eos_token_id is not None and token == self.eos_token_id:
                return n
        return min(len(new_tokens), max(room, 0))

    def emit(self, new_tokens: list[int]) -> None:
        """Confirm tokens in order; stops at the budget or at end-of-sequence (which is kept, like `generate`)."""
        n = self.confirmable(new_tokens)
        for token in new_tokens[:n]:
            self.tokens.append(token)
            if self.on_token is not None:
                self.on_token(token)
        if n and (len(self.tokens) >= self.max_new_tokens or (
                not self.ignore_eos and self.eos_token_id is not None and self.tokens[-1] == self.eos_token_id)):
            self.finished = True


def decode_autoregressive(target, cache, state: DecodeState, sampling, generator, timer: PhaseTimer,
                          device) -> None:
    """One target step per token; the first token is already in `state`, its K/V not yet in `cache`."""
    while not state.finished:
        ids = torch.tensor([[state.tokens[-1]]], dtype=torch.long, device=device)
        with timer.phase("decode"):
            logits = forward(target, ids, cache, keep=1)[-1]
            token = select_token(logits, sampling, generator)
        state.emit([token])
    state.note_memory(cache)  # an autoregressive cache only grows: its peak is its final size


def decode_speculative(target, cache, proposer: Proposer, k: int, prompt: list[int], state: DecodeState, sampling,
                       generator, timer: PhaseTimer, device, depth: RoundDepth | None = None, draft_kv=None) -> None:
    """Speculative rounds until done. Invariant: `cache` holds prompt + all confirmed tokens but the last.

    `depth` (rakv.runtime.depth): propose up to its largest k, keep the k it chooses for this round's match;
    `draft_kv`: a draft model's K/V for the prompt's first positions (a store hit), so it prefills only the rest.
    A round is `round_depth`, the proposer, `kept_candidates`, one verify forward, `accept_round`, `close_round`;
    the serving executor (rakv.serving.executor) runs the same pieces with the forwards batched across requests."""
    with timer.phase("draft_prefill"):  # `draft_kv`: the draft's K/V of the prompt's first positions, from the store
        proposer.start(prompt + state.tokens, draft_kv)
    while not state.finished:
        context = prompt + state.tokens
        k_round = round_depth(state, depth.max_k if depth else k)
        with timer.phase("propose"):
            offered, proposal = proposer.propose(context, k_round, sampling, generator) if k_round else ([], None)
            candidates, proposal, match = kept_candidates(proposer, depth, len(context), offered, proposal)
        ids = torch.tensor([[context[-1], *candidates]], dtype=torch.long, device=device)
        with timer.phase("verify"):
            logits = verify_forward(target, ids, cache, proposer, len(context) - 1)
            verdict = accept_round(candidates, proposal, logits, sampling, generator)
        with timer.phase("rollback"):
            close_round(state, cache, proposer, len(context), verdict, candidates, offered, depth, match)


def verify_forward(target, ids: torch.Tensor, cache, proposer: Proposer, first_position: int) -> torch.Tensor:
    """A round's verify forward over `ids` [1, n] (context positions from `first_position` on): its logits; a
    proposer that drafts from the target's hidden states is given those of the same rows."""
    if not proposer.needs_target_hidden:
        return forward(target, ids, cache)
    logits, hidden = forward(target, ids, cache, return_hidden=True)
    proposer.observe_target_hidden(first_position, hidden)
    return logits


def round_depth(state: DecodeState, k: int) -> int:
    """The candidates a round may propose: k, but none past the request's token budget."""
    return min(k, state.max_new_tokens - len(state.tokens) - 1)


def kept_candidates(proposer: Proposer, depth: RoundDepth | None, context_length: int, candidates: list[int],
                    proposal: torch.Tensor | None) -> tuple[list[int], torch.Tensor | None, str | None]:
    """The candidates a per-round depth keeps for this round's match class (all of them without a depth)."""
    if depth is None or not candidates:
        return candidates, proposal, None
    match = proposer.match_class  # Engine.run checks the proposer has one
    kept = depth.choose(context_length, len(candidates), match)
    return candidates[:kept], (proposal[:kept] if proposal is not None else None), match


def accept_round(candidates: list[int], proposal: torch.Tensor | None, logits: torch.Tensor, sampling: Sampling,
                 generator: torch.Generator | None) -> Verdict:
    """What a verify confirms (the accepted candidates and the target's own next token) under the request's sampling
    and verification rule, with each candidate's closed-form acceptance (rakv.runtime.verification)."""
    return verify(candidates, proposal, logits, sampling, generator)


def close_round(state: DecodeState, cache, proposer: Proposer, context_length: int, verdict: Verdict,
                candidates: list[int], offered: list[int], depth: RoundDepth | None, match: str | None) -> None:
    """Roll the target and the proposer back to the confirmed tokens, log the round, confirm its tokens."""
    state.note_memory(cache, proposer)  # before rollback: the rejected candidates' K/V are still held
    rollback_round(cache, proposer, context_length, verdict.tokens, candidates, offered, depth, match)
    state.record_round(len(candidates), verdict.accepted, bool(offered), verdict.closed_form, verdict.expected)
    state.emit(verdict.tokens)


def rollback_round(cache, proposer: Proposer, context_length: int, new_tokens: list[int], candidates: list[int],
                   offered: list[int], depth: RoundDepth | None, match: str | None) -> None:
    """The tensor side of closing a round: crop the target's cache and the proposer's to the confirmed tokens, and
    tell a per-round depth what its match class earned."""
    accepted = len(new_tokens) - 1
    crop_cache(cache, context_length + accepted)
    proposer.rollback(context_length + accepted)
    if candidates and depth is not None:
        depth.observe(match, len(candidates), accepted)
    elif offered and not candidates:  # the depth kept none: the target's token still says whether the first passed
        depth.observe(match, 1, int(new_tokens[0] == offered[0]))
