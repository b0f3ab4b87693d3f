"""Two results folders side by side (scripts/compare_runs.py; the paper's "Across runs and machines").

For every headline statistic that carries a confidence interval in both runs' summary.json: whether the two runs'
estimates differ significantly (rakv.experiments.replication.differences: both runs' uncertainty, Holm over the
statistics), whether they draw the same conclusion from it (the side of 0 each one's interval lies on), and, for
reference, whether B's value lies inside A's interval (`agreement`); statistics without an interval with their
relative difference; and the machine each study ran on (its study/metadata.json: processor, ISA, the kernels'
compile target, cores, caches), so that a comparison says "other machine" when it is one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, is_dataclass
from pathlib import Path

from rakv.experiments.metadata import Hardware, run_metadata_if_any
from rakv.experiments.replication import (
    degrees_of_freedom,
    differences,
    held_out_coverage,
    inside_rate_expected,
    pool_runs,
)
from rakv.experiments.summary import ClaimAcrossRuns, PooledStatistic, Replication, Summary
from rakv.experiments.verdicts import ClaimVerdict, ci_side
from rakv.runtime.actions import ADAPTIVE, JOINT_K4, KV_ONLY
from rakv.runtime.json_records import CI, record_items
from rakv.runtime.paths import shown as shown_path
from rakv.runtime.run_layout import RunLayout


def sections(summary: Summary) -> list[tuple[str, object]]:
    """Where the summary keeps its statistics: per configuration, and pooled over configurations."""
    return [("per_configuration", summary.per_configuration), ("pooled", summary.pooled)]


def walk(node, prefix=""):
    """(dotted name, value) for every leaf under `node` (a record or a map of records, named as in summary.json):
    a [value, low, high] triple counts as one leaf."""
    if is_dataclass(node):
        yield from walk(dict(record_items(node)), prefix)
    elif isinstance(node, dict):
        for key, child in node.items():
            yield from walk(child, f"{prefix}.{key}" if prefix else key)
    elif isinstance(node, CI):
        yield prefix, node
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield prefix, node


def with_intervals(summary: Summary) -> dict[str, list[float]]:
    """name -> [value, low, high] for every statistic reported with a confidence interval."""
    return {name: value for section, node in sections(summary) for name, value in walk(node, section)
            if isinstance(value, CI) and None not in value}


def scalars(summary: Summary) -> dict[str, float]:
    """name -> value for every statistic reported without an interval."""
    return {name: value for section, node in sections(summary) for name, value in walk(node, section)
            if not isinstance(value, CI)}


def compare(a: Summary, b: Summary) -> tuple[list[str], Agreement]:
    """The side-by-side lines (every statistic with an interval: both CIs, B - A, Holm's p of the difference test,
    and whether B lies inside A's CI; then those without an interval, with their relative difference) and the
    runs' `Agreement`."""
    a_ci, b_ci = with_intervals(a), with_intervals(b)
    width = max([34, *(len(n) for n in a_ci), *(len(n) for n in scalars(a))])
    lines = [f"{'statistic':<{width}} {'A [95% CI]':>28} {'B [95% CI]':>28} {'B - A':>8} {'p (Holm)':>9}  "
             "B in A's CI"]
    tested = {d.name: d for d in differences(a_ci, b_ci, degrees_of_freedom(a))}
    for name, (value, low, high) in a_ci.items():
        if name not in b_ci:
            lines.append(f"{name:<{width}} {'':>28} {'missing':>28}")
            continue
        d = tested.get(name)
        other = b_ci[name]
        test = f"{d.difference:>+8.4f} {d.p_holm:>9.3f}{' *' if d.significant else '  '}" if d else f"{'':>20}"
        lines.append(f"{name:<{width}} {value:>9.4f} [{low:>7.4f}, {high:>7.4f}] {_ci(other)} {test}"
                     f"{'yes' if d and d.inside else 'no'}")
    lines.append(f"{'statistic (no interval)':<{width}} {'A':>28} {'B':>28}  relative difference")
    b_scalars = scalars(b)
    for name, x in scalars(a).items():
        y = b_scalars.get(name)
        if y is None:
            continue
        relative = (y - x) / abs(x) if x else float("nan")
        lines.append(f"{name:<{width}} {x:>28.4f} {y:>28.4f}  {relative:+.1%}")
    return lines, agreement(a, b)


def _ci(triple) -> str:
    value, low, high = triple
    if value is None:
        return f"{'missing':>28}"
    if low is None or high is None:
        return f"{value:>9.4f} {'':>18}"
    return f"{value:>9.4f} [{low:>7.4f}, {high:>7.4f}]"


def hardware(folder: Path) -> Hardware | None:
    """What a results folder's study ran on (None without its metadata.json): processor, ISA, the kernels' compile
    target, cores, caches, device, threads, dtype (a record written before a field existed lacks it)."""
    meta = run_metadata_if_any(RunLayout.of(folder))
    return meta.hardware if meta else None


def same_machine(a: Hardware, b: Hardware) -> bool:
    """The same machine class: every field both records carry is equal (an older record lacks the newer fields)."""
    return all(x == y for x, y in zip(a.machine_class(), b.machine_class()) if x is not None and y is not None)


def described(machine: Hardware | None) -> str:
    if machine is None:
        return "hardware not recorded"
    extra = "".join(f", {value}" for value in (machine.isa, machine.kernels_march) if value)
    cores = f", {machine.cores} cores" if machine.cores else ""
    caches = f", caches {machine.caches}" if machine.caches else ""
    return (f"{machine.processor} ({machine.device}{extra}{cores}, {machine.threads or 'GPU'} threads"
            f"{caches}, {machine.dtype})")


@dataclass(frozen=True)
class Agreement:
    """How far run B reproduces run A, over the `total` statistics with an interval in both: `significant` names
    those whose difference is significant (Welch's t on each statistic's scale, Holm-adjusted over all of them at
    5 %: the test, rakv.experiments.replication.differences); `same_conclusion` draw the same conclusion (both
    intervals above 0, both below, or both straddling it) and `flipped` names the rest; `inside` have B's value in
    A's 95 % CI and `outside` names the rest, shown beside `expected_inside`, the share an exact replication puts
    inside (about 0.86 at 8 prompts: "outside" is no evidence of a difference)."""
    total: int
    inside: int
    same_conclusion: int
    outside: list[str]
    flipped: list[str]
    significant: list[str]
    expected_inside: float


def agreement(a: Summary, b: Summary) -> Agreement:
    a_ci, b_ci = with_intervals(a), with_intervals(b)
    names = [n for n in a_ci if n in b_ci and b_ci[n][0] is not None]
    outside = [n for n in names if not a_ci[n][1] <= b_ci[n][0] <= a_ci[n][2]]
    flipped = [n for n in names if ci_side(a_ci[n], 0.0) != ci_side(b_ci[n], 0.0)]
    df = degrees_of_freedom(a)
    significant = [d.name for d in differences(a_ci, b_ci, df) if d.significant]
    return Agreement(len(names), len(names) - len(outside), len(names) - len(flipped), outside, flipped,
                     significant, inside_rate_expected(df))


DECISION_KEY = ["configuration", "prompt_id", "scenario", "repeat"]


def controller_decisions(folder: Path):
    """The controller's study runs of a results folder, indexed by DECISION_KEY: action and tie set (None without
    the raw table)."""
    import pandas as pd

    from rakv.experiments.calibrations import tables_by_configuration, with_tie_sets

    path = RunLayout.of(folder).study.runs
    if not path.exists():
        return None  # a summary shipped without its raw tables
    runs = pd.read_parquet(path)
    runs = with_tie_sets(runs, tables_by_configuration(runs, Path(folder)))
    return runs[runs.strategy == ADAPTIVE].set_index(DECISION_KEY)[["action", "tie_set"]]


def decision_agreement(a: Path, b: Path, tied: bool = False) -> dict[str, float]:
    """Per configuration, the share of the controller's study runs (the same prompt, scenario and repeat in both
    runs) in which the two runs chose the same action (`tied`: one run's choice lies in the other's tie set, i.e. the
    two choices lie within the cost model's noise of each other in at least one run's eyes; runs without a tie set
    are left out). Each run calibrates its own cost tables, so near-ties can fall either way."""
    import pandas as pd

    decisions = [controller_decisions(folder) for folder in (a, b)]
    if any(d is None for d in decisions):
        return {}
    both = decisions[0].merge(decisions[1], left_index=True, right_index=True, suffixes=("_a", "_b"))
    if tied:
        both = both.dropna(subset=["tie_set_a", "tie_set_b"])  # no tie set (no predictions recorded): not judged
        same = pd.Series([b in json.loads(x) or a in json.loads(y) for a, b, x, y in
                          zip(both.action_a, both.action_b, both.tie_set_a, both.tie_set_b)], index=both.index,
                         dtype=bool)
    else:
        same = both.action_a == both.action_b
    return {str(name): float(part.mean()) for name, part in same.groupby(level="configuration")}


# ---------------------------------------------------------------------------------------------
# The shipped runs of one commit on one machine class, together (Summary.replication)

# a claim with an interval -> its statistic under per_configuration.<configuration>. in summary.json
CLAIM_STATISTICS = {
    "latency_reduction_vs_joint_k4": f"latency_reduction.{JOINT_K4}",
    "throughput_gain_vs_joint_k4": f"throughput_gain.{JOINT_K4}",
    "latency_reduction_vs_kv_only": f"latency_reduction.{KV_ONLY}",
    "throughput_gain_vs_kv_only": f"throughput_gain.{KV_ONLY}",
    "accuracy_k": "accuracy_k", "accuracy_action": "accuracy_action", "mape": "mape", "spearman": "spearman",
    "mean_regret": "mean_regret", "spec_regime": "spec_slowdown.pooled",
}


def commit_of(folder: Path) -> str | None:
    meta = run_metadata_if_any(RunLayout.of(folder))
    return meta.git_commit if meta else None


def sibling_runs(results: Path) -> list[Path]:
    """The other shipped runs of this run's commit and machine class: folders beside it named <name>-rerun*, with a
    summary.json, the same study commit and the same hardware class."""
    results = Path(results)
    mine = hardware(results), commit_of(results)
    out = []
    for rerun in RunLayout.of(results).reruns():
        folder = rerun.root
        if not rerun.summary.exists() or commit_of(folder) != mine[1] or mine[1] is None:
            continue
        theirs = hardware(folder)
        if None not in (mine[0], theirs) and same_machine(mine[0], theirs):
            out.append(folder)
    return out


def pooled_claims(summaries: list[Summary], pooled: dict[str, PooledStatistic]):
    """The claims judged on the pooled estimates (rows with a CI; the others as this run has them) and every claim's
    verdicts run by run."""
    from rakv.experiments.claims import claim_row

    rows, across = [], []
    for row in summaries[0].claims:
        statistic = CLAIM_STATISTICS.get(row.key)
        stat = pooled.get(f"per_configuration.{row.configuration}.{statistic}") if statistic else None
        rows.append(claim_row(row.key, row.configuration, stat.pooled) if stat else row)
        same = [next((r for r in s.claims if (r.key, r.configuration) == (row.key, row.configuration)), None)
                for s in summaries]
        direction = [r.direction if r else ClaimVerdict.MISSING for r in same]  # a run without the claim
        magnitude = [r.magnitude if r else ClaimVerdict.MISSING for r in same]
        held = all(d == rows[-1].direction for d in direction) and all(m == rows[-1].magnitude for m in magnitude)
        across.append(ClaimAcrossRuns(row.key, row.configuration, direction, magnitude, rows[-1].direction,
                                      rows[-1].magnitude, held))
    return rows, across


def replication_summary(results: Path, summary: Summary) -> Replication | None:
    """`summary` (this run's, under `results`) with its siblings (`sibling_runs`); None without any."""
    from rakv.experiments.summary import read_summary

    siblings = sibling_runs(results)
    if not siblings:
        return None
    summaries = [summary, *(read_summary(f) for f in siblings)]
    df = degrees_of_freedom(summary)
    cis = [with_intervals(s) for s in summaries]
    tested = [(f, differences(cis[0], other, df)) for f, other in zip(siblings, cis[1:])]  # Holm within each pair
    significant = [f"{f.name}: {d.name}" for f, found in tested for d in found if d.significant]
    pooled = pool_runs(cis, df)
    claims, across = pooled_claims(summaries, pooled)
    coverage = held_out_coverage(cis, df)
    return Replication(
        runs=[shown_path(results), *(shown_path(f) for f in siblings)], tests=sum(len(found) for _, found in tested),
        significant=significant, statistics=list(pooled.values()), claims=claims, claim_runs=across,
        coverage_inside=coverage.inside, coverage_total=coverage.total, coverage_expected=coverage.expected,
        decisions_same=decision_agreement(results, siblings[0]),
        decisions_tied=decision_agreement(results, siblings[0], tied=True))
