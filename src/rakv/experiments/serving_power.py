"""The serving study's plan, fixed before the data (docs/serving.md, "Fixed before the data"): the goals the design
names (`planned_goals`, each a `PlannedGoal` named by a `GoalId`), and from the pilot each one's minimum detectable
difference at the profile's repeats (`goal_power`) and each family's paired noise (`power_rows`).

A goal is named by its family, its kind and the baseline it is judged against (`GoalId`,
rakv.experiments.serving_goal_ids); `GoalId.key` spells it as summary.json's `serving.goals[].key` and
`serving.goal_power[].key` ("speculation/no_worse/k0"), and `GoalId.from_key` alone reads one back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from rakv.experiments.intervals import CONFIDENCE
from rakv.experiments.serving_cells import judged_loads, paired_values, per_repeat_mean, request_values, residual_sd
from rakv.experiments.serving_goal_ids import GoalId, GoalKind
from rakv.experiments.summary_serving import FamilyPower, GoalPower
from rakv.runtime.paths import ROOT
from rakv.runtime.run_layout import ServingStudyLayout

POWER = 0.80
ALPHA = 1.0 - CONFIDENCE  # the family-wise error rate of the goals' verdicts (Holm within each family)


@dataclass(frozen=True)
class PlannedGoal:
    """A goal as the design names it before any run (`planned_goals`): its name, the metric of cells it compares
    (None: read from the requests), the policy it judges against `id.rival`, the design's loads and how it reads
    them (`over`: "every" load, "some" load, "top": the highest, "picked": the one its rule picks from the data,
    "pooled": every request), and the margin its power is judged against (None: a threshold goal, whose MDD is
    printed alone). A "higher" goal's margin is the family's goodput margin: the smallest gain a user would notice,
    by the same standard as "no worse"."""
    id: GoalId
    metric: str | None
    policy: str | None
    loads: tuple[float, ...]
    over: str
    margin: float | None

    @property
    def key(self) -> str:
        return self.id.key

    @property
    def family(self) -> str:
        return self.id.family

    @property
    def rival(self) -> str | None:
        return self.id.rival


def goodput_goals(named: dict) -> list[tuple[GoalKind, str, str]]:
    """(kind, policy, baseline) of a speculation family's goodput goals, in the summary's order."""
    ours = named["ours"]
    out = [(GoalKind.NO_WORSE, ours, rival) for rival in named["no_worse_than"]]
    out += [(GoalKind.HIGHER, ours, rival) for rival in named.get("higher_than", [])]
    if named.get("ablation"):
        out += [(GoalKind.PART_ACCEPTANCE, ours, named["ablation"]),
                (GoalKind.PART_LOAD_AWARE, named["ablation"], named.get("fixed_k", "k2"))]
    return out


def family_margins(design: dict) -> dict[str, dict[str, float]]:
    """family -> its own margins (metric -> margin), for the families of the design that set any (the present design
    sets none: conf/experiment/serving.yaml)."""
    return {family: dict(spec["margins"]) for family, spec in design.items() if spec.get("margins")}


def family_margin(margins: dict, design: dict | None, family: str, metric: str) -> float:
    """The family's equivalence margin for `metric` ("goodput" or "ttft"): its own (`margins` in its design entry,
    fixed before the data like the default) or the study's default."""
    own = ((design or {}).get(family) or {}).get("margins") or {}
    return float(own.get(metric, margins[metric]))


def pilot_path(grid: dict) -> ServingStudyLayout | None:
    """The pilot run the profile's serving section names (a serving study's folder, relative to the repository),
    None where it names none."""
    pilot = grid.get("pilot")
    return ServingStudyLayout(ROOT / pilot) if pilot else None


def planned_goals(design: dict, rates: dict, margins: dict) -> list[PlannedGoal]:
    """Every goal of the design at the profile's loads (`rates`: family -> loads), in the summary's order; the goal
    builders (rakv.experiments.serving_goals) name theirs the same, so a planned goal absent from the data is
    reported "missing", not skipped."""
    out = []
    loads = {f: tuple(sorted(float(r) for r in rs)) for f, rs in rates.items()}
    for family, spec in design.items():
        named = spec.get("goals") or {}
        if "no_worse_than" not in named or family not in loads:
            continue
        margin = family_margin(margins, design, family, "goodput")
        out += [PlannedGoal(GoalId(family, kind, rival), "goodput", a, loads[family],
                            "every" if kind == GoalKind.NO_WORSE else "some", margin)
                for kind, a, rival in goodput_goals(named)]
        out += [PlannedGoal(GoalId(family, GoalKind.THROUGHPUT, rival), "output_throughput", named["ours"],
                            (max(loads[family]),), "top", margin) for rival in named["no_worse_than"]]
    chunking = (design.get("chunking") or {}).get("goals") or {}
    if "ours" in chunking and "chunking" in loads:
        out += [PlannedGoal(GoalId("chunking", GoalKind.SLO_REACH), "p99_itl_ms", chunking["ours"],
                            loads["chunking"], "every", None),
                PlannedGoal(GoalId("chunking", GoalKind.TTFT, chunking["ttft_baseline"]), "median_ttft_ms",
                            chunking["ours"], loads["chunking"], "picked",
                            family_margin(margins, design, "chunking", "ttft"))]
    out += [PlannedGoal(GoalId(family, GoalKind.LATENCY_MAPE), None, None, loads[family], "pooled", None)
            for family in sorted(loads)]
    acceptance = (design.get("acceptance") or {}).get("goals") or {}
    if "baseline" in acceptance and "acceptance" in loads:
        out.append(PlannedGoal(GoalId("acceptance", GoalKind.ACCEPTANCE_ERROR, acceptance["baseline"]), None,
                               acceptance["ours"], loads["acceptance"], "pooled", None))
    return out


# ---------------------------------------------------------------------------------------------
# Minimum detectable differences


def minimum_detectable(sd: float, repeats: int, confidence: float = CONFIDENCE, power: float = POWER) -> float:
    """The smallest true paired difference a t interval over `repeats` excludes 0 for with probability `power`,
    when the per-repeat differences have standard deviation `sd`."""
    if repeats < 2:
        return float("inf")
    df = repeats - 1
    return float((stats.t.ppf(0.5 + confidence / 2, df) + stats.t.ppf(power, df)) * sd / math.sqrt(repeats))


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


# ---------------------------------------------------------------------------------------------
# Each family's paired noise (the plan's power lines, and summary.json's `serving.power`)


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
                sd = residual_sd(wide[[a, b]].dropna()) if a in wide and b in wide else None
                if sd is not None:
                    variances.append((sd, f"{a} vs {b} at {float(rate):g} req/s"))
        if variances:
            out[family] = variances
    return out


def power_rows(cells: pd.DataFrame, repeats: int, margins: dict | None = None, design: dict | None = None,
               rates: dict | None = None, source: str = "run") -> list[FamilyPower]:
    """Per family, from a run's cells (a pilot's, or the run's own): the paired noise of its goals' comparisons
    (goodput for the speculation families, median TTFT for chunking; `design`: the families' goals, else every
    pair in goodput) at the loads `rates` names (family -> rates; None: every load of `cells`), the minimum
    detectable relative difference at `repeats` repeats and the family's margin (`family_margin`; None without
    `margins`), as FamilyPower records of `source` ("pilot" or "run")."""
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
            rows.append(FamilyPower(source=source, family=family, metric=metric, paired_sd=sd,
                                    largest_sd=worst[family][0], largest_at=worst[family][1], repeats=repeats,
                                    mdd=minimum_detectable(sd, repeats),
                                    own_repeats=int(cells[cells.family == family].repeat.nunique()), margin=margin))
    return rows


def power(pilot: Path | ServingStudyLayout, repeats: int, margins: dict | None = None, design: dict | None = None,
          rates: dict | None = None) -> list[str]:
    """The plan's power lines: `power_rows` of a pilot's cells.parquet at the run's loads and repeats."""
    path = ServingStudyLayout.of(pilot).cells
    if not path.exists():
        return [f"no pilot at {path}"]
    lines = []
    for row in power_rows(pd.read_parquet(path), repeats, margins, design, rates, source="pilot"):
        sd, mdd, margin, own = row.paired_sd, row.mdd, row.margin, row.own_repeats
        line = (f"{row.family} {row.metric}: paired sd {sd:.1%} (median over its goal comparisons; the largest "
                f"{row.largest_sd:.1%}, {row.largest_at}); minimum detectable difference (95 % CI, power "
                f"{POWER:.0%}) {mdd:.1%} at {repeats} repeats ({minimum_detectable(sd, own):.1%} at the pilot's "
                f"{own})")
        if margin is not None:
            line += (f"; margin {margin:.0%}: " + ("MDD <= margin" if mdd <= margin else "MDD > margin")
                     + " (the family's median comparison at 95 % alone; each goal's own line below decides its power)")
        lines.append(line)
    return lines


def family_power(cells: pd.DataFrame, grid: dict, design: dict, margins: dict) -> list[FamilyPower]:
    """The plan's power rows (from the pilot the profile names, where it is shipped) and this run's own, at the
    run's loads and repeats."""
    repeats, rates = int(grid["repeats"]), grid.get("rates")
    sources = []
    pilot = pilot_path(grid)
    if pilot and pilot.cells.exists():
        sources.append(("pilot", pd.read_parquet(pilot.cells)))
    sources.append(("run", cells))
    return [row for source, frame in sources for row in power_rows(frame, repeats, margins, design, rates, source)]


# ---------------------------------------------------------------------------------------------
# Each goal's power from the pilot


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
    if goal.id.kind == GoalKind.LATENCY_MAPE:
        means = per_repeat_mean(request_values(part, "latency"))
    else:
        errors = request_values(part, "acceptance")
        mine, theirs = (per_repeat_mean(errors[errors.policy == p]) for p in (goal.policy, goal.rival))
        means = (mine - theirs).dropna()
    return {None: float(means.std(ddof=1))} if len(means) >= 2 else {}


def goal_power(planned: list[PlannedGoal], pilot: Path | ServingStudyLayout | None, repeats: int,
               requests: int | None = None) -> list[GoalPower]:
    """Per planned goal, from the pilot's cells (and requests where it shipped them): the MDD at `repeats` (95 % CI
    family-wise, 80 % power: `minimum_detectable` at `goal_level`) of the load that binds (every load: the noisiest;
    some load: the quietest; the picked load: the noisiest, whichever the data pick), whether it is within the
    margin (`powered`), and if not the repeats that would power it (`repeats_to_power`: the least n with
    (t(1 - a/2, n - 1) + t(0.8, n - 1)) sd / sqrt(n) <= margin) and the requests per trace that would at these
    repeats if a run's requests were independent (the SD falling as 1/sqrt(requests): requests x (MDD / margin)^2)."""
    pilot = ServingStudyLayout.of(pilot) if pilot else None
    cells_path = pilot.cells if pilot else None
    cells = pd.read_parquet(cells_path) if cells_path and cells_path.exists() else None
    requests_path = pilot.requests if pilot else None
    pilot_requests = pd.read_parquet(requests_path) if requests_path and requests_path.exists() else None
    rows = []
    for goal in planned:
        level = goal_level(goal, planned)
        sds = _pilot_sds(goal, cells, pilot_requests) if cells is not None else {}
        row = dict(key=goal.key, family=goal.family, metric=goal.metric or "requests", repeats=repeats,
                   confidence=1.0 - level, margin=goal.margin, loads=[r for r in sds if r is not None], load=None,
                   paired_sd=None, mdd=None, powered=None, repeats_needed=None, requests_needed=None)
        if not sds:
            note = ("no pilot: the profile names none, or it is not shipped" if cells is None else
                    "the pilot shipped no requests.parquet, which this statistic is read from"
                    if goal.metric is None and pilot_requests is None else
                    "the pilot has no two repeats of this statistic at the design's loads")
            rows.append(GoalPower(**row, note=note))
            continue
        pick = min if goal.over == "some" else max
        load, sd = pick(sds.items(), key=lambda item: item[1])
        mdd = minimum_detectable(sd, repeats, 1.0 - level)
        row.update(load=load, paired_sd=sd, mdd=mdd)
        if goal.margin is not None:
            row["powered"] = bool(mdd <= goal.margin)
            if not row["powered"]:
                row["repeats_needed"] = repeats_to_power(sd, goal.margin, 1.0 - level)
                row["requests_needed"] = (math.ceil(requests * (mdd / goal.margin) ** 2)
                                          if requests and row["repeats_needed"] else None)
        rows.append(GoalPower(**row, note=""))
    return rows


def goal_power_lines(rows: list[GoalPower]) -> list[str]:
    """The plan's lines on each goal's power (`goal_power`), written to plan.txt before the first run."""
    lines = ["each goal's minimum detectable difference from the pilot, at the profile's repeats n: MDD = (t(1 - a/2, "
             "n - 1) + t(0.80, n - 1)) x sd / sqrt(n), a = 0.05 / (the family's goals) [/ the goal's loads where one "
             "load decides it] (Holm within the family at 95 %: its strictest step); a goal whose MDD exceeds its "
             "margin is reported underpowered, with the least n that powers it"]
    for row in rows:
        if row.mdd is None:
            lines.append(f"  {row.key}: MDD unknown ({row.note})")
            continue
        where = f" at {row.load:g} req/s" if row.load is not None else ""
        line = (f"  {row.key}: MDD {row.mdd:.1%} at {row.repeats} repeats (a = {1 - row.confidence:.4f}; "
                f"the pilot's sd {row.paired_sd:.1%}{where})")
        if row.margin is None:
            line += "; a threshold goal, no margin: its MDD says how far from the threshold it can decide"
        elif row.powered:
            line += f" <= margin {row.margin:.0%}: powered"
        else:
            line += f" > margin {row.margin:.0%}: underpowered; {power_needed(row)}"
        lines.append(line)
    return lines


def power_needed(row: GoalPower, trace: bool = True) -> str:
    """What would power an underpowered goal: repeats, or (`trace`) a longer trace at the same repeats."""
    repeats = (f"{row.repeats_needed} repeats would power it" if row.repeats_needed else
               "no repeat count up to 10,000 would power it")
    longer = (f", or about {row.requests_needed:,} requests per trace at {row.repeats} repeats (if a run's "
              "requests were independent)" if trace and row.requests_needed else "")
    return repeats + longer
