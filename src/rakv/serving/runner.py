"""Runs one iteration's plan (rakv.serving.scheduler.Step): batched proposals, one batched target forward,
acceptance and per-request rollback; and the K/V side of the scheduler (store lookups, byte accounting).

Every piece is the batch-one engine's (rakv.runtime: engine, decoding, proposers, cache): the store lookup and
namespace, `new_kv_cache`, the proposers (`propose_batch` batches the draft model's steps), `kept_candidates`,
`accept_round`, `close_round` (crop, rollback, round log, emit), `select_token`. What is new is only that the
forwards of several requests run together (`rakv.runtime.decoding.forward_rows`), whose kernels compute each row as
they would alone (batch-invariant), so a greedy request's output is the one `rakv generate` gives it alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from rakv.runtime.actions import ADAPTIVE
from rakv.runtime.cache import Hit
from rakv.runtime.controller import AcceptanceTracker
from rakv.runtime.compact import Segment
from rakv.runtime.decoding import (Sampling, accept_round, cache_nbytes, close_round, forward, forward_rows,
                           kept_candidates, select_token)
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import new_kv_cache
from rakv.runtime.proposers import DraftModelProposer, PromptLookupProposer, propose_batch
from rakv.serving.batchcost import pass_features
from rakv.serving.request import ServedRequest
from rakv.serving.scheduler import Step
from rakv.runtime.strategies import action_of


ACCEPTANCE_SOURCES = ("ewma", "prefix")
PRIOR_ALPHA = 0.5  # the EWMA's start when no controller (and so no calibrated acceptance) is given
PRIOR_ROUNDS = 4.0  # weight of the EWMA against a prefix's own recorded rounds


@dataclass
class Live:
    """The tensor side of a running request."""

    cache: object  # the target's K/V (rakv.runtime.kernels.new_kv_cache)
    proposer: object | None  # its own proposer (a draft model's cache, or prompt lookup)
    generator: torch.Generator | None
    depth: object | None = None  # rakv.runtime.depth.RoundDepth when the controller revises k per round
    drafting: bool = False  # the draft has been reset for this run of the request


@dataclass
class StepOutcome:
    emitted: dict[str, int] = field(default_factory=dict)  # request id -> tokens confirmed this iteration
    rows: int = 0  # rows of the target forward
    # what the batch cost model prices (rakv.serving.batchcost.BatchCost.iteration_s): the rows of the pass, the
    # mean K/V positions before each row, and the decodes' candidates
    features: dict = field(default_factory=dict)


@dataclass
class Runner:
    engine: Engine
    strategy: str = "ar"
    sampling: Sampling = Sampling()
    controller: object | None = None  # rakv.runtime.controller.Controller, for rakv-asd
    live: dict = field(default_factory=dict)
    prompt_logits: dict = field(default_factory=dict)  # id -> logits after the prompt (for the store insert)
    last_logits: dict = field(default_factory=dict)  # id -> logits that produced its latest token
    decisions: dict = field(default_factory=dict)  # id -> rakv.runtime.controller.Decision (rakv-asd)
    depths: dict = field(default_factory=dict)  # id -> its per-round depth (rakv.runtime.depth), or None
    acceptance: str = "ewma"  # a request's acceptance at admission: the EWMA across requests, or `prefix`-keyed
    tracker: AcceptanceTracker | None = None  # the EWMA (the controller's own for rakv-asd)
    k_by_iteration: tuple[int, ...] = ()  # the speculation policy picks k per iteration from these (load-aware)

    def __post_init__(self):
        if self.acceptance not in ACCEPTANCE_SOURCES:
            raise RakvError(f"--acceptance takes {' or '.join(ACCEPTANCE_SOURCES)}, got '{self.acceptance}'")
        if self.controller is not None:
            self.tracker = self.controller.tracker
        elif self.tracker is None:
            self.tracker = AcceptanceTracker(PRIOR_ALPHA, 0.9)
        pair = self.engine.pair
        self.device, self.target = pair.device, pair.target.module
        if self.strategy != ADAPTIVE:
            action_of(self.strategy)  # an unknown strategy fails before any work
        self._target_bpt = _bytes_per_token(self.target, self.device)
        self._draft_bpt = (_bytes_per_token(pair.draft.module, self.device) if self.engine.proposer == "draft"
                           else 0)

    # --- the K/V side the scheduler sees (rakv.serving.scheduler.KVSpace) ---

    def bytes_per_token(self, request: ServedRequest) -> int:
        return self._target_bpt + (self._draft_bpt if request.max_k else 0)

    def lookup_ids(self, request: ServedRequest) -> np.ndarray:
        """What the store is asked: the prompt at first; after a preemption, every token but the last."""
        tokens = request.tokens if not request.state.tokens else request.tokens[:-1]
        return np.asarray(tokens, dtype=np.int64)

    def reusable(self, request: ServedRequest) -> int:
        hit = self.engine.store.peek(self.engine.namespace(request.salt), self.lookup_ids(request))
        if not request.decided:
            self.decide(request, hit)
        return hit.reused_tokens if request.action.reuse else 0

    def request_alpha(self, hit: Hit) -> float:
        """Acceptance at admission: with `prefix`, the rounds recorded with the store entry it extends (the EWMA as
        a prior of PRIOR_ROUNDS rejections' weight); otherwise, and without history, the EWMA across requests."""
        alpha = self.tracker.alpha
        if self.acceptance == "prefix" and hit.acceptance is not None:
            accepted, rejected = hit.acceptance
            return (accepted + PRIOR_ROUNDS * alpha) / (accepted + rejected + PRIOR_ROUNDS)
        return alpha

    def decide(self, request: ServedRequest, hit: Hit) -> None:
        """The request's action at its first admission: the strategy's, or the controller's (rakv-asd); under a
        load-aware speculation policy a speculating request may then use any k of the set, chosen per iteration."""
        request.decided = True
        request.alpha = self.request_alpha(hit)
        request.prefix_acceptance = hit.acceptance if hit.is_hit else None
        if self.strategy != ADAPTIVE:
            action = action_of(self.strategy)
            depth = None
        else:
            decision = self.controller.decide(len(request.prompt), hit, request.state.max_new_tokens,
                                              alpha=request.alpha)
            self.decisions[request.id] = decision
            request.predicted_s = decision.predicted_latency_s
            action = decision.action
            depth = self.controller.round_depth(self.engine.proposer) if action.k else None
        request.action, request.max_k = action, (depth.max_k if depth else action.k)
        if self.k_by_iteration and (self.strategy == ADAPTIVE or action.k):
            request.max_k = max(self.k_by_iteration)
        self.depths[request.id] = depth

    # --- one iteration ---

    @torch.inference_mode()
    def run(self, step: Step) -> StepOutcome:
        """Preemptions, admissions (store hits copied in), proposals, one batched target forward, then each
        request's acceptance, rollback and confirmed tokens; `computed` follows each request's cache."""
        touched = [w.request for w in step.decodes + step.prefills] + step.admitted
        before = {id(r): len(r.state.tokens) for r in touched}
        for request in step.preempted:
            self.live.pop(request.id)  # its K/V and its draft's are dropped; its output and logits are kept
        for request in step.admitted:
            self._start(request)
        proposals = self._propose([w for w in step.decodes if w.k > 0])
        segments = []
        for work in step.decodes:  # the last confirmed token and the candidates: 1 + k rows, all of them kept
            request = work.request
            kept = proposals[request.id][1] if work.k else []
            ids = torch.tensor([request.tokens[-1], *kept], dtype=torch.long, device=self.device)
            segments.append(Segment(ids, self.live[request.id].cache, 0 if work.k else 1))
        for work in step.prefills:  # a chunk of the uncomputed tokens: the bits its whole prefill gives them
            request = work.request
            ids = torch.tensor(request.tokens[request.computed:request.computed + work.rows], dtype=torch.long,
                               device=self.device)
            segments.append(Segment(ids, self.live[request.id].cache, 1))
        features = iteration_features(segments, [w.k for w in step.decodes])
        logits = forward_rows(self.target, segments) if segments else []
        for work, rows in zip(step.decodes, logits):
            self._close_decode(work, rows, proposals.get(work.request.id))
        for work, rows in zip(step.prefills, logits[len(step.decodes):]):
            self._close_prefill(work.request, rows)
        outcome = StepOutcome(rows=sum(int(s.ids.shape[0]) for s in segments), features=features)
        for request in touched:
            live = self.live.get(request.id)
            request.computed = min(live.cache.get_seq_length(), len(request.tokens)) if live else 0
            emitted = len(request.state.tokens) - before[id(request)]
            if emitted:
                outcome.emitted[request.id] = emitted
        return outcome

    def _start(self, request: ServedRequest) -> None:
        """Admission: a cache holding the store's hit (the scheduler counted it as computed), a proposer."""
        engine, reused = self.engine, request.computed
        kv, stored_logits = None, None
        if reused:
            hit, kv, stored_logits = engine.store.lookup(engine.namespace(request.salt), self.lookup_ids(request))
            assert hit.reused_tokens == reused, f"request {request.id}: the store changed between peek and lookup"
        if request.preempted == 0:
            request.hit_tokens = reused
        generator = None
        if not self.sampling.greedy:
            generator = torch.Generator(device=self.device).manual_seed(self.sampling.seed)
        proposer = engine.make_proposer() if request.max_k else None
        self.live[request.id] = Live(new_kv_cache(self.target, kv), proposer, generator, self.depths.get(request.id))
        if stored_logits is not None and not request.state.tokens:  # exact repeat: the first token needs no forward
            self.prompt_logits[request.id] = stored_logits
            self._emit(request, self.live[request.id], stored_logits)

    def _propose(self, works) -> dict:
        """Each speculating decode's candidates: (offered, kept, proposal, match), proposers batched."""
        if not works:
            return {}
        lives = [self.live[w.request.id] for w in works]
        for live, work in zip(lives, works):
            if isinstance(live.proposer, DraftModelProposer) and not live.drafting:
                live.proposer.reset()  # its first round feeds the whole context, as `start` does alone
                live.drafting = True
        contexts = [w.request.tokens for w in works]
        offered, proposals = propose_batch([lv.proposer for lv in lives], contexts, [w.k for w in works],
                                           self.sampling, [lv.generator for lv in lives])
        out = {}
        for work, live, context, o, p in zip(works, lives, contexts, offered, proposals):
            kept, proposal, match = kept_candidates(live.proposer, live.depth, len(context), o, p)
            out[work.request.id] = (o, kept, proposal, match)
        return out

    def _close_decode(self, work, logits, proposal) -> None:
        request, live = work.request, self.live[work.request.id]
        before = len(request.state.tokens)
        if work.k:
            offered, kept, dists, match = proposal
            new_tokens = accept_round(kept, dists, logits, self.sampling, live.generator)
            close_round(request.state, live.cache, live.proposer, len(request.tokens), new_tokens, kept, offered,
                        live.depth, match)
            self.last_logits[request.id] = logits[len(request.state.tokens) - before - 1]
        else:
            self._emit(request, live, logits[-1])

    def _close_prefill(self, request, logits) -> None:
        live = self.live[request.id]
        if live.cache.get_seq_length() < len(request.tokens):
            return  # a chunk short of the end: no token yet
        if not request.state.tokens:
            self.prompt_logits[request.id] = logits[-1]
        # the prompt's first token, or (a recomputed request) what its next decode step would give
        self._emit(request, live, logits[-1])

    def _emit(self, request, live, logits) -> None:
        request.state.emit([select_token(logits, self.sampling, live.generator)])
        request.state.note_memory(live.cache)
        self.last_logits[request.id] = logits

    # --- completion ---

    def complete(self, request: ServedRequest) -> None:
        """Insert the prompt and the prompt + output (all but the last token, whose K/V is never computed) into
        the store, so a repeat is an exact hit and a conversation's next turn an exact-prefix hit; free the K/V."""
        live = self.live.pop(request.id)
        engine = self.engine
        ns = engine.namespace(request.salt)
        log, empty = self.observed_rounds(request)
        acceptance = self._observed_acceptance(request, log)
        layers = [(layer.keys, layer.values) for layer in live.cache.layers]
        prompt_logits = self.prompt_logits.pop(request.id, None)
        exact_repeat = request.hit_tokens == len(request.prompt)
        if prompt_logits is not None and not exact_repeat and live.cache.get_seq_length() >= len(request.prompt):
            engine.store.insert(ns, np.asarray(request.prompt, dtype=np.int64), layers, prompt_logits, acceptance)
        extended = request.tokens[:-1]
        last = self.last_logits.pop(request.id, None)
        if len(extended) > len(request.prompt) and last is not None and live.cache.get_seq_length() >= len(extended):
            engine.store.insert(ns, np.asarray(extended, dtype=np.int64), layers, last, acceptance)
        if self.controller is not None and request.id in self.decisions:
            self.controller.observe(log, empty, live.depth)
        elif self.controller is None:
            self.tracker.observe(log, empty)
        self.depths.pop(request.id, None)

    def observed_rounds(self, request: ServedRequest) -> tuple[list[tuple[int, int]], int]:
        """What a finished request tells about acceptance: its speculative rounds; or, when it ran none, with prompt
        lookup under greedy decoding, the rounds speculation at the deepest k would have run over its output
        (rakv.serving.replay.lookup_rounds: greedy acceptance is fixed by the output, so it is observed without
        speculating, and a k = 0 decision does not starve the estimate). The EWMA and the prefix-keyed record
        learn from the same rounds."""
        log, empty = request.state.round_log, request.state.empty_rounds
        if log or empty or not self.sampling.greedy or self.engine.proposer != "prompt-lookup":
            return log, empty
        from rakv.serving.replay import lookup_rounds

        depth = max(self.k_by_iteration or (self.controller.config.k_set if self.controller else (4,)))
        return lookup_rounds(PromptLookupProposer(), request.prompt, request.state.tokens, max(depth, 1))

    @staticmethod
    def _observed_acceptance(request: ServedRequest, log) -> tuple[float, float] | None:
        """(accepted, rejections) to record with its store entries: its rounds, added to its prefix's."""
        accepted, rejected = float(sum(a for _, a in log)), float(sum(a < p for p, a in log))
        prior = request.prefix_acceptance
        if prior is not None:
            accepted, rejected = accepted + prior[0], rejected + prior[1]
        return (accepted, rejected) if accepted + rejected > 0 else None

    def release(self, request: ServedRequest) -> None:
        """A refused or abandoned request: nothing to insert."""
        self.live.pop(request.id, None)
        self.prompt_logits.pop(request.id, None)
        self.last_logits.pop(request.id, None)


def iteration_features(segments: list[Segment], ks: list[int]) -> dict:
    """The batch cost model's features of one iteration's segments, before they run (rakv.serving.batchcost)."""
    shape = [(int(s.ids.shape[0]), s.cache.get_seq_length()) for s in segments]
    return {"ks": list(ks), **pass_features(shape)}


def _bytes_per_token(model, device) -> int:
    """K/V bytes one position takes in this model's cache, measured by one token's forward."""
    cache = new_kv_cache(model)
    with torch.inference_mode():
        forward(model, torch.zeros((1, 1), dtype=torch.long, device=device), cache, keep=1)
    return cache_nbytes(cache)
