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
from rakv.serving.policies import SloBudget, speculation_policy
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
    itl_slo_ms: float | None = None  # chunking by the batch cost model: each iteration's prefill rows under this SLO
    acceptance: str = "ewma"  # a request's acceptance at admission: ewma (across requests) or prefix (its store hit's)


def serve_parts(engine: Engine, options: ServeOptions, table_for, controller_config=None,
                recalibrate: str = "auto", progress: bool = True) -> dict:
    """serve()'s keyword arguments for `options`: the controller (rakv-asd), the batch cost model (the model
    policies and the per-iteration predictions) and the acceptance EWMA seeded from the calibrated acceptance.
    `table_for()` gives the engine's per-request cost table (rakv.runtime.calibration), called only when needed."""
    from rakv.runtime.actions import ADAPTIVE
    from rakv.runtime.controller import AcceptanceTracker, Controller, ControllerConfig
    from rakv.serving.batchcost import load_or_calibrate_batch
    from rakv.serving.policies import MODEL_POLICIES

    config = controller_config or ControllerConfig.default()
    model = options.speculation in MODEL_POLICIES or options.itl_slo_ms is not None
    parts: dict = {"k_set": tuple(config.k_set)}
    if options.strategy == ADAPTIVE or model:
        table = table_for()
        if options.strategy == ADAPTIVE:
            parts["controller"] = Controller(table, config)
        else:
            parts["tracker"] = AcceptanceTracker(table.acceptance, config.beta, table.match_rate)
        parts["batch_cost"] = load_or_calibrate_batch(engine, recalibrate=recalibrate, progress=progress)
    return parts


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
        "turn": request.turn, "peak_kv_bytes": state.peak_kv_bytes, "alpha": request.alpha,
        "prefix_acceptance": list(request.prefix_acceptance) if request.prefix_acceptance else None,
        "predicted_s": request.predicted_s,
        "service_s": request.finished_s - request.admitted_s if ok and request.admitted_s is not None else None,
        "empty_rounds": state.empty_rounds, "prompt_ids": request.prompt,
    }


def serve(engine: Engine, trace: list[TraceRequest], out_dir: str | Path, options: ServeOptions = ServeOptions(),
          *, controller=None, batch_cost=None, tracker=None, k_set: tuple[int, ...] = (), progress: bool = True) -> dict:
    """Serve a (validated) trace; writes out_dir/requests.jsonl and out_dir/summary.json; returns the summary.

    controller: rakv-asd's (rakv.runtime.controller.Controller); batch_cost (rakv.serving.batchcost.BatchCost):
    for the model policies (`smartspec`, `load-aware`, `itl_slo_ms`) and the predicted time of every iteration;
    tracker: the acceptance EWMA to start from when there is no controller; k_set: the model policies' depths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if options.token_budget <= 0 or options.max_batch <= 0 or options.kv_budget_mib <= 0:
        raise RakvError("--token-budget, --max-batch and --kv-budget-mib must be positive")
    if options.itl_slo_ms is not None and (options.itl_slo_ms <= 0 or batch_cost is None):
        raise RakvError("--itl-slo-ms needs a positive SLO and the batch cost model")
    k_set = tuple(k_set or (controller.config.k_set if controller is not None else ()))
    load_aware = options.speculation == "load-aware"
    runner = Runner(engine, options.strategy, options.sampling, controller, acceptance=options.acceptance,
                    tracker=tracker, k_by_iteration=k_set if load_aware else ())
    policy = speculation_policy(options.speculation, batch_cost, runner.tracker, k_set)
    budget = SloBudget(batch_cost, options.itl_slo_ms / 1e3) if options.itl_slo_ms is not None else None
    scheduler = Scheduler(runner, options.token_budget, options.max_batch, int(options.kv_budget_mib * (1 << 20)),
                          options.chunking, policy, budget)
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
            for request in step.admitted:
                if request.admitted_s is None:
                    request.admitted_s = now
            outcome = runner.run(step)
            ended = time.perf_counter()
            at = ended - start
            features = outcome.features
            predicted = (batch_cost.iteration_s(features, features["ks"])
                         if batch_cost is not None and outcome.rows else None)
            iterations.append({"at_s": at, "rows": outcome.rows, "running": len(scheduler.running),
                               "segments": features.get("segments", 0),
                               "kv_positions": features.get("kv_positions", 0),
                               "attended": features.get("attended", 0), "predicted_s": predicted,
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
                   max_batch=options.max_batch, kv_budget_mib=options.kv_budget_mib, itl_slo_ms=options.itl_slo_ms,
                   acceptance=options.acceptance,
                   peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    with (out / "iterations.jsonl").open("w") as fh:  # one line per iteration: what ran and how long it took
        fh.writelines(json.dumps(i) + "\n" for i in iterations)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
