"""A served run's line files: requests.jsonl (a served request's record, `RequestRecord`, one line each, and the
writer that appends it) and iterations.jsonl (an engine iteration's record, `IterationRecord`).

The records are typed as batch one's rakv.runtime.engine.RequestResult is; their fields, in this order, are the
keys of a line (docs/serving.md), written and read back, every key checked, by the records' codec
(rakv.runtime.json_records: `to_json`, `read_records`, `read_iterations`); rakv.serving.metrics summarises a run's
records into summary.json.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import ABSENT, from_json, optional, to_json
from rakv.serving.request import ServedRequest, Status

STATUS_NAMES = {Status.FINISHED: "ok", Status.REFUSED: "refused", Status.ABORTED: "aborted",
                Status.FAILED: "failed"}
"""A record's `status` for each way a request leaves the engine."""


@dataclass(frozen=True)
class RequestRecord:
    """One served (or refused, or aborted) request. Times are seconds on the serving clock; the latencies are None
    for a request that did not finish."""

    id: str
    status: str  # ok, refused, aborted or failed
    error: str | None  # why it was refused, aborted or failed
    prompt_tokens: int
    hit_tokens: int  # prompt positions whose K/V came from the prefix store
    draft_hit_tokens: int  # of those, positions whose draft-model K/V came from the store too
    new_tokens: int
    token_ids: list[int]
    text: str
    arrival_s: float
    ttft_s: float | None  # arrival to first token
    tpot_s: float | None  # (e2el - ttft) / (new tokens - 1), for more than one token
    itl_s: list[float]  # gaps between successive emissions (a speculative round's tokens arrive together)
    e2el_s: float | None  # arrival to last token
    reuse: bool  # its action: reuse the store's hit
    k: int  # ... and speculate k candidates per round
    rounds: int
    proposed: int
    accepted: int
    preempted: int  # times its K/V was dropped and recomputed
    conversation: str | None
    turn: int
    peak_kv_bytes: int
    alpha: float | None  # the acceptance its action was chosen with
    prefix_acceptance: list | None  # the acceptance recorded with the store entry it extended
    predicted_s: float | None  # the cost model's latency for its action, alone
    served_predicted_s: float | None  # ... and under the load it was admitted into
    concurrency_at_admission: int | None
    realised_alpha: float | None  # the acceptance its rounds realised
    admitted_s: float | None
    service_s: float | None  # admission to last token
    empty_rounds: int  # speculative rounds without a candidate
    prompt_ids: list[int]
    proposer: str = optional()  # of several proposers, the one chosen for it (its rounds' and k's); absent for one

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict:
        """The requests.jsonl line's object: every field, in declaration order."""
        return to_json(self)


def read_lines(cls, path: Path, what: str) -> list:
    """A .jsonl file of records `cls` (missing: none); a line of another shape stops with one line naming it, `what`
    it is not, and its first field that does not fit."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out.append(from_json(cls, json.loads(line)))
        except ValueError as exc:  # not JSON, or a SchemaError naming the field
            raise RakvError(f"{path}:{number}: not {what} ({exc})") from None
    return out


def read_records(path: Path) -> list[RequestRecord]:
    """A requests.jsonl as its records (missing: none)."""
    return read_lines(RequestRecord, path, "a requests.jsonl record")


def record_of(request: ServedRequest, text: str) -> RequestRecord:
    """The record of a request that has left the engine (finished, refused or aborted); `text`: its output decoded."""
    state = request.state
    ok = request.status == Status.FINISHED
    times = request.emitted_s
    ttft = times[0] - request.arrival_s if ok and times else None
    e2el = request.finished_s - request.arrival_s if ok else None
    return RequestRecord(
        id=request.id, status=STATUS_NAMES[request.status],
        error=request.error, prompt_tokens=len(request.prompt), hit_tokens=request.hit_tokens,
        draft_hit_tokens=request.draft_hit_tokens, new_tokens=len(state.tokens), token_ids=state.tokens, text=text,
        arrival_s=request.arrival_s, ttft_s=ttft,
        tpot_s=(e2el - ttft) / (len(state.tokens) - 1) if ok and len(state.tokens) > 1 else None,
        itl_s=[b - a for a, b in zip(times, times[1:])] if ok else [], e2el_s=e2el,
        reuse=request.action.reuse, k=request.action.k, rounds=state.rounds, proposed=state.proposed,
        accepted=state.accepted, preempted=request.preempted, conversation=request.conversation,
        turn=request.turn, peak_kv_bytes=state.peak_kv_bytes, alpha=request.alpha,
        prefix_acceptance=list(request.prefix_acceptance) if request.prefix_acceptance else None,
        predicted_s=request.predicted_s, served_predicted_s=request.served_predicted_s,
        concurrency_at_admission=request.concurrency_at_admission, realised_alpha=request.realised_alpha,
        admitted_s=request.admitted_s,
        service_s=request.finished_s - request.admitted_s if ok and request.admitted_s is not None else None,
        empty_rounds=state.empty_rounds, prompt_ids=request.prompt, proposer=request.proposer or ABSENT)


class RecordWriter:
    """requests.jsonl: each line in one write, flushed to disk before the next request is served."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, record: RequestRecord) -> None:
        os.write(self.fd, (json.dumps(record.to_json()) + "\n").encode())
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class IterationRecord:
    """One engine iteration that ran (rakv.serving.server.iteration_record): what ran, its batch-cost features
    (rakv.serving.batchcost.PassFeatures) and prediction, and how long it took. Times are seconds on the serving
    clock."""

    at_s: float  # when it ended
    rows: int  # new tokens of every request together
    running: int  # requests that ran to its end (those it finished included)
    segments: int
    kv_positions: int
    attended: int
    predicted_s: float | None  # the batch cost model's, scaled by the iterations before it (None: not priced)
    model_s: float | None  # ... the table's alone
    mixed: bool  # a prefill chunk beside the decodes
    prefill_context: int | None  # the deepest prefill chunk's starting position (None: decodes only)
    decodes: int
    prefill_rows: int
    k: list[int]  # each decoding request's candidates
    admitted: int
    preempted: int
    kv_bytes: int  # K/V the running requests held at its end
    schedule_s: float
    iteration_s: float

    def to_json(self) -> dict:
        """The iterations.jsonl line's object: every field, in declaration order."""
        return to_json(self)


def read_iterations(path: Path) -> list[IterationRecord]:
    """An iterations.jsonl as its records (missing: none)."""
    return read_lines(IterationRecord, path, "an iterations.jsonl record")


def write_iterations(path: Path, iterations: list[IterationRecord]) -> None:
    """iterations.jsonl: one line per iteration, in the order they ran."""
    with Path(path).open("w") as fh:
        fh.writelines(json.dumps(i.to_json()) + "\n" for i in iterations)
