"""Statistics of the serving study (results/<name>/serving/, rakv.experiments.serving), as pure functions.

Units and CIs: a run serves one trace once, and its requests share that run's machine state and each other's
iterations, so the unit is the run: every metric is computed per run (its goodput, p99 ITL, median TTFT, mean
concurrency, the mean error of its requests' predictions) and every CI is a Student-t interval over repeats (95 %;
rakv.experiments.intervals). A comparison of two policies in one cell is paired by repeat (the two ran back to back
on the repeat's trace, rakv.experiments.serving.run_order): a relative difference is the ratio of their means over
the repeats minus 1, its interval the delta method's on the log scale (never past -100 %); an absolute one the t
interval of the per-repeat differences.
With few repeats a percentile bootstrap over repeats covers far less than it says (3 repeats give 10 distinct
resamples: about 75 %); the t interval holds its level for normal differences at any count and close to it for
skewed ones (tests/test_serving_stats.py simulates both at the study's repeat count).

Goals (`goals`): each a statistic with its CI, read by a rule named in the design (rakv.experiments.verdicts):
non-inferiority within an equivalence margin against baselines named before the run, superiority at some load,
an SLO met at a load at least every fixed budget's, and errors below a threshold. Every rule can answer met, missed
or inconclusive. That every served output is identical to batch-one greedy AR is a check of the engine, reported
beside the goals (`exact`), not one of them.

Fixed before the data (docs/serving.md, "Fixed before the data"): the design's goals and margins and the profile's
loads are the repository's (`judged_by`); the plan names every goal (`planned_goals`) and, from the pilot, its
minimum detectable difference at the profile's repeats (`goal_power`), a goal above its margin being "underpowered"
whatever the run shows; each tested goal's p-value (`p_value`, its loads corrected within it: `over_loads`) is
Holm-adjusted within its family (`family_wise`), and a goal the data cannot answer is "missing", with why. Every
goal ends with one of rakv.experiments.verdicts.GOAL_VERDICTS, so the tally sums to the goals.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from rakv.experiments.intervals import CONFIDENCE, ratio_interval, t_interval
from rakv.experiments.replication import holm
from rakv.experiments.summary import (
    ALL_ITERATIONS,
    AcceptanceErrors,
    BatchBreakEven,
    Cell,
    ChosenK,
    Comparison,
    FamilyPower,
    Goal,
    GoalPair,
    GoalPower,
    IterationMape,
    LatencyMape,
    Margins,
    ServedExact,
    ServingSummary,
    Slos,
    SloSteps,
)
from rakv.experiments.verdicts import UNDERPOWERED, below, ci_side, higher, non_inferior
from rakv.runtime.costmodel import tokens_per_round
from rakv.runtime.paths import CONF_DIR, ROOT, conf_file
from rakv.serving.batchcost import shape_class

POWER = 0.80
METRICS = ("goodput", "output_throughput", "p99_itl_ms", "median_ttft_ms", "concurrency")


def load(results: Path) -> dict[str, pd.DataFrame]:
    folder = Path(results) / "serving"
    return {name: pd.read_parquet(folder / f"{name}.parquet") for name in ("requests", "cells", "iterations")}


def available(results: Path) -> bool:
    return (Path(results) / "serving" / "cells.parquet").exists()


def minimum_detectable(sd: float, repeats: int, confidence: float = CONFIDENCE, power: float = POWER) -> float:
    """The smallest true paired difference a t interval over `repeats` excludes 0 for with probability `power`,
    when the per-repeat differences have standard deviation `sd`."""
    if repeats < 2:
        return float("inf")
    df = repeats - 1
    return float((stats.t.ppf(0.5 + confidence / 2, df) + stats.t.ppf(power, df)) * sd / math.sqrt(repeats))


def goal_pairs(design: dict) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Per family, the metric its relative goals compare and the (ours, baseline) pairs they compare."""
    out = {}
    for family, spec in (design or {}).items():
        named = spec.get("goals") or {}
        if "no_worse_than" in named:
            rivals = list(dict.fromkeys([*named["no_worse_than"], *named.get("higher_than", [])]))
            out[family] = ("goodput", [(named["ours"], r) for r in rivals])
        elif "ttft_baseline" in named:
            out[family] = ("median_ttft_ms", [(named["ours"], named["ttft_baseline"])])
    return out


def paired_sd(cells: pd.DataFrame, metric: str = "goodput", pairs: dict | None = None) -> dict[str, float]:
    """Per family: the median over its comparisons (goal pairs x rates) of the standard deviation of the per-repeat
    residuals a - (sum a / sum b) b relative to b's mean (what paired_difference's interval is made of); `pairs`:
    family -> [(a, b)], None: every pair of its policies. A comparison where b's mean is not positive is left out.
    The median, not a pooled mean: one comparison with a policy that collapses at saturation (goodput near 0 in
    some repeats) would otherwise set the whole family's noise (`paired_sd_worst` names it)."""
    return {family: float(np.median([sd for sd, _ in rows]))
            for family, rows in _paired_sds(cells, metric, pairs).items()}


def paired_sd_worst(cells: pd.DataFrame, metric: str = "goodput", pairs: dict | None = None) -> dict[str, tuple]:
    """Per family: (the largest paired SD, "a vs b at rate r") over its comparisons."""
    return {family: max(rows) for family, rows in _paired_sds(cells, metric, pairs).items()}


def residual_sd(both: pd.DataFrame | None) -> float | None:
    """The standard deviation of the per-repeat residuals a - (sum a / sum b) b relative to b's mean (columns a, b:
    paired repeats), what relative_interval's delta method is made of; None with fewer than two pairs or where b's
    mean is not positive (no relative difference to it)."""
    if both is None or len(both) < 2:
        return None
    a, b = both.columns
    if not both[b].mean() > 0:
        return None
    ratio = both[a].sum() / both[b].sum()
    return float(((both[a] - ratio * both[b]) / both[b].mean()).std(ddof=1))


def repeats_to_power(sd: float, margin: float, confidence: float = CONFIDENCE, most: int = 10_000) -> int | None:
    """The least repeats n with minimum_detectable(sd, n, confidence) <= margin (the MDD falls with n), None where
    even `most` do not reach it."""
    if not (np.isfinite(sd) and margin > 0) or minimum_detectable(sd, most, confidence) > margin:
        return None
    low, high = 1, most  # minimum_detectable(sd, low) > margin >= minimum_detectable(sd, high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if minimum_detectable(sd, middle, confidence) <= margin else (middle, high)
    return high


def _paired_sds(cells: pd.DataFrame, metric: str, pairs: dict | None) -> dict[str, list[tuple[float, str]]]:
    out = {}
    for family, part in cells.groupby("family"):
        variances = []
        for rate, cell in part.groupby("rate"):
            wide = cell.pivot_table(index="repeat", columns="policy", values=metric)
            policies = list(wide.columns)
            chosen = (pairs or {}).get(family) if pairs is not None else \
                [(a, b) for i, a in enumerate(policies) for b in policies[i + 1:]]
            for a, b in chosen or []:
                sd = residual_sd(wide[[a, b]].dropna()) if a in wide and b in wide else None
                if sd is not None:
                    variances.append((sd, f"{a} vs {b} at {float(rate):g} req/s"))
        if variances:
            out[family] = variances
    return out


def family_margins(design: dict) -> dict[str, dict[str, float]]:
    """family -> its own margins (metric -> margin), for the families of the design that set any (the present design
    sets none: conf/experiment/serving.yaml)."""
    return {family: dict(spec["margins"]) for family, spec in design.items() if spec.get("margins")}


def pilot_path(grid: dict) -> Path | None:
    """The pilot run the profile's serving section names (relative to the repository), None where it names none."""
    pilot = grid.get("pilot")
    return ROOT / pilot if pilot else None


def family_margin(margins: dict, design: dict | None, family: str, metric: str) -> float:
    """The family's equivalence margin for `metric` ("goodput" or "ttft"): its own (`margins` in its design entry,
    fixed before the data like the default) or the study's default."""
    own = ((design or {}).get(family) or {}).get("margins") or {}
    return float(own.get(metric, margins[metric]))


def power_rows(cells: pd.DataFrame, repeats: int, margins: dict | None = None, design: dict | None = None,
               rates: dict | None = None) -> list[dict]:
    """Per family, from a run's cells (a pilot's, or the run's own): the paired noise of its goals' comparisons
    (goodput for the speculation families, median TTFT for chunking; `design`: the families' goals, else every
    pair in goodput) at the loads `rates` names (family -> rates; None: every load of `cells`), the minimum
    detectable relative difference at `repeats` repeats and the family's margin (`family_margin`; None without
    `margins`)."""
    if rates:
        served = {family: {float(r) for r in family_rates} for family, family_rates in rates.items()}
        cells = cells[[float(r) in served.get(f, ()) for f, r in zip(cells.family, cells.rate)]]
    by_family = goal_pairs(design) if design else {}
    metrics = sorted({m for m, _ in by_family.values()}) if by_family else ["goodput"]
    rows = []
    for metric in metrics:
        pairs = {f: p for f, (m, p) in by_family.items() if m == metric} if by_family else None
        worst = paired_sd_worst(cells, metric, pairs)
        for family, sd in paired_sd(cells, metric, pairs).items():
            margin = (family_margin(margins, design, family, "goodput" if metric == "goodput" else "ttft")
                      if margins else None)
            rows.append({"family": family, "metric": metric, "paired_sd": sd, "largest_sd": worst[family][0],
                         "largest_at": worst[family][1], "repeats": repeats, "mdd": minimum_detectable(sd, repeats),
                         "own_repeats": int(cells[cells.family == family].repeat.nunique()), "margin": margin})
    return rows


def power(pilot: Path, repeats: int, margins: dict | None = None, design: dict | None = None,
          rates: dict | None = None) -> list[str]:
    """The plan's power lines: `power_rows` of a pilot's cells.parquet at the run's loads and repeats."""
    path = Path(pilot) / "cells.parquet"
    if not path.exists():
        return [f"no pilot at {path}"]
    lines = []
    for row in power_rows(pd.read_parquet(path), repeats, margins, design, rates):
        sd, mdd, margin, own = row["paired_sd"], row["mdd"], row["margin"], row["own_repeats"]
        line = (f"{row['family']} {row['metric']}: paired sd {sd:.1%} (median over its goal comparisons; the largest "
                f"{row['largest_sd']:.1%}, {row['largest_at']}); minimum detectable difference (95 % CI, power "
                f"{POWER:.0%}) {mdd:.1%} at {repeats} repeats ({minimum_detectable(sd, own):.1%} at the pilot's "
                f"{own})")
        if margin is not None:
            line += (f"; margin {margin:.0%}: " + ("MDD <= margin" if mdd <= margin else "MDD > margin")
                     + " (the family's median comparison at 95 % alone; each goal's own line below decides its power)")
        lines.append(line)
    return lines


def runs(data: dict) -> pd.DataFrame:
    """One row per run with its metrics (cells.parquet has them: summary.json of each run)."""
    return data["cells"]


def cell_table(data: dict) -> pd.DataFrame:
    """Every cell's metrics: the mean over repeats and its t interval."""
    rows = []
    for (family, rate, policy), part in runs(data).groupby(["family", "rate", "policy"], sort=False):
        row = {"family": family, "rate": float(rate), "policy": policy, "repeats": int(len(part)),
               "configuration": part.configuration.iloc[0] if "configuration" in part else None}
        for metric in METRICS:
            if metric in part:
                row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = t_interval(part[metric].astype(float))
        rows.append(row)
    return pd.DataFrame(rows)


def paired_values(data: dict, family: str, rate: float, a: str, b: str, metric: str) -> pd.DataFrame | None:
    """metric of `a` and `b` over the repeats both ran (columns a, b), None where either lacks them."""
    cells = runs(data)
    part = cells[(cells.family == family) & (cells.rate == rate) & cells.policy.isin([a, b])]
    wide = part.pivot_table(index="repeat", columns="policy", values=metric)
    if a not in wide or b not in wide:
        return None
    both = wide[[a, b]].dropna()
    return both if len(both) else None


def relative_interval(both: pd.DataFrame | None, confidence: float = CONFIDENCE) -> list[float]:
    """mean(a) / mean(b) - 1 over paired repeats (columns: a, b) with the delta method's t interval on the log scale
    (rakv.experiments.intervals.ratio_interval), so it never passes -100 %; NaN without pairs."""
    if both is None:
        return [float("nan")] * 3
    a, b = both.columns
    try:
        return ratio_interval(both[a], both[b], scale="log", transform=lambda r: r - 1.0, confidence=confidence)
    except OverflowError:  # a quantile so far out (a p-value's search) that exp() of the bound leaves float range
        return [ratio_interval(both[a], both[b], scale="log", transform=lambda r: r - 1.0)[0], -1.0, math.inf]


def paired_difference(data: dict, family: str, rate: float, a: str, b: str, metric: str,
                      relative: bool = True, confidence: float = CONFIDENCE) -> list[float]:
    """metric(a) - metric(b) over the repeats both ran, with its interval over repeats: relative, mean(a) / mean(b)
    - 1 (`relative_interval`); absolute, the t interval of the per-repeat differences."""
    both = paired_values(data, family, rate, a, b, metric)
    if relative or both is None:
        return relative_interval(both, confidence)
    return t_interval(both[a] - both[b], confidence)


def verdict(ci: list[float], threshold: float, above: bool) -> str:
    """met: the CI lies wholly on the goal's side of the threshold; missed: wholly on the other; else inconclusive."""
    side = ci_side(ci, threshold)
    if side in ("missing", "straddles"):
        return "missing" if side == "missing" else "inconclusive"
    return "met" if side == ("above" if above else "below") else "missed"


def _goal(goal: str, key: str, ci: list[float], verdict_: str, rule: str, **extra) -> dict:
    return {"goal": goal, "key": key, "value": ci[0], "ci_low": ci[1], "ci_high": ci[2], "verdict": verdict_,
            "rule": rule, **extra}


def _rates(data: dict, family: str) -> list[float]:
    cells = runs(data)
    return sorted(float(r) for r in cells[cells.family == family].rate.unique())


def _unmeasured(rates: dict | None, family: str, measured: list[float]) -> list[float]:
    """The design's loads of `family` (the profile's rates) that the data lack: the run was measured without them."""
    planned = {float(r) for r in ((rates or {}).get(family) or [])}
    return sorted(planned - set(measured))


def _loads_text(loads) -> str:
    return ", ".join(f"{r:g}" for r in loads) + " req/s"


ALPHA = 1.0 - CONFIDENCE  # the family-wise error rate of the goals' verdicts (Holm within each family)
DECIDED = ("met", "missed")


def p_value(decide) -> tuple[float, str]:
    """A goal's p-value and its side: the least alpha at which `decide(alpha)` (the goal's rule with every CI at
    confidence 1 - alpha, its loads corrected within it) answers met or missed, and that answer. `decide` is
    monotone (nested CIs: an answer at alpha stands at any larger alpha), so bisection on log alpha finds it;
    (1.0, its answer as alpha -> 1) where no alpha decides. At one load and one goal, p < 0.05 exactly when the 95 %
    CI lies wholly on one side of the rule's threshold."""
    top = decide(1.0 - 1e-9)
    if top not in DECIDED:
        return 1.0, top
    low, high = -16.0, math.log10(1.0 - 1e-9)
    if decide(10.0 ** low) in DECIDED:
        return 10.0 ** low, decide(10.0 ** low)
    for _ in range(48):
        middle = (low + high) / 2
        low, high = (low, middle) if decide(10.0 ** middle) in DECIDED else (middle, high)
    return 10.0 ** high, decide(10.0 ** high)


def _tested(goal: dict, decide, missing: str | None = None) -> dict:
    """`goal` with its test: `p_value` and `side` (p_value(decide)), its verdict at 95 % before the family's Holm
    correction (rakv.experiments.serving_stats.family_wise), and `missing`: why the data cannot answer it (None
    where they can)."""
    p, side = p_value(decide)
    alone = side if p < ALPHA else ("missing" if missing else "inconclusive")
    return {**goal, "verdict": alone, "p_value": p, "side": side, "missing": missing}


def over_loads(boths: list, rule, every: bool, unmeasured: int = 0):
    """decide(alpha) of a goal over loads (each a paired frame, `relative_interval`; `rule`: a CI -> met / missed /
    inconclusive / missing): `every` load must meet it (met: met at every load; missed: missed at some load) or
    `some` load (met: met at some load; missed: missed at every one). The side that needs only one load of L is
    read at 1 - alpha / L (Bonferroni over the goal's loads: it had L tries), the other at 1 - alpha (it must hold at
    each, an intersection). `unmeasured` loads of the design count in L and forbid the answer that needs them all."""
    count = len(boths) + unmeasured

    def decide(alpha: float) -> str:
        if not boths:
            return "missing"
        one_of = [rule(relative_interval(b, 1.0 - alpha / count)) for b in boths]
        each = [rule(relative_interval(b, 1.0 - alpha)) for b in boths]
        if every:
            if "missed" in one_of:
                return "missed"
            return "met" if not unmeasured and all(v == "met" for v in each) else "inconclusive"
        if "met" in one_of:
            return "met"
        return "missed" if not unmeasured and all(v == "missed" for v in each) else "inconclusive"
    return decide


def judged_loads(data: dict, family: str) -> dict[float, bool]:
    """rate -> whether goodput can tell the family's policies apart there: some policy, in some repeat, served a
    request that missed an SLO (goodput below the completed requests' rate) or failed one. Where every request of
    every policy meets every SLO, goodput is the rate requests finish at, set by the arrivals, and "no worse in
    goodput" tests nothing. The rule reads no policy's value against another's, so it cannot favour one."""
    cells = runs(data)
    part = cells[cells.family == family]
    out = {}
    for rate, group in part.groupby("rate"):
        missed = (group.goodput < group.request_throughput * (1 - 1e-9)) | (group.failed > 0)
        out[float(rate)] = bool(missed.any())
    return out


LABELS = {  # kind -> (the goal's words, its key's tail)
    "higher": ("{a} goodput higher than {rival}", "higher/{rival}"),
    "part: acceptance": ("the prefix-keyed acceptance's part: {a} goodput higher than {rival} (load-aware k, EWMA "
                         "acceptance)", "part/acceptance"),
    "part: load-aware k": ("load-aware k's part: {a} (EWMA acceptance) goodput higher than {rival}",
                           "part/load_aware"),
}


def goodput_key(family: str, kind: str, rival: str) -> str:
    return f"{family}/no_worse/{rival}" if kind == "no worse" else f"{family}/{LABELS[kind][1].format(rival=rival)}"


def _load_rule(kind: str, margin: float):
    return (lambda ci: non_inferior(ci, margin)) if kind == "no worse" else higher


def speculation_goals(data: dict, design: dict, margins: dict,
                      rates: dict | None = None) -> tuple[list[dict], list[dict]]:
    """Per speculation family (one naming `no_worse_than`): RAKV-ASD's goodput against each named baseline, no worse
    within the margin at every judged load (`judged_loads`) and higher than the field's rules at some judged load;
    its output throughput at the design's highest (saturating) load no worse than each baseline; and, where the
    design names an `ablation` arm (load-aware k with the EWMA acceptance), which of RAKV-ASD's two differences
    pays: RAKV-ASD against the arm (the prefix-keyed acceptance's part) and the arm against the fixed k (load-aware
    k's part), each higher at some judged load. `rates`: the design's loads per family (the profile's); a load there
    but not in the data makes a goal that needs it "missing", named. Returns (goals, each with its p-value, the
    per-rate pairs they are read from; a pair at a load that is not judged carries `judged` false)."""
    goals, pairs = [], []
    for family, spec in design.items():
        named = spec.get("goals") or {}
        if "no_worse_than" not in named or family not in set(runs(data).family):
            continue
        margin = family_margin(margins, design, family, "goodput")
        judged, measured = judged_loads(data, family), _rates(data, family)
        unmeasured = _unmeasured(rates, family, measured)
        for kind, a, rival in _comparisons(named):
            per_rate = []
            for rate in measured:
                both = paired_values(data, family, rate, a, rival, "goodput")
                ci = relative_interval(both)
                one = _load_rule(kind, margin)(ci)
                per_rate.append((rate, ci, one, both))
                pairs.append({"family": family, "rate": rate, "policy": a, "against": rival, "metric": "goodput",
                              "kind": kind, "value": ci[0], "ci_low": ci[1], "ci_high": ci[2], "verdict": one,
                              "judged": judged.get(rate, False)})
            goals.append(_goodput_goal(family, kind, a, rival, per_rate, judged, margin, unmeasured))
        goals += _throughput_goals(data, family, named, measured, margin, unmeasured)
    return goals, pairs


def _comparisons(named: dict) -> list[tuple[str, str, str]]:
    """(kind, policy, baseline) of a speculation family's goodput goals."""
    ours = named["ours"]
    out = [("no worse", ours, rival) for rival in named["no_worse_than"]]
    out += [("higher", ours, rival) for rival in named.get("higher_than", [])]
    if named.get("ablation"):
        out += [("part: acceptance", ours, named["ablation"]),
                ("part: load-aware k", named["ablation"], named.get("fixed_k", "k2"))]
    return out


def _goodput_missing(scored: list, unmeasured: list[float], rival: str) -> str | None:
    """Why a goodput goal's data cannot answer it, or None: no judged load, a judged load without an interval (its
    baseline's goodput 0 there: a relative difference to 0 is undefined), loads of the design not measured."""
    reasons = []
    if not scored and not unmeasured:
        reasons.append("no load where a policy missed an SLO: goodput is the arrival rate whatever the policy")
    for rate, ci, _, both in scored:
        if not np.isfinite(ci[0]) or not np.isfinite(ci[1]):
            zero = both is not None and not both[rival].mean() > 0
            reasons.append(f"no interval at {rate:g} req/s" + (f" ({rival}'s goodput is 0 there: a relative "
                                                                 "difference to 0 is undefined)" if zero else ""))
    if unmeasured:
        reasons.append(f"{_loads_text(unmeasured)} in the design but not in the data (measured without them)")
    return "; ".join(reasons) or None


def _goodput_goal(family, kind, a, rival, per_rate, judged, margin, unmeasured=()) -> dict:
    """One goodput goal over its loads (`per_rate`: every measured load's (rate, CI, verdict, pairs)): tested where
    judged (`over_loads`), the CI shown from the worst (no worse) or the best (higher) judged load (every load where
    none is judged)."""
    scored = [p for p in per_rate if judged.get(p[0])]
    shown = scored or per_rate
    loads = [f"{r:g}" for r, *_ in scored]
    where = (f"judged at {', '.join(loads)} req/s" if loads else
             "no load judged: every request of every policy met every SLO")
    decide = over_loads([p[3] for p in scored], _load_rule(kind, margin), kind == "no worse", len(unmeasured))
    missing = _goodput_missing(scored, list(unmeasured), rival)
    corrected = "Holm within the family; the side one load decides Bonferroni-corrected for the loads"
    if kind == "no worse":
        rate, ci, *_ = min(shown, key=lambda p: p[1][0] if np.isfinite(p[1][0]) else -np.inf)
        return _tested(_goal(
            f"{family}: {a} goodput no worse than {rival} (margin {margin:.0%}) at every judged load; worst at "
            f"{rate:g} req/s ({where})",
            f"{family}/no_worse/{rival}", ci, "", f"per judged load: met if the CI of the relative difference lies "
            f"above -{margin:.0%}, missed if below it; met at every judged load, missed at some ({corrected})",
            family=family, rival=rival, rate=rate, unit="relative"), decide, missing)
    rate, ci, *_ = max(shown, key=lambda p: p[1][1] if np.isfinite(p[1][1]) else -np.inf)
    words = LABELS[kind][0].format(a=a, rival=rival)
    return _tested(_goal(
        f"{family}: {words} at some judged load; best at {rate:g} req/s ({where})", goodput_key(family, kind, rival),
        ci, "",
        f"per judged load: met if the CI of the relative difference lies above 0, missed if below 0; met at some "
        f"judged load, missed at every one ({corrected})", family=family, rival=rival, rate=rate, unit="relative"),
        decide, missing)


def _throughput_goals(data, family, named, measured, margin, unmeasured=()) -> list[dict]:
    """Output throughput at the design's highest load (saturation: the server, not the arrivals, sets it), no worse
    than each named baseline within the margin; judged whatever the SLOs."""
    top = max([*measured, *unmeasured], default=None)
    if top is None:
        return []
    ours, goals = named["ours"], []
    missing = None if top in measured else f"{_loads_text([top])} in the design but not in the data"
    for rival in named["no_worse_than"]:
        both = paired_values(data, family, top, ours, rival, "output_throughput") if not missing else None
        goals.append(_tested(_goal(
            f"{family}: {ours} output throughput no worse than {rival} (margin {margin:.0%}) at the highest load, "
            f"{top:g} req/s", f"{family}/throughput/{rival}", relative_interval(both), "",
            f"met if the CI of the relative difference lies above -{margin:.0%}, missed if below it (Holm within "
            "the family)", family=family, rival=rival, rate=top, unit="relative"),
            over_loads([both] if both is not None else [], lambda ci: non_inferior(ci, margin), True),
            missing or (None if both is not None else "no interval: a policy lacks runs at that load")))
    return goals


def slo_status(table: pd.DataFrame, family: str, policy: str, slo_ms: float) -> dict[float, str]:
    """rate -> "meets" (p99 ITL CI wholly under the SLO), "fails" (wholly over) or "unclear"."""
    rows = table[(table.family == family) & (table.policy == policy)].sort_values("rate")
    out = {}
    for row in rows.itertuples(index=False):
        side = ci_side((row.p99_itl_ms, row.p99_itl_ms_low, row.p99_itl_ms_high), slo_ms, point_if_no_interval=False)
        out[float(row.rate)] = {"below": "meets", "above": "fails"}.get(side, "unclear")
    return out


def slo_status_at(data: dict, family: str, policy: str, slo_ms: float, confidence: float) -> dict[float, str]:
    """slo_status with every p99 ITL CI at `confidence` (the t interval over repeats)."""
    cells = runs(data)
    part = cells[(cells.family == family) & (cells.policy == policy)]
    out = {}
    for rate, group in part.groupby("rate"):
        ci = t_interval(group.p99_itl_ms.astype(float), confidence)
        side = ci_side(ci, slo_ms, point_if_no_interval=False)
        out[float(rate)] = {"below": "meets", "above": "fails"}.get(side, "unclear")
    return out


def reach(status: dict[float, str], sure: bool) -> float:
    """The highest rate up to which every rate `meets` the SLO (sure) or does not `fail` it (not sure); 0: none."""
    best = 0.0
    for rate in sorted(status):
        if status[rate] == "meets" or (not sure and status[rate] == "unclear"):
            best = rate
        else:
            break
    return best


def reach_verdict(status: dict[str, dict[float, str]], ours: str, fixed: list[str]) -> str:
    """met if the loads `ours` surely meets the SLO at reach every fixed budget's possible ones, missed if a fixed
    budget surely meets it where `ours` surely fails, else inconclusive."""
    sure = {p: reach(s, True) for p, s in status.items()}
    maybe = {p: reach(s, False) for p, s in status.items()}
    if all(sure[ours] >= maybe[f] for f in fixed):
        return "met"
    return "missed" if any(sure[f] > maybe[ours] for f in fixed) else "inconclusive"


def _slo_reach_decide(data, ours, fixed, slo, unmeasured):
    """decide(alpha) of the SLO-reach goal: met read with every p99 ITL CI at 1 - alpha (it needs all of them), missed
    at 1 - alpha / (fixed budgets) (any one budget surely ahead suffices)."""
    def decide(alpha: float) -> str:
        at = lambda confidence: {p: slo_status_at(data, "chunking", p, slo, confidence)  # noqa: E731
                                 for p in [ours, *fixed]}
        if reach_verdict(at(1.0 - alpha / len(fixed)), ours, fixed) == "missed":
            return "missed"
        return "met" if not unmeasured and reach_verdict(at(1.0 - alpha), ours, fixed) == "met" else "inconclusive"
    return decide


def chunking_goals(data: dict, table: pd.DataFrame, design: dict, margins: dict,
                   rates: dict | None = None) -> list[dict]:
    spec = design.get("chunking") or {}
    named = spec.get("goals") or {}
    cells = runs(data)
    if "ours" not in named or "chunking" not in set(cells.family):
        return []
    ours, fixed, baseline = named["ours"], list(named["fixed"]), named["ttft_baseline"]
    slo = float(cells[cells.family == "chunking"].slo_itl_ms.median())
    unmeasured = _unmeasured(rates, "chunking", _rates(data, "chunking"))
    status = {p: slo_status(table, "chunking", p, slo) for p in [ours, *fixed]}
    sure = {p: reach(s, True) for p, s in status.items()}
    maybe = {p: reach(s, False) for p, s in status.items()}
    rival = max(fixed, key=lambda f: (maybe[f], sure[f]))
    missing = f"{_loads_text(unmeasured)} in the design but not in the data" if unmeasured else None
    goals = [_tested({
        "goal": f"chunking: {ours} meets the ITL SLO ({slo:.0f} ms p99) up to a load >= every fixed budget's (it: "
                f"{sure[ours]:g} req/s surely; best fixed {rival}: {maybe[rival]:g} at most)",
        "key": "chunking/slo_reach", "value": sure[ours], "ci_low": None, "ci_high": None, "verdict": "",
        "rule": "per load the p99 ITL CI wholly under the SLO (meets) or over (fails); met if the loads it surely "
                "meets reach every fixed budget's possible ones, missed if a fixed budget surely meets where it "
                "surely fails (that side's CIs Bonferroni-corrected over the fixed budgets; Holm within the family)",
        "rival": rival, "unit": "req/s", "family": "chunking",
        "status": {p: {f"{rate:g}": v for rate, v in by_rate.items()} for p, by_rate in status.items()}},
        _slo_reach_decide(data, ours, fixed, slo, unmeasured), missing)]
    margin = family_margin(margins, design, "chunking", "ttft")
    rate = sure[baseline] or _rates(data, "chunking")[0]
    both = paired_values(data, "chunking", rate, ours, baseline, "median_ttft_ms")
    goals.append(_tested(_goal(
        f"chunking: {ours} median TTFT no worse than {baseline} (margin {margin:.0%}) at {rate:g} req/s, the highest "
        f"load {baseline} meets the SLO", "chunking/ttft", relative_interval(both), "",
        f"met if the CI of the relative difference lies below +{margin:.0%}, missed if above it (Holm within the "
        "family)", rival=baseline, rate=rate, unit="relative", family="chunking"),
        over_loads([both] if both is not None else [], lambda ci: non_inferior(ci, margin, worse="above"), True),
        None if both is not None else f"no interval at {rate:g} req/s"))
    return goals


def request_values(requests: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per finished request, `error`: `latency` |served prediction - service| / service (admission's load-aware
    prediction, rakv.serving.admission.service_prediction), `batch_one` the controller's batch-one prediction the
    same way, `acceptance` |alpha at admission - realised alpha|, or `regret` (ex post)."""
    rows = requests[requests.status == "ok"]
    if column == "latency":
        rows = rows[rows.served_predicted_s.notna() & rows.service_s.notna() & (rows.service_s > 0)]
        error = (rows.served_predicted_s - rows.service_s).abs() / rows.service_s
    elif column == "batch_one":
        rows = rows[rows.predicted_s.notna() & rows.service_s.notna() & (rows.service_s > 0)]
        error = (rows.predicted_s - rows.service_s).abs() / rows.service_s
    elif column == "acceptance":
        if "realised_alpha" not in rows:
            return rows.iloc[:0].assign(error=pd.Series(dtype=float))
        rows = rows[rows.alpha.notna() & rows.realised_alpha.notna()]
        error = (rows.alpha - rows.realised_alpha).abs()
    else:  # ex-post regret: computed for prompt lookup only (rakv.experiments.serving.expost_regret)
        if "expost_regret" not in rows:
            return rows.iloc[:0].assign(error=pd.Series(dtype=float))
        rows = rows[rows.expost_regret.notna()]
        error = rows.expost_regret
    return rows.assign(error=error.astype(float))


def per_repeat_mean(frame: pd.DataFrame) -> pd.Series:
    return frame.groupby("repeat").error.mean()


def latency_goals(requests: pd.DataFrame, threshold: float) -> tuple[list[dict], dict]:
    """Per family: the mean relative error of admission's load-aware service prediction, under `threshold`."""
    goals, detail = [], {}
    latency, batch_one = request_values(requests, "latency"), request_values(requests, "batch_one")
    for family in sorted(requests.family.unique()):
        part = latency[latency.family == family]
        if not len(part):
            continue
        means = per_repeat_mean(part)
        ci = t_interval(means)
        one = batch_one[batch_one.family == family]
        detail[family] = {"served": ci, "requests": int(len(part)),
                          "batch_one": t_interval(per_repeat_mean(one)) if len(one) else [float("nan")] * 3,
                          "by_rate": {f"{rate:g}": t_interval(per_repeat_mean(g)) for rate, g in part.groupby("rate")}}
        goals.append(_tested(
            _goal(f"{family}: serving latency MAPE (admission's prediction under load) < {threshold:.0%}",
                  f"{family}/latency_mape", ci, "", f"met if the CI lies below {threshold:.0%}, missed if above "
                  "(Holm within the family)", family=family, unit="fraction"),
            lambda alpha, means=means: below(t_interval(means, 1.0 - alpha), threshold),
            None if np.isfinite(ci[1]) else "no interval: fewer than two repeats"))
    return goals, detail


def acceptance_goals(requests: pd.DataFrame, design: dict) -> tuple[list[dict], dict]:
    """The acceptance family: |alpha at admission - realised| under the prefix-keyed source against the EWMA
    (paired by repeat), and each source's mean error and ex-post regret."""
    named = (design.get("acceptance") or {}).get("goals") or {}
    part = requests[requests.family == "acceptance"]
    if "ours" not in named or not len(part):
        return [], {}
    ours, baseline = named["ours"], named["baseline"]
    errors, regret = request_values(part, "acceptance"), request_values(part, "regret")
    stats_ = {}
    for policy in (baseline, ours):
        stats_[policy] = {"acceptance_error": t_interval(per_repeat_mean(errors[errors.policy == policy])),
                          "regret": t_interval(per_repeat_mean(regret[regret.policy == policy]))
                          if len(regret) else [float("nan")] * 3}
    a, b = per_repeat_mean(errors[errors.policy == ours]), per_repeat_mean(errors[errors.policy == baseline])
    common = sorted(set(a.index) & set(b.index))
    differences = [a[r] - b[r] for r in common]
    ci = t_interval(differences)
    stats_[ours]["vs_baseline"] = ci

    def decide(alpha: float) -> str:
        side = ci_side(t_interval(differences, 1.0 - alpha), 0.0, point_if_no_interval=False)
        return {"below": "met", "above": "missed", "missing": "missing"}.get(side, "inconclusive")

    goal = _tested(_goal(f"acceptance: |alpha at admission - realised| lower with {ours} than with {baseline} "
                         f"({stats_[baseline]['acceptance_error'][0]:.3f}), difference", "acceptance/error", ci, "",
                         "met if the CI of the paired difference lies below 0, missed if above (Holm within the "
                         "family)", rival=baseline, unit="alpha", family="acceptance"),
                   decide, None if np.isfinite(ci[1]) else "no interval: no acceptance errors in two repeats or more")
    return [goal], stats_


# ---------------------------------------------------------------------------------------------
# The plan: the goals the design names before any run, each one's power from the pilot, the family-wise verdicts


@dataclass(frozen=True)
class PlannedGoal:
    """A goal as the design names it before any run (`planned_goals`): its key and family, the metric of cells it
    compares (None: read from the requests), the policies, the design's loads and how it reads them (`over`:
    "every" load, "some" load, "top": the highest, "picked": the one its rule picks from the data, "pooled": every
    request), and the margin its power is judged against (None: a threshold goal, whose MDD is printed alone). A
    "higher" goal's margin is the family's goodput margin: the smallest gain a user would notice, by the same
    standard as "no worse"."""
    key: str
    family: str
    metric: str | None
    policy: str | None
    rival: str | None
    loads: tuple[float, ...]
    over: str
    margin: float | None


def planned_goals(design: dict, rates: dict, margins: dict) -> list[PlannedGoal]:
    """Every goal of the design at the profile's loads (`rates`: family -> loads), in the summary's order; the goal
    builders above produce these keys, so a planned goal absent from the data is reported "missing", not skipped."""
    out = []
    loads = {f: tuple(sorted(float(r) for r in rs)) for f, rs in rates.items()}
    for family, spec in design.items():
        named = spec.get("goals") or {}
        if "no_worse_than" not in named or family not in loads:
            continue
        margin = family_margin(margins, design, family, "goodput")
        out += [PlannedGoal(goodput_key(family, kind, rival), family, "goodput", a, rival, loads[family],
                            "every" if kind == "no worse" else "some", margin)
                for kind, a, rival in _comparisons(named)]
        out += [PlannedGoal(f"{family}/throughput/{rival}", family, "output_throughput", named["ours"], rival,
                            (max(loads[family]),), "top", margin) for rival in named["no_worse_than"]]
    chunking = (design.get("chunking") or {}).get("goals") or {}
    if "ours" in chunking and "chunking" in loads:
        out += [PlannedGoal("chunking/slo_reach", "chunking", "p99_itl_ms", chunking["ours"], None,
                            loads["chunking"], "every", None),
                PlannedGoal("chunking/ttft", "chunking", "median_ttft_ms", chunking["ours"],
                            chunking["ttft_baseline"], loads["chunking"], "picked",
                            family_margin(margins, design, "chunking", "ttft"))]
    out += [PlannedGoal(f"{family}/latency_mape", family, None, None, None, loads[family], "pooled", None)
            for family in sorted(loads)]
    acceptance = (design.get("acceptance") or {}).get("goals") or {}
    if "baseline" in acceptance and "acceptance" in loads:
        out.append(PlannedGoal("acceptance/error", "acceptance", None, acceptance["ours"], acceptance["baseline"],
                               loads["acceptance"], "pooled", None))
    return out


def goal_level(goal: PlannedGoal, planned: list[PlannedGoal]) -> float:
    """The two-sided level a goal is powered at: 0.05 over the goals of its family (Holm's first step, the strictest:
    an MDD there holds at every later step) and, for a goal met at some load, over its loads as well."""
    family = sum(g.family == goal.family for g in planned)
    return ALPHA / family / (len(goal.loads) if goal.over == "some" else 1)


def _pilot_sds(goal: PlannedGoal, cells: pd.DataFrame, requests: pd.DataFrame | None) -> dict:
    """load (None: pooled) -> the pilot's noise of a goal's statistic there: the paired residual SD of a relative
    difference (residual_sd; goodput only at loads the pilot judged, elsewhere it is the arrival rate), the SD of p99
    ITL over the SLO, or of the per-repeat mean error (from the pilot's requests, where it shipped them)."""
    data = {"cells": cells}
    if goal.metric == "p99_itl_ms":
        part = cells[(cells.family == goal.family) & (cells.policy == goal.policy)]
        return {float(r): float((g.p99_itl_ms / g.slo_itl_ms).std(ddof=1)) for r, g in part.groupby("rate")
                if float(r) in goal.loads and len(g) >= 2}
    if goal.metric is not None:
        judged = judged_loads(data, goal.family) if goal.metric == "goodput" else {}
        out = {}
        for rate in goal.loads:
            if goal.metric != "goodput" or judged.get(rate):
                sd = residual_sd(paired_values(data, goal.family, rate, goal.policy, goal.rival, goal.metric))
                if sd is not None:
                    out[rate] = sd
        return out
    if requests is None or "family" not in requests:
        return {}
    part = requests[requests.family == goal.family]
    if goal.key.endswith("/latency_mape"):
        means = per_repeat_mean(request_values(part, "latency"))
    else:
        errors = request_values(part, "acceptance")
        mine, theirs = (per_repeat_mean(errors[errors.policy == p]) for p in (goal.policy, goal.rival))
        means = (mine - theirs).dropna()
    return {None: float(means.std(ddof=1))} if len(means) >= 2 else {}


def goal_power(planned: list[PlannedGoal], pilot: Path | None, repeats: int, requests: int | None = None) -> list[dict]:
    """Per planned goal, from the pilot's cells (and requests where it shipped them): the MDD at `repeats` (95 % CI
    family-wise, 80 % power: `minimum_detectable` at `goal_level`) of the load that binds (every load: the noisiest;
    some load: the quietest; the picked load: the noisiest, whichever the data pick), whether it is within the
    margin (`powered`), and if not the repeats that would power it (`repeats_to_power`: the least n with
    (t(1 - a/2, n - 1) + t(0.8, n - 1)) sd / sqrt(n) <= margin) and the requests per trace that would at these
    repeats if a run's requests were independent (the SD falling as 1/sqrt(requests): requests x (MDD / margin)^2)."""
    cells_path = Path(pilot) / "cells.parquet" if pilot else None
    cells = pd.read_parquet(cells_path) if cells_path and cells_path.exists() else None
    requests_path = Path(pilot) / "requests.parquet" if pilot else None
    pilot_requests = pd.read_parquet(requests_path) if requests_path and requests_path.exists() else None
    rows = []
    for goal in planned:
        level = goal_level(goal, planned)
        sds = _pilot_sds(goal, cells, pilot_requests) if cells is not None else {}
        row = {"key": goal.key, "family": goal.family, "metric": goal.metric or "requests", "repeats": repeats,
               "confidence": 1.0 - level, "margin": goal.margin, "loads": [r for r in sds if r is not None],
               "load": None, "paired_sd": None, "mdd": None, "powered": None, "repeats_needed": None,
               "requests_needed": None}
        if not sds:
            row["note"] = ("no pilot: the profile names none, or it is not shipped" if cells is None else
                           "the pilot shipped no requests.parquet, which this statistic is read from"
                           if goal.metric is None and pilot_requests is None else
                           "the pilot has no two repeats of this statistic at the design's loads")
            rows.append(row)
            continue
        pick = min if goal.over == "some" else max
        load, sd = pick(sds.items(), key=lambda item: item[1])
        mdd = minimum_detectable(sd, repeats, 1.0 - level)
        row.update(load=load, paired_sd=sd, mdd=mdd, note="")
        if goal.margin is not None:
            row["powered"] = bool(mdd <= goal.margin)
            if not row["powered"]:
                row["repeats_needed"] = repeats_to_power(sd, goal.margin, 1.0 - level)
                row["requests_needed"] = (math.ceil(requests * (mdd / goal.margin) ** 2)
                                          if requests and row["repeats_needed"] else None)
        rows.append(row)
    return rows


def goal_power_lines(rows: list[dict]) -> list[str]:
    """The plan's lines on each goal's power (`goal_power`), written to plan.txt before the first run."""
    lines = ["each goal's minimum detectable difference from the pilot, at the profile's repeats n: MDD = (t(1 - a/2, "
             "n - 1) + t(0.80, n - 1)) x sd / sqrt(n), a = 0.05 / (the family's goals) [/ the goal's loads where one "
             "load decides it] (Holm within the family at 95 %: its strictest step); a goal whose MDD exceeds its "
             "margin is reported underpowered, with the least n that powers it"]
    for row in rows:
        if row["mdd"] is None:
            lines.append(f"  {row['key']}: MDD unknown ({row['note']})")
            continue
        where = f" at {row['load']:g} req/s" if row["load"] is not None else ""
        line = (f"  {row['key']}: MDD {row['mdd']:.1%} at {row['repeats']} repeats (a = {1 - row['confidence']:.4f}; "
                f"the pilot's sd {row['paired_sd']:.1%}{where})")
        if row["margin"] is None:
            line += "; a threshold goal, no margin: its MDD says how far from the threshold it can decide"
        elif row["powered"]:
            line += f" <= margin {row['margin']:.0%}: powered"
        else:
            line += f" > margin {row['margin']:.0%}: underpowered; {power_needed(row)}"
        lines.append(line)
    return lines


def power_needed(row: dict, trace: bool = True) -> str:
    """What would power an underpowered goal: repeats, or (`trace`) a longer trace at the same repeats."""
    repeats = (f"{row['repeats_needed']} repeats would power it" if row["repeats_needed"] else
               "no repeat count up to 10,000 would power it")
    longer = (f", or about {row['requests_needed']:,} requests per trace at {row['repeats']} repeats (if a run's "
              "requests were independent)" if trace and row["requests_needed"] else "")
    return repeats + longer


def family_wise(goals: list[dict], planned: list[PlannedGoal], power: list[dict]) -> list[dict]:
    """Every goal's one verdict (rakv.experiments.verdicts.GOAL_VERDICTS), in the plan's order (a goal the data gave
    but the plan lacks after them): "underpowered" where the plan found its MDD above its margin (`power`, with what
    would power it); else Holm's step-down within its family over all the family's goals (one untested counts with
    p = 1): met or missed where the Holm-adjusted p < 0.05 (the side its CIs lie on), else "missing" where the data
    cannot answer it (with why), else inconclusive. A planned goal the data lack is "missing", counted."""
    by_key = {g["key"]: g for g in goals}
    plan = {g.key: g for g in planned}
    order = [*plan, *(k for k in by_key if k not in plan)]
    family = {k: plan[k].family if k in plan else by_key[k].get("family") or k.split("/")[0] for k in order}
    weak = {row["key"]: row for row in power if row["powered"] is False}
    adjusted = {}
    for name in dict.fromkeys(family.values()):
        keys = [k for k in order if family[k] == name]
        tested = [by_key[k]["p_value"] if k in by_key and k not in weak else 1.0 for k in keys]
        adjusted.update(zip(keys, holm(tested)))
    return [_final(key, by_key.get(key), weak.get(key), adjusted[key], family[key]) for key in order]


def _final(key: str, goal: dict | None, weak: dict | None, p_holm: float, family: str) -> dict:
    """One goal's verdict (family_wise): missing where its data are incomplete (unless Holm decided it from what is
    there), underpowered where the plan said so, else Holm's."""
    if goal is None:
        return {"goal": f"{key}: named by the design, not in the data", "key": key, "value": None, "ci_low": None,
                "ci_high": None, "verdict": "missing", "rule": "--", "family": family,
                "reason": "not in the data: its family was not served, or none of its requests finished"}
    kept = {k: v for k, v in goal.items() if k not in ("verdict", "side", "missing", "p_value")}
    weak_text = (f"the plan's MDD {weak['mdd']:.1%} at {weak['repeats']} repeats exceeds the margin "
                 f"{weak['margin']:.0%}: {power_needed(weak, trace=False)}") if weak else ""
    if weak and not goal["missing"]:
        return {**kept, "verdict": UNDERPOWERED, "reason": weak_text}
    tested = {"p_value": goal["p_value"], "p_holm": p_holm} if not weak else {}
    if not weak and p_holm < ALPHA:
        return {**kept, **tested, "verdict": goal["side"]}
    if goal["missing"]:
        return {**kept, **tested, "verdict": "missing",
                "reason": goal["missing"] + (f"; underpowered besides (MDD {weak['mdd']:.1%} at {weak['repeats']} "
                                             f"repeats > {weak['margin']:.0%})" if weak else "")}
    return {**kept, **tested, "verdict": "inconclusive"}


def iteration_mape(iterations: pd.DataFrame) -> dict:
    """The batch cost model's held-out check: |predicted - measured| / measured per served iteration, the online-
    scaled prediction (`predicted_s`) and the table's alone (`model_s`), by family and by iteration shape; CIs over
    repeats of the per-repeat means."""
    known = iterations[iterations.predicted_s.notna() & (iterations.iteration_s > 0)].copy()
    out = {}
    if not len(known):
        return out
    known["scaled"] = (known.predicted_s - known.iteration_s).abs() / known.iteration_s
    has_model = "model_s" in known and known.model_s.notna().any()
    known["table"] = ((known.model_s - known.iteration_s).abs() / known.iteration_s) if has_model else np.nan
    known["shape"] = (known.prefill_context.map(lambda c: shape_class(None if pd.isna(c) else int(c)))
                      if "prefill_context" in known else "decode")
    groups = [(ALL_ITERATIONS, known), *known.groupby("family"),
              *[(f"shape: {s}", g) for s, g in known.groupby("shape")]]
    for name, part in groups:
        out[name] = {"scaled": t_interval(part.groupby("repeat").scaled.mean()),
                     "table": t_interval(part.groupby("repeat").table.mean()), "iterations": int(len(part))}
    return out


def chosen_k(iterations: pd.DataFrame, policies=("smartspec", "rakv-asd")) -> pd.DataFrame:
    """Mean candidates per decoding request by the number of decoding requests, per family and policy."""
    rows = []
    part = iterations[iterations.family.str.startswith("speculation") & iterations.policy.isin(policies)]
    for row in part.itertuples(index=False):
        ks = json.loads(row.k)
        if ks:
            rows.append({"family": row.family, "policy": row.policy, "rate": row.rate, "batch": len(ks),
                         "mean_k": float(np.mean(ks)), "speculating": float(np.mean([k > 0 for k in ks]))})
    frame = pd.DataFrame(rows)
    if not len(frame):
        return frame
    return frame.groupby(["family", "policy", "batch"], as_index=False).agg(
        mean_k=("mean_k", "mean"), speculating=("speculating", "mean"), iterations=("mean_k", "size"))


def break_even_by_batch(cost, k_values=(1, 2, 4), batches=(1, 2, 4, 8, 16), context: int = 256,
                        match: float = 1.0) -> pd.DataFrame:
    """From the batch cost table: per batch size b and k, the least acceptance (the same for every request) at
    which speculating with k gives more expected tokens per second than k = 0 (None: not even alpha = 1)."""
    rows = []
    for b in batches:
        base = b / cost.decode_s([(1, context)] * b, [0] * b)
        for k in k_values:
            time_k = cost.decode_s([(1 + k, context)] * b, [k] * b)

            def gain(alpha, b=b, k=k, time_k=time_k, base=base):
                return b * tokens_per_round(alpha, k, match) / time_k - base

            alpha = None
            if gain(1.0) > 0:
                low, high = 0.0, 1.0
                if gain(0.0) > 0:
                    high = 0.0
                while high - low > 1e-4:
                    mid = (low + high) / 2
                    low, high = (low, mid) if gain(mid) > 0 else (mid, high)
                alpha = high
            rows.append({"batch": b, "k": k, "break_even_alpha": alpha, "context": context})
    return pd.DataFrame(rows)


COMPARISONS = (  # (family, policy, against, metric): the paper's sentences, one per rate
    ("chunking", "cost-model-slo", "none", "p99_itl_ms"),
    ("chunking", "cost-model-slo", "none", "median_ttft_ms"),
    ("chunking", "fixed-32", "none", "p99_itl_ms"),
    ("speculation", "rakv-asd", "k0", "goodput"),
    ("speculation", "k2", "k0", "goodput"),
    ("speculation", "smartspec", "k0", "goodput"),
    ("speculation-draft", "rakv-asd", "k0", "goodput"),
    ("speculation-draft", "k2", "k0", "goodput"),
    ("speculation-draft", "smartspec", "k0", "goodput"),
)


def comparisons(data: dict) -> list[dict]:
    """Relative paired differences (policy over `against`, minus 1) per rate, with t intervals over repeats."""
    cells, rows = runs(data), []
    for family, a, b, metric in COMPARISONS:
        for rate in _rates(data, family):
            present = set(cells[(cells.family == family) & (cells.rate == rate)].policy)
            if {a, b} <= present:
                ci = paired_difference(data, family, rate, a, b, metric)
                rows.append({"family": family, "rate": float(rate), "policy": a, "against": b, "metric": metric,
                             "value": ci[0], "ci_low": ci[1], "ci_high": ci[2]})
    return rows


def _profile(name: str):
    """conf/profile/<name>.yaml as Hydra composes it (the profiles its `defaults` name beneath it, `_self_` last),
    None where conf/ has no such profile."""
    from omegaconf import OmegaConf

    if not (CONF_DIR / "profile" / f"{name}.yaml").exists():
        return None
    node = conf_file(f"profile/{name}.yaml")
    bases = [_profile(entry) for entry in node.get("defaults") or [] if isinstance(entry, str) and entry != "_self_"]
    own = OmegaConf.masked_copy(node, [k for k in node if k != "defaults"])
    return OmegaConf.merge(*[b for b in bases if b is not None], own)


def judged_by(meta: dict) -> tuple[dict, dict]:
    """(the experiment, the profile's serving section) a run is judged by. The goals, margins and loads are fixed in
    the repository before any run (conf/experiment/serving.yaml; conf/profile/<the run's profile>.yaml's rates and
    pilot), so a run is judged by them as they stand, not by the copy in its metadata.json: a run measured under
    an earlier design (data/reference/offline's, whose margins were moved after a pilot) is judged by the present
    one, and a load of the design it lacks is reported missing. The run's own repeats, requests and configurations
    stay its own; the run's copy stands in where the repository has no such profile."""
    from omegaconf import OmegaConf

    run = meta["config"]
    experiment = {**run["experiment"], **OmegaConf.to_container(conf_file("experiment/serving.yaml"))}
    grid = dict(run["profile"]["serving"])
    profile = _profile(run["profile"]["name"])
    if profile is not None and profile.profile.get("serving") is not None:
        own = OmegaConf.to_container(profile.profile.serving)
        grid.update({k: own[k] for k in ("rates", "pilot") if k in own})
        if "pilot" not in own:
            grid.pop("pilot", None)
    return experiment, grid


def judged_goals(data: dict, table: pd.DataFrame, experiment: dict, grid: dict) -> tuple:
    """(goals with their final verdicts, the per-load pairs, latency detail, acceptance detail, each goal's planned
    power) of a run judged by `experiment` and `grid` (judged_by)."""
    design, margins, rates = experiment["families"], experiment["margins"], grid.get("rates") or {}
    spec_goals, pairs = speculation_goals(data, design, margins, rates)
    goals = spec_goals + chunking_goals(data, table, design, margins, rates)
    latency_rows, latency = latency_goals(data["requests"], float(experiment["mape_goal"]))
    acceptance_rows, acceptance = acceptance_goals(data["requests"], design)
    planned = planned_goals(design, rates, margins)
    power = goal_power(planned, pilot_path(grid), int(runs(data).repeat.nunique()), grid.get("requests"))
    goals = family_wise(goals + latency_rows + acceptance_rows, planned, power)
    return goals, pairs, latency, acceptance, power


def serving_summary(results: Path, seed: int = 0) -> ServingSummary:
    """Everything the serving study's analysis reports (summary.json's `serving`, rakv.experiments.summary)."""
    from rakv.experiments.config import configuration
    from rakv.serving.batchcost import BatchCost

    results = Path(results)
    data = load(results)
    meta = json.loads((results / "serving" / "metadata.json").read_text())
    experiment, grid = judged_by(meta)
    design, margins = experiment["families"], experiment["margins"]
    table = cell_table(data)
    cells = runs(data)
    goals, pairs, latency, acceptance, power = judged_goals(data, table, experiment, grid)
    # exactness is a check of the engine (reported beside the goals, `exact`), not a goal of the policies
    equal, total = int(cells.outputs_equal_ar.sum()), int((cells.completed + cells.failed).sum())
    chosen = configuration(grid["configuration"])
    cost = BatchCost.from_json(json.loads(
        (results / "serving" / f"batch_cost-{grid['configuration']}.json").read_text()))
    calibration = results / "calibration" / f"{chosen.pair}-{chosen.proposer}.json"
    alpha = json.loads(calibration.read_text())["acceptance"] if calibration.exists() else None
    slos = (cells.groupby("configuration")[["slo_itl_ms", "slo_ttft_ms", "slo_tpot_ms"]].median()
            .to_dict("index"))
    return ServingSummary(
        configuration=grid["configuration"], configurations=sorted(cells.configuration.unique()),
        calibrated_acceptance=alpha, runs=int(len(cells)), requests=int(len(data["requests"])),
        repeats=int(cells.repeat.nunique()), commit=meta.get("git_commit"),
        slo_steps=SloSteps(**meta["config"]["experiment"]["slo_steps"]),  # the run's: its SLOs were measured by them
        slos_ms={name: Slos(**v) for name, v in slos.items()},
        margins=Margins(**margins, by_family=family_margins(design)),
        mape_goal=float(experiment["mape_goal"]), itl_slo_ms=float(cells.slo_itl_ms.median()),
        exact=ServedExact(equal, total),
        cells=[Cell(**r) for r in table.to_dict("records")], pairs=[GoalPair(**p) for p in pairs],
        iteration_mape={name: IterationMape(**v) for name, v in iteration_mape(data["iterations"]).items()},
        latency={family: LatencyMape(**v) for family, v in latency.items()},
        acceptance={name: AcceptanceErrors(**v) for name, v in acceptance.items()},
        chosen_k=[ChosenK(**r) for r in chosen_k(data["iterations"]).to_dict("records")],
        break_even_by_batch=[BatchBreakEven(**r) for r in break_even_by_batch(cost).to_dict("records")],
        goals=[Goal(**g) for g in goals], comparisons=[Comparison(**r) for r in comparisons(data)],
        power=family_power(cells, grid, design, margins), goal_power=[GoalPower(**row) for row in power])


def family_power(cells: pd.DataFrame, grid: dict, design: dict, margins: dict) -> list[FamilyPower]:
    """The plan's power rows (from the pilot the profile names, where it is shipped) and this run's own, at the
    run's loads and repeats."""
    repeats, rates = int(grid["repeats"]), grid.get("rates")
    sources = []
    pilot = pilot_path(grid)
    if pilot and (pilot / "cells.parquet").exists():
        sources.append(("pilot", pd.read_parquet(pilot / "cells.parquet")))
    sources.append(("run", cells))
    return [FamilyPower(source=source, **row) for source, frame in sources
            for row in power_rows(frame, repeats, margins, design, rates)]
