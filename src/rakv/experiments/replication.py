"""What several runs of one commit on one machine class say together, and whether two runs differ
(scripts/compare_runs.py; the paper's "Across runs and machines"; docs/outputs.md, "Replication").

Every headline statistic of a run carries a 95 % CI over its prompts (rakv.experiments.intervals). Read back on
the scale its interval was built on (`SCALES`: log(1 - x) for a latency reduction, log(1 + x) for a gain, log x for
an error rate, arcsine-square-root for a share, linear otherwise), the half-width gives the statistic's standard
error at the run's degrees of freedom (prompts - 1). From there:

- **Two runs' difference** (`differences`): Welch's comparison of the two estimates on that scale,
  t = (y_B - y_A) / sqrt(se_A^2 + se_B^2) on Welch and Satterthwaite's degrees of freedom, Holm-adjusted over the
  headline statistics (`holm`). A significant difference is the only evidence that two runs disagree: "B inside
  A's CI" is not a test (an exact replication puts B outside A's CI for about one statistic in seven,
  `inside_rate_expected`).
  The runs of one profile draw the same prompts, so their estimates are positively correlated and the test is
  conservative (it may miss a small difference; it does not invent one).
- **Pooled over R runs** (`pool`): a random-effects model y_r = theta + u_r + e_r, with u_r the run-level effect
  (variance tau^2, estimated by DerSimonian and Laird's moments, zero when the runs agree within their own
  intervals) and e_r the run's own error (se_r). Because the runs share their prompts, pooling does not shrink the
  prompts' part of the error: the pooled variance is mean(se_r^2) + tau^2 / R, never less than a typical run's.
  For the same reason tau^2 is a lower bound: the prompts' part of se_r is in Q's yardstick but cancels between
  runs that share the prompts, so a run-level variance smaller than it can read as zero.
- **A held-out run** (`held_out_coverage`): each run left out in turn, the others pooled; the share of statistics
  whose left-out estimate lies inside the pooled CI, beside what an exact replication gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

from rakv.experiments.intervals import CONFIDENCE
from rakv.experiments.summary import PooledStatistic, Summary

ALPHA = 1.0 - CONFIDENCE  # the family-wise level of the Holm-adjusted difference tests


@dataclass(frozen=True)
class Scale:
    """The scale a statistic's interval is symmetric on (approximately): forward and back."""
    name: str
    forward: Callable[[float], float]
    back: Callable[[float], float]


def _clip(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


LINEAR = Scale("linear", lambda x: x, lambda y: y)
SCALES = {
    "latency_reduction": Scale("log(1 - x)", lambda x: math.log(1.0 - x), lambda y: 1.0 - math.exp(y)),
    "throughput_gain": Scale("log(1 + x)", math.log1p, math.expm1),
    "pooled_slowdown": Scale("log(1 + x)", math.log1p, math.expm1),
    "mape": Scale("log x", math.log, math.exp),
    "share": Scale("arcsin(sqrt x)", lambda x: math.asin(math.sqrt(_clip(x, 0.0, 1.0))),
                   lambda y: math.sin(_clip(y, 0.0, math.pi / 2)) ** 2),
}


def scale_of(name: str) -> Scale:
    """The scale of a statistic, from its dotted name in summary.json (runcompare.with_intervals)."""
    parts = name.split(".")
    if "latency_reduction" in parts:
        return SCALES["latency_reduction"]
    if "throughput_gain" in parts:
        return SCALES["throughput_gain"]
    if parts[-2:] == ["spec_slowdown", "pooled"]:
        return SCALES["pooled_slowdown"]
    if parts[-1] == "mape":
        return SCALES["mape"]
    if parts[-1].startswith("accuracy_"):
        return SCALES["share"]
    return LINEAR  # regret, a difference of errors, a correlation


def degrees_of_freedom(summary: Summary) -> int:
    """The runs' CIs are over prompts: prompts - 1 degrees of freedom (at least 1)."""
    return max(1, sum(summary.grid.prompts.values()) - 1)


def quantile(df: int) -> float:
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, df))


def on_scale(ci, scale: Scale, df: int) -> tuple[float, float] | None:
    """(estimate, standard error) on `scale` from a [value, low, high] CI; None where it cannot be read."""
    try:
        y, low, high = (scale.forward(float(v)) for v in ci)
    except (TypeError, ValueError):
        return None
    low, high = sorted((low, high))  # a decreasing scale (a reduction's) swaps the ends
    if not all(math.isfinite(v) for v in (y, low, high)):
        return None
    return y, (high - low) / (2.0 * quantile(df))


def welch_df(se_a: float, se_b: float, df: int) -> float:
    """Welch and Satterthwaite's degrees of freedom of a difference of two estimates, each with `df`."""
    if se_a == 0 and se_b == 0:
        return float(df)
    return (se_a ** 2 + se_b ** 2) ** 2 / ((se_a ** 4 + se_b ** 4) / df)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment: p-values whose rejection at level a controls the family-wise error at a."""
    order = np.argsort(pvalues)
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class Difference:
    """One statistic in two runs: both CIs, B - A on the natural scale, the test's t and p (raw and Holm's)."""
    name: str
    a: list
    b: list
    difference: float
    t: float
    p: float
    p_holm: float
    inside: bool  # B's estimate inside A's CI (shown for comparison with older reports; not a test)

    @property
    def significant(self) -> bool:
        return self.p_holm < ALPHA


def differences(a: dict[str, list], b: dict[str, list], df: int) -> list[Difference]:
    """Every statistic with an interval in both runs (`a`, `b`: runcompare.with_intervals), tested and
    Holm-adjusted over all of them."""
    rows = []
    for name, ci_a in a.items():
        ci_b = b.get(name)
        scale = scale_of(name)
        read_a, read_b = on_scale(ci_a, scale, df), ci_b and on_scale(ci_b, scale, df)
        if read_a is None or not read_b:
            continue
        (ya, sa), (yb, sb) = read_a, read_b
        se = math.hypot(sa, sb)
        t = (yb - ya) / se if se > 0 else (0.0 if yb == ya else math.inf)
        p = float(2 * stats.t.sf(abs(t), welch_df(sa, sb, df))) if math.isfinite(t) else 0.0
        rows.append((name, ci_a, ci_b, ci_b[0] - ci_a[0], t, p, bool(ci_a[1] <= ci_b[0] <= ci_a[2])))
    adjusted = holm([r[5] for r in rows]) if rows else []
    return [Difference(n, ca, cb, d, t, p, q, inside) for (n, ca, cb, d, t, p, inside), q in zip(rows, adjusted)]


def inside_rate_expected(df: int, pooled_runs: int = 1) -> float:
    """The share of statistics whose estimate in an exact replication lies inside the CI pooled from `pooled_runs`
    others (one: "B inside A's CI"), for independent prompt samples of equal size (runs that share their prompts, as
    one profile's do, agree more: for them this is a lower bound): the left-out estimate minus the
    pooled one has variance se^2 (1 + 1/R), and the CI's half-width is t * se with se estimated on df degrees of
    freedom, so the share is P(|T_df| < t / sqrt(1 + 1/R))."""
    return float(2 * stats.t.cdf(quantile(df) / math.sqrt(1 + 1 / pooled_runs), df) - 1)


def pool(cis: list[list], name: str, df: int) -> PooledStatistic | None:
    """The statistic `name` pooled over its runs' CIs (random effects, DerSimonian-Laird; shared prompts: see the
    module's docstring); None where any run's CI cannot be read."""
    scale = scale_of(name)
    read = [on_scale(ci, scale, df) for ci in cis]
    if any(r is None for r in read) or not read:
        return None
    y = np.array([r[0] for r in read])
    # a zero-width interval (a statistic with no spread over prompts): a tiny floor keeps the weights finite
    se2 = np.maximum(np.array([r[1] ** 2 for r in read]), 1e-12)
    runs = len(y)
    w = 1.0 / se2
    fixed = float((w * y).sum() / w.sum())
    q = float((w * (y - fixed) ** 2).sum())
    denominator = float(w.sum() - (w ** 2).sum() / w.sum())
    tau2 = max(0.0, (q - (runs - 1)) / denominator) if runs > 1 and denominator > 0 else 0.0
    w_star = 1.0 / (se2 + tau2)
    mean = float((w_star * y).sum() / w_star.sum())
    half = quantile(df) * math.sqrt(float(se2.mean()) + tau2 / runs)
    ends = sorted((scale.back(mean - half), scale.back(mean + half)))
    q_p = float(stats.chi2.sf(q, runs - 1)) if runs > 1 else None
    return PooledStatistic(name=name, scale=scale.name, runs=[list(ci) for ci in cis],
                           pooled=[scale.back(mean), *ends], run_sd=math.sqrt(tau2), heterogeneity_p=q_p)


def pool_runs(runs: list[dict[str, list]], df: int) -> dict[str, PooledStatistic]:
    """Every statistic with an interval in every run, pooled."""
    names = [n for n in runs[0] if all(n in r for r in runs[1:])]
    pooled = {n: pool([r[n] for r in runs], n, df) for n in names}
    return {n: p for n, p in pooled.items() if p is not None}


@dataclass(frozen=True)
class Coverage:
    """Each run left out in turn: of `total` (statistic, run) pairs, `inside` have the left-out run's estimate in
    the CI pooled from the others; `expected`: the share an exact replication gives."""
    inside: int
    total: int
    expected: float


def held_out_coverage(runs: list[dict[str, list]], df: int) -> Coverage | None:
    """The pooled CIs' coverage of a held-out run, by leaving each shipped run out in turn (None: fewer than 2)."""
    if len(runs) < 2:
        return None
    inside = total = 0
    for i, left_out in enumerate(runs):
        rest = pool_runs([r for j, r in enumerate(runs) if j != i], df)
        for name, stat in rest.items():
            value = left_out.get(name, [None])[0]
            if value is None or not all(v is not None and math.isfinite(v) for v in stat.pooled):
                continue
            total += 1
            inside += bool(stat.pooled[1] <= value <= stat.pooled[2])
    return Coverage(inside, total, inside_rate_expected(df, len(runs) - 1))


def _pooled_record(record, prefix: str, pooled: dict[str, PooledStatistic]):
    """`record` (a statistics record of summary.json under `prefix`) with every interval that was pooled replaced
    by its pooled CI; nested records likewise."""
    from dataclasses import fields, is_dataclass, replace

    from rakv.runtime.json_records import CI, name_of

    changes = {}
    for f in fields(record):
        value, name = getattr(record, f.name), f"{prefix}.{name_of(f)}"
        if is_dataclass(value):
            changes[f.name] = _pooled_record(value, name, pooled)
        elif isinstance(value, CI) and name in pooled:
            changes[f.name] = pooled[name].pooled
    return replace(record, **changes)


def pooled_summary(summary: Summary) -> Summary:
    """The summary as the shipped runs of its commit and machine class give it together: every pooled interval
    (per configuration and over configurations) and the claims judged on them (Summary.replication); the summary
    itself where no other run is shipped. The paper's abstract, introduction and conclusion read this view."""
    from dataclasses import replace

    if not summary.replication:
        return summary
    pooled = {p.name: p for p in summary.replication.statistics}
    per_configuration = {name: _pooled_record(s, f"per_configuration.{name}", pooled)
                         for name, s in summary.per_configuration.items()}
    return replace(summary, per_configuration=per_configuration,
                   pooled=_pooled_record(summary.pooled, "pooled", pooled), claims=summary.replication.claims)
