"""The vLLM peer's numbers as they are shipped (data/reference/peer/, scripts/ship_peer.sh) and shown: the statistics
over repeats that scripts/bench_vllm_serve.py and scripts/bench_serving.py store beside their runs, and the markdown
tables of docs/peers.md, rendered from the shipped files only (scripts/peer_tables.py rewrites the blocks between
`<!-- peer-table: NAME -->` and `<!-- /peer-table: NAME -->`; tests/test_peer_tables.py checks they are current).
The paper's "Against vLLM" paragraph (rakv.experiments.prose_serving.peer_section) reads the same statistics.

Intervals: a metric over repeats is the mean with its Student t interval (rakv.experiments.intervals.t_interval); a
comparison of rakv with vLLM is the ratio rakv / vLLM, per repeat (the same prompts and arrivals in both), as the
geometric mean of the repeats' ratios with the t interval of their logs, exponentiated.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from rakv.bench.peer_reports import (
    RAKV,
    RATIO_METRICS,
    SERVE_METRICS,
    Agreement,
    ConcurrencyRow,
    EngineSetting,
    PairedRatios,
    RepeatRecord,
    ServingBenchReport,
    TuneReport,
    VllmServeSummary,
    WorkloadAggregate,
    read_serve_summary,
    read_serving_report,
    read_tune,
)
from rakv.experiments.intervals import geometric_mean_interval, t_interval
from rakv.runtime.actions import AR
from rakv.runtime.json_records import CI
from rakv.runtime.run_layout import PeerLayout

RATIO_DEFINITION = ("rakv / vLLM per repeat (same prompts and arrivals); the geometric mean over repeats with the t "
                    "interval of the logs")
BLOCK = re.compile(r"(<!-- peer-table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /peer-table: (?P=name) -->)", re.S)


def finite(triple) -> CI:
    """A CI with NaN as None (JSON has no NaN)."""
    return CI(*(x if x is not None and math.isfinite(x) else None for x in triple))


def log_ratio_interval(ours, theirs) -> CI:
    """The geometric mean of ours_i / theirs_i over repeats i and its CI (t interval of the logs)."""
    logs = [math.log(a / b) for a, b in zip(ours, theirs) if a and b and a > 0 and b > 0]
    return finite(geometric_mean_interval(logs))


def serve_aggregates(repeats: list[RepeatRecord]) -> dict[str, dict[str, WorkloadAggregate]]:
    """Per engine setting and workload, over the repeats: each metric's mean and t interval, and the requests
    completed and failed (summed)."""
    out: dict[str, dict[str, WorkloadAggregate]] = {}
    for key, workloads in repeats[0].engines.items():
        out[key] = {}
        for label in workloads:
            runs = [r.engines[key][label] for r in repeats]
            out[key][label] = WorkloadAggregate(
                **{m.field: finite(t_interval([run.metric(m) for run in runs])) for m in SERVE_METRICS},
                completed=sum(run.completed for run in runs), failed=sum(run.failed for run in runs),
                repeats=len(runs))
    return out


def serve_paired(repeats: list[RepeatRecord], ours: str = RAKV) -> dict[str, dict[str, PairedRatios]]:
    """rakv / each vLLM setting per workload and metric (RATIO_DEFINITION)."""
    out: dict[str, dict[str, PairedRatios]] = {}
    for key, workloads in repeats[0].engines.items():
        if key == ours:
            continue
        out[key] = {label: PairedRatios(**{m.field: log_ratio_interval(
            [r.engines[ours][label].metric(m) for r in repeats], [r.engines[key][label].metric(m) for r in repeats])
            for m in RATIO_METRICS}) for label in workloads}
    return out


@dataclass(frozen=True)
class RowStatistics:
    """bench_serving.py's statistics of one concurrency row from its per-repeat tok/s (`*_tok_s_runs`): each
    engine's mean and t interval (None where it did not run), and ours / vLLM's (repeat i of ours against repeat i
    of vLLM's)."""

    ours_tok_s_ci: CI | None
    sequential_tok_s_ci: CI | None
    transformers_tok_s_ci: CI | None
    vllm_tok_s_ci: CI | None
    ours_over_vllm_ci: CI | None


def row_statistics(row: ConcurrencyRow) -> RowStatistics:
    def ci(runs) -> CI | None:
        return finite(t_interval(runs)) if runs else None

    return RowStatistics(ci(row.ours_tok_s_runs), ci(row.sequential_tok_s_runs), ci(row.transformers_tok_s_runs),
                         ci(row.vllm_tok_s_runs), log_ratio_interval(row.ours_tok_s_runs, row.vllm_tok_s_runs)
                         if row.vllm_tok_s_runs else None)


class RatioSide(enum.StrEnum):
    """Where a paired ratio's CI lies against 1 for rakv (each member names its list in `Sides`)."""
    BETTER = "better"
    WORSE = "worse"
    UNRESOLVED = "unresolved"  # across 1
    MISSING = "missing"  # no interval


def ratio_side(triple, lower_is_better: bool) -> RatioSide:
    """Where a ratio's CI lies against 1, in rakv's favour, against it or across 1; missing without an interval."""
    value, low, high = triple
    if value is None or low is None:
        return RatioSide.MISSING
    if high < 1 or low > 1:
        return RatioSide.BETTER if (high < 1) == lower_is_better else RatioSide.WORSE
    return RatioSide.UNRESOLVED


@dataclass(frozen=True)
class Sides:
    """The metrics whose paired ratio's CI says rakv is better, worse, neither, or has no interval."""

    better: list[str] = field(default_factory=list)
    worse: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def serve_reading(serve: VllmServeSummary) -> dict[tuple[str, str], Sides]:
    """Per (workload, vLLM setting): the metrics whose paired ratio's CI says rakv is better, worse, or neither."""
    out = {}
    for key, workloads in serve.paired.items():
        for label, ratios in workloads.items():
            sides = Sides()
            for m in RATIO_METRICS:
                getattr(sides, ratio_side(ratios.metric(m), lower_is_better=m.is_latency)).append(m.label)
            out[(label, key)] = sides
    return out


def serve_sentences(serve: VllmServeSummary) -> list[str]:
    """The paired ratios in words, one sentence per workload and vLLM setting; no side presupposed."""
    sentences = []
    for (label, key), sides in serve_reading(serve).items():
        parts = [f"rakv better on {', '.join(sides.better)}" if sides.better else "rakv better on none",
                 f"worse on {', '.join(sides.worse)}" if sides.worse else "worse on none"]
        if sides.unresolved:
            parts.append(f"the CI spans 1 on {', '.join(sides.unresolved)}")
        sentences.append(f"{workload_name(label, serve.workloads[label])} against "
                         f"{setting_name(serve, key)}: " + "; ".join(parts) + ".")
    return sentences


@dataclass(frozen=True)
class BatchFile:
    """A shipped bench_serving.py --out file: its name and its report (which carries the options it ran with)."""

    file: str
    report: ServingBenchReport

    @property
    def vllm_threads(self) -> int:
        return self.report.args.vllm_threads or 0

    @property
    def vllm_ngram(self) -> int:
        return self.report.args.vllm_ngram or 0


@dataclass(frozen=True)
class SpeculationPair:
    """At one c: rakv's prompt lookup / rakv's AR and vLLM's n-gram / vLLM's AR, at n-gram depth k."""

    k: int
    c: int
    rakv: float
    vllm: float


def speculation_pairs(files: list[BatchFile]) -> list[SpeculationPair]:
    """Each n-gram file's rows beside the AR file's at the same c and vLLM threads: rakv's prompt lookup / rakv's AR and
    vLLM's n-gram / vLLM's AR (medians of separate runs, minutes apart)."""
    ar = {f.vllm_threads: f for f in files if not f.vllm_ngram}
    out = []
    for f in (f for f in files if f.vllm_ngram):
        base = ar.get(f.vllm_threads)
        rows = base.report.by_concurrency() if base else {}
        for r in f.report.rows:
            if r.concurrency in rows and r.has_vllm:
                b = rows[r.concurrency]
                out.append(SpeculationPair(f.vllm_ngram, r.concurrency, r.ours_tok_s / b.ours_tok_s,
                                           r.vllm_tok_s / b.vllm_tok_s))
    return out


def speculation_sentence(files: list[BatchFile]) -> str:
    pairs = speculation_pairs(files)
    if not pairs:
        return ""
    return ("Speculating against not, at the same c (medians of separate runs, minutes apart): " + "; ".join(
        f"k = {p.k}, c = {p.c}: rakv prompt lookup / rakv AR {p.rakv:.2f}, vLLM n-gram / vLLM AR "
        f"{p.vllm:.2f}" for p in pairs) + ". A ratio above 1: speculating served more tokens per second.")


# ---------------------------------------------------------------------------------------------
# reading the shipped files


def batch_reports(folder: Path) -> list[BatchFile]:
    """bench_serving.py's --out files under folder/bench_serving/ that carry vLLM rows, in a fixed order (AR before
    n-gram speculation, vLLM's default threads before a set count)."""
    files = [BatchFile(p.name, read_serving_report(p))
             for p in sorted(PeerLayout(Path(folder)).bench_serving_dir.glob("*.json"))]
    files = [f for f in files if any(r.has_vllm for r in f.report.rows)]
    return sorted(files, key=lambda f: (f.vllm_ngram, f.vllm_threads, f.file))


def threads_words(threads) -> str:
    return f"{threads} threads" if threads else "default threads"


def setting_name(serve: VllmServeSummary, key: str) -> str:
    """An engine setting of bench_vllm_serve's result as shown: 'rakv serve', 'vLLM 0.32.0 (default threads)'."""
    setting: EngineSetting = serve.settings[key]
    if setting.is_rakv:
        return "rakv serve"
    return f"vLLM {serve.vllm} ({threads_words(setting.threads)})"


def workload_name(label: str, rate) -> str:
    return f"{label.rsplit('-', 1)[0]}, {rate:g}/s"


# ---------------------------------------------------------------------------------------------
# tune_vllm's check: how far apart the same configuration lands when served twice


def k_of(table: list[list[int]], b: int) -> int:
    return next(k for start, end, k in table if start <= b <= end)


@dataclass(frozen=True)
class SameConfiguration:
    """At c, the tuned schedule runs the k of a fixed column: their relative gap is the check's noise."""

    c: int
    k: int
    gap: float


class AgainstNoise(enum.StrEnum):
    """Where a difference lies against the check's own run-to-run noise (`tune_reading`)."""
    WITHIN = "within"
    ABOVE = "above"
    BELOW = "below"
    MISSING = "missing"  # no noise measured


@dataclass(frozen=True)
class AgainstNone:
    """At c, tuned / k=0 - 1, and where it lies against the noise."""

    c: int
    k: int
    diff: float
    side: AgainstNoise


@dataclass(frozen=True)
class TuneReading:
    same: list[SameConfiguration]
    noise: float | None  # the largest |gap|
    against_k0: list[AgainstNone]
    concurrency: list[int]


def tune_reading(tune: TuneReport) -> TuneReading:
    """tune_vllm.py's check read against its own noise. Where the tuned schedule runs the same k at c as a fixed-k
    column, the two are one configuration served by two engines: their relative gaps are the run-to-run noise of the
    check (`noise`: the largest). Against k = 0 at each c: the relative difference tuned / k=0 - 1 and whether it is
    within that noise ('within'), above or below it."""
    rate = tune.rates()
    cs = sorted({r.c for r in tune.check})
    same = [SameConfiguration(c, k_of(tune.schedule, c), rate[("tuned", c)] / rate[(f"k={k_of(tune.schedule, c)}", c)]
                              - 1) for c in cs if (f"k={k_of(tune.schedule, c)}", c) in rate]
    noise = max((abs(s.gap) for s in same), default=None)
    against = []
    for c in cs:
        diff = rate[("tuned", c)] / rate[("k=0", c)] - 1
        side = (AgainstNoise.MISSING if noise is None else AgainstNoise.WITHIN if abs(diff) <= noise
                else AgainstNoise.ABOVE if diff > 0 else AgainstNoise.BELOW)
        against.append(AgainstNone(c, k_of(tune.schedule, c), diff, side))
    return TuneReading(same, noise, against, cs)


# ---------------------------------------------------------------------------------------------
# markdown


def ci_cell(triple, digits: int, percent: bool = False) -> str:
    """mean ± half-width (a t interval is symmetric), or the mean alone without an interval."""
    value, low, high = triple
    if value is None:
        return "-"
    scale, unit = (100, " %") if percent else (1, "")
    if low is None:
        return f"{scale * value:.{digits}f}{unit}"
    return f"{scale * value:.{digits}f} ± {scale * (high - low) / 2:.{digits}f}{unit}"


def ratio_cell(triple) -> str:
    value, low, high = triple
    if value is None:
        return "-"
    return f"{value:.2f}" if low is None else f"{value:.2f} [{low:.2f}, {high:.2f}]"


def serve_markdown(serve: VllmServeSummary) -> str:
    """bench_vllm_serve's table: each metric's mean ± the half-width of its 95 % t interval over the repeats."""
    lines = [f"{len(serve.repeats)} repeats, mean ± the half-width of the 95 % t interval over them; times in ms; "
             "hits: prompt tokens reused; done / failed: requests over all repeats.", "",
             "| workload | engine | done | failed | " + " | ".join(m.label for m in SERVE_METRICS) + " |",
             "|---|---|---|---|" + "---|" * len(SERVE_METRICS)]
    for label, rate in serve.workloads.items():
        for i, key in enumerate(serve.settings):
            a = serve.aggregate[key][label]
            cells = [ci_cell(a.metric(m), m.digits, percent=m.field == "prefix_hit_rate") for m in SERVE_METRICS]
            lines.append(f"| {workload_name(label, rate) if i == 0 else ''} | {setting_name(serve, key)} | "
                         f"{a.completed} | {a.failed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def repeat_agreements(repeat: RepeatRecord) -> list[Agreement]:
    """One bench_vllm_serve repeat's output agreements: rakv against each vLLM setting, on each workload."""
    return [a for setting in repeat.agreement.values() for a in setting.values()]


def paired_markdown(serve: VllmServeSummary) -> str:
    """rakv / vLLM per metric (RATIO_DEFINITION), with its 95 % CI; below 1: rakv's latency is lower."""
    metrics = [m for m in SERVE_METRICS if m in RATIO_METRICS]
    lines = [f"{RATIO_DEFINITION} [95 % CI]; a latency ratio below 1: rakv's is lower.", "",
             "| workload | against | " + " | ".join(m.label for m in metrics) + " |",
             "|---|---|" + "---|" * len(metrics)]
    for label, rate in serve.workloads.items():
        for i, key in enumerate(serve.paired):
            cells = [ratio_cell(serve.paired[key][label].metric(m)) for m in metrics]
            lines.append(f"| {workload_name(label, rate) if i == 0 else ''} | {setting_name(serve, key)} | "
                         + " | ".join(cells) + " |")
    agreed = [(sum(a.equal for a in repeat_agreements(r)), sum(a.requests for a in repeat_agreements(r)))
              for r in serve.repeats]
    lost = sum(a.failed for r in serve.repeats for a in repeat_agreements(r))
    lines += ["", "Outputs equal token for token (rakv against each vLLM setting, all workloads, the requests both "
              "completed), per repeat: " + ", ".join(f"{e} of {n}" for e, n in agreed)
              + (f"; comparisons left out because one engine failed the request: {lost}" if lost else "") + ".", "",
              "Read from the ratios' CIs (better: rakv's latency lower, or its tok/s higher):", ""]
    lines += [f"- {sentence}" for sentence in serve_sentences(serve)]
    return "\n".join(lines) + "\n"


def batch_markdown(files: list[BatchFile]) -> str:
    """bench_serving.py --peer vllm's rows: tok/s as mean ± the t interval's half-width over repeats, ours / vLLM
    with its CI."""
    lines = ["| file | rakv strategy | vLLM | c | rakv serve tok/s | vLLM tok/s | rakv / vLLM [95 % CI] | "
             "outputs equal |", "|---|---|---|---|---|---|---|---|"]
    for f in files:
        report, a = f.report, f.report.args
        vllm = f"{report.vllm}, {threads_words(a.vllm_threads)}" + (
            f", n-gram k = {a.vllm_ngram}" if a.vllm_ngram else "") + (", eager" if a.vllm_eager else "")
        for r in (r for r in report.rows if r.has_vllm):
            stats = row_statistics(r)
            strategy = report.strategy + (f" ({report.proposer})" if report.strategy != AR and report.proposer
                                          else "")
            lines.append(f"| `{f.file}` | {strategy} | {vllm} | {r.concurrency} | "
                         f"{ci_cell(stats.ours_tok_s_ci, 1)} | {ci_cell(stats.vllm_tok_s_ci, 1)} | "
                         f"{ratio_cell(stats.ours_over_vllm_ci)} | {r.vllm_equal} of {report.requests} |")
    repeats = sorted({f.report.args.repeats for f in files})
    return ("\n".join(lines) + f"\n\n{' / '.join(map(str, repeats))} repeats per row (after a warm-up); the ratio is "
            "the geometric mean of repeat i of rakv over repeat i of vLLM, with the t interval of the logs (the two "
            "engines' repeats run minutes apart, vLLM's first).\n") + (f"\n{speculation_sentence(files)}\n"
                                                                     if speculation_pairs(files) else "")


def tune_markdown(tune: TuneReport) -> str:
    reading = tune_reading(tune)
    configs = sorted({r.config for r in tune.check}, key=lambda c: (c == "tuned", c == "hand-set", c))
    rate = tune.rates()
    model = tune.model
    lines = [f"vLLM {tune.vllm}: step = {1e3 * model.fixed_s:.2f} ms + {1e3 * model.per_request_s:.2f} ms "
             f"x requests + {1e3 * model.per_row_s:.2f} ms x rows (NNLS over {len(tune.steps)} measured (b, k) "
             f"points); acceptance {tune.alpha:.3f}, n-gram match rate {tune.match_rate:.3f}; the schedule "
             f"(batch_start, batch_end, k): {tune.schedule}; hand-set: {tune.hand}. Output tok/s, batches of c "
             "requests:", "", "| c | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    lines += [f"| {c} | " + " | ".join(f"{rate[(name, c)]:.1f}" for name in configs) + " |"
              for c in reading.concurrency]
    return "\n".join(lines) + "\n\n" + tune_sentence(reading) + "\n"


def percent(x: float) -> str:
    return f"{100 * x:+.1f} %"


def tune_sentence(reading: TuneReading) -> str:
    """The check read against its noise, in words that follow the numbers (no side presupposed)."""
    if reading.noise is None:
        return "No column runs the tuned schedule's k alone, so the check has no measure of its own noise."
    same = ", ".join(f"{percent(s.gap)} at c = {s.c} (k = {s.k})" for s in reading.same)
    words = {AgainstNoise.WITHIN: "within that noise", AgainstNoise.ABOVE: "above k = 0 by more than that noise",
             AgainstNoise.BELOW: "below k = 0 by more than that noise"}
    parts = [f"{percent(a.diff)} at c = {a.c} ({words[a.side]}"
             + ("; the schedule runs k = 0 there, the same configuration" if a.k == 0 else "") + ")"
             for a in reading.against_k0]
    return (f"Where the schedule runs the same k as a fixed column, the two are one configuration served by two "
            f"engines: tuned / fixed - 1 = {same}, so this check's run-to-run noise reaches "
            f"{100 * reading.noise:.1f} %. Against k = 0 the tuned schedule is " + "; ".join(parts) + ".")


def render_blocks(folder: Path) -> dict[str, str]:
    """docs/peers.md's generated blocks from the shipped files under `folder` (data/reference/peer/)."""
    peer = PeerLayout(Path(folder))
    serve = read_serve_summary(peer.vllm_serve_summary)
    blocks = {"bench_vllm_serve": serve_markdown(serve), "bench_vllm_serve-ratios": paired_markdown(serve)}
    files = batch_reports(peer.root)
    if files:
        blocks["bench_serving"] = batch_markdown(files)
    if peer.tune.exists():
        blocks["tune_vllm"] = tune_markdown(read_tune(peer.tune))
    return blocks


def doc_blocks(text: str) -> dict[str, str]:
    """The generated blocks of a document, by name."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def refresh(text: str, blocks: dict[str, str]) -> str:
    """`text` with each of its blocks replaced by the rendered one; a block without a rendering is an error."""
    missing = set(doc_blocks(text)) - set(blocks)
    if missing:
        raise ValueError(f"no shipped data renders the block(s) {', '.join(sorted(missing))}")
    return BLOCK.sub(lambda m: m[1] + blocks[m["name"]] + m[4], text)
