"""The serving study's statistics (rakv.experiments.serving_cells, serving_power, serving_goals): the interval
method's coverage at the study's repeat count (simulated), the power arithmetic, and the goal rules answering met,
missed and inconclusive."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rakv.experiments import serving_cells as sc
from rakv.experiments import serving_goals as sg
from rakv.experiments import serving_power as sp
from rakv.experiments.intervals import t_interval
from rakv.experiments.serving_power import GoalId, GoalKind
from rakv.experiments.verdicts import Verdict, all_of, any_of, below, ci_side, higher, non_inferior, tally
from rakv.runtime.json_records import ABSENT, CI
from rakv.runtime.paths import conf_file
from rakv.runtime.run_layout import ServingStudyLayout

REPEATS = int(conf_file("profile/offline.yaml").profile.serving.repeats)  # the study's repeat count


def coverage(draw, repeats, truth, trials=4000, seed=0):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        _, low, high = t_interval(draw(rng, repeats))
        hits += low <= truth <= high
    return hits / trials


def test_the_t_interval_holds_its_level_at_the_studys_repeat_count():
    assert REPEATS >= 5
    normal = coverage(lambda rng, n: rng.normal(0.3, 1.0, n), REPEATS, 0.3)
    assert 0.93 <= normal <= 0.97, normal
    # skewed per-repeat differences (a lognormal, centred on its mean): somewhat below the level, not far
    mean = np.exp(0.5 * 0.5 ** 2)
    skewed = coverage(lambda rng, n: rng.lognormal(0.0, 0.5, n) - mean, REPEATS, 0.0)
    assert skewed >= 0.88, skewed


def test_the_percentile_bootstrap_over_three_repeats_covers_far_less_than_it_says():
    """Why the study left it: 3 repeats give 10 distinct resamples and the range of the three as the interval."""
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(2000):
        x = rng.normal(0.0, 1.0, 3)
        draws = [rng.choice(x, 3).mean() for _ in range(200)]
        low, high = np.percentile(draws, [2.5, 97.5])
        hits += low <= 0.0 <= high
    assert hits / 2000 < 0.85


def test_the_minimum_detectable_difference_is_detected_with_the_stated_power():
    sd, n = 0.08, REPEATS
    mdd = sp.minimum_detectable(sd, n)
    rng = np.random.default_rng(2)
    detected = np.mean([t_interval(rng.normal(mdd, sd, n))[1] > 0 for _ in range(4000)])
    assert abs(detected - sp.POWER) < 0.04, detected
    assert sp.minimum_detectable(sd, 10) < mdd and sp.minimum_detectable(sd, 1) == float("inf")


finite = st.floats(-1, 1, allow_nan=False)


@given(finite, finite, finite, st.floats(0.01, 0.3))
def test_every_goal_rule_can_say_met_missed_or_inconclusive(a, b, c, margin):
    low, value, high = sorted((a, b, c))
    ci = [value, low, high]
    ni = non_inferior(ci, margin)
    assert ni == ("met" if low > -margin else "missed" if high < -margin else "inconclusive")
    assert non_inferior([-v for v in (value, high, low)], margin, worse="above") == ni  # the mirror image
    hi = higher(ci)
    assert hi == ("met" if low > 0 else "missed" if high < 0 else "inconclusive")
    assert below(ci, 0.1) == ("met" if high < 0.1 else "missed" if low > 0.1 else "inconclusive")


SWAP = {"met": "missed", "missed": "met", "inconclusive": "inconclusive", "missing": "missing"}


def reflect(ci, about):
    value, low, high = ci
    return [2 * about - value, 2 * about - high, 2 * about - low]


@given(finite, finite, finite, st.floats(0.01, 0.3), st.floats(-0.5, 0.5))
def test_every_rule_is_symmetric_about_its_threshold_and_agrees_with_ci_side(a, b, c, margin, threshold):
    """Reflecting a CI about a rule's threshold swaps met and missed and keeps inconclusive; each rule's answer is
    ci_side's about that threshold (no zone where one side of it is read as the other)."""
    low, value, high = sorted((a, b, c))
    ci = [value, low, high]
    rules = [(lambda x: higher(x, threshold), threshold, {"above": "met", "below": "missed"}),
             (lambda x: below(x, threshold), threshold, {"below": "met", "above": "missed"}),
             (lambda x: non_inferior(x, margin), -margin, {"above": "met", "below": "missed"}),
             (lambda x: non_inferior(x, margin, worse="above"), margin, {"below": "met", "above": "missed"})]
    for rule, about, reading in rules:
        assert rule(reflect(ci, about)) == SWAP[rule(ci)]
        assert rule(ci) == reading.get(ci_side(ci, about, point_if_no_interval=False), "inconclusive")


def test_the_rules_over_loads():
    assert all_of(["met", "met"]) == "met" and all_of(["met", "inconclusive"]) == "inconclusive"
    assert all_of(["met", "missed"]) == "missed"
    assert any_of(["missed", "met"]) == "met" and any_of(["missed", "missed"]) == "missed"
    assert any_of(["missed", "inconclusive"]) == "inconclusive" and any_of(["missing", "missing"]) == "missing"
    assert non_inferior([0.0, float("nan"), float("nan")], 0.1) == "missing"  # a scalar is not judged


def cells_frame(values: dict) -> pd.DataFrame:
    """cells.parquet-like rows: values[(rate, policy)] = per-repeat goodput / p99 ITL / median TTFT."""
    rows = []
    for (rate, policy), per_repeat in values.items():
        for repeat, (goodput, itl, ttft) in enumerate(per_repeat):
            rows.append({"family": "chunking", "rate": rate, "policy": policy, "repeat": repeat, "goodput": goodput,
                         "p99_itl_ms": itl, "median_ttft_ms": ttft, "output_throughput": 1.0, "concurrency": 1.0,
                         "configuration": "x", "slo_itl_ms": 100.0})
    return pd.DataFrame(rows)


def test_paired_differences_are_per_repeat_and_relative_to_the_baseline():
    frame = cells_frame({(1.0, "a"): [(2.0, 0, 0), (3.0, 0, 0), (4.0, 0, 0)],
                         (1.0, "b"): [(1.0, 0, 0), (2.0, 0, 0), (3.0, 0, 0)]})
    ci = sc.paired_difference({"cells": frame}, "chunking", 1.0, "a", "b", "goodput")
    assert ci[0] == pytest.approx(0.5) and -1.0 < ci[1] < 0.5 < ci[2]  # 9 / 6 - 1, its interval over 3 repeats
    same = cells_frame({(1.0, "a"): [(2.0, 0, 0), (4.0, 0, 0), (6.0, 0, 0)],
                        (1.0, "b"): [(1.0, 0, 0), (2.0, 0, 0), (3.0, 0, 0)]})
    ci = sc.paired_difference({"cells": same}, "chunking", 1.0, "a", "b", "goodput")
    assert ci == pytest.approx([1.0, 1.0, 1.0])  # twice the baseline in every repeat: no spread
    halved = cells_frame({(1.0, "a"): [(0.0, 0, 0), (0.1, 0, 0), (0.0, 0, 0)],
                          (1.0, "b"): [(1.0, 0, 0), (2.0, 0, 0), (3.0, 0, 0)]})
    assert sc.paired_difference({"cells": halved}, "chunking", 1.0, "a", "b", "goodput")[1] >= -1.0


def test_the_slo_reach_rule_can_meet_miss_and_be_unsure():
    design = {"chunking": {"goals": {"ours": "ours", "fixed": ["f"], "ttft_baseline": "f"}}}
    margins = {"ttft": 0.1}

    def verdict(ours_itl, fixed_itl):
        frame = cells_frame({(1.0, "ours"): [(1, i, 100) for i in ours_itl[0]],
                             (4.0, "ours"): [(1, i, 100) for i in ours_itl[1]],
                             (1.0, "f"): [(1, i, 100) for i in fixed_itl[0]],
                             (4.0, "f"): [(1, i, 100) for i in fixed_itl[1]]})
        data = {"cells": frame}
        return sg.chunking_goals(data, sc.cell_table(data), design, margins)[0].verdict

    under, over, around = [50, 52, 51], [150, 152, 151], [60, 140, 100]
    assert verdict((under, under), (under, over)) == "met"
    assert verdict((under, over), (under, under)) == "missed"
    assert verdict((under, around), (under, under)) == "inconclusive"


def test_a_draft_configurations_requests_have_no_ex_post_regret_and_that_is_not_an_error():
    requests = pd.DataFrame({"family": ["acceptance"] * 2, "policy": ["ewma", "prefix-keyed"], "status": "ok",
                             "repeat": 0, "alpha": [0.5, 0.6], "realised_alpha": [0.7, 0.7]})
    assert sc.request_values(requests, "regret").empty
    goals, stats = sg.acceptance_goals(requests, {"acceptance": {"goals": {"ours": "prefix-keyed",
                                                                              "baseline": "ewma"}}})
    assert goals[0].verdict == "missing" and stats["ewma"].acceptance_error[0] == pytest.approx(0.2)


def speculation_cells(goodput: dict, throughput: float = 1.0) -> pd.DataFrame:
    """cells.parquet-like rows of the speculation family: goodput[(rate, policy)] = per-repeat (goodput, requests/s)."""
    rows = []
    for (rate, policy), per_repeat in goodput.items():
        for repeat, (good, done) in enumerate(per_repeat):
            rows.append({"family": "speculation", "rate": rate, "policy": policy, "repeat": repeat, "goodput": good,
                         "request_throughput": done, "failed": 0, "output_throughput": throughput * done})
    return pd.DataFrame(rows)


def test_goodput_goals_are_judged_only_where_some_policy_misses_an_slo():
    """At 1 req/s every request of both policies meets every SLO (goodput = the completion rate): that load is
    reported, not scored, however the two differ; at 8 req/s the baseline misses some, and the goal is judged there."""
    design = {"speculation": {"goals": {"ours": "ours", "no_worse_than": ["base"], "higher_than": ["base"]}}}
    worse = [(0.5, 0.5), (0.52, 0.52), (0.49, 0.49)]  # ours 50 % below the baseline, every request in its SLOs
    frame = speculation_cells({(1.0, "ours"): worse, (1.0, "base"): [(1.0, 1.0), (1.02, 1.02), (0.98, 0.98)],
                               (8.0, "ours"): [(4.0, 4.0), (4.1, 4.1), (3.9, 3.9)],
                               (8.0, "base"): [(2.0, 4.0), (2.1, 4.1), (1.9, 3.9)]})
    data = {"cells": frame}
    assert sc.judged_loads(data, "speculation") == {1.0: False, 8.0: True}
    goals, pairs = sg.speculation_goals(data, design, {"goodput": 0.1})
    by_id = {g.id: g for g in goals}
    assert by_id[GoalId("speculation", GoalKind.NO_WORSE, "base")].verdict == "met"  # judged at 8 only: ours doubles
    assert by_id[GoalId("speculation", GoalKind.HIGHER, "base")].verdict == "met"
    assert {(p.rate, p.judged) for p in pairs} == {(1.0, False), (8.0, True)}
    only_low = {"cells": frame[frame.rate == 1.0]}
    goals, _ = sg.speculation_goals(only_low, design, {"goodput": 0.1})
    goodput = [g for g in goals if g.id.kind != GoalKind.THROUGHPUT]
    assert {g.verdict for g in goodput} == {"missing"}  # counted, explained
    assert all("no load where a policy missed an SLO" in g.missing for g in goodput)
    # the highest load's throughput goal is judged whatever the SLOs: ours is 50 % lower there
    assert next(g for g in goals if g.id == GoalId("speculation", GoalKind.THROUGHPUT, "base")).verdict == "missed"
    assert [g.key for g in goals] == ["speculation/no_worse/base", "speculation/higher/base",
                                      "speculation/throughput/base"]  # summary.json's keys


def test_the_ablation_arm_says_which_part_pays():
    design = {"speculation": {"goals": {"ours": "ours", "no_worse_than": ["k2"], "ablation": "arm",
                                        "fixed_k": "k2"}}}
    slo_missed = lambda good: [(good * f, 4.0 * f) for f in (1.0, 1.02, 0.98)]  # noqa: E731
    frame = speculation_cells({(8.0, "ours"): slo_missed(3.0), (8.0, "arm"): slo_missed(3.0),
                               (8.0, "k2"): slo_missed(2.0)})
    goals, _ = sg.speculation_goals({"cells": frame}, design, {"goodput": 0.1})
    by_kind = {g.id.kind: g.verdict for g in goals}
    # the arm (load-aware k, EWMA acceptance) already has all of ours' gain over k2: load-aware k pays, the
    # prefix-keyed acceptance adds nothing measurable
    assert by_kind[GoalKind.PART_LOAD_AWARE] == "met"
    assert by_kind[GoalKind.PART_ACCEPTANCE] in ("inconclusive", "missed")
    assert {g.key for g in goals} >= {"speculation/part/load_aware", "speculation/part/acceptance"}


def test_a_familys_own_margin_decides_its_no_worse_goal():
    """Ours 20 % below the baseline at a judged load: missed against the 10 % default, met within a family's own
    25 % margin (the design's `margins`), and the goal's words name the margin it was judged by."""
    named = {"ours": "ours", "no_worse_than": ["base"]}
    per = lambda good: [(good * f, 4.0 * f) for f in (1.0, 1.01, 0.99)]  # noqa: E731  (every run misses SLOs)
    data = {"cells": speculation_cells({(8.0, "ours"): per(2.4), (8.0, "base"): per(3.0)})}
    default = {"speculation": {"goals": named}}
    own = {"speculation": {"goals": named, "margins": {"goodput": 0.25}}}
    verdict = lambda design: next(g for g in sg.speculation_goals(data, design, {"goodput": 0.1, "ttft": 0.3})[0]  # noqa: E731
                                  if g.id.kind == GoalKind.NO_WORSE)
    assert verdict(default).verdict == "missed" and "margin 10%" in verdict(default).goal
    assert verdict(own).verdict == "met" and "margin 25%" in verdict(own).goal
    assert sp.family_margin({"goodput": 0.1, "ttft": 0.3}, own, "speculation", "ttft") == 0.3  # the default


def test_the_plans_power_is_computed_at_the_loads_the_run_serves(tmp_path):
    """A pilot load the run will not serve does not set the plan's noise: the noisy 6 req/s cell leaves the paired
    SD when the run's rates leave it out."""
    rng = np.random.default_rng(0)
    values = {}
    for rate, spread in ((4.0, 0.01), (6.0, 0.5)):
        base = 3.0 + spread * rng.standard_normal(5)
        values[(rate, "base")] = [(g, 4.0) for g in base]
        values[(rate, "ours")] = [(g * (1 + spread * z), 4.0) for g, z in zip(base, rng.standard_normal(5))]
    speculation_cells(values).to_parquet(ServingStudyLayout(tmp_path).cells)
    design = {"speculation": {"goals": {"ours": "ours", "no_worse_than": ["base"]}, "margins": {"goodput": 0.05}}}
    every = sp.power(tmp_path, 5, {"goodput": 0.1, "ttft": 0.3}, design)[0]
    served = sp.power(tmp_path, 5, {"goodput": 0.1, "ttft": 0.3}, design, rates={"speculation": [4]})[0]
    assert "margin 5%" in served and "MDD <= margin" in served
    assert "MDD > margin" in every


def test_a_no_worse_goal_met_below_zero_is_named_as_measurably_lower():
    from types import SimpleNamespace

    from rakv.experiments.prose_serving import met_but_lower_sentence
    from rakv.experiments.summary_serving import Goal

    def goal(key, value, low, high, verdict="met"):
        return Goal(goal=key, key=key, ci=CI(value, low, high), verdict=verdict, rule="r",
                    family="speculation-draft", rival="k0", rate=32.0, unit="relative")

    lower = goal("speculation-draft/no_worse/k0", -0.099, -0.138, -0.058)
    straddles = goal("speculation-draft/no_worse/k2", -0.02, -0.05, 0.01)
    missed = goal("speculation-draft/no_worse/smartspec", -0.6, -0.7, -0.5, verdict="missed")
    text = met_but_lower_sentence(SimpleNamespace(goals=[lower, straddles, missed]))
    assert text.startswith("1 ``no worse'' goal is met") and "against k0" in text and "k2" not in text
    assert met_but_lower_sentence(SimpleNamespace(goals=[straddles])) == ""


# ---------------------------------------------------------------------------------------------
# Goals fixed before the data: their power from the pilot, Holm within a family, loads corrected, the tally


def pairs_frame(ours, base):
    """Paired per-repeat values of two policies (columns ours, base), as paired_values returns them."""
    return pd.DataFrame({"ours": ours, "base": base})


positive = st.lists(st.floats(0.5, 2.0), min_size=REPEATS, max_size=REPEATS)


@given(positive, positive, st.floats(0.01, 0.3))
def test_a_goals_p_value_is_below_005_exactly_when_its_95_percent_interval_decides(ours, base, margin):
    both = pairs_frame(ours, base)
    rule = lambda ci: non_inferior(ci, margin)  # noqa: E731
    p, side = sg.p_value(sg.over_loads([both], rule, every=True))
    alone = rule(sc.relative_interval(both))
    if abs(p - 0.05) > 1e-6:
        assert (p < 0.05) == (alone in ("met", "missed"))
    if p < 0.05:
        assert side == alone


def test_a_goal_met_at_some_load_of_several_is_corrected_for_its_loads():
    """Four loads with the same data: "higher at some load" had four tries, so its p is four times one load's
    (Bonferroni); "no worse at every load" needs all four, so its p is one load's."""
    both = pairs_frame([1.10, 1.18, 1.05, 1.22, 1.12], [1.0, 1.02, 0.99, 1.03, 1.0])
    one, side = sg.p_value(sg.over_loads([both], higher, every=False))
    assert side == "met" and one < 0.05 / 4
    four, _ = sg.p_value(sg.over_loads([both] * 4, higher, every=False))
    assert four == pytest.approx(4 * one, rel=1e-3)
    every, _ = sg.p_value(sg.over_loads([both] * 4, lambda ci: non_inferior(ci, 0.1), every=True))
    assert every == pytest.approx(sg.p_value(sg.over_loads([both], lambda ci: non_inferior(ci, 0.1), True))[0])
    # a load of the design the data lack: "every load" can no longer be met, "some load" no longer missed
    assert sg.over_loads([both], lambda ci: non_inferior(ci, 0.1), True, unmeasured=1)(0.5) == "inconclusive"


def no_worse(family, rival):
    return GoalId(family, GoalKind.NO_WORSE, rival)


def with_p(goal_id, p, side="met", missing=None):
    """A goal tested on the data at p-value `p`, deciding `side`."""
    return sg.TestedGoal(goal_id, goal_id.key, [0.0, -0.1, 0.1], "r", p, Verdict(side), missing)


def planned(goal_id, margin=0.1):
    return sp.PlannedGoal(goal_id, "goodput", "ours", (4.0,), "every", margin)


def test_holm_within_a_family_and_the_tally_sums_to_the_planned_goals():
    """Four goals of one family at p 0.01-0.04, each "met" alone at 95 %: Holm keeps the first (0.01 <= 0.05 / 4)
    and leaves the rest inconclusive; another family's lone goal at p 0.04 is met (families are corrected apart);
    a planned goal the data lack is missing, named and counted (and counts in its family's Holm, as p = 1)."""
    goals = [with_p(no_worse("a", f"r{i}"), p) for i, p in enumerate((0.01, 0.02, 0.03, 0.04))]
    goals.append(with_p(no_worse("b", "r0"), 0.04))
    plan = [planned(g.id) for g in goals] + [planned(no_worse("c", "absent")), planned(no_worse("c", "r1"))]
    goals.append(with_p(no_worse("c", "r1"), 0.04))
    assert all(g.verdict == "met" for g in goals)  # each alone, at 95 %
    final = sg.family_wise(goals, plan, power=[])
    verdicts = {g.key: g.verdict for g in final}
    assert verdicts == {"a/no_worse/r0": "met", "a/no_worse/r1": "inconclusive", "a/no_worse/r2": "inconclusive",
                        "a/no_worse/r3": "inconclusive", "b/no_worse/r0": "met", "c/no_worse/absent": "missing",
                        "c/no_worse/r1": "inconclusive"}  # c: 2 x 0.04 > 0.05
    by_key = {g.key: g for g in final}
    assert by_key["c/no_worse/absent"].reason.startswith("not in the data")
    assert by_key["c/no_worse/absent"].family == "c"
    assert by_key["a/no_worse/r1"].p_holm == pytest.approx(0.06)
    assert sum(tally([g.verdict for g in final]).values()) == len(plan)
    with pytest.raises(ValueError):
        tally(["met", "passed"])


def test_a_goal_the_plan_cannot_power_is_underpowered_whatever_the_run_shows(tmp_path):
    """The pilot's paired SD at the goal's load sets its MDD at the profile's repeats; above the margin the goal is
    "underpowered" (even with a p of 1e-6 in the run) and the plan names the least repeats that power it."""
    rng = np.random.default_rng(3)
    base = 4.0 + 0.1 * rng.standard_normal(5)
    ours = base * (1 + 0.2 * rng.standard_normal(5))  # ~20 % paired noise
    cells = speculation_cells({(8.0, "base"): [(g, 5.0) for g in base], (8.0, "ours"): [(g, 5.0) for g in ours]})
    cells.to_parquet(ServingStudyLayout(tmp_path).cells)
    design = {"speculation": {"goals": {"ours": "ours", "no_worse_than": ["base"]}}}
    plan = sp.planned_goals(design, {"speculation": [8]}, {"goodput": 0.1, "ttft": 0.2})
    assert [g.key for g in plan] == ["speculation/no_worse/base", "speculation/throughput/base",
                                     "speculation/latency_mape"]
    assert [(g.id.kind, g.rival) for g in plan] == [(GoalKind.NO_WORSE, "base"), (GoalKind.THROUGHPUT, "base"),
                                                    (GoalKind.LATENCY_MAPE, None)]
    rows = {r.key: r for r in sp.goal_power(plan, tmp_path, REPEATS, requests=12)}
    row = rows["speculation/no_worse/base"]
    level = 1 - 0.05 / 3  # three goals in the family: Holm's strictest step
    assert row.confidence == pytest.approx(level) and row.mdd > 0.1 and row.powered is False
    n = row.repeats_needed
    assert sp.minimum_detectable(row.paired_sd, n, level) <= 0.1 < sp.minimum_detectable(row.paired_sd, n - 1, level)
    assert rows["speculation/latency_mape"].mdd is None  # no requests in this pilot: said, not guessed
    lines = sp.goal_power_lines(list(rows.values()))
    assert all(any(key in line for line in lines) for key in rows)
    assert f"{n} repeats would power it" in "\n".join(lines)
    final = sg.family_wise([with_p(plan[0].id, 1e-6)], plan, list(rows.values()))
    weak = next(g for g in final if g.key == "speculation/no_worse/base")
    assert weak.verdict == "underpowered" and f"{n} repeats" in weak.reason and weak.p_holm is ABSENT
    wide = sp.planned_goals(design, {"speculation": [8]}, {"goodput": 0.9, "ttft": 0.2})
    assert sp.goal_power(wide, tmp_path, REPEATS)[0].powered is True


def test_a_load_of_the_design_missing_from_the_data_is_reported_and_counted():
    """The design names 2 and 8 req/s, the run measured 8 only: "no worse at every load" cannot be met (missing,
    the load named), "higher at some load" can still be met at 8, with both loads counted in its correction."""
    design = {"speculation": {"goals": {"ours": "ours", "no_worse_than": ["base"], "higher_than": ["base"]}}}
    frame = speculation_cells({(8.0, "ours"): [(4.0, 4.0), (4.1, 4.1), (3.9, 3.9), (4.0, 4.0), (4.05, 4.05)],
                               (8.0, "base"): [(2.0, 4.0), (2.1, 4.1), (1.9, 3.9), (2.0, 4.0), (2.05, 4.05)]})
    data, rates = {"cells": frame}, {"speculation": [2, 8]}
    goals, _ = sg.speculation_goals(data, design, {"goodput": 0.1}, rates)
    plan = sp.planned_goals(design, rates, {"goodput": 0.1, "ttft": 0.2})
    final = {g.key: g for g in sg.family_wise(goals, plan, power=[])}
    missing = final["speculation/no_worse/base"]
    assert missing.verdict == "missing" and "2 req/s in the design but not in the data" in missing.reason
    assert final["speculation/higher/base"].verdict == "met"
    assert final["speculation/latency_mape"].verdict == "missing"  # no requests in this data: named, counted
    assert sum(tally([g.verdict for g in final.values()]).values()) == len(plan)


def test_a_goal_is_named_by_its_fields_and_its_key_spells_them():
    """summary.json's keys, one per kind, spelled from the record's fields (nothing parses them back)."""
    keys = {GoalId("speculation", GoalKind.NO_WORSE, "k0"): "speculation/no_worse/k0",
            GoalId("speculation-draft", GoalKind.HIGHER, "smartspec"): "speculation-draft/higher/smartspec",
            GoalId("speculation", GoalKind.PART_ACCEPTANCE, "arm"): "speculation/part/acceptance",
            GoalId("speculation", GoalKind.PART_LOAD_AWARE, "k2"): "speculation/part/load_aware",
            GoalId("speculation", GoalKind.THROUGHPUT, "k0"): "speculation/throughput/k0",
            GoalId("chunking", GoalKind.SLO_REACH): "chunking/slo_reach",
            GoalId("chunking", GoalKind.TTFT, "none"): "chunking/ttft",
            GoalId("acceptance", GoalKind.LATENCY_MAPE): "acceptance/latency_mape",
            GoalId("acceptance", GoalKind.ACCEPTANCE_ERROR, "ewma"): "acceptance/error"}
    assert {goal_id.kind for goal_id in keys} == set(GoalKind)
    assert all(goal_id.key == key for goal_id, key in keys.items())


@given(st.floats(0.01, 0.6), st.floats(0.03, 0.5), st.sampled_from([0.95, 0.99, 0.999]))
def test_the_repeats_that_power_a_goal_are_the_least_that_do(sd, margin, confidence):
    n = sp.repeats_to_power(sd, margin, confidence)
    if n is None:
        assert sp.minimum_detectable(sd, 10_000, confidence) > margin
    else:
        assert sp.minimum_detectable(sd, n, confidence) <= margin < sp.minimum_detectable(sd, n - 1, confidence)


def test_the_designs_margins_are_what_a_user_calls_no_worse_and_no_pilot_load_is_dropped():
    """Goodput margins of at most 10 % for every family (none widened to what a pilot could decide), and the offline
    profile serves every load its pilot served (a load is never dropped after its values were seen)."""
    design = conf_file("experiment/serving.yaml")
    assert float(design.margins.goodput) <= 0.10
    assert all(float((spec.get("margins") or {}).get("goodput", 0.0)) <= 0.10 for spec in design.families.values())
    grid = conf_file("profile/offline.yaml").profile.serving
    pilot = pd.read_parquet(sp.pilot_path(dict(grid)).cells)
    for family, part in pilot.groupby("family"):
        assert {float(r) for r in part.rate} <= {float(r) for r in grid.rates[family]}, family


def test_the_papers_tally_names_every_verdict_and_why_goals_went_unanswered():
    from types import SimpleNamespace

    from rakv.experiments.prose import goal_tally
    from rakv.experiments.prose_serving import unanswered_sentence
    from rakv.experiments.summary_serving import Goal

    def goal(verdict, reason=None):
        extra = {"reason": reason} if reason else {}
        return Goal(goal="g", key="k", ci=CI(0.0, None, None), verdict=verdict, rule="r", **extra)

    goals = [goal("met"), goal("underpowered", "the plan's MDD 30% at 5 repeats exceeds the margin 10%: 12 repeats "
                                              "would power it"),
             goal("underpowered", "... 40 repeats would power it"), goal("missing", "6 req/s in the design but not in "
                                                                                  "the data; underpowered besides"),
             goal("not judged")]
    assert goal_tally(goals) == "1 met, 0 missed, 0 inconclusive, 2 underpowered and 2 missing"
    text = unanswered_sentence(SimpleNamespace(goals=goals, repeats=5))
    assert "2 goals are underpowered at 5 repeats" in text and "12 to 40 repeats" in text
    assert "2 goals are missing" in text and "6 req/s in the design but not in the data (1)" in text


def test_a_p_value_search_survives_two_repeats_and_a_zero_baseline():
    """Two repeats put the t quantile of a tiny alpha past exp()'s range, and a baseline's goodput of 0 leaves no
    relative difference: the search answers (1.0 where nothing decides), it does not raise."""
    noisy = pairs_frame([1.0, 3.0], [2.0, 1.0])
    assert sg.p_value(sg.over_loads([noisy], higher, every=False))[0] <= 1.0
    zero = pairs_frame([1.0, 1.2, 0.9], [0.0, 0.0, 0.0])
    assert sg.p_value(sg.over_loads([zero], higher, every=False))[0] == 1.0  # its goal says why (missing)
