"""One iteration's plan: which requests get how many rows, under a token budget and a K/V byte budget.

In the style of Sarathi-Serve's stall-free batching and vLLM v1's scheduler (docs/serving.md): every
iteration is one batched target forward whose rows are filled in a fixed order under `token_budget` —

1. decodes: one row per decoding request, plus its k candidates when it speculates (k from the speculation
   policy, rakv.serving.policies, then trimmed to the budget); with an ITL SLO (`prefill_budget`), the rows
   left for prefill are then the batch cost model's choice for this iteration (rakv.serving.policies.SloBudget);
2. prefills in progress, a chunk each (`min(needed, budget left)`);
3. new admissions (first come, first served; preempted requests first), a chunk each.

`chunking=False` is the baseline: an iteration that admits a request runs its whole prefill alone, and the
decodes wait. K/V: a running request holds `computed` positions (and its draft's); when this iteration's
rows would take the running requests past `kv_budget_bytes`, the newest is preempted (its K/V dropped, its
output kept, recomputed later) and nothing is admitted in that iteration.

One engine step is three calls, as in vLLM v1: `schedule(now) -> Step` here, `Executor.execute(step) -> StepOutput`
(rakv.serving.executor: the tensors), then `update_from_output(step, output, now)` here — the one place a request's
output, computed positions and completion change, its prompt's K/V is published to the store once computed, its
K/V is committed to the store and freed at completion, and its rounds teach the acceptance estimate. A request's
action is chosen by admission (rakv.serving.admission) at its first admission attempt, with the store lookup's
answer, before its size is checked. No tensors here: the K/V side is a `KVSide` (rakv.serving.kv.KVManager)
that answers queries and frees, so the scheduler is tested with fakes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from rakv.runtime.cache import Hit
from rakv.runtime.costmodel import acceptance_estimate
from rakv.serving.admission import Admission
from rakv.serving.policies import PerRequest, SloBudget
from rakv.serving.request import ServedRequest, Status


class KVSide(Protocol):
    """What the scheduler asks of the K/V manager (rakv.serving.kv.KVManager)."""

    def bytes_per_token(self, request: ServedRequest) -> int:
        """K/V bytes one position of this request holds (the target's, and its draft model's if it speculates)."""

    def hit(self, request: ServedRequest) -> Hit:
        """What the prefix store would give it if admitted now (a query)."""

    def free(self, request: ServedRequest) -> None:
        """Drop its K/V (a preemption)."""

    def publish(self, request: ServedRequest) -> None:
        """Its prompt has just been computed: the prompt's K/V into the prefix store now, for requests that arrive
        while it decodes."""

    def commit(self, request: ServedRequest, acceptance: tuple[float, float] | None) -> None:
        """A finished request: its positions into the prefix store, then free."""


class Outputs(Protocol):
    """What `update_from_output` reads of an iteration's output, rakv.serving.executor.StepOutput (a protocol: the
    executor imports this module's Step): each request's RequestOutput, by id."""

    requests: dict  # id -> rakv.serving.executor.RequestOutput, applied by ServedRequest.advance


class SpeculationPolicy(Protocol):
    """k per decoding request under load (rakv.serving.policies: per-request, disable-by-batch-size, k-by-batch,
    smartspec, load-aware)."""

    def depths(self, decoding: list[ServedRequest]) -> list[int]:
        """The most candidates each decoding request (in admission order) may verify in this iteration."""


LOAD_SECONDS = 1.0  # the load forecast's memory: the last second or so of iterations


@dataclass
class Load:
    """What recent iterations ran, averaged over time with a memory of LOAD_SECONDS (an EWMA weighted by each
    iteration's duration, and idle time counting as nothing running): admission's forecast of the iterations a new
    request will share (rakv.serving.admission.service_prediction). Changed only by `observe`, from
    update_from_output."""

    running: float = 0.0  # requests running
    at_s: float | None = None  # when it last observed an iteration's end

    def observe(self, running: int, now: float, duration_s: float) -> None:
        if self.at_s is not None:  # the idle time since the last iteration: nothing ran
            idle = max(now - duration_s - self.at_s, 0.0)
            self.running *= math.exp(-idle / LOAD_SECONDS)
        weight = math.exp(-max(duration_s, 0.0) / LOAD_SECONDS)
        self.running = weight * self.running + (1 - weight) * running
        self.at_s = now


@dataclass(frozen=True)
class Work:
    request: ServedRequest
    rows: int  # new tokens of this request in the iteration's forward: a prefill chunk, or 1 + k
    k: int = 0  # candidates to propose and verify (decodes only; the proposer may find fewer)


@dataclass
class Step:
    decodes: list[Work] = field(default_factory=list)
    prefills: list[Work] = field(default_factory=list)
    admitted: list[ServedRequest] = field(default_factory=list)  # the executor copies their store hit in first
    preempted: list[ServedRequest] = field(default_factory=list)  # their K/V already dropped (recomputed later)
    refused: list[ServedRequest] = field(default_factory=list)  # larger than the K/V budget on their own
    failed: list[ServedRequest] = field(default_factory=list)  # serving them raised (update_from_output): K/V freed
    at_s: float = 0.0  # when it was planned (the scheduler's clock): its iteration ran from then to its output

    @property
    def rows(self) -> int:
        return sum(w.rows for w in self.decodes) + sum(w.rows for w in self.prefills)

    @property
    def idle(self) -> bool:
        """Nothing to execute and nothing preempted (a preemption is an iteration of its own in iterations.jsonl):
        the loop waits for the next arrival."""
        return not (self.decodes or self.prefills or self.admitted or self.preempted)


@dataclass
class Scheduler:
    kv: KVSide
    admission: Admission  # decides a request's action; its `acceptance` learns
    token_budget: int  # rows per iteration (with chunking)
    max_batch: int  # running requests at most
    kv_budget_bytes: int
    chunking: bool = True
    speculation: SpeculationPolicy = field(default_factory=PerRequest)  # k per decode under load
    prefill_budget: SloBudget | None = None  # prefill rows per iteration under an SLO
    waiting: deque[ServedRequest] = field(default_factory=deque)  # arrived, not running; preempted ones at the front
    running: list[ServedRequest] = field(default_factory=list)  # in admission order
    admissions: int = 0
    kv_budget_mib: float | None = None  # the budget as the user gave it, for the refusal message
    load: Load = field(default_factory=Load)  # what recent iterations ran (update_from_output): admission's forecast

    def __post_init__(self):
        assert self.token_budget > 0 and self.max_batch > 0 and self.kv_budget_bytes > 0, "budgets must be positive"

    def held_bytes(self, request: ServedRequest, rows: int = 0) -> int:
        """K/V bytes a running request holds with `rows` more positions: the one account of the K/V budget."""
        return (request.computed + rows) * self.kv.bytes_per_token(request)

    def fits_alone(self, request: ServedRequest) -> bool:
        """Whether its whole prompt, output and candidates fit the K/V budget on their own (else it is refused)."""
        final = len(request.prompt) + request.state.max_new_tokens + request.max_k
        return final * self.kv.bytes_per_token(request) <= self.kv_budget_bytes

    def schedule(self, now: float = 0.0) -> Step:
        step = Step(at_s=now)
        budget = self.token_budget if self.chunking else 1 << 30  # the baseline: no cap on rows
        if not self.chunking and self.waiting and len(self.running) < self.max_batch:
            if self._admit_whole(step, now):
                return step  # the baseline: one whole prefill, alone
        decoding = [r for r in self.running if r.decoding]
        for request, wanted in zip(decoding, self.speculation.depths(decoding)):  # 1. decodes (+ candidates)
            if budget < 1 or request.status != Status.RUNNING:  # (preempted by an older decode's growth)
                continue
            k = max(min(wanted, request.max_k, request.remaining_new - 1, int(budget) - 1), 0)
            while k and self._room(step, request) < 1 + k:
                k -= 1  # fewer candidates before preempting anyone
            if self._make_room(step, request, 1):
                step.decodes.append(Work(request, 1 + k, k))
                budget -= 1 + k
        if self.prefill_budget is not None and self.chunking:  # the cost model's budget for this iteration
            pending = next((r for r in self.running if not r.decoding), None)
            budget = self.prefill_budget.prefill_rows(step.decodes, pending.computed if pending else 0, int(budget))
        for request in [r for r in self.running if not r.decoding]:  # 2. prefills in progress
            chunk = int(min(request.needed, budget, self._room(step, request)))
            if chunk < 1:
                continue
            step.prefills.append(Work(request, chunk))
            budget -= chunk
        if self.running and not (step.decodes or step.prefills):  # nothing fits: the oldest goes on alone
            oldest = self.running[0]
            if self._make_room(step, oldest, 1):
                step.prefills.append(Work(oldest, int(min(oldest.needed, budget, self._room(step, oldest)))))
        while not step.preempted and self.waiting and budget >= 1 and len(self.running) < self.max_batch:
            request = self.waiting[0]  # 3. admissions
            computed = self._reusable(request)
            if not self.fits_alone(request):
                self._refuse(step, now)
                continue
            chunk = int(min(len(request.tokens) - computed, budget))
            if self._bytes(step) + (computed + chunk) * self.kv.bytes_per_token(request) > self.kv_budget_bytes:
                break
            self._admit(step, request, computed, now)
            if chunk:
                step.prefills.append(Work(request, chunk))
                budget -= chunk
        self._check(step)
        return step

    def _reusable(self, request: ServedRequest) -> int:
        """Positions of the store's hit it will reuse; its action is chosen here, at its first admission attempt,
        for what the store offers then (admission owns the decision; the K/V side only answers the lookup)."""
        hit = self.kv.hit(request)
        if not request.decided:
            # the company it will decode with: the running requests and those waiting (admitted soon after it)
            company = (self.running + [r for r in self.waiting if r is not request])[:self.max_batch - 1]
            self.admission.decide(request, hit, company, self.load)
        return hit.reused_tokens if request.action.reuse else 0

    def _refuse(self, step: Step, now: float) -> None:
        request = self.waiting.popleft()
        request.refuse(f"prompt + max_new_tokens need more K/V than --kv-budget-mib "
                       f"{self.kv_budget_mib or self.kv_budget_bytes / (1 << 20):g} on their own", now)
        step.refused.append(request)

    def _room(self, step: Step, request: ServedRequest) -> int:
        """Positions `request` can still add in this iteration under the K/V budget."""
        return max(self.kv_budget_bytes - self._bytes(step), 0) // self.kv.bytes_per_token(request)

    def _make_room(self, step: Step, request: ServedRequest, rows: int) -> bool:
        """Preempt the newest running requests until `request` can add `rows`; False if it was preempted itself."""
        while self._room(step, request) < rows:
            newest = max(self.running, key=lambda r: r.order)
            self._preempt(step, newest)
            if newest is request:
                return False
        return True

    def _preempt(self, step: Step, request: ServedRequest) -> None:
        self.running.remove(request)
        step.decodes = [w for w in step.decodes if w.request is not request]
        step.prefills = [w for w in step.prefills if w.request is not request]
        self.kv.free(request)  # its output and its logits' tokens are kept; prompt and output are recomputed
        request.preempt()
        step.preempted.append(request)
        self.waiting.appendleft(request)

    def _bytes(self, step: Step) -> int:
        rows = {id(w.request): w.rows for w in step.decodes + step.prefills}
        return sum(self.held_bytes(r, rows.get(id(r), 0)) for r in self.running)

    def _admit(self, step: Step, request: ServedRequest, computed: int, now: float) -> None:
        self.waiting.popleft()
        request.admit(self.admissions, computed, now)
        self.admissions += 1
        self.running.append(request)
        step.admitted.append(request)

    def _admit_whole(self, step: Step, now: float) -> bool:
        request = self.waiting[0]
        computed = self._reusable(request)
        if not self.fits_alone(request):
            self._refuse(step, now)
            return True
        if self._bytes(step) + len(request.tokens) * self.kv.bytes_per_token(request) > self.kv_budget_bytes:
            return False
        self._admit(step, request, computed, now)
        if len(request.tokens) > computed:
            step.prefills.append(Work(request, len(request.tokens) - computed))
        return True

    def _check(self, step: Step) -> None:
        assert not self.chunking or step.rows <= self.token_budget, f"{step.rows} rows over the budget"
        assert len(self.running) <= self.max_batch, "more running requests than max_batch"
        assert self._bytes(step) <= self.kv_budget_bytes, "K/V over its budget"
        worked = [id(w.request) for w in step.decodes + step.prefills]
        assert len(worked) == len(set(worked)), "a request got two pieces of work in one iteration"
        assert all(w.request.status == Status.RUNNING for w in step.decodes + step.prefills), \
            "work for a request that is not running"

    def abort(self, request: ServedRequest, reason: str, now: float) -> None:
        """Between iterations: drop a waiting or running request (its client went away) and free its K/V; nothing
        of it goes into the store."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.abort(reason, now)
        self.kv.free(request)  # (a preempted one's kept logits too)

    def fail(self, request: ServedRequest, reason: str, now: float) -> None:
        """Serving this request raised (an iteration's work for it, or the whole iteration it was in): it ends with
        the reason and its K/V is freed, nothing of it goes into the store; the other requests go on."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.fail(reason, now)
        self.kv.free(request)

    def update_from_output(self, step: Step, output: Outputs, now: float) -> list[ServedRequest]:
        """Apply an iteration's output (rakv.serving.executor.StepOutput): each request it touched advances (tokens,
        rounds, computed positions), or fails alone if its part raised (into `step.failed`); a finished one leaves the
        running set, its K/V goes into the store and is freed, and its rounds teach the acceptance estimate. Returns
        the requests finished, in admission order."""
        touched = {r.id: r for r in step.admitted + [w.request for w in step.decodes + step.prefills]}
        assert set(output.requests) == set(touched), "the output does not answer the step's requests"
        for request_id, result in output.requests.items():
            request = touched[request_id]
            if result.error is not None:  # its own part of the iteration raised (rakv.serving.executor)
                self.fail(request, result.error, now)
                step.failed.append(request)
                continue
            prefilling = not request.state.tokens
            request.advance(result, now)
            if prefilling and request.state.tokens:  # its prompt is computed: shared from now, as vLLM's blocks are
                self.kv.publish(request)
        finished = [r for r in self.running if r.state.finished]
        acceptance = self.admission.acceptance
        for request in finished:
            self.running.remove(request)
            log, empty = acceptance.observed_rounds(request)
            self.kv.commit(request, acceptance.recorded(request, log))
            acceptance.learn(request, log, empty)
            request.finish(now, acceptance_estimate(log))
        assert all(r.computed <= len(r.tokens) for r in self.running), "more positions computed than tokens"
        self.load.observe(len(self.running) + len(finished), now, now - step.at_s)
        return finished
