"""The serving loop: requests arrive on the clock, and every iteration is schedule -> run -> apply.

    summary = serve(engine, read_trace("trace.jsonl"), "out/", ServeOptions(strategy="spec-k4"))

`requests.jsonl` gets one line per request as soon as it is finished or refused (written with one system call,
flushed and fsynced: a kill -9 leaves complete lines only); `iterations.jsonl` (per iteration: rows, running
requests, decodes and their k, prefill rows, admissions, preemptions, K/V held, scheduler and iteration time)
and `summary.json` (rakv.serving.metrics) at the end.
A bad request (an empty prompt, longer than the context or than the K/V budget alone) is refused alone.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from rakv.runtime.decoding import DecodeState, Sampling
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.serving.metrics import summarize
from rakv.serving.policies import speculation_policy
from rakv.serving.replay import outputs_alone
from rakv.serving.request import ServedRequest, Status
from rakv.serving.runner import Runner
from rakv.serving.scheduler import Scheduler
from rakv.serving.trace import TraceRequest


@dataclass(frozen=True)
class ServeOptions:
    """conf/serving/default.yaml holds the defaults (the CLI reads them there)."""

    strategy: str = "ar"
    token_budget: int = 256
    chunking: bool = True
    max_batch: int = 16
    kv_budget_mib: float = 512.0
    slos_ms: dict = field(default_factory=dict)  # rakv.serving.metrics.parse_goodput
    sampling: Sampling = Sampling()
    ignore_eos: bool = False
    speculation: str = "per-request"  # rakv.serving.policies.speculation_policy
    check_alone: bool = False  # after serving, generate each finished request alone (greedy AR) and count equal ones


class RecordWriter:
    """requests.jsonl: each line in one write, flushed to disk before the next request is served."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, record: dict) -> None:
        os.write(self.fd, (json.dumps(record) + "\n").encode())
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def record_of(request: ServedRequest, text: str) -> dict:
    state = request.state
    ok = request.status == Status.FINISHED
    times = request.emitted_s
    ttft = times[0] - request.arrival_s if ok and times else None
    e2el = request.finished_s - request.arrival_s if ok else None
    return {
        "id": request.id, "status": "ok" if ok else "refused", "error": request.error,
        "prompt_tokens": len(request.prompt), "hit_tokens": request.hit_tokens, "new_tokens": len(state.tokens),
        "token_ids": state.tokens, "text": text, "arrival_s": request.arrival_s, "ttft_s": ttft,
        "tpot_s": (e2el - ttft) / (len(state.tokens) - 1) if ok and len(state.tokens) > 1 else None,
        "itl_s": [b - a for a, b in zip(times, times[1:])] if ok else [], "e2el_s": e2el,
        "reuse": request.action.reuse, "k": request.action.k, "rounds": state.rounds, "proposed": state.proposed,
        "accepted": state.accepted, "preempted": request.preempted, "conversation": request.conversation,
        "turn": request.turn, "peak_kv_bytes": state.peak_kv_bytes,
    }


def serve(engine: Engine, trace: list[TraceRequest], out_dir: str | Path, options: ServeOptions = ServeOptions(),
          *, controller=None, progress: bool = True) -> dict:
    """Serve a (validated) trace; writes out_dir/requests.jsonl and out_dir/summary.json; returns the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if options.token_budget <= 0 or options.max_batch <= 0 or options.kv_budget_mib <= 0:
        raise RakvError("--token-budget, --max-batch and --kv-budget-mib must be positive")
    runner = Runner(engine, options.strategy, options.sampling, controller)
    scheduler = Scheduler(runner, options.token_budget, options.max_batch, int(options.kv_budget_mib * (1 << 20)),
                          options.chunking, speculation_policy(options.speculation))
    tokenizer, max_context = engine.pair.tokenizer, engine.pair.max_context
    arrivals = deque(sorted((r for r in trace if not r.follows), key=lambda r: r.arrival_s))
    next_turn = {(r.conversation, r.turn): r for r in trace if r.follows}
    followers: list[tuple[float, TraceRequest, ServedRequest]] = []  # (arrival, turn, previous turn)
    writer = RecordWriter(out / "requests.jsonl")
    records, iterations = [], []
    bar = tqdm(total=len(trace), desc="serve", unit="req", disable=not progress, leave=False)

    def close(request: ServedRequest) -> None:
        text = tokenizer.decode(request.state.tokens, skip_special_tokens=True)
        record = record_of(request, text)
        writer.write(record)
        records.append(record)
        bar.update(1)
        successor = next_turn.pop((request.conversation, request.turn + 1), None) if request.conversation else None
        if successor is None:
            return
        if request.status != Status.FINISHED:
            refused = new_request(successor, request.finished_s, [])
            refused.refuse(f"turn {request.turn} of conversation {request.conversation} was refused",
                           request.finished_s)
            close(refused)
        else:
            followers.append((request.finished_s + successor.after_s, successor, request))

    def new_request(source: TraceRequest, arrival: float, prompt: list[int]) -> ServedRequest:
        return ServedRequest(id=source.id, arrival_s=arrival, prompt=prompt,
                             state=DecodeState(source.max_new_tokens, engine.pair.eos_token_id, options.ignore_eos),
                             salt=source.salt, conversation=source.conversation, turn=source.turn)

    def arrive(source: TraceRequest, arrival: float, previous: ServedRequest | None) -> None:
        request = new_request(source, arrival, [])
        try:
            message = engine.encode(source.prompt)
            request.prompt = (previous.tokens if previous is not None else []) + message
            engine.check_lengths(len(request.prompt), source.max_new_tokens)
        except RakvError as exc:
            request.refuse(str(exc), arrival)
            close(request)
            return
        scheduler.waiting.append(request)

    start = time.perf_counter()
    try:
        while arrivals or followers or scheduler.waiting or scheduler.running:
            now = time.perf_counter() - start
            while arrivals and arrivals[0].arrival_s <= now:
                source = arrivals.popleft()
                arrive(source, source.arrival_s, None)
            for item in sorted(f for f in followers if f[0] <= now):
                followers.remove(item)
                arrive(item[1], item[0], item[2])
            began = time.perf_counter()
            step = scheduler.schedule()
            scheduled = time.perf_counter()
            for request in step.refused:
                request.refuse(f"prompt + max_new_tokens need more K/V than --kv-budget-mib "
                               f"{options.kv_budget_mib:g} on their own", now)
                runner.release(request)
                close(request)
            if not (step.decodes or step.prefills or step.admitted or step.preempted):  # nothing to run yet
                upcoming = [a.arrival_s for a in list(arrivals)[:1]] + [f[0] for f in followers]
                if not scheduler.waiting and not scheduler.running and upcoming:
                    time.sleep(max(0.0, min(upcoming) - (time.perf_counter() - start)))
                continue
            outcome = runner.run(step)
            ended = time.perf_counter()
            at = ended - start
            iterations.append({"at_s": at, "rows": outcome.rows, "running": len(scheduler.running),
                               "decodes": len(step.decodes), "prefill_rows": sum(w.rows for w in step.prefills),
                               "k": [w.k for w in step.decodes], "admitted": len(step.admitted),
                               "preempted": len(step.preempted),
                               "kv_bytes": sum(scheduler.held_bytes(r) for r in scheduler.running),
                               "schedule_s": scheduled - began, "iteration_s": ended - began})
            for request in list(scheduler.running):
                if request.id in outcome.emitted:
                    request.emitted_s.append(at)
                if request.state.finished:
                    scheduler.finished(request)
                    runner.complete(request)
                    request.finish(at)
                    close(request)
    finally:
        writer.close()
        bar.close()
    duration = time.perf_counter() - start
    summary = summarize(records, duration, options.slos_ms, iterations)
    if options.check_alone:
        served = {r["id"]: r["token_ids"] for r in records if r["status"] == "ok"}
        reference = outputs_alone(engine, trace, served, ignore_eos=options.ignore_eos)
        summary["outputs_equal_alone"] = sum(reference[i] == tokens for i, tokens in served.items())
    summary.update(strategy=options.strategy, speculation=options.speculation, proposer=engine.proposer, pair=engine.pair.name,
                   token_budget=options.token_budget if options.chunking else None, chunking=options.chunking,
                   max_batch=options.max_batch, kv_budget_mib=options.kv_budget_mib,
                   peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    with (out / "iterations.jsonl").open("w") as fh:  # one line per iteration: what ran and how long it took
        fh.writelines(json.dumps(i) + "\n" for i in iterations)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
