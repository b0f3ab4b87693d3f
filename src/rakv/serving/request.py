"""A served request: its tokens, how many of them are computed, its state and timings. No tensors here.

As in vLLM v1 there is no prefill or decode phase flag: a request knows its tokens (prompt + confirmed
output) and how many of them have K/V in its cache (`computed`); what it needs next is `len(tokens) - computed`
rows: a prefill chunk, or the last token (plus k candidates when it speculates). A preempted request drops
its K/V (`computed = 0`) and later recomputes prompt and output in prefill chunks; its output is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from rakv.runtime.actions import Action
from rakv.runtime.decoding import DecodeState


class Status(IntEnum):
    WAITING = 0  # arrived, not admitted yet (or preempted: waiting to be recomputed)
    RUNNING = 1  # admitted: holds K/V, gets rows in iterations
    FINISHED = 2
    REFUSED = 3  # bad request (empty, longer than the context or the K/V budget): refused alone


@dataclass
class ServedRequest:
    id: str
    arrival_s: float  # seconds from the start of serving (a later turn: when the previous one finished + think)
    prompt: list[int]  # token ids; a later turn: previous prompt + its output + the new message
    state: DecodeState  # confirmed output, stopping rule, round log (rakv.runtime.decoding)
    salt: str | None = None
    action: Action = Action(False, 0)  # (reuse, k): fixed by the strategy, or the controller's at admission
    decided: bool = False  # the action is chosen (at the first admission attempt, against the store then)
    max_k: int = 0  # candidates a round may propose: k, or a per-round depth's largest
    status: Status = Status.WAITING
    computed: int = 0  # positions of `tokens` whose K/V is in the request's cache
    hit_tokens: int = 0  # positions copied from the prefix store at (first) admission
    preempted: int = 0  # times its K/V was dropped to stay under the K/V budget
    error: str | None = None
    conversation: str | None = None
    turn: int = 0
    emitted_s: list[float] = field(default_factory=list)  # when each batch of confirmed tokens came out
    finished_s: float | None = None
    order: int = 0  # admission order: preemption takes the newest first
    alpha: float | None = None  # its acceptance estimate at admission (prefix-keyed or the EWMA; rakv.serving.runner)
    prefix_acceptance: tuple[float, float] | None = None  # (accepted, rejections) its store hit carried
    predicted_s: float | None = None  # rakv-asd: the controller's predicted latency of the chosen action
    admitted_s: float | None = None  # when it was first admitted (its service starts)

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

    def refuse(self, reason: str, now: float) -> None:
        assert self.status == Status.WAITING, f"request {self.id}: refused while {self.status.name}"
        self.status, self.error, self.finished_s = Status.REFUSED, reason, now

    def admit(self, order: int) -> None:
        assert self.status == Status.WAITING, f"request {self.id}: admitted while {self.status.name}"
        self.status, self.order = Status.RUNNING, order

    def preempt(self) -> None:
        assert self.status == Status.RUNNING, f"request {self.id}: preempted while {self.status.name}"
        self.status, self.computed = Status.WAITING, 0
        self.preempted += 1

    def finish(self, now: float) -> None:
        assert self.status == Status.RUNNING and self.state.finished, f"request {self.id}: finished too early"
        self.status, self.finished_s = Status.FINISHED, now
