"""A served request: its tokens, how many of them are computed, its state and timings. No tensors here.

As in vLLM v1 there is no prefill or decode phase flag: a request knows its tokens (prompt + confirmed
output) and how many of them have K/V in its cache (`computed`); what it needs next is `len(tokens) - computed`
rows: a prefill chunk, or the last token (plus k candidates when it speculates). A preempted request drops
its K/V (`computed = 0`) and later recomputes prompt and output in prefill chunks; its output is kept.

Every field changes only through the methods below, each asserting the state it comes from, and each called
from one place (docs/serving.md):

    assign    action, proposer, acceptance, service     admission (rakv.serving.admission.Admission.decide)
    admit     status, admission order, hit, computed   Scheduler.schedule (a store hit counts as computed)
    preempt   status, computed = 0                     Scheduler.schedule (the K/V budget)
    refuse    status, error                            Scheduler.schedule (too large alone), serve's arrival
    advance   output tokens, round counts, computed    Scheduler.update_from_output (rakv.serving.scheduler)
    finish    status, finish time, realised acceptance Scheduler.update_from_output
    abort     status, error, finish time               Scheduler.abort (its client went away, the server stopped)
    fail      status, error, finish time               Scheduler.fail (serving it raised: it alone ends)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from rakv.runtime.actions import Action
from rakv.runtime.decoding import DecodeState, Sampling
from rakv.runtime.strategies import Choice


class Status(IntEnum):
    WAITING = 0  # arrived, not admitted yet (or preempted: waiting to be recomputed)
    RUNNING = 1  # admitted: holds K/V, gets rows in iterations
    FINISHED = 2
    REFUSED = 3  # bad request (empty, longer than the context or the K/V budget): refused alone
    ABORTED = 4  # its client went away (rakv serve --http): dropped where it was, its K/V freed
    FAILED = 5  # serving it raised (rakv.serving.executor): it ends with the error, its K/V freed; the others go on


@dataclass
class ServedRequest:
    id: str
    arrival_s: float  # seconds from the start of serving (a later turn: when the previous one finished + think)
    prompt: list[int]  # token ids; a later turn: previous prompt + its output + the new message
    state: DecodeState  # confirmed output, stopping rule, round log (rakv.runtime.decoding)
    sampling: Sampling = Sampling()  # greedy, or temperature / top-p with its own seeded stream
    salt: str | None = None
    choice: Choice = Choice(Action(False, 0))  # (reuse, k) and the controller's decision and per-round depth
    decided: bool = False  # the action is chosen (at the first admission attempt, against the store then)
    max_k: int = 0  # candidates a round may propose: k, or a per-round depth's largest
    status: Status = Status.WAITING
    computed: int = 0  # positions of `tokens` whose K/V is in the request's cache
    hit_tokens: int = 0  # positions copied from the prefix store at (first) admission
    draft_hit_tokens: int = 0  # of those, positions whose draft K/V came from the store too (the draft skipped them)
    preempted: int = 0  # times its K/V was dropped to stay under the K/V budget
    error: str | None = None
    conversation: str | None = None
    turn: int = 0
    emitted_s: list[float] = field(default_factory=list)  # when each batch of confirmed tokens came out
    finished_s: float | None = None
    order: int = 0  # admission order: preemption takes the newest first
    # its acceptance estimate at admission (prefix-keyed or the EWMA; rakv.serving.acceptance)
    alpha: float | None = None
    match_rate: float | None = None  # with it, the share of its rounds expected to offer candidates (its proposer's)
    prefix_acceptance: tuple[float, float] | None = None  # (accepted, rejections) its store hit carried
    predicted_s: float | None = None  # rakv-asd: the controller's predicted latency of the chosen action (batch one)
    served_predicted_s: float | None = None  # its service time predicted at admission with the running requests
    concurrency_at_admission: int = 0  # requests running with it when it was decided (itself included)
    realised_alpha: float | None = None  # at its end: the acceptance its own rounds (or their replay) showed
    admitted_s: float | None = None  # when it was first admitted (its service starts)

    @property
    def action(self) -> Action:
        return self.choice.action

    @property
    def proposer(self) -> str:
        """Of several proposers, the one it runs with (its choice's); "": the engine's own."""
        return self.choice.proposer

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.state.tokens

    @property
    def needed(self) -> int:
        """Rows the request needs next: its uncomputed tokens (a prefill, or 1 for the last confirmed token)."""
        return len(self.prompt) + len(self.state.tokens) - self.computed

    @property
    def decoding(self) -> bool:
        """Past its prefill: one confirmed token lacks K/V, and it produces the next from it."""
        return bool(self.state.tokens) and self.needed == 1

    @property
    def remaining_new(self) -> int:
        return self.state.max_new_tokens - len(self.state.tokens)

    def assign(self, choice: Choice, max_k: int, alpha: float, prefix_acceptance, served_predicted_s=None,
               concurrency: int = 0, match_rate: float | None = None) -> None:
        """The action chosen at its first admission attempt (against the store as it was then), with what admission
        predicted of its service under the load it saw."""
        assert not self.decided and self.status == Status.WAITING, f"request {self.id}: decided twice"
        self.decided, self.choice, self.max_k = True, choice, max_k
        self.alpha, self.prefix_acceptance, self.match_rate = alpha, prefix_acceptance, match_rate
        self.predicted_s = choice.decision.predicted_latency_s if choice.decision is not None else None
        self.served_predicted_s, self.concurrency_at_admission = served_predicted_s, concurrency

    def refuse(self, reason: str, now: float) -> None:
        assert self.status == Status.WAITING, f"request {self.id}: refused while {self.status.name}"
        self.status, self.error, self.finished_s = Status.REFUSED, reason, now

    def admit(self, order: int, computed: int, now: float) -> None:
        """Running from now on, its first `computed` positions given by the store (a hit; 0 without)."""
        assert self.status == Status.WAITING and self.decided, f"request {self.id}: admitted while {self.status.name}"
        self.status, self.order, self.computed = Status.RUNNING, order, computed
        if self.preempted == 0:
            self.hit_tokens = computed
        if self.admitted_s is None:
            self.admitted_s = now

    def preempt(self) -> None:
        assert self.status == Status.RUNNING, f"request {self.id}: preempted while {self.status.name}"
        self.status, self.computed = Status.WAITING, 0
        self.preempted += 1

    def advance(self, output, now: float) -> None:
        """What one iteration did for it: its round (if it verified candidates), its confirmed tokens, how many
        positions its cache now holds (rakv.serving.executor.RequestOutput)."""
        assert self.status == Status.RUNNING, f"request {self.id}: advanced while {self.status.name}"
        state = self.state
        before = len(state.tokens)
        if output.round is not None:
            state.record_round(*output.round)
        state.emit(output.tokens)
        state.peak_kv_bytes = max(state.peak_kv_bytes, output.held_bytes)
        if output.draft_hit_tokens is not None and self.preempted == 0:
            self.draft_hit_tokens = output.draft_hit_tokens
        if len(state.tokens) > before:
            self.emitted_s.append(now)
        self.computed = min(output.cache_positions, len(self.tokens))

    def abort(self, reason: str, now: float) -> None:
        assert self.status in (Status.WAITING, Status.RUNNING), f"request {self.id}: aborted while {self.status.name}"
        self.status, self.error, self.finished_s = Status.ABORTED, reason, now

    def fail(self, reason: str, now: float) -> None:
        assert self.status in (Status.WAITING, Status.RUNNING), f"request {self.id}: failed while {self.status.name}"
        self.status, self.error, self.finished_s = Status.FAILED, reason, now

    def finish(self, now: float, realised_alpha: float | None = None) -> None:
        assert self.status == Status.RUNNING and self.state.finished, f"request {self.id}: finished too early"
        self.status, self.finished_s, self.realised_alpha = Status.FINISHED, now, realised_alpha
