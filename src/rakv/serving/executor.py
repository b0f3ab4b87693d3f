"""Runs one iteration's plan (rakv.serving.scheduler.Step) and reports what happened: `execute(step) -> StepOutput`.

Batched proposals, one batched target forward, acceptance and per-request rollback, all on the tensor side (the
caches in rakv.serving.kv.KVManager's slots); what each request confirmed comes back typed (`RequestOutput`) and is
applied to the request by Scheduler.update_from_output, the one place request state changes.

Every piece is the batch-one engine's (rakv.runtime: decoding, proposers, kernels): `propose_batch` batches the draft
model's steps, `kept_candidates`, `accept_round`, `rollback_round` (crop, proposer rollback, per-round depth),
`select_token`. What is new is only that the forwards of several requests run together
(`rakv.runtime.decoding.forward_rows`), whose kernels compute each row as they would alone (batch-invariant), so a
greedy request's output is the one `rakv generate` gives it alone.

A request's own part of an iteration (its admission's K/V and sampler, its acceptance, rollback and sampling) runs
`alone`: if it raises, its output carries the error in one line (and the traceback goes to the log), the scheduler
fails that request alone and the others go on. The shared part (proposals, the batched forward) has no one request
to blame: an exception there leaves `execute`, and the caller fails the iteration's requests
(rakv.serving.server.StepFailed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rakv.runtime.compact import Segment
from rakv.runtime.decoding import (
    accept_round,
    cache_nbytes,
    forward_rows,
    kept_candidates,
    rollback_round,
    select_token,
)
from rakv.runtime.proposers import propose_batch
from rakv.serving.batchcost import PassFeatures, pass_features
from rakv.serving.kv import KVManager, Slot
from rakv.serving.request import ServedRequest
from rakv.serving.scheduler import Step, Work

log = logging.getLogger(__name__)


@dataclass
class RequestOutput:
    """What one iteration did for one request (applied by ServedRequest.advance)."""

    tokens: list[int] = field(default_factory=list)  # tokens it produced, in order (the stopping rule applies later)
    cache_positions: int = 0  # positions its target cache holds after the iteration (after rollback)
    # a speculative round: (verified, accepted, candidates offered, the candidates' closed-form acceptance)
    round: tuple[int, int, bool, tuple[float, ...]] | None = None
    held_bytes: int = 0  # K/V it held at its peak in the iteration (before rollback), for its peak_kv_bytes
    draft_hit_tokens: int | None = None  # at admission: positions of the draft's K/V the store gave
    error: str | None = None  # its part of the iteration raised: why, in one line (the scheduler fails it alone)


@dataclass
class StepOutput:
    requests: dict[str, RequestOutput] = field(default_factory=dict)  # id -> output, for every request it touched
    rows: int = 0  # rows of the target forward
    features: PassFeatures | None = None  # what the batch cost model prices (rakv.serving.batchcost)
    ks: list[int] = field(default_factory=list)  # the decodes' candidates, in the step's order
    kinds: list[str] = field(default_factory=list)  # their proposers, of several ("": the engine's own)


@dataclass
class Executor:
    kv: KVManager  # (each request samples with its own `sampling`)

    def __post_init__(self):
        pair = self.kv.engine.pair
        self.device, self.target = pair.device, pair.target.module

    @torch.inference_mode()
    def execute(self, step: Step) -> StepOutput:
        """Admissions' K/V (store hits copied in), proposals, one batched target forward, then each request's
        acceptance and rollback."""
        output = StepOutput()
        requests = output.requests
        for request in step.admitted:
            requests[request.id] = alone(lambda r=request: self._allocate(r))
        decodes = [w for w in step.decodes if w.request.id not in requests or not requests[w.request.id].error]
        prefills = [w for w in step.prefills if w.request.id not in requests or not requests[w.request.id].error]
        output.ks, output.kinds = [w.k for w in decodes], [w.request.proposer for w in decodes]
        proposals = self._propose([w for w in decodes if w.k > 0])
        segments = [self._segment(w.request, [w.request.tokens[-1], *(proposals[w.request.id][1] if w.k else [])],
                                  0 if w.k else 1) for w in decodes]
        segments += [self._segment(w.request, w.request.tokens[w.request.computed:w.request.computed + w.rows], 1)
                     for w in prefills]
        output.features = pass_features([(int(s.ids.shape[0]), s.cache.get_seq_length()) for s in segments])
        logits = self._forward(decodes, segments)
        for work, rows in zip(decodes, logits):
            requests[work.request.id] = alone(lambda w=work, x=rows: self._close_decode(w, x,
                                                                                  proposals.get(w.request.id)))
        for work, rows in zip(prefills, logits[len(decodes):]):
            requests[work.request.id] = alone(lambda w=work, x=rows: self._close_prefill(w.request, x))
        for request in step.admitted:  # (after any prefill chunk of theirs replaced their admission's output)
            if not requests[request.id].error:
                requests[request.id].draft_hit_tokens = self.kv.slot(request).draft_hit_tokens
        output.rows = sum(int(s.ids.shape[0]) for s in segments)
        return output

    def _forward(self, decodes: list[Work], segments: list[Segment]) -> list[torch.Tensor]:
        """The one batched target forward; a proposer that drafts from the target's hidden states is given those of
        its request's decode rows (rakv.runtime.proposers.Proposer.needs_target_hidden), as alone."""
        if not segments:
            return []
        proposers = [self.kv.slot(w.request).proposer for w in decodes]
        wanting = [i for i, p in enumerate(proposers) if p is not None and p.needs_target_hidden]
        if not wanting:
            return forward_rows(self.target, segments)
        logits, hidden = forward_rows(self.target, segments, return_hidden=True)
        for i in wanting:
            proposers[i].observe_target_hidden(len(decodes[i].request.tokens) - 1, hidden[i])
        return logits

    def _segment(self, request: ServedRequest, ids: list[int], keep: int) -> Segment:
        return Segment(torch.tensor(ids, dtype=torch.long, device=self.device), self.kv.slot(request).cache, keep)

    def _allocate(self, request: ServedRequest) -> RequestOutput:
        """A slot holding its store hit; an exact repeat's first token comes from the stored logits, no forward."""
        slot = self.kv.allocate(request)
        if slot.stored_logits is None:
            output = RequestOutput(cache_positions=slot.cache.get_seq_length())
        else:
            slot.prompt_logits = slot.stored_logits
            output = self._select(request, slot, slot.stored_logits)
        return output

    def _propose(self, works) -> dict:
        """Each speculating decode's candidates: (offered, kept, proposal, match), proposers batched."""
        if not works:
            return {}
        slots = [self.kv.slot(w.request) for w in works]
        for slot in slots:
            if not slot.drafting:
                slot.proposer.reset()  # a draft model's first round feeds the whole context, as `start` does alone
                slot.drafting = True
        contexts = [w.request.tokens for w in works]
        offered, proposals = propose_batch([s.proposer for s in slots], contexts, [w.k for w in works],
                                           [w.request.sampling for w in works], [s.generator for s in slots])
        out = {}
        for work, slot, context, o, p in zip(works, slots, contexts, offered, proposals):
            kept, proposal, match = kept_candidates(slot.proposer, work.request.choice.depth, len(context), o, p)
            out[work.request.id] = (o, kept, proposal, match)
        return out

    def _close_decode(self, work, logits, proposal) -> RequestOutput:
        request, slot = work.request, self.kv.slot(work.request)
        if not work.k:
            return self._select(request, slot, logits[-1])
        offered, kept, dists, match = proposal
        verdict = accept_round(kept, dists, logits, request.sampling, slot.generator)
        new_tokens = verdict.tokens
        held = cache_nbytes(slot.cache) + cache_nbytes(getattr(slot.proposer, "cache", None))  # before rollback
        rollback_round(slot.cache, slot.proposer, len(request.tokens), new_tokens, kept, offered,
                       request.choice.depth, match)
        slot.last_logits = logits[request.state.confirmable(new_tokens) - 1]
        return RequestOutput(new_tokens, slot.cache.get_seq_length(),
                             (len(kept), verdict.accepted, bool(offered), verdict.closed_form), held)

    def _close_prefill(self, request: ServedRequest, logits) -> RequestOutput:
        slot = self.kv.slot(request)
        if slot.cache.get_seq_length() < len(request.tokens):
            return RequestOutput(cache_positions=slot.cache.get_seq_length())  # a chunk short of the end: no token
        if not request.state.tokens:
            slot.prompt_logits = logits[-1]
        # the prompt's first token, or (a recomputed request) what its next decode step would give
        return self._select(request, slot, logits[-1])

    def _select(self, request: ServedRequest, slot: Slot, logits) -> RequestOutput:
        slot.last_logits = logits
        token = select_token(logits, request.sampling, slot.generator)
        return RequestOutput([token], slot.cache.get_seq_length(), None, cache_nbytes(slot.cache))


def alone(work: Callable[[], RequestOutput]) -> RequestOutput:
    """One request's part of an iteration; if it raises, an output carrying the error in one line (the traceback to
    the log) instead: that request fails alone (Scheduler.update_from_output)."""
    try:
        return work()
    except Exception as exc:  # any failure of one request's own work is that request's alone
        log.exception("serving one request raised; it fails alone")
        return RequestOutput(error=one_line(exc))


def one_line(exc: BaseException) -> str:
    """An exception as the one line a client is shown: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
