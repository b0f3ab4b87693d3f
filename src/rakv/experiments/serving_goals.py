"""The serving study's goals judged on its data (docs/serving.md, "Goals"): each goal's statistic with its CI, read
by a rule named in the design (rakv.experiments.verdicts), its p-value, and its one final verdict.

Rules: non-inferiority within an equivalence margin against baselines named before the run, superiority at some
load, an SLO met at a load at least every fixed budget's, and errors below a threshold; each can answer met, missed
or inconclusive. Each tested goal's p-value (`p_value`, its loads corrected within it: `over_loads`) is
Holm-adjusted within its family (`family_wise`); a goal the plan found underpowered (rakv.experiments.serving_power
.goal_power) is "underpowered" whatever the run shows, and a goal the data cannot answer is "missing", with why.
Every goal ends with one of rakv.experiments.verdicts.GOAL_VERDICTS, so the tally sums to the goals.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from rakv.experiments.intervals import t_interval
from rakv.experiments.replication import holm
from rakv.experiments.serving_cells import (
    judged_loads,
    paired_values,
    per_repeat_mean,
    rates_of,
    relative_interval,
    request_values,
    runs,
)
from rakv.experiments.serving_power import (
    ALPHA,
    GoalId,
    GoalKind,
    PlannedGoal,
    family_margin,
    goodput_goals,
    power_needed,
)
from rakv.experiments.summary_serving import AcceptanceErrors, Goal, GoalPair, GoalPower, LatencyMape
from rakv.experiments.verdicts import DECIDED, Side, Verdict, all_of, any_of, below, higher, non_inferior
from rakv.runtime.json_records import CI


@dataclass(frozen=True)
class TestedGoal:
    """A goal judged on the data, before its family's Holm correction (`family_wise` gives its final verdict): its
    name, its words (`goal`), its statistic and CI ([value, low, high]), its rule, its p-value and the answer the
    test decides (`side`, `p_value`), and why the data cannot answer it (`missing`; None where they can). `rival`,
    `rate`, `unit` and `status` are what the summary shows beside it (None: the goal has none)."""
    id: GoalId
    goal: str
    ci: list[float]
    rule: str
    p_value: float
    side: Verdict
    missing: str | None
    rival: str | None = None
    rate: float | None = None
    unit: str | None = None
    status: dict[str, dict[str, str]] | None = None

    @property
    def key(self) -> str:
        return self.id.key

    @property
    def verdict(self) -> Verdict:
        """Its verdict at 95 % alone, before the family's Holm correction."""
        if self.p_value < ALPHA:
            return self.side
        return Verdict.MISSING if self.missing else Verdict.INCONCLUSIVE


def p_value(decide) -> tuple[float, Verdict]:
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


def tested(goal_id: GoalId, words: str, ci, rule: str, decide, missing: str | None = None, **shown) -> TestedGoal:
    """A goal with its test: `p_value(decide)` and the side it decides, and `missing`, why the data cannot answer it
    (None where they can)."""
    p, side = p_value(decide)
    return TestedGoal(goal_id, words, list(ci), rule, p, side, missing, **shown)


def over_loads(boths: list, rule, every: bool, unmeasured: int = 0):
    """decide(alpha) of a goal over loads (each a paired frame, `relative_interval`; `rule`: a CI -> a Verdict):
    `every` load must meet it (rakv.experiments.verdicts.all_of) or `some` load (any_of). The side that needs only
    one load of L is read at 1 - alpha / L (Bonferroni over the goal's loads: it had L tries), the other at
    1 - alpha (it must hold at each, an intersection). `unmeasured` loads of the design count in L and forbid the
    answer that needs them all."""
    count = len(boths) + unmeasured
    combine = all_of if every else any_of

    def decide(alpha: float) -> Verdict:
        once = [rule(relative_interval(b, 1.0 - alpha / count)) for b in boths]
        each = [rule(relative_interval(b, 1.0 - alpha)) for b in boths]
        return combine(each, once, complete=not unmeasured)
    return decide


def _unmeasured(rates: dict | None, family: str, measured: list[float]) -> list[float]:
    """The design's loads of `family` (the profile's rates) that the data lack: the run was measured without them."""
    planned = {float(r) for r in ((rates or {}).get(family) or [])}
    return sorted(planned - set(measured))


def _loads_text(loads) -> str:
    return ", ".join(f"{r:g}" for r in loads) + " req/s"


# ---------------------------------------------------------------------------------------------
# The speculation families: goodput and output throughput against the design's baselines


WORDS = {  # a goodput goal's words but "no worse"'s
    GoalKind.HIGHER: "{a} goodput higher than {rival}",
    GoalKind.PART_ACCEPTANCE: "the prefix-keyed acceptance's part: {a} goodput higher than {rival} (load-aware k, "
                              "EWMA acceptance)",
    GoalKind.PART_LOAD_AWARE: "load-aware k's part: {a} (EWMA acceptance) goodput higher than {rival}",
}


def _load_rule(kind: GoalKind, margin: float):
    return (lambda ci: non_inferior(ci, margin)) if kind == GoalKind.NO_WORSE else higher


def speculation_goals(data: dict, design: dict, margins: dict,
                      rates: dict | None = None) -> tuple[list[TestedGoal], list[GoalPair]]:
    """Per speculation family (one naming `no_worse_than`): RAKV-ASD's goodput against each named baseline, no worse
    within the margin at every judged load (rakv.experiments.serving_cells.judged_loads) and higher than the field's
    rules at some judged load; its output throughput at the design's highest (saturating) load no worse than each
    baseline; and, where the design names an `ablation` arm (load-aware k with the EWMA acceptance), which of
    RAKV-ASD's two differences pays: RAKV-ASD against the arm (the prefix-keyed acceptance's part) and the arm
    against the fixed k (load-aware k's part), each higher at some judged load. `rates`: the design's loads per
    family (the profile's); a load there but not in the data makes a goal that needs it "missing", named. Returns
    (goals, each with its p-value; the per-rate pairs they are read from, a pair at a load that is not judged
    carrying `judged` false)."""
    goals, pairs = [], []
    for family, spec in design.items():
        named = spec.get("goals") or {}
        if "no_worse_than" not in named or family not in set(runs(data).family):
            continue
        margin = family_margin(margins, design, family, "goodput")
        judged, measured = judged_loads(data, family), rates_of(data, family)
        unmeasured = _unmeasured(rates, family, measured)
        for kind, a, rival in goodput_goals(named):
            per_rate = []
            for rate in measured:
                both = paired_values(data, family, rate, a, rival, "goodput")
                ci = relative_interval(both)
                one = _load_rule(kind, margin)(ci)
                per_rate.append((rate, ci, one, both))
                pairs.append(GoalPair(family=family, rate=rate, policy=a, against=rival, metric="goodput", kind=kind,
                                      ci=CI(*ci), verdict=one,
                                      judged=judged.get(rate, False)))
            goals.append(_goodput_goal(GoalId(family, kind, rival), a, per_rate, judged, margin, unmeasured))
        goals += _throughput_goals(data, family, named, measured, margin, unmeasured)
    return goals, pairs


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


def _goodput_goal(goal_id: GoalId, a: str, per_rate, judged, margin, unmeasured=()) -> TestedGoal:
    """One goodput goal over its loads (`per_rate`: every measured load's (rate, CI, verdict, pairs)): tested where
    judged (`over_loads`), the CI shown from the worst (no worse) or the best (higher) judged load (every load where
    none is judged)."""
    family, kind, rival = goal_id.family, goal_id.kind, goal_id.rival
    scored = [p for p in per_rate if judged.get(p[0])]
    shown = scored or per_rate
    loads = [f"{r:g}" for r, *_ in scored]
    where = (f"judged at {', '.join(loads)} req/s" if loads else
             "no load judged: every request of every policy met every SLO")
    decide = over_loads([p[3] for p in scored], _load_rule(kind, margin), kind == GoalKind.NO_WORSE, len(unmeasured))
    missing = _goodput_missing(scored, list(unmeasured), rival)
    corrected = "Holm within the family; the side one load decides Bonferroni-corrected for the loads"
    if kind == GoalKind.NO_WORSE:
        rate, ci, *_ = min(shown, key=lambda p: p[1][0] if np.isfinite(p[1][0]) else -np.inf)
        return tested(
            goal_id, f"{family}: {a} goodput no worse than {rival} (margin {margin:.0%}) at every judged load; worst "
            f"at {rate:g} req/s ({where})", ci, f"per judged load: met if the CI of the relative difference lies "
            f"above -{margin:.0%}, missed if below it; met at every judged load, missed at some ({corrected})",
            decide, missing, rival=rival, rate=rate, unit="relative")
    rate, ci, *_ = max(shown, key=lambda p: p[1][1] if np.isfinite(p[1][1]) else -np.inf)
    words = WORDS[kind].format(a=a, rival=rival)
    return tested(
        goal_id, f"{family}: {words} at some judged load; best at {rate:g} req/s ({where})", ci,
        f"per judged load: met if the CI of the relative difference lies above 0, missed if below 0; met at some "
        f"judged load, missed at every one ({corrected})", decide, missing, rival=rival, rate=rate, unit="relative")


def _throughput_goals(data, family, named, measured, margin, unmeasured=()) -> list[TestedGoal]:
    """Output throughput at the design's highest load (saturation: the server, not the arrivals, sets it), no worse
    than each named baseline within the margin; judged whatever the SLOs."""
    top = max([*measured, *unmeasured], default=None)
    if top is None:
        return []
    ours, goals = named["ours"], []
    missing = None if top in measured else f"{_loads_text([top])} in the design but not in the data"
    for rival in named["no_worse_than"]:
        both = paired_values(data, family, top, ours, rival, "output_throughput") if not missing else None
        goals.append(tested(
            GoalId(family, GoalKind.THROUGHPUT, rival),
            f"{family}: {ours} output throughput no worse than {rival} (margin {margin:.0%}) at the highest load, "
            f"{top:g} req/s", relative_interval(both),
            f"met if the CI of the relative difference lies above -{margin:.0%}, missed if below it (Holm within "
            "the family)", over_loads([both] if both is not None else [], lambda ci: non_inferior(ci, margin), True),
            missing or (None if both is not None else "no interval: a policy lacks runs at that load"),
            rival=rival, rate=top, unit="relative"))
    return goals


# ---------------------------------------------------------------------------------------------
# Chunking: the ITL SLO's reach and the TTFT it costs


class SloStatus(enum.StrEnum):
    """A policy's p99 ITL at one load against the SLO, as summary.json's `serving.goals[].status` writes it: the
    words of rakv.experiments.verdicts.below's met (meets), missed (fails) and the rest (unclear)."""
    MEETS = "meets"
    FAILS = "fails"
    UNCLEAR = "unclear"


def slo_status_of(ci, slo_ms: float) -> SloStatus:
    """Whether a p99 ITL CI lies wholly under the SLO (`below`), in the status table's words."""
    return {Verdict.MET: SloStatus.MEETS, Verdict.MISSED: SloStatus.FAILS}.get(below(ci, slo_ms), SloStatus.UNCLEAR)


def slo_status(table: pd.DataFrame, family: str, policy: str, slo_ms: float) -> dict[float, SloStatus]:
    """rate -> meets (p99 ITL CI wholly under the SLO), fails (wholly over) or unclear."""
    rows = table[(table.family == family) & (table.policy == policy)].sort_values("rate")
    return {float(row.rate): slo_status_of((row.p99_itl_ms, row.p99_itl_ms_low, row.p99_itl_ms_high), slo_ms)
            for row in rows.itertuples(index=False)}


def slo_status_at(data: dict, family: str, policy: str, slo_ms: float, confidence: float) -> dict[float, SloStatus]:
    """slo_status with every p99 ITL CI at `confidence` (the t interval over repeats)."""
    cells = runs(data)
    part = cells[(cells.family == family) & (cells.policy == policy)]
    return {float(rate): slo_status_of(t_interval(group.p99_itl_ms.astype(float), confidence), slo_ms)
            for rate, group in part.groupby("rate")}


def reach(status: dict[float, SloStatus], sure: bool) -> float:
    """The highest rate up to which every rate `meets` the SLO (sure) or does not `fail` it (not sure); 0: none."""
    best = 0.0
    for rate in sorted(status):
        if status[rate] == SloStatus.MEETS or (not sure and status[rate] == SloStatus.UNCLEAR):
            best = rate
        else:
            break
    return best


def reach_verdict(status: dict[str, dict[float, SloStatus]], ours: str, fixed: list[str]) -> Verdict:
    """met if the loads `ours` surely meets the SLO at reach every fixed budget's possible ones, missed if a fixed
    budget surely meets it where `ours` surely fails, else inconclusive."""
    sure = {p: reach(s, True) for p, s in status.items()}
    maybe = {p: reach(s, False) for p, s in status.items()}
    if all(sure[ours] >= maybe[f] for f in fixed):
        return Verdict.MET
    return Verdict.MISSED if any(sure[f] > maybe[ours] for f in fixed) else Verdict.INCONCLUSIVE


def _slo_reach_decide(data, ours, fixed, slo, unmeasured):
    """decide(alpha) of the SLO-reach goal: met read with every p99 ITL CI at 1 - alpha (it needs all of them), missed
    at 1 - alpha / (fixed budgets) (any one budget surely ahead suffices)."""
    def decide(alpha: float) -> Verdict:
        at = lambda confidence: {p: slo_status_at(data, "chunking", p, slo, confidence)  # noqa: E731
                                 for p in [ours, *fixed]}
        if reach_verdict(at(1.0 - alpha / len(fixed)), ours, fixed) == Verdict.MISSED:
            return Verdict.MISSED
        met = not unmeasured and reach_verdict(at(1.0 - alpha), ours, fixed) == Verdict.MET
        return Verdict.MET if met else Verdict.INCONCLUSIVE
    return decide


def chunking_goals(data: dict, table: pd.DataFrame, design: dict, margins: dict,
                   rates: dict | None = None) -> list[TestedGoal]:
    spec = design.get("chunking") or {}
    named = spec.get("goals") or {}
    cells = runs(data)
    if "ours" not in named or "chunking" not in set(cells.family):
        return []
    ours, fixed, baseline = named["ours"], list(named["fixed"]), named["ttft_baseline"]
    slo = float(cells[cells.family == "chunking"].slo_itl_ms.median())
    unmeasured = _unmeasured(rates, "chunking", rates_of(data, "chunking"))
    status = {p: slo_status(table, "chunking", p, slo) for p in [ours, *fixed]}
    sure = {p: reach(s, True) for p, s in status.items()}
    maybe = {p: reach(s, False) for p, s in status.items()}
    rival = max(fixed, key=lambda f: (maybe[f], sure[f]))
    missing = f"{_loads_text(unmeasured)} in the design but not in the data" if unmeasured else None
    goals = [tested(
        GoalId("chunking", GoalKind.SLO_REACH),
        f"chunking: {ours} meets the ITL SLO ({slo:.0f} ms p99) up to a load >= every fixed budget's (it: "
        f"{sure[ours]:g} req/s surely; best fixed {rival}: {maybe[rival]:g} at most)", [sure[ours], None, None],
        "per load the p99 ITL CI wholly under the SLO (meets) or over (fails); met if the loads it surely "
        "meets reach every fixed budget's possible ones, missed if a fixed budget surely meets where it "
        "surely fails (that side's CIs Bonferroni-corrected over the fixed budgets; Holm within the family)",
        _slo_reach_decide(data, ours, fixed, slo, unmeasured), missing, rival=rival, unit="req/s",
        status={p: {f"{rate:g}": v for rate, v in by_rate.items()} for p, by_rate in status.items()})]
    margin = family_margin(margins, design, "chunking", "ttft")
    rate = sure[baseline] or rates_of(data, "chunking")[0]
    both = paired_values(data, "chunking", rate, ours, baseline, "median_ttft_ms")
    goals.append(tested(
        GoalId("chunking", GoalKind.TTFT, baseline),
        f"chunking: {ours} median TTFT no worse than {baseline} (margin {margin:.0%}) at {rate:g} req/s, the highest "
        f"load {baseline} meets the SLO", relative_interval(both),
        f"met if the CI of the relative difference lies below +{margin:.0%}, missed if above it (Holm within the "
        "family)", over_loads([both] if both is not None else [], lambda ci: non_inferior(ci, margin, worse=Side.ABOVE),
                              True),
        None if both is not None else f"no interval at {rate:g} req/s", rival=baseline, rate=rate, unit="relative"))
    return goals


# ---------------------------------------------------------------------------------------------
# Predictions: admission's service time, the acceptance at admission


def latency_goals(requests: pd.DataFrame, threshold: float) -> tuple[list[TestedGoal], dict[str, LatencyMape]]:
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
        detail[family] = LatencyMape(
            served=ci, requests=int(len(part)),
            batch_one=t_interval(per_repeat_mean(one)) if len(one) else [float("nan")] * 3,
            by_rate={f"{rate:g}": t_interval(per_repeat_mean(g)) for rate, g in part.groupby("rate")})
        goals.append(tested(
            GoalId(family, GoalKind.LATENCY_MAPE),
            f"{family}: serving latency MAPE (admission's prediction under load) < {threshold:.0%}", ci,
            f"met if the CI lies below {threshold:.0%}, missed if above (Holm within the family)",
            lambda alpha, means=means: below(t_interval(means, 1.0 - alpha), threshold),
            None if np.isfinite(ci[1]) else "no interval: fewer than two repeats", unit="fraction"))
    return goals, detail


def acceptance_goals(requests: pd.DataFrame, design: dict) -> tuple[list[TestedGoal], dict[str, AcceptanceErrors]]:
    """The acceptance family: |alpha at admission - realised| under the prefix-keyed source against the EWMA
    (paired by repeat), and each source's mean error and ex-post regret."""
    named = (design.get("acceptance") or {}).get("goals") or {}
    part = requests[requests.family == "acceptance"]
    if "ours" not in named or not len(part):
        return [], {}
    ours, baseline = named["ours"], named["baseline"]
    errors, regret = request_values(part, "acceptance"), request_values(part, "regret")
    sources = {}
    for policy in (baseline, ours):
        sources[policy] = AcceptanceErrors(
            acceptance_error=t_interval(per_repeat_mean(errors[errors.policy == policy])),
            regret=t_interval(per_repeat_mean(regret[regret.policy == policy])) if len(regret) else [float("nan")] * 3)
    a, b = per_repeat_mean(errors[errors.policy == ours]), per_repeat_mean(errors[errors.policy == baseline])
    common = sorted(set(a.index) & set(b.index))
    differences = [a[r] - b[r] for r in common]
    ci = t_interval(differences)
    sources[ours] = replace(sources[ours], vs_baseline=ci)
    goal = tested(GoalId("acceptance", GoalKind.ACCEPTANCE_ERROR, baseline),
                  f"acceptance: |alpha at admission - realised| lower with {ours} than with {baseline} "
                  f"({sources[baseline].acceptance_error[0]:.3f}), difference", ci,
                  "met if the CI of the paired difference lies below 0, missed if above (Holm within the family)",
                  lambda alpha: below(t_interval(differences, 1.0 - alpha), 0.0),
                  None if np.isfinite(ci[1]) else "no interval: no acceptance errors in two repeats or more",
                  rival=baseline, unit="alpha")
    return [goal], sources


# ---------------------------------------------------------------------------------------------
# The family-wise verdicts


def family_wise(goals: list[TestedGoal], planned: list[PlannedGoal], power: list[GoalPower]) -> list[Goal]:
    """Every goal's one verdict (rakv.experiments.verdicts.GOAL_VERDICTS), in the plan's order (a goal the data gave
    but the plan lacks after them): "underpowered" where the plan found its MDD above its margin (`power`, with what
    would power it); else Holm's step-down within its family over all the family's goals (one untested counts with
    p = 1): met or missed where the Holm-adjusted p < 0.05 (the side its CIs lie on), else "missing" where the data
    cannot answer it (with why), else inconclusive. A planned goal the data lack is "missing", counted."""
    by_id = {g.id: g for g in goals}
    order = list(dict.fromkeys([*(g.id for g in planned), *by_id]))
    weak = {row.key: row for row in power if row.powered is False}
    adjusted = {}
    for family in dict.fromkeys(i.family for i in order):
        ids = [i for i in order if i.family == family]
        tested_p = [by_id[i].p_value if i in by_id and i.key not in weak else 1.0 for i in ids]
        adjusted.update(zip(ids, holm(tested_p)))
    return [_final(i, by_id.get(i), weak.get(i.key), adjusted[i]) for i in order]


def _final(goal_id: GoalId, goal: TestedGoal | None, weak: GoalPower | None, p_holm: float) -> Goal:
    """One goal's verdict (family_wise): missing where its data are incomplete (unless Holm decided it from what is
    there), underpowered where the plan said so, else Holm's."""
    if goal is None:
        return Goal(goal=f"{goal_id.key}: named by the design, not in the data", key=goal_id.key,
                    ci=CI(None, None, None), verdict=Verdict.MISSING, rule="--", family=goal_id.family,
                    reason="not in the data: its family was not served, or none of its requests finished")

    def final(verdict: Verdict, **test) -> Goal:
        shown = {name: value for name in ("rival", "rate", "unit", "status")
                 if (value := getattr(goal, name)) is not None}
        return Goal(goal=goal.goal, key=goal.key, ci=CI(*goal.ci), verdict=verdict,
                    rule=goal.rule, family=goal_id.family, **shown, **test)

    if weak and not goal.missing:
        return final(Verdict.UNDERPOWERED, reason=f"the plan's MDD {weak.mdd:.1%} at {weak.repeats} repeats exceeds "
                                                  f"the margin {weak.margin:.0%}: {power_needed(weak, trace=False)}")
    test = {"p_value": goal.p_value, "p_holm": p_holm} if not weak else {}
    if not weak and p_holm < ALPHA:
        return final(goal.side, **test)
    if goal.missing:
        return final(Verdict.MISSING, **test, reason=goal.missing + (
            f"; underpowered besides (MDD {weak.mdd:.1%} at {weak.repeats} repeats > {weak.margin:.0%})"
            if weak else ""))
    return final(Verdict.INCONCLUSIVE, **test)

