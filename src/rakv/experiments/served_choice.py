"""scripts/served_choice.py's measurement: the proposer chosen per request under load against one proposer
per server, on the same traces (docs/heads.md, "Serving").

Each repeat draws one Poisson trace (its own seed) and serves it once per setup, the setups in a shuffled order:
one server per proposer (rakv-asd with that proposer alone: the (reuse, k) chosen per request, as vLLM and SGLang
fix one method per server) and `choice` (rakv-asd choosing (reuse, proposer, k) per request among them,
rakv.serving.server.ServeOptions.proposers). All use the load-aware speculation policy with the EWMA acceptance
(the `prefix` source records rounds whatever proposer ran them, so it does not apply to a choice among several).

A request's end-to-end latency is paired across the setups of its repeat; the goal fixed before the data is the
batch-one one of issue 58: the choice's regret against the best fixed proposer <= 5 % (mean end-to-end latency),
judged on a 95 % interval over the repeats (`mean_ratio`; rakv.experiments.verdicts.below). The best
fixed proposer is the one of least mean latency over these same runs: chosen in hindsight, which can only favour
it. Every greedy output is checked against the first setup's (a proposer never changes a greedy output).
"""

from __future__ import annotations

import math
import random
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rakv.experiments.intervals import geometric_mean_interval
from rakv.experiments.verdicts import below
from rakv.runtime.actions import ADAPTIVE
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.calibration import calibration_for
from rakv.runtime.controller import ControllerConfig
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import optional, read_record
from rakv.runtime.models import load_pair
from rakv.runtime.proposers import parse_proposers
from rakv.runtime.run_layout import ServedRunLayout
from rakv.runtime.workloads import dataset_texts
from rakv.serving.records import read_records
from rakv.serving.server import ServeOptions, serve, serve_parts
from rakv.serving.trace import generate_trace

CHOICE = "choice"
AT_LOAD = "choice-at-load"  # the choice by the predicted service time under load (`--proposer-choice service`)
REGRET_GOAL = 0.05  # issue 58's batch-one goal, kept for serving: regret against the best fixed proposer <= 5 %


@dataclass(frozen=True)
class ServedProposersOptions:
    pair: str = "smollm2"
    proposers: tuple[str, ...] = ("draft", "prompt-lookup", "heads")
    datasets: tuple[str, ...] = ("humaneval", "wikitext2")  # the trace's prompts, drawn from their texts together
    requests: int = 24
    rate: float = 2.0  # requests per second (Poisson)
    new_tokens: int = 32
    prompt_words: int = 48
    max_batch: int = 8
    repeats: int = 5
    seed: int = 0
    at_load: bool = False  # also serve the choice made by the predicted service time (a setup of its own)

    def __post_init__(self):
        if len(parse_proposers(self.proposers)) < 2:
            raise RakvError("--proposers: name at least two proposers to choose among")
        if min(self.requests, self.repeats, self.max_batch, self.new_tokens) < 1 or self.rate <= 0:
            raise RakvError("--requests, --repeats, --max-batch, --new-tokens and --rate must be positive")


@dataclass
class ProposerService:
    """What admission predicted for one proposer's requests against what they measured, summed over a setup's
    requests (requests.jsonl's `served_predicted_s` and `service_s`, `alpha` and `realised_alpha`): whether the
    choice at load prices each proposer as it serves (the means are the sums over `requests`)."""

    requests: int = 0
    predicted_s: float = 0.0  # admission's service prediction (admission to last token, beside its company)
    measured_s: float = 0.0  # the service time measured (admission to last token)
    alpha_priced: float = 0.0  # the acceptance its action was priced with
    alpha_realised: float = 0.0  # the acceptance its rounds realised (over `realised` requests: those with rounds)
    realised: int = 0

    def add(self, record) -> None:
        if record.served_predicted_s is None or record.service_s is None:
            return
        self.requests += 1
        self.predicted_s += record.served_predicted_s
        self.measured_s += record.service_s
        self.alpha_priced += record.alpha or 0.0
        if record.realised_alpha is not None:
            self.realised += 1
            self.alpha_realised += record.realised_alpha

    def text(self, name: str) -> str:
        realised = f"{self.alpha_realised / self.realised:.3f}" if self.realised else "none"
        return (f"{name} {self.measured_s / self.predicted_s:.2f} (alpha priced {self.alpha_priced / self.requests:.3f}"
                f", realised {realised})")


@dataclass
class SetupRuns:
    """One setup's served runs: per repeat, each request's end-to-end latency and the run's output tokens/s."""

    e2el_s: list[dict[str, float]] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    proposer_share: dict[str, int] = field(default_factory=dict)  # requests per proposer (the choice: chosen)
    equal: int = 0  # greedy outputs equal to the first setup's
    total: int = 0
    # per proposer, admission's service prediction against the measured service (reports before it: ABSENT)
    service: dict[str, ProposerService] = optional()


@dataclass
class ChoiceResult:
    """Another choice setup (AT_LOAD) against the same fixed proposers, judged by the same goal."""

    setup: str
    regret: tuple[float, float, float]
    against: dict[str, tuple[float, float, float]]
    verdict: str


@dataclass
class ServedProposersReport:
    options: ServedProposersOptions
    setups: dict[str, SetupRuns]
    best_fixed: str
    regret: tuple[float, float, float]  # mean e2el of the choice / the best fixed's - 1, with its 95 % CI
    against: dict[str, tuple[float, float, float]]  # the same against each fixed proposer
    verdict: str
    others: list[ChoiceResult] = field(default_factory=list)  # the choice at load, when served


def setups(options: ServedProposersOptions) -> dict[str, tuple[str, tuple[str, ...], str]]:
    """Setup name -> (engine proposer, --proposers, --proposer-choice)."""
    fixed = {name: (name, (), "batch-one") for name in options.proposers}
    every = tuple(options.proposers)
    return {**fixed, CHOICE: (every[0], every, "batch-one"),
            **({AT_LOAD: (every[0], every, "service")} if options.at_load else {})}


def trace_of(options: ServedProposersOptions, repeat: int):
    texts = [t for name in options.datasets for t in dataset_texts(name)]
    return generate_trace(texts, requests=options.requests, rate=options.rate, kind="plain",
                          max_new_tokens=options.new_tokens, prompt_words=options.prompt_words,
                          seed=options.seed * 1000 + repeat)


def serve_once(pair, setup: tuple[str, tuple[str, ...], str], trace, max_batch: int):
    """One served run: its records (id -> record) and output tokens/s; an empty store and a controller fresh from
    the calibration each time, as a new server's."""
    proposer, proposers, how = setup
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30), proposer=proposer)
    options = ServeOptions.default(strategy=ADAPTIVE, speculation="load-aware", acceptance="ewma",
                                   proposers=proposers, proposer_choice=how, max_batch=max_batch, ignore_eos=True)
    parts = serve_parts(engine, options, calibration_for, ControllerConfig.default(), progress=False)
    with tempfile.TemporaryDirectory() as out:
        summary = serve(engine, trace, out, options, parts, progress=False)
        records = {r.id: r for r in read_records(ServedRunLayout(Path(out)).requests)}
    return records, summary.statistics.output_throughput


def measure(options: ServedProposersOptions, log=print) -> ServedProposersReport:
    pair = load_pair(options.pair)
    plan = setups(options)
    runs = {name: SetupRuns(service={}) for name in plan}
    warm = trace_of(options, 999)[:4]
    for setup in plan.values():  # warm-up, and every table measured before any timing
        serve_once(pair, setup, warm, options.max_batch)
    rng = random.Random(options.seed)
    for repeat in range(options.repeats):
        trace = trace_of(options, repeat)
        order = list(plan)
        rng.shuffle(order)
        outputs = {}
        for name in order:
            proposer = plan[name][0]
            records, throughput = serve_once(pair, plan[name], trace, options.max_batch)
            if not all(r.ok for r in records.values()):
                raise RakvError(f"{name}: a request was not served ({[r.error for r in records.values() if not r.ok]})")
            outputs[name] = {i: r.token_ids for i, r in records.items()}
            setup = runs[name]
            setup.e2el_s.append({i: r.e2el_s for i, r in records.items()})
            setup.tokens_per_s.append(throughput)
            for r in records.values():
                kind = (r.proposer if isinstance(r.proposer, str) else proposer) if r.k else "k = 0"
                setup.proposer_share[kind] = setup.proposer_share.get(kind, 0) + 1
                setup.service.setdefault(kind, ProposerService()).add(r)
            log(f"repeat {repeat} {name:<14} {throughput:6.1f} tok/s, mean e2el "
                f"{statistics.fmean(setup.e2el_s[-1].values()):.2f} s")
        first = outputs[order[0]]
        for name in plan:
            runs[name].equal += sum(outputs[name][i] == first[i] for i in first)
            runs[name].total += len(first)
    return report_of(options, runs)


def mean_ratio(runs: SetupRuns, other: SetupRuns) -> tuple[float, float, float]:
    """Mean e2el of `runs` over `other`'s on the same requests, minus 1, with a 95 % interval whose units are the
    repeats: each repeat's paired ratio carries its trace and the machine's speed during it (a shift that moves
    every request of a run together, which an interval over requests would leave out); the geometric mean of the
    repeats' ratios with its t interval (rakv.experiments.intervals)."""
    logs = [math.log(sum(a[i] for i in a) / sum(b[i] for i in a)) for a, b in zip(runs.e2el_s, other.e2el_s)]
    value, low, high = geometric_mean_interval(logs)
    return value - 1.0, low - 1.0, high - 1.0


def report_of(options: ServedProposersOptions, runs: dict[str, SetupRuns]) -> ServedProposersReport:
    fixed = [name for name in runs if name not in (CHOICE, AT_LOAD)]
    mean = {name: statistics.fmean(v for run in runs[name].e2el_s for v in run.values()) for name in fixed}
    best = min(fixed, key=mean.get)

    def judged(setup: str) -> ChoiceResult:
        against = {name: mean_ratio(runs[setup], runs[name]) for name in fixed}
        return ChoiceResult(setup, against[best], against, str(below(against[best], REGRET_GOAL)))

    first = judged(CHOICE)
    others = [judged(AT_LOAD)] if AT_LOAD in runs else []
    return ServedProposersReport(options, runs, best, first.regret, first.against, first.verdict, others)


def read_report(path: Path) -> ServedProposersReport:
    """A report scripts/served_choice.py --out wrote (a one-line error when it is not one)."""
    return read_record(ServedProposersReport, Path(path), when_missing=f"no served-choice report at {path}")


def report_text(report: ServedProposersReport) -> str:
    o = report.options
    lines = [f"{o.pair}: {o.requests} requests per trace at {o.rate:g}/s (Poisson; {'+'.join(o.datasets)}, "
             f"{o.new_tokens} new tokens each), max batch {o.max_batch}, {o.repeats} repeats; rakv-asd with the "
             "load-aware policy and the EWMA acceptance in every setup",
             f"{'setup':<14} {'tok/s (median)':>15} {'mean e2el s':>12} {'equal':>9}  requests by proposer"]
    for name, runs in report.setups.items():
        latencies = [v for run in runs.e2el_s for v in run.values()]
        shares = ", ".join(f"{k} {v}" for k, v in sorted(runs.proposer_share.items()))
        lines.append(f"{name:<14} {statistics.median(runs.tokens_per_s):>15.1f} {statistics.fmean(latencies):>12.3f} "
                     f"{runs.equal:>4}/{runs.total:<4}  {shares}")
    for name, runs in report.setups.items():
        if runs.service:
            lines.append(f"{name:<14} service measured / predicted at admission: "
                         + "; ".join(s.text(k) for k, s in sorted(runs.service.items()) if s.requests))
    for name, (value, low, high) in report.against.items():
        lines.append(f"choice vs {name:<14} mean e2el {value:+.1%} [{low:+.1%}, {high:+.1%}]")
    value, low, high = report.regret
    lines.append(f"goal: regret vs the best fixed proposer ({report.best_fixed}, chosen in hindsight) <= "
                 f"{REGRET_GOAL:.0%}: {value:+.1%} [{low:+.1%}, {high:+.1%}] -> {report.verdict}")
    for other in report.others:
        lines += [f"{other.setup} vs {name:<14} mean e2el {v:+.1%} [{lo:+.1%}, {hi:+.1%}]"
                  for name, (v, lo, hi) in other.against.items()]
        value, low, high = other.regret
        lines.append(f"goal, {other.setup}: regret vs {report.best_fixed} <= {REGRET_GOAL:.0%}: {value:+.1%} "
                     f"[{low:+.1%}, {high:+.1%}] -> {other.verdict}")
    return "\n".join(lines)
