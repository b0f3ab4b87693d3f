"""The engine thread of `rakv serve --http`: the one owner of the scheduler, between the HTTP handlers and the engine.

Handlers (rakv.serving.http) only validate, tokenise, `submit` and read their request's events; this thread, between
iterations, takes the new requests and aborts from its inbox, runs one engine step (trace replay's,
rakv.serving.server.EngineCore.step: schedule -> execute -> update_from_output) and hands each request's newly
confirmed tokens to its handler through the request's `notify` (thread-safe; called here). So request state still
changes in the scheduler alone.

What it guarantees, whatever a request holds:
- *Bounded*: `submit` refuses (`Overloaded`, 429) once `max_batch + max_waiting` requests are in flight.
- *Faults isolated*: a request whose own part of an iteration raises fails alone (rakv.serving.executor.alone);
  an iteration whose shared part raises fails the requests it ran (EngineCore.fail_step). Either way their K/V is
  freed, their record says `failed` with a one-line reason, and the others go on.
- *Nothing waits forever*: if the loop itself cannot go on (an exception outside an iteration's execution, or
  `MAX_FAILED_ITERATIONS` failed iterations in a row), the engine is `dead`: every request in flight ends `failed`
  with the reason, `health` says so, and `submit` refuses (`Unavailable`, 503).
- *Drained, then recorded*: while `draining`, `submit` refuses (503) and running requests go on; `finish` (after
  the thread stopped) aborts what is left, so every admitted request has exactly one line in requests.jsonl, and
  writes summary.json / iterations.jsonl.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rakv.runtime.decoding import Sampling
from rakv.runtime.engine import Engine
from rakv.serving.executor import one_line
from rakv.serving.metrics import RunSummary
from rakv.serving.prometheus import ServerMetrics
from rakv.serving.request import ServedRequest, Status
from rakv.serving.scoring import score
from rakv.serving.server import EngineCore, Iteration, ServeOptions, ServeParts, StepFailed
from rakv.serving.stops import output_text, stop_state

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05  # how long the engine thread blocks on its inbox when nothing runs
MAX_FAILED_ITERATIONS = 3  # failed iterations in a row after which the engine is declared dead

TOKENS, END = "tokens", "end"  # events: (TOKENS, tokens confirmed so far), (END, None)
SCORED, FAILED = "scored", "failed"  # a scoring's one event: (SCORED, rakv.serving.scoring.Scored), (FAILED, why)


class Overloaded(Exception):
    """The admission queue is full: 429, try again later."""


class Unavailable(Exception):
    """The engine is draining or dead: 503."""


@dataclass
class Live:
    """A request in flight and how its handler hears of it: `notify((TOKENS, n))` as tokens are confirmed, then
    `notify((END, None))` once, when it has left the engine (its status says how)."""

    request: ServedRequest
    notify: Callable[[tuple[str, int | None]], None]
    sent: int = 0


@dataclass
class Scoring:
    """A sequence to score (echo / logprobs: rakv.serving.scoring), and how its handler hears of it: `notify` once,
    (SCORED, Scored) or (FAILED, why)."""

    ids: list[int]
    top: int
    notify: Callable[[tuple[str, object]], None]


class EngineLoop:
    """The engine thread and its inbox. `submit` / `abort` / `health` from any thread; `run` is the thread."""

    def __init__(self, engine: Engine, options: ServeOptions, out: Path | None, parts: ServeParts | None,
                 max_waiting: int, metrics: ServerMetrics | None = None):
        self.engine, self.options, self.metrics = engine, options, metrics
        self.core = EngineCore.build(engine, options, parts, out)
        self.scheduler = self.core.scheduler
        self.capacity = options.max_batch + max_waiting
        self.inbox: queue.Queue = queue.Queue()
        self.live: dict[str, Live] = {}  # the engine thread's: requests it holds
        self.scorings: list[Scoring] = []  # the engine thread's: taken, not run yet
        self.in_flight = 0  # submitted, not ended (under `gate`)
        self.gate = threading.Lock()  # submit vs death: nothing is put in the inbox of a dead engine
        self.stopping = threading.Event()
        self.draining = False
        self.dead: str | None = None  # why the engine stopped, once it has
        self.thread: threading.Thread | None = None

    # --- from the handlers' side ---

    def new_request(self, prompt: list[int], max_tokens: int, sampling: Sampling, stop_at_eos: bool,
                    prefix: str = "cmpl", stops: tuple[str, ...] = ()) -> ServedRequest:
        """A request to submit; with `stops`, its output ends at the first of them (rakv.serving.stops), checked on
        this thread's tokenizer as its tokens are confirmed."""
        state = stop_state(max_tokens, self.engine.pair.eos_token_id, not stop_at_eos, stops, self.decode)
        return ServedRequest(id=f"{prefix}-{uuid.uuid4().hex[:24]}", arrival_s=self.core.now(), prompt=prompt,
                             state=state, sampling=sampling)

    def submit(self, request: ServedRequest, notify) -> Live:
        """Into the engine's inbox, or refused now: `Unavailable` (draining, dead), `Overloaded` (the queue is full)."""
        live = Live(request, notify)
        self._enqueue("submit", live)
        return live

    def score(self, ids: list[int], top: int, notify) -> None:
        """A sequence to score on the engine thread, between iterations (refused now as `submit` refuses)."""
        self._enqueue("score", Scoring(ids, top, notify))

    def _enqueue(self, kind: str, item) -> None:
        with self.gate:
            if self.dead is not None or not self.running:
                raise Unavailable(f"the engine is not running ({self.dead or 'stopped'})")
            if self.draining:
                raise Unavailable("the server is shutting down")
            if self.in_flight >= self.capacity:
                raise Overloaded(f"{self.in_flight} requests are in flight, the most this server queues; retry later")
            self.in_flight += 1
            self.inbox.put((kind, item))

    def abort(self, live: Live) -> None:
        """Its client went away: dropped between iterations and its K/V freed (a request already ended: nothing)."""
        self.inbox.put(("abort", live))

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and not self.stopping.is_set()

    def health(self) -> tuple[str, str | None]:
        """ok, draining, or stopped (with why)."""
        if self.dead is not None or not self.running:
            return "stopped", self.dead or "the engine thread is not running"
        return ("draining", "the server is shutting down") if self.draining else ("ok", None)

    # --- the engine thread ---

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="rakv-engine", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join()

    def run(self) -> None:
        """Until `stopping`: take what arrived, then one engine step; block briefly on the inbox when idle."""
        failed_in_a_row = 0
        try:
            while not self.stopping.is_set():
                self._take(block=not self.core.busy)
                self._score()
                if self.core.busy:
                    try:
                        self._deliver(self.core.step(self.core.now()))
                        failed_in_a_row = 0
                    except StepFailed as failure:
                        failed_in_a_row += 1
                        self._failed_iteration(failure, failed_in_a_row)
                self._observe_load()
        except Exception as exc:  # the loop itself cannot go on: every request in flight is told, nothing hangs
            log.exception("the engine loop stopped")
            self._die(one_line(exc))

    def _failed_iteration(self, failure: StepFailed, in_a_row: int) -> None:
        log.error("an iteration failed (%d in a row): %s", in_a_row, failure, exc_info=failure.__cause__)
        if self.metrics is not None:
            self.metrics.failed_iterations.inc()
        if in_a_row >= MAX_FAILED_ITERATIONS:  # (before any request is told: they are told the engine stopped)
            raise RuntimeError(f"{in_a_row} iterations failed in a row, the last: {failure}")
        for request in self.core.fail_step(failure, self.core.now()):
            self._close(self.live.pop(request.id))

    def _take(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait()
            while True:
                kind, live = item
                if kind == "submit":
                    self.live[live.request.id] = live
                    self.scheduler.waiting.append(live.request)
                elif kind == "score":
                    self.scorings.append(live)
                elif live.request.id in self.live:  # an abort of a request still in flight
                    self.scheduler.abort(self.live.pop(live.request.id).request, "the client went away",
                                         self.core.now())
                    self._close(live)
                item = self.inbox.get_nowait()
        except queue.Empty:
            return

    def _score(self) -> None:
        """The scorings taken: each one forward of the target (between iterations), its handler told."""
        while self.scorings:
            job = self.scorings.pop(0)
            try:
                result = (SCORED, score(self.engine.pair.target.module, job.ids, job.top, self.engine.pair.device))
            except Exception as exc:  # one scoring's failure is its alone
                log.exception("scoring a sequence raised")
                result = (FAILED, one_line(exc))
            finally:
                with self.gate:
                    self.in_flight -= 1
            job.notify(result)

    def decode(self, tokens: list[int]) -> str:
        """Token ids as text, on the engine's tokenizer (this thread's)."""
        return self.engine.pair.tokenizer.decode(tokens, skip_special_tokens=True)

    def _deliver(self, done: Iteration) -> None:
        for request in done.step.refused + done.step.failed:
            self._close(self.live.pop(request.id))
        if done.output is None:
            return
        for request_id in done.output.requests:
            live = self.live.get(request_id)
            if live is not None and len(live.request.state.tokens) > live.sent:
                live.sent = len(live.request.state.tokens)
                live.notify((TOKENS, live.sent))
        for request in done.finished:
            self._close(self.live.pop(request.id))

    def _close(self, live: Live) -> None:
        """The request has left the engine: its record (requests.jsonl), its metrics, then its handler is told."""
        request = live.request
        try:
            text = output_text(request.state, self.decode(request.state.tokens))
            record = self.core.close(request, text)
            if self.metrics is not None:
                self.metrics.observe_request(record, finish_reason(request))
        finally:
            with self.gate:
                self.in_flight -= 1
            live.notify((END, None))

    def _observe_load(self) -> None:
        if self.metrics is not None:
            running = self.scheduler.running
            self.metrics.observe_load(len(running), len(self.scheduler.waiting) + self.inbox.qsize(),
                                      sum(self.scheduler.held_bytes(r) for r in running),
                                      int(self.options.kv_budget_mib * (1 << 20)))

    def _die(self, reason: str) -> None:
        """The engine cannot go on: no more submissions; every request it holds or was sent ends `failed`."""
        with self.gate:
            self.dead = reason
        if self.metrics is not None:
            self.metrics.engine_alive.set(0)
        self._end_all(Status.FAILED, f"the engine stopped: {reason}")

    def _end_all(self, status: Status, reason: str) -> None:
        """Every request in flight (held, or still in the inbox) ends with `status` and is recorded."""
        while True:
            try:
                kind, live = self.inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                self.live[live.request.id] = live
            elif kind == "score":
                self.scorings.append(live)
        for job in self.scorings:
            with self.gate:
                self.in_flight -= 1
            job.notify((FAILED, reason))
        self.scorings.clear()
        now = self.core.now()
        for live in list(self.live.values()):
            request = live.request
            try:
                if request in self.scheduler.running or request in self.scheduler.waiting:
                    (self.scheduler.abort if status == Status.ABORTED else self.scheduler.fail)(request, reason, now)
                elif request.status in (Status.WAITING, Status.RUNNING):
                    (request.abort if status == Status.ABORTED else request.fail)(reason, now)
                self._close(live)
            except Exception:  # recording one request must not keep the others from being told
                log.exception("ending request %s", request.id)
                live.notify((END, None))
        self.live.clear()

    def finish(self) -> RunSummary | None:
        """After the engine thread stopped: what is still in flight is aborted and recorded, then summary.json and
        iterations.jsonl (with --out)."""
        if self.dead is None:
            self._end_all(Status.ABORTED, "the server stopped")
        return self.core.finish([])


def finish_reason(request: ServedRequest) -> str | None:
    """OpenAI's finish reason of a finished request: stop (its end-of-sequence token or a stop string) or length;
    None otherwise."""
    if request.status != Status.FINISHED:
        return None
    state = request.state
    if getattr(state, "stop_reason", None) is not None:
        return "stop"
    stopped = not state.ignore_eos and state.tokens and state.eos_token_id is not None \
        and state.tokens[-1] == state.eos_token_id
    return "stop" if stopped else "length"
