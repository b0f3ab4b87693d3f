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
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from rakv.experiments.intervals import CONFIDENCE, ratio_interval, t_interval
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
    IterationMape,
    LatencyMape,
    Margins,
    ServedExact,
    ServingSummary,
    Slos,
    SloSteps,
)
from rakv.experiments.verdicts import all_of, any_of, below, ci_side, higher, non_inferior
from rakv.runtime.costmodel import tokens_per_round
from rakv.runtime.paths import ROOT
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
                if a not in wide or b not in wide:
                    continue
                both = wide[[a, b]].dropna()
                if len(both) >= 2 and both[b].mean() > 0:
                    ratio = both[a].sum() / both[b].sum()
                    sd = float(((both[a] - ratio * both[b]) / both[b].mean()).std(ddof=1))
                    variances.append((sd, f"{a} vs {b} at {float(rate):g} req/s"))
        if variances:
            out[family] = variances
    return out


def family_margins(design: dict) -> dict[str, dict[str, float]]:
    """family -> its own margins (metric -> margin), for the families of the design that set any."""
    return {family: dict(spec["margins"]) for family, spec in design.items() if spec.get("margins")}


def pilot_path(grid: dict) -> Path | None:
    """The pilot run the profile's serving section names (relative to the repository), None where it names none."""
    pilot = grid.get("pilot")
    return ROOT / pilot if pilot else None


def family_margin(margins: dict, design: dict | None, family: str, metric: str) -> float:
    """The family's equivalence margin for `metric` ("goodput" or "ttft"): its own (`margins` in its design entry,
    sized from the pilot's minimum detectable difference) or the study's default."""
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
            line += (f"; margin {margin:.0%}: " + ("MDD <= margin" if mdd <= margin else
                     "MDD > margin, so a 'no worse' goal is expected inconclusive unless the effect is large"))
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


def paired_difference(data: dict, family: str, rate: float, a: str, b: str, metric: str,
                      relative: bool = True) -> list[float]:
    """metric(a) - metric(b) over the repeats both ran, with its interval over repeats: relative, mean(a) / mean(b)
    - 1 (the delta method's t interval of the ratio on the log scale, so it never passes -100 %); absolute, the t
    interval of the per-repeat differences."""
    cells = runs(data)
    part = cells[(cells.family == family) & (cells.rate == rate) & cells.policy.isin([a, b])]
    wide = part.pivot_table(index="repeat", columns="policy", values=metric)
    if a not in wide or b not in wide:
        return [float("nan")] * 3
    both = wide[[a, b]].dropna()
    if not len(both):
        return [float("nan")] * 3
    if relative:  # mean(a) / mean(b) - 1 on the log scale (rakv.experiments.intervals.ratio_interval): >= -100 %
        return ratio_interval(both[a], both[b], scale="log", transform=lambda r: r - 1.0)
    return t_interval(both[a] - both[b])


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


NOT_JUDGED = "not judged"  # a goal whose every load is one where no policy misses an SLO: reported, not scored


def judged_loads(data: dict, family: str) -> dict[float, bool]:
    """rate -> whether goodput can tell the family's policies apart there: some policy, in some repeat, served a
    request that missed an SLO (goodput below the completed requests' rate) or failed one. Where every request of
    every policy meets every SLO, goodput is the rate requests finish at, set by the arrivals, and "no worse in
    goodput" tests nothing."""
    cells = runs(data)
    part = cells[cells.family == family]
    out = {}
    for rate, group in part.groupby("rate"):
        missed = (group.goodput < group.request_throughput * (1 - 1e-9)) | (group.failed > 0)
        out[float(rate)] = bool(missed.any())
    return out


def _over_loads(per_rate: list, judged: dict[float, bool], combine) -> str:
    verdicts = [v for rate, _, v in per_rate if judged.get(rate)]
    return combine(verdicts) if verdicts else NOT_JUDGED


LABELS = {  # kind -> (the goal's words, its key's tail)
    "higher": ("{a} goodput higher than {rival}", "higher/{rival}"),
    "part: acceptance": ("the prefix-keyed acceptance's part: {a} goodput higher than {rival} (load-aware k, EWMA "
                         "acceptance)", "part/acceptance"),
    "part: load-aware k": ("load-aware k's part: {a} (EWMA acceptance) goodput higher than {rival}",
                           "part/load_aware"),
}


def speculation_goals(data: dict, design: dict, margins: dict) -> tuple[list[dict], list[dict]]:
    """Per speculation family (one naming `no_worse_than`): RAKV-ASD's goodput against each named baseline, no worse
    within the margin at every judged load (`judged_loads`) and higher than the field's rules at some judged load;
    its output throughput at the family's highest (saturating) load no worse than each baseline; and, where the
    design names an `ablation` arm (load-aware k with the EWMA acceptance), which of RAKV-ASD's two differences
    pays: RAKV-ASD against the arm (the prefix-keyed acceptance's part) and the arm against the fixed k (load-aware
    k's part), each higher at some judged load. Returns (goals, the per-rate pairs they are read from; a pair at a
    load that is not judged carries its rule's verdict and `judged` false)."""
    goals, pairs = [], []
    for family, spec in design.items():
        named = spec.get("goals") or {}
        if "no_worse_than" not in named or family not in set(runs(data).family):
            continue
        margin = family_margin(margins, design, family, "goodput")
        judged, rates = judged_loads(data, family), _rates(data, family)
        for kind, a, rival in _comparisons(named):
            per_rate = []
            for rate in rates:
                ci = paired_difference(data, family, rate, a, rival, "goodput")
                one = non_inferior(ci, margin) if kind == "no worse" else higher(ci)
                per_rate.append((rate, ci, one))
                pairs.append({"family": family, "rate": rate, "policy": a, "against": rival, "metric": "goodput",
                              "kind": kind, "value": ci[0], "ci_low": ci[1], "ci_high": ci[2], "verdict": one,
                              "judged": judged.get(rate, False)})
            if per_rate:
                goals.append(_goodput_goal(family, kind, a, rival, per_rate, judged, margin))
        goals += _throughput_goals(data, family, named, rates, margin)
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


def _goodput_goal(family, kind, a, rival, per_rate, judged, margin) -> dict:
    """One goodput goal over its loads: scored where judged, the CI shown from the worst (no worse) or the best
    (higher) judged load (every load where none is judged)."""
    scored = [p for p in per_rate if judged.get(p[0])] or per_rate
    loads = [f"{r:g}" for r, _, _ in per_rate if judged.get(r)]
    where = (f"judged at {', '.join(loads)} req/s" if loads else
             "no load judged: every request of every policy met every SLO")
    if kind == "no worse":
        rate, ci, _ = min(scored, key=lambda p: p[1][0] if np.isfinite(p[1][0]) else -np.inf)
        return _goal(f"{family}: {a} goodput no worse than {rival} (margin {margin:.0%}) at every judged load; worst "
                     f"at {rate:g} req/s ({where})", f"{family}/no_worse/{rival}", ci,
                     _over_loads(per_rate, judged, all_of),
                     f"per judged load: met if the CI of the relative difference lies above -{margin:.0%}, missed if "
                     f"below it; met at every judged load", family=family, rival=rival, rate=rate, unit="relative")
    rate, ci, _ = max(scored, key=lambda p: p[1][1] if np.isfinite(p[1][1]) else -np.inf)
    words, key = (x.format(a=a, rival=rival) for x in LABELS[kind])
    return _goal(f"{family}: {words} at some judged load; best at {rate:g} req/s ({where})", f"{family}/{key}", ci,
                 _over_loads(per_rate, judged, any_of),
                 "per judged load: met if the CI of the relative difference lies above 0, missed if below 0; met at "
                 "some judged load, missed at every one", family=family, rival=rival, rate=rate, unit="relative")


def _throughput_goals(data, family, named, rates, margin) -> list[dict]:
    """Output throughput at the family's highest load (saturation: the server, not the arrivals, sets it), no worse
    than each named baseline within the margin; judged whatever the SLOs."""
    if not rates:
        return []
    top, ours, goals = max(rates), named["ours"], []
    for rival in named["no_worse_than"]:
        ci = paired_difference(data, family, top, ours, rival, "output_throughput")
        goals.append(_goal(f"{family}: {ours} output throughput no worse than {rival} (margin {margin:.0%}) at the "
                           f"highest load, {top:g} req/s", f"{family}/throughput/{rival}", ci,
                           non_inferior(ci, margin),
                           f"met if the CI of the relative difference lies above -{margin:.0%}, missed if below it",
                           family=family, rival=rival, rate=top, unit="relative"))
    return goals


def slo_status(table: pd.DataFrame, family: str, policy: str, slo_ms: float) -> dict[float, str]:
    """rate -> "meets" (p99 ITL CI wholly under the SLO), "fails" (wholly over) or "unclear"."""
    rows = table[(table.family == family) & (table.policy == policy)].sort_values("rate")
    out = {}
    for row in rows.itertuples(index=False):
        side = ci_side((row.p99_itl_ms, row.p99_itl_ms_low, row.p99_itl_ms_high), slo_ms, point_if_no_interval=False)
        out[float(row.rate)] = {"below": "meets", "above": "fails"}.get(side, "unclear")
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


def chunking_goals(data: dict, table: pd.DataFrame, design: dict, margins: dict) -> list[dict]:
    spec = design.get("chunking") or {}
    named = spec.get("goals") or {}
    cells = runs(data)
    if "ours" not in named or "chunking" not in set(cells.family):
        return []
    ours, fixed, baseline = named["ours"], list(named["fixed"]), named["ttft_baseline"]
    slo = float(cells[cells.family == "chunking"].slo_itl_ms.median())
    status = {p: slo_status(table, "chunking", p, slo) for p in [ours, *fixed]}
    sure = {p: reach(s, True) for p, s in status.items()}
    maybe = {p: reach(s, False) for p, s in status.items()}
    if all(sure[ours] >= maybe[f] for f in fixed):
        reached = "met"
    elif any(sure[f] > maybe[ours] for f in fixed):
        reached = "missed"
    else:
        reached = "inconclusive"
    rival = max(fixed, key=lambda f: (maybe[f], sure[f]))
    goals = [{"goal": f"chunking: {ours} meets the ITL SLO ({slo:.0f} ms p99) up to a load >= every fixed budget's "
                      f"(it: {sure[ours]:g} req/s surely; best fixed {rival}: {maybe[rival]:g} at most)",
              "key": "chunking/slo_reach", "value": sure[ours], "ci_low": None, "ci_high": None, "verdict": reached,
              "rule": "per load the p99 ITL CI wholly under the SLO (meets) or over (fails); met if the loads it "
                      "surely meets reach every fixed budget's possible ones, missed if a fixed budget surely meets "
                      "where it surely fails", "rival": rival, "unit": "req/s",
              "status": {p: {f"{rate:g}": v for rate, v in by_rate.items()} for p, by_rate in status.items()}}]
    margin = family_margin(margins, design, "chunking", "ttft")
    rate = sure[baseline] or _rates(data, "chunking")[0]
    ci = paired_difference(data, "chunking", rate, ours, baseline, "median_ttft_ms")
    goals.append(_goal(f"chunking: {ours} median TTFT no worse than {baseline} (margin {margin:.0%}) at {rate:g} "
                       f"req/s, the highest load {baseline} meets the SLO", "chunking/ttft", ci,
                       non_inferior(ci, margin, worse="above"),
                       f"met if the CI of the relative difference lies below +{margin:.0%}, missed if above it",
                       rival=baseline, rate=rate, unit="relative"))
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
        ci = t_interval(per_repeat_mean(part))
        one = batch_one[batch_one.family == family]
        detail[family] = {"served": ci, "requests": int(len(part)),
                          "batch_one": t_interval(per_repeat_mean(one)) if len(one) else [float("nan")] * 3,
                          "by_rate": {f"{rate:g}": t_interval(per_repeat_mean(g)) for rate, g in part.groupby("rate")}}
        goals.append(_goal(f"{family}: serving latency MAPE (admission's prediction under load) < {threshold:.0%}",
                           f"{family}/latency_mape", ci, below(ci, threshold),
                           f"met if the CI lies below {threshold:.0%}, missed if above", family=family,
                           unit="fraction"))
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
    ci = t_interval([a[r] - b[r] for r in common])
    stats_[ours]["vs_baseline"] = ci
    side = ci_side(ci, 0.0, point_if_no_interval=False)
    rule = {"below": "met", "above": "missed", "missing": "missing"}.get(side, "inconclusive")
    goal = _goal(f"acceptance: |alpha at admission - realised| lower with {ours} than with {baseline} "
                 f"({stats_[baseline]['acceptance_error'][0]:.3f}), difference", "acceptance/error", ci, rule,
                 "met if the CI of the paired difference lies below 0, missed if above", rival=baseline,
                 unit="alpha")
    return [goal], stats_


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


def serving_summary(results: Path, seed: int = 0) -> ServingSummary:
    """Everything the serving study's analysis reports (summary.json's `serving`, rakv.experiments.summary)."""
    from rakv.experiments.config import configuration
    from rakv.serving.batchcost import BatchCost

    results = Path(results)
    data = load(results)
    meta = json.loads((results / "serving" / "metadata.json").read_text())
    grid = meta["config"]["profile"]["serving"]
    design = meta["config"]["experiment"]["families"]
    margins = meta["config"]["experiment"]["margins"]
    threshold = float(meta["config"]["experiment"]["mape_goal"])
    table = cell_table(data)
    cells = runs(data)
    spec_goals, pairs = speculation_goals(data, design, margins)
    goals = spec_goals + chunking_goals(data, table, design, margins)
    latency_rows, latency = latency_goals(data["requests"], threshold)
    acceptance_rows, acceptance = acceptance_goals(data["requests"], design)
    goals += latency_rows + acceptance_rows
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
        slo_steps=SloSteps(**meta["config"]["experiment"]["slo_steps"]),
        slos_ms={name: Slos(**v) for name, v in slos.items()},
        margins=Margins(**margins, by_family=family_margins(design)),
        mape_goal=threshold, itl_slo_ms=float(cells.slo_itl_ms.median()), exact=ServedExact(equal, total),
        cells=[Cell(**r) for r in table.to_dict("records")], pairs=[GoalPair(**p) for p in pairs],
        iteration_mape={name: IterationMape(**v) for name, v in iteration_mape(data["iterations"]).items()},
        latency={family: LatencyMape(**v) for family, v in latency.items()},
        acceptance={name: AcceptanceErrors(**v) for name, v in acceptance.items()},
        chosen_k=[ChosenK(**r) for r in chosen_k(data["iterations"]).to_dict("records")],
        break_even_by_batch=[BatchBreakEven(**r) for r in break_even_by_batch(cost).to_dict("records")],
        goals=[Goal(**g) for g in goals], comparisons=[Comparison(**r) for r in comparisons(data)],
        power=family_power(cells, grid, design, margins))


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
