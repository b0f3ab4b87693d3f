"""The serving loop: requests arrive on the clock, and every iteration is schedule -> execute -> update_from_output.

    summary = serve(engine, read_trace("trace.jsonl"), "out/", ServeOptions.default(strategy="spec-k4"))

`requests.jsonl` gets one line per request as soon as it is finished or refused (written with one system call,
flushed and fsynced: a kill -9 leaves complete lines only); `iterations.jsonl` (per iteration: rows, running
requests, decodes and their k, prefill rows, admissions, preemptions, K/V held, scheduler and iteration time)
and `summary.json` (rakv.serving.metrics.RunSummary) at the end, each written through its record.
A bad request (an empty prompt, longer than the context or than the K/V budget alone) is refused alone.
"""

from __future__ import annotations

import json
import resource
import time
from collections import deque
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from tqdm import tqdm

from rakv.runtime.actions import ADAPTIVE, FIXED_STRATEGIES
from rakv.runtime.controller import AcceptanceTracker, Controller, ControllerConfig, ProposerChoice
from rakv.runtime.costmodel import CostTable
from rakv.runtime.decoding import DecodeState, Sampling
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import ABSENT
from rakv.runtime.paths import conf_file
from rakv.runtime.proposers import parse_proposers
from rakv.runtime.run_layout import ServedRunLayout
from rakv.runtime.strategies import action_of, check_strategy
from rakv.serving.acceptance import ACCEPTANCE_SOURCES, Acceptance
from rakv.serving.admission import Admission
from rakv.serving.batchcost import BatchCost, ScaledCost, load_or_calibrate_batch
from rakv.serving.executor import Executor, StepOutput, one_line
from rakv.serving.kv import KVManager
from rakv.serving.metrics import RunSummary, ServeSettings, parse_goodput, served_statistics
from rakv.serving.policies import MODEL_POLICIES, SloBudget, speculation_policy
from rakv.serving.records import IterationRecord, RecordWriter, RequestRecord, record_of, write_iterations
from rakv.serving.replay import outputs_alone
from rakv.serving.request import ServedRequest, Status
from rakv.serving.scheduler import Scheduler, Step
from rakv.serving.trace import TraceRequest

PROPOSER_CHOICES = ("batch-one", "service")  # how rakv-asd chooses among several proposers (ServeOptions)


@dataclass(frozen=True)
class ServeOptions:
    """How to serve, checked once here (a one-line RakvError) for the CLI, bench_serving.py and the serving study.
    The fields without a default are conf/serving/default.yaml's, the one source of their defaults
    (`ServeOptions.default(**overrides)`). Each field is also `rakv serve`'s flag of the same name (rakv.runtime.flags
    generates them from the metadata here; docs/usage.md)."""

    strategy: str = field(metadata={"help": f"per request: {', '.join(FIXED_STRATEGIES)}, rakv-asd"})  # or r1k4
    token_budget: int = field(metadata={"metavar": "N", "help": "rows of an iteration's forward: decodes first, then "
                                        "prefill chunks"})
    chunking: bool = field(metadata={  # false (--no-chunking): the baseline
        "help": "each prompt's whole prefill in an iteration of its own (the baseline)"})
    max_batch: int = field(metadata={"metavar": "B", "help": "running requests at most"})
    kv_budget_mib: float = field(metadata={"metavar": "M", "help": "K/V of the running requests; over it the newest "
                                           "is preempted"})
    speculation: str = field(metadata={"metavar": "POLICY", "help": (
        "k per decoding request under load, capping the strategy's: per-request, disable-by-batch-size:B, "
        "k-by-batch:1=4,4=2,8=0, smartspec (SmartSpec's goodput rule), load-aware (RAKV-ASD under load)")})
    itl_slo_ms: float | None = field(metadata={"metavar": "MS", "help": (
        "chunk prefills so that each iteration's predicted time (the batch cost model) stays under this inter-token "
        "latency; --token-budget stays the cap (default: fixed budget)")})
    acceptance: str = field(metadata={"choices": ACCEPTANCE_SOURCES, "help": (
        "a request's acceptance at admission: the EWMA across requests, or the one recorded with the store entry it "
        "extends")})
    slos_ms: dict = field(default_factory=dict, metadata={  # goodput's SLOs
        "flag": "--goodput", "nargs": "+", "metavar": "METRIC:MS", "parse": parse_goodput,
        "help": "SLOs for summary.json's goodput: ttft:MS tpot:MS e2el:MS"})
    proposers: tuple[str, ...] = field(default=(), metadata={"metavar": "NAMES", "parse": parse_proposers, "help": (
        "rakv-asd chooses (reuse, proposer, k) per request among these proposers, comma-separated, the engine's "
        "--proposer first (e.g. draft,prompt-lookup,heads); a fixed `heads:r1k4` runs the one it names "
        "(default: the engine's alone)")})
    proposer_choice: str = field(default="batch-one", metadata={"choices": PROPOSER_CHOICES, "help": (
        "with several --proposers: choose the proposer by the least batch-one latency (each proposer's controller, "
        "as rakv generate does) or by the least predicted service time beside the running requests (the batch cost "
        "model)")})
    sampling: Sampling = Sampling()  # its own flags (rakv.runtime.decoding.Sampling)
    ignore_eos: bool = field(default=False, metadata={"help": "generate exactly max_new_tokens per request"})
    check_alone: bool = field(default=False, metadata={"help": (  # then count the outputs equal to batch one's
        "then generate each finished request alone (greedy AR, empty store) and count in summary.json how many "
        "outputs are identical (outputs_equal_alone)")})

    def __post_init__(self):
        check_strategy(self.strategy)
        object.__setattr__(self, "proposers", parse_proposers(self.proposers))  # a config's list, checked
        if self.token_budget <= 0 or self.max_batch <= 0 or self.kv_budget_mib <= 0:
            raise RakvError("--token-budget, --max-batch and --kv-budget-mib must be positive")
        if self.itl_slo_ms is not None and self.itl_slo_ms <= 0:
            raise RakvError("--itl-slo-ms must be positive")
        if self.acceptance not in ACCEPTANCE_SOURCES:
            raise RakvError(f"--acceptance takes {' or '.join(ACCEPTANCE_SOURCES)}, got '{self.acceptance}'")
        if self.speculation not in MODEL_POLICIES:
            speculation_policy(self.speculation)  # a malformed policy fails before any model work
        if self.sampling.temperature < 0 or not 0 < self.sampling.top_p <= 1:
            raise RakvError("--temperature must be >= 0 and --top-p in (0, 1]")
        if self.check_alone and not self.sampling.greedy:
            raise RakvError("--check-alone compares greedy outputs; it needs --temperature 0")
        named = action_of(self.strategy).proposer if self.strategy != ADAPTIVE else ""
        if named and named not in self.proposers:
            raise RakvError(f"strategy {self.strategy} runs proposer '{named}': list it in --proposers")
        if self.proposer_choice not in PROPOSER_CHOICES:
            raise RakvError(f"--proposer-choice takes {' or '.join(PROPOSER_CHOICES)}, got '{self.proposer_choice}'")
        if self.proposer_choice == "service" and (len(self.proposers) < 2 or self.strategy != ADAPTIVE):
            raise RakvError("--proposer-choice service chooses among several --proposers under --strategy rakv-asd")
        if len(self.proposers) > 1 and self.acceptance == "prefix":
            raise RakvError("--acceptance prefix records a prefix's rounds whatever proposer ran them: with several "
                            "--proposers use ewma")

    @property
    def needs_batch_cost(self) -> bool:
        """The model policies and the ITL-SLO chunking price iterations with the batch cost model."""
        return self.speculation in MODEL_POLICIES or self.itl_slo_ms is not None or self.proposer_choice == "service"

    @classmethod
    def from_config(cls, node, **overrides) -> ServeOptions:
        """From a composed `serving` node (conf/serving/default.yaml), its other keys (trace, proposer) ignored."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in dict(node).items() if k in names}
        return cls(**{**values, **overrides})

    @classmethod
    def default(cls, **overrides) -> ServeOptions:
        return cls.from_config(conf_file("serving/default.yaml"), **overrides)


CONF_FIELDS = tuple(f.name for f in fields(ServeOptions) if f.default is MISSING and f.default_factory is MISSING)
"""ServeOptions' fields whose defaults conf/serving/default.yaml holds (a serving study's policy sets these)."""


@dataclass(frozen=True)
class ServeParts:
    """What serving needs besides its options: rakv-asd's controller, the acceptance EWMA to start from when there
    is no controller, the batch cost model (the model policies, `itl_slo_ms` and every iteration's prediction) and
    the model policies' depths. `serve_parts` builds the ones `options` need; empty: a fixed strategy, no cost model."""

    controller: Controller | ProposerChoice | None = None  # of several proposers: their choice
    tracker: AcceptanceTracker | None = None
    batch_cost: BatchCost | None = None
    k_set: tuple[int, ...] = ()

    @property
    def depths(self) -> tuple[int, ...]:
        """The model policies' depths: `k_set`, else the controller's."""
        return tuple(self.k_set or (self.controller.config.k_set if self.controller is not None else ()))


def serve_parts(engine: Engine, options: ServeOptions, table_for: Callable[[Engine], CostTable],
                controller_config: ControllerConfig | None = None, recalibrate: str = "auto", progress: bool = True,
                batch_cost: BatchCost | None = None) -> ServeParts:
    """The parts `options` need: the controller (rakv-asd; with several `proposers`, one per proposer in a
    ProposerChoice), the batch cost model (the model policies and the per-iteration predictions; with several
    proposers, pricing each one's proposals) and the acceptance EWMA seeded from the calibrated acceptance.
    `table_for(engine)` gives an engine's per-request cost table (rakv.runtime.calibration), called only when needed,
    once per proposer (`engine.with_proposer`). `batch_cost`: a batch cost table at hand, used whether or not
    `options` need one (the serving study prices every run's iterations with its own); without it, this machine's
    is loaded (or measured) when `options` need one."""
    config = controller_config or ControllerConfig.default()
    names = served_proposers(engine, options)
    if not (options.strategy == ADAPTIVE or options.needs_batch_cost):
        return ServeParts(batch_cost=batch_cost, k_set=tuple(config.k_set))
    tables = {name: table_for(engine.with_proposer(name)) for name in names}
    table = tables[engine.proposer]
    controller = None
    if options.strategy == ADAPTIVE:
        controller = (Controller(table, config) if len(names) == 1
                      else ProposerChoice.for_pair(tables, config, engine.pair))
    tracker = AcceptanceTracker(table.acceptance, config.beta, table.match_rate) if controller is None else None
    if batch_cost is None:
        batch_cost = load_or_calibrate_batch(engine, recalibrate=recalibrate, progress=progress)
    if len(names) > 1 and set(batch_cost.other_steps) != set(names[1:]):
        others = {name: load_or_calibrate_batch(engine.with_proposer(name), recalibrate=recalibrate,
                                                progress=progress) for name in names[1:]}
        batch_cost = batch_cost.with_proposers(others)
    return ServeParts(controller, tracker, batch_cost, tuple(config.k_set))


def served_proposers(engine: Engine, options: ServeOptions) -> tuple[str, ...]:
    """The proposers served: the engine's, or `options.proposers` (which must list the engine's first)."""
    if not options.proposers:
        return (engine.proposer,)
    if options.proposers[0] != engine.proposer:
        raise RakvError(f"--proposers lists the engine's proposer first: {engine.proposer}, not "
                        f"{options.proposers[0]}")
    return tuple(options.proposers)


@dataclass
class Arrivals:
    """The trace on the clock: first turns at their arrival times, a later turn once the previous one has finished
    (plus its think time), with the previous prompt and output before its message."""

    engine: Engine
    trace: list[TraceRequest]
    ignore_eos: bool
    sampling: Sampling = Sampling()

    def __post_init__(self):
        self.pending = deque(sorted((r for r in self.trace if not r.follows), key=lambda r: r.arrival_s))
        self.next_turn = {(r.conversation, r.turn): r for r in self.trace if r.follows}
        self.followers: list[tuple[float, TraceRequest, ServedRequest]] = []  # (arrival, turn, previous turn)

    @property
    def more(self) -> bool:
        return bool(self.pending or self.followers)

    def next_s(self) -> float | None:
        upcoming = [a.arrival_s for a in list(self.pending)[:1]] + [f[0] for f in self.followers]
        return min(upcoming) if upcoming else None

    def due(self, now: float) -> list[ServedRequest]:
        """Requests arrived by `now`, tokenised and checked (a bad one comes back refused)."""
        out = []
        while self.pending and self.pending[0].arrival_s <= now:
            source = self.pending.popleft()
            out.append(self._request(source, source.arrival_s, None))
        for item in sorted(f for f in self.followers if f[0] <= now):
            self.followers.remove(item)
            out.append(self._request(item[1], item[0], item[2]))
        return out

    def closed(self, request: ServedRequest) -> ServedRequest | None:
        """A request is done: schedule its conversation's next turn; a refused turn refuses the next (returned)."""
        successor = self.next_turn.pop((request.conversation, request.turn + 1), None) if request.conversation else None
        if successor is None:
            return None
        if request.status == Status.FINISHED:
            self.followers.append((request.finished_s + successor.after_s, successor, request))
            return None
        refused = self._new(successor, request.finished_s, [])
        refused.refuse(f"turn {request.turn} of conversation {request.conversation} was refused", request.finished_s)
        return refused

    def _new(self, source: TraceRequest, arrival: float, prompt: list[int]) -> ServedRequest:
        state = DecodeState(source.max_new_tokens, self.engine.pair.eos_token_id, self.ignore_eos)
        return ServedRequest(id=source.id, arrival_s=arrival, prompt=prompt, state=state, sampling=self.sampling,
                             salt=source.salt, conversation=source.conversation, turn=source.turn)

    def _request(self, source: TraceRequest, arrival: float, previous: ServedRequest | None) -> ServedRequest:
        request = self._new(source, arrival, [])
        try:
            request.prompt = (previous.tokens if previous is not None else []) + self.engine.encode(source.prompt)
            self.engine.check_lengths(len(request.prompt), source.max_new_tokens)
        except RakvError as exc:
            request.refuse(str(exc), arrival)
        return request


def prefill_context(step: Step) -> int | None:
    """The deepest prefill chunk's starting position in the iteration (None: decodes only): its shape class."""
    return max((w.request.computed for w in step.prefills), default=None)


def iteration_record(at: float, step: Step, output: StepOutput, running: list[ServedRequest], held_bytes, batch_cost,
                     began: float, scheduled: float, ended: float) -> IterationRecord:
    """One line of iterations.jsonl: what ran, its batch-cost features and prediction (`predicted_s`: scaled by the
    iterations before it, rakv.serving.batchcost.ScaledCost; `model_s`: the table's alone), and how long it took;
    `running`: the requests that ran to the end of the iteration (those it finished included) and the K/V they
    held then (`held_bytes`, the scheduler's account)."""
    features, context = output.features, prefill_context(step)
    priced = batch_cost is not None and output.rows
    predicted = batch_cost.iteration_s(features, output.ks, context, output.kinds) if priced else None
    model = batch_cost.table.iteration_s(features, output.ks, kinds=output.kinds) if priced else None
    return IterationRecord(
        at_s=at, rows=output.rows, running=len(running), segments=features.segments,
        kv_positions=features.kv_positions, attended=features.attended, predicted_s=predicted, model_s=model,
        mixed=context is not None, prefill_context=context, decodes=len(step.decodes),
        prefill_rows=sum(w.rows for w in step.prefills), k=output.ks, admitted=len(step.admitted),
        preempted=len(step.preempted), kv_bytes=sum(held_bytes(r) for r in running), schedule_s=scheduled - began,
        iteration_s=ended - began)


def build_scheduler(engine: Engine, options: ServeOptions, controller: Controller | ProposerChoice | None,
                    batch_cost: ScaledCost | None, tracker: AcceptanceTracker | None,
                    k_set: tuple[int, ...]) -> tuple[Scheduler, Executor]:
    """The three parts of an engine step for `options`: admission (with the acceptance estimate), the K/V manager,
    the scheduler with its speculation and chunking policies; and the executor over the same K/V. `batch_cost`:
    the run's rakv.serving.batchcost.ScaledCost (or None)."""
    if options.itl_slo_ms is not None and batch_cost is None:
        raise RakvError("--itl-slo-ms needs the batch cost model")
    load_aware = options.speculation == "load-aware"
    acceptance = Acceptance(options.acceptance, controller, tracker, engine.proposer_type,
                            k_set if load_aware else ())
    admission = Admission(options.strategy, acceptance, engine.proposer_type, controller, k_set if load_aware else (),
                          batch_cost, options.token_budget if options.chunking else 1 << 30,
                          options.proposer_choice == "service")
    kv = KVManager(engine, tuple(options.proposers))
    policy = speculation_policy(options.speculation, batch_cost, acceptance.tracker, k_set)
    budget = SloBudget(batch_cost, options.itl_slo_ms / 1e3) if options.itl_slo_ms is not None else None
    scheduler = Scheduler(kv, admission, options.token_budget, options.max_batch,
                          int(options.kv_budget_mib * (1 << 20)), options.chunking, policy, budget,
                          kv_budget_mib=options.kv_budget_mib)
    return scheduler, Executor(kv)


@dataclass
class Iteration:
    """One engine step's results: the plan, what the executor returned (None: idle), the requests it finished (in
    admission order) and its iterations.jsonl line."""

    step: Step
    output: StepOutput | None = None
    finished: list[ServedRequest] = field(default_factory=list)
    record: IterationRecord | None = None


class StepFailed(RuntimeError):
    """An iteration's shared part (its proposals, the batched forward) raised: no one request to blame, so the
    requests it ran are failed (EngineCore.fail_step); `step` is its plan."""

    def __init__(self, step: Step, cause: BaseException):
        super().__init__(one_line(cause))
        self.step = step


def step_once(scheduler: Scheduler, executor: Executor, start: float, now: float,
              batch_cost: ScaledCost | None) -> Iteration:
    """One engine step, the same for trace replay and the HTTP endpoint: schedule -> execute -> update_from_output
    (`start`: time.perf_counter() when serving began; `now`: seconds since then, the scheduler's clock)."""
    began = time.perf_counter()
    step = scheduler.schedule(now)
    scheduled = time.perf_counter()
    if step.idle:
        return Iteration(step)
    try:
        output = executor.execute(step)
    except Exception as exc:
        raise StepFailed(step, exc) from exc
    ended = time.perf_counter()
    finished = scheduler.update_from_output(step, output, ended - start)
    record = iteration_record(ended - start, step, output, scheduler.running + finished, scheduler.held_bytes,
                              batch_cost, began, scheduled, ended)
    if batch_cost is not None and output.rows:  # the scale learns this iteration only after its prediction
        batch_cost.observe(output.features, output.ks, prefill_context(step), ended - began, output.kinds)
    return Iteration(step, output, finished, record)


@dataclass
class EngineCore:
    """The serving engine, set up once for trace replay (`serve`) and the HTTP endpoint (rakv.serving.http): the
    scheduler with its admission, K/V manager and policies and the executor over the same K/V (`build_scheduler`),
    this run's batch cost model (its scale starts at 1 and follows this run's iterations), the clock both loops read,
    and what a run leaves behind: the records of the requests that left (requests.jsonl as they leave, with `out`)
    and the iterations' lines (iterations.jsonl and summary.json at `finish`)."""

    engine: Engine
    options: ServeOptions
    scheduler: Scheduler
    executor: Executor
    batch_cost: ScaledCost | None
    out: Path | None
    writer: RecordWriter | None
    start: float = field(default_factory=time.perf_counter)
    records: list[RequestRecord] = field(default_factory=list)
    iterations: list[IterationRecord] = field(default_factory=list)

    @classmethod
    def build(cls, engine: Engine, options: ServeOptions, parts: ServeParts | None, out: Path | None) -> EngineCore:
        parts = parts or ServeParts()
        batch_cost = ScaledCost(parts.batch_cost) if parts.batch_cost is not None else None
        scheduler, executor = build_scheduler(engine, options, parts.controller, batch_cost, parts.tracker,
                                              parts.depths)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        writer = RecordWriter(ServedRunLayout(out).requests) if out is not None else None
        return cls(engine, options, scheduler, executor, batch_cost, out, writer)

    def now(self) -> float:
        """Seconds since serving began: the scheduler's clock."""
        return time.perf_counter() - self.start

    @property
    def busy(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def step(self, now: float) -> Iteration:
        """One engine step (`step_once`); its iterations.jsonl line kept when it ran."""
        done = step_once(self.scheduler, self.executor, self.start, now, self.batch_cost)
        if done.record is not None:
            self.iterations.append(done.record)
        return done

    def fail_step(self, failure: StepFailed, now: float) -> list[ServedRequest]:
        """An iteration raised in its shared part: each request it ran fails (its K/V freed), the others go on."""
        step = failure.step
        ran = {r.id: r for r in step.admitted + [w.request for w in step.decodes + step.prefills]}
        failed = [r for r in ran.values() if r.status in (Status.RUNNING, Status.WAITING)]
        for request in failed:
            self.scheduler.fail(request, f"the iteration serving it failed: {failure}", now)
        return failed

    def close(self, request: ServedRequest, text: str) -> RequestRecord:
        """A request left the engine (finished, refused or aborted): its record, on disk before the next step."""
        record = record_of(request, text)
        self.records.append(record)
        if self.writer is not None:
            self.writer.write(record)
        return record

    def stop_writing(self) -> None:
        """requests.jsonl closed (what was written stays: complete lines only)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def finish(self, trace: list[TraceRequest]) -> RunSummary | None:
        """After the last step: requests.jsonl closed, then summary.json and iterations.jsonl (with `out`)."""
        self.stop_writing()
        if self.out is None:
            return None
        return finish_summary(self.engine, trace, self.out, self.options, self.records, self.iterations, self.now())


def serve(engine: Engine, trace: list[TraceRequest], out_dir: str | Path, options: ServeOptions,
          parts: ServeParts | None = None, progress: bool = True) -> RunSummary:
    """Serve a (validated) trace; writes out_dir/requests.jsonl, iterations.jsonl and summary.json; returns the summary.
    `parts`: the controller, acceptance EWMA and batch cost model `options` need (`serve_parts`); none: a fixed
    strategy without the batch cost model."""
    arrivals = Arrivals(engine, trace, options.ignore_eos, options.sampling)  # before requests.jsonl is opened
    core = EngineCore.build(engine, options, parts, Path(out_dir))
    bar = tqdm(total=len(trace), desc="serve", unit="req", disable=not progress, leave=False)

    def close(request: ServedRequest) -> None:
        while request is not None:  # a refused turn refuses its conversation's later turns
            core.close(request, engine.pair.tokenizer.decode(request.state.tokens, skip_special_tokens=True))
            bar.update(1)
            request = arrivals.closed(request)

    core.start = time.perf_counter()  # the clock starts with the loop
    try:
        while arrivals.more or core.busy:
            now = core.now()
            for request in arrivals.due(now):
                close(request) if request.status == Status.REFUSED else core.scheduler.waiting.append(request)
            done = core.step(now)
            for request in done.step.refused + done.step.failed:
                close(request)
            if done.output is None:  # nothing to run yet: wait for the next arrival
                if not core.busy and arrivals.next_s() is not None:
                    time.sleep(max(0.0, arrivals.next_s() - core.now()))
                continue
            for request in done.finished:
                close(request)
    finally:
        bar.close()
        core.stop_writing()
    return core.finish(trace)


def finish_summary(engine: Engine, trace: list[TraceRequest], out: Path, options: ServeOptions,
                   records: list[RequestRecord], iterations: list[IterationRecord], duration: float) -> RunSummary:
    """summary.json (rakv.serving.metrics.RunSummary: the statistics, the equality check, the settings served with)
    and iterations.jsonl."""
    statistics = served_statistics(records, duration, options.slos_ms, iterations)
    equal = ABSENT  # not checked: left out of summary.json
    if options.check_alone:
        served = {r.id: r.token_ids for r in records if r.ok}
        reference = outputs_alone(engine, trace, served, ignore_eos=options.ignore_eos)
        equal = sum(reference[i] == tokens for i, tokens in served.items())
    settings = ServeSettings(strategy=options.strategy, speculation=options.speculation, proposer=engine.proposer,
                             pair=engine.pair.name, token_budget=options.token_budget if options.chunking else None,
                             chunking=options.chunking, max_batch=options.max_batch,
                             kv_budget_mib=options.kv_budget_mib, itl_slo_ms=options.itl_slo_ms,
                             acceptance=options.acceptance,
                             proposers=list(options.proposers) if len(options.proposers) > 1 else ABSENT,
                             proposer_choice=options.proposer_choice if len(options.proposers) > 1 else ABSENT)
    summary = RunSummary(statistics=statistics, outputs_equal_alone=equal, settings=settings,
                         peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    written = ServedRunLayout(out)
    write_iterations(written.iterations, iterations)  # one line per iteration: what ran and how long it took
    written.served_summary.write_text(json.dumps(summary.to_json(), indent=1) + "\n")
    return summary
