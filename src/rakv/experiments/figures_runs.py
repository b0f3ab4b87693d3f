"""The headline statistics of every shipped run in one forest plot: each run's estimate and 95 % CI, runs labelled
by commit and machine (the paper's Section "Across machines").

The runs are this run, its reruns on the same machine class, the same profile on the artifact's earlier engines
(conf/profile: profile.before_engines) and the runs of other machines (data/reference/other-machines/); each
summary.json is read as JSON, since an earlier run's summary predates today's record.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from rakv.experiments import runcompare
from rakv.experiments.figures import save, style
from rakv.experiments.metadata import read_about
from rakv.runtime.actions import JOINT_K4, KV_ONLY
from rakv.runtime.run_layout import RunLayout

FOREST = "headline_forest"
# statistic shown -> (the summary's path to a [value, low, high] triple, its sign: +1 where positive means RAKV-ASD
# or speculation is faster)
STATISTICS = {
    "RAKV-ASD vs Joint-k4": (("latency_reduction", JOINT_K4), 1),
    "RAKV-ASD vs KV-only": (("latency_reduction", KV_ONLY), 1),
}
REGIME = "best k>0 vs best k=0"


def shipped_runs(results: Path, befores: list[Path]) -> dict[Path, str]:
    """Every shipped run to plot, folder -> label (its role, commit and machine), this run first."""
    runs = {Path(results): f"this run {(runcompare.commit_of(Path(results)) or '')[:7]}"}
    for rerun in runcompare.sibling_runs(Path(results)):
        runs[rerun] = f"rerun {(runcompare.commit_of(rerun) or '')[:7]}"
    for before in befores:
        runs[Path(before)] = (f"{Path(before).name.split('-', 1)[-1]} engine "
                              f"{(runcompare.commit_of(Path(before)) or '')[:7]}")
    for run in RunLayout.other_machines(analysis_others()):
        about = read_about(run)
        runs[run.root] = f"{about.label} {about.commit}"
    return runs


def analysis_others() -> Path:
    from rakv.experiments.analysis import OTHER_MACHINES

    return OTHER_MACHINES


def _triple(value) -> tuple[float, float, float] | None:
    if isinstance(value, dict):
        value = [value.get("value"), value.get("low"), value.get("high")]
    if not isinstance(value, (list, tuple)) or len(value) != 3 or any(v is None for v in value):
        return None
    return tuple(float(v) for v in value)


def run_estimates(runs: dict[Path, str]) -> pd.DataFrame:
    """One row per (run, configuration, statistic): the estimate and its CI, signed so that positive is faster."""
    rows = []
    for folder, label in runs.items():
        data = json.loads(RunLayout.of(folder).summary.read_text())
        for configuration, stats in data.get("per_configuration", {}).items():
            for name, ((group, key), sign) in STATISTICS.items():
                triple = _triple(stats.get(group, {}).get(key, stats.get(group, {}).get(key.replace("-", "_"))))
                if triple:
                    value, low, high = (sign * v for v in triple)
                    rows.append((label, configuration, name, value, min(low, high), max(low, high)))
        for claim in data.get("claims", []):
            triple = _triple([claim.get("reproduced"), claim.get("ci_low"), claim.get("ci_high")])
            if claim.get("key") == "spec_regime" and triple:  # a latency change of speculation: turned to a reduction
                rows.append((label, claim.get("configuration"), REGIME, -triple[0], -triple[2], -triple[1]))
    return pd.DataFrame(rows, columns=["run", "configuration", "statistic", "value", "low", "high"])


def headline_forest(estimates: pd.DataFrame, out_dir: Path) -> list[Path]:
    """A panel per statistic, a row per (configuration, run): the estimate (latency reduction, positive: faster)
    with its 95 % CI, and zero marked."""
    style()
    statistics = [s for s in [*STATISTICS, REGIME] if s in set(estimates.statistic)]
    labels = list(dict.fromkeys(zip(estimates.configuration, estimates.run)))
    fig, axes = plt.subplots(1, max(len(statistics), 1), figsize=(3.0 * max(len(statistics), 1) + 1.6,
                                                                  0.24 * len(labels) + 1.2), sharey=True,
                             squeeze=False)
    for ax, statistic in zip(axes[0], statistics):
        part = estimates[estimates.statistic == statistic]
        for y, (configuration, run) in enumerate(labels):
            row = part[(part.configuration == configuration) & (part.run == run)]
            if row.empty:
                continue
            r = row.iloc[0]
            ax.errorbar(100 * r.value, y, xerr=[[100 * (r.value - r.low)], [100 * (r.high - r.value)]], fmt="o",
                        color="C0" if configuration == labels[0][0] else "C1", markersize=3, capsize=2)
        ax.axvline(0, color="grey", linewidth=1, linestyle="--")
        ax.set_title(statistic, fontsize=10)
        ax.set_xlabel("latency reduction (%)")
    axes[0][0].set_yticks(range(len(labels)), [f"{c}: {r}" for c, r in labels], fontsize=9)
    axes[0][0].invert_yaxis()
    return save(fig, out_dir, FOREST)
