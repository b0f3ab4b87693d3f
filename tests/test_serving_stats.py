"""The serving study's statistics (rakv.experiments.serving_stats): the interval method's coverage at the study's
repeat count (simulated), the power arithmetic, and the goal rules answering met, missed and inconclusive."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rakv.experiments import serving_stats as ss
from rakv.experiments.verdicts import all_of, any_of, below, ci_side, higher, non_inferior
from rakv.runtime.paths import conf_file

REPEATS = int(conf_file("profile/offline.yaml").profile.serving.repeats)  # the study's repeat count


def coverage(draw, repeats, truth, trials=4000, seed=0):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        _, low, high = ss.t_interval(draw(rng, repeats))
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
    mdd = ss.minimum_detectable(sd, n)
    rng = np.random.default_rng(2)
    detected = np.mean([ss.t_interval(rng.normal(mdd, sd, n))[1] > 0 for _ in range(4000)])
    assert abs(detected - ss.POWER) < 0.04, detected
    assert ss.minimum_detectable(sd, 10) < mdd and ss.minimum_detectable(sd, 1) == float("inf")


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
    ci = ss.paired_difference({"cells": frame}, "chunking", 1.0, "a", "b", "goodput")
    assert ci[0] == pytest.approx(0.5) and -1.0 < ci[1] < 0.5 < ci[2]  # 9 / 6 - 1, its interval over 3 repeats
    same = cells_frame({(1.0, "a"): [(2.0, 0, 0), (4.0, 0, 0), (6.0, 0, 0)],
                        (1.0, "b"): [(1.0, 0, 0), (2.0, 0, 0), (3.0, 0, 0)]})
    ci = ss.paired_difference({"cells": same}, "chunking", 1.0, "a", "b", "goodput")
    assert ci == pytest.approx([1.0, 1.0, 1.0])  # twice the baseline in every repeat: no spread
    halved = cells_frame({(1.0, "a"): [(0.0, 0, 0), (0.1, 0, 0), (0.0, 0, 0)],
                          (1.0, "b"): [(1.0, 0, 0), (2.0, 0, 0), (3.0, 0, 0)]})
    assert ss.paired_difference({"cells": halved}, "chunking", 1.0, "a", "b", "goodput")[1] >= -1.0


def test_the_slo_reach_rule_can_meet_miss_and_be_unsure():
    design = {"chunking": {"goals": {"ours": "ours", "fixed": ["f"], "ttft_baseline": "f"}}}
    margins = {"ttft": 0.1}

    def verdict(ours_itl, fixed_itl):
        frame = cells_frame({(1.0, "ours"): [(1, i, 100) for i in ours_itl[0]],
                             (4.0, "ours"): [(1, i, 100) for i in ours_itl[1]],
                             (1.0, "f"): [(1, i, 100) for i in fixed_itl[0]],
                             (4.0, "f"): [(1, i, 100) for i in fixed_itl[1]]})
        data = {"cells": frame}
        return ss.chunking_goals(data, ss.cell_table(data), design, margins)[0]["verdict"]

    under, over, around = [50, 52, 51], [150, 152, 151], [60, 140, 100]
    assert verdict((under, under), (under, over)) == "met"
    assert verdict((under, over), (under, under)) == "missed"
    assert verdict((under, around), (under, under)) == "inconclusive"


def test_a_draft_configurations_requests_have_no_ex_post_regret_and_that_is_not_an_error():
    requests = pd.DataFrame({"family": ["acceptance"] * 2, "policy": ["ewma", "prefix-keyed"], "status": "ok",
                             "repeat": 0, "alpha": [0.5, 0.6], "realised_alpha": [0.7, 0.7]})
    assert ss.request_values(requests, "regret").empty
    goals, stats = ss.acceptance_goals(requests, {"acceptance": {"goals": {"ours": "prefix-keyed",
                                                                              "baseline": "ewma"}}})
    assert goals[0]["verdict"] == "missing" and stats["ewma"]["acceptance_error"][0] == pytest.approx(0.2)


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
    assert ss.judged_loads(data, "speculation") == {1.0: False, 8.0: True}
    goals, pairs = ss.speculation_goals(data, design, {"goodput": 0.1})
    by_key = {g["key"]: g for g in goals}
    assert by_key["speculation/no_worse/base"]["verdict"] == "met"  # judged at 8 only, where ours doubles goodput
    assert by_key["speculation/higher/base"]["verdict"] == "met"
    assert {(p["rate"], p["judged"]) for p in pairs} == {(1.0, False), (8.0, True)}
    only_low = {"cells": frame[frame.rate == 1.0]}
    goals, _ = ss.speculation_goals(only_low, design, {"goodput": 0.1})
    assert {g["verdict"] for g in goals if "/throughput/" not in g["key"]} == {ss.NOT_JUDGED}
    # the highest load's throughput goal is judged whatever the SLOs: ours is 50 % lower there
    assert next(g for g in goals if g["key"] == "speculation/throughput/base")["verdict"] == "missed"


def test_the_ablation_arm_says_which_part_pays():
    design = {"speculation": {"goals": {"ours": "ours", "no_worse_than": ["k2"], "ablation": "arm",
                                        "fixed_k": "k2"}}}
    slo_missed = lambda good: [(good * f, 4.0 * f) for f in (1.0, 1.02, 0.98)]  # noqa: E731
    frame = speculation_cells({(8.0, "ours"): slo_missed(3.0), (8.0, "arm"): slo_missed(3.0),
                               (8.0, "k2"): slo_missed(2.0)})
    goals, _ = ss.speculation_goals({"cells": frame}, design, {"goodput": 0.1})
    by_key = {g["key"]: g["verdict"] for g in goals}
    # the arm (load-aware k, EWMA acceptance) already has all of ours' gain over k2: load-aware k pays, the
    # prefix-keyed acceptance adds nothing measurable
    assert by_key["speculation/part/load_aware"] == "met"
    assert by_key["speculation/part/acceptance"] in ("inconclusive", "missed")


def test_a_familys_own_margin_decides_its_no_worse_goal():
    """Ours 20 % below the baseline at a judged load: missed against the 10 % default, met within a family's own
    25 % margin (the design's `margins`), and the goal's words name the margin it was judged by."""
    named = {"ours": "ours", "no_worse_than": ["base"]}
    per = lambda good: [(good * f, 4.0 * f) for f in (1.0, 1.01, 0.99)]  # noqa: E731  (every run misses SLOs)
    data = {"cells": speculation_cells({(8.0, "ours"): per(2.4), (8.0, "base"): per(3.0)})}
    default = {"speculation": {"goals": named}}
    own = {"speculation": {"goals": named, "margins": {"goodput": 0.25}}}
    verdict = lambda design: next(g for g in ss.speculation_goals(data, design, {"goodput": 0.1, "ttft": 0.3})[0]  # noqa: E731
                                  if g["key"] == "speculation/no_worse/base")
    assert verdict(default)["verdict"] == "missed" and "margin 10%" in verdict(default)["goal"]
    assert verdict(own)["verdict"] == "met" and "margin 25%" in verdict(own)["goal"]
    assert ss.family_margin({"goodput": 0.1, "ttft": 0.3}, own, "speculation", "ttft") == 0.3  # the default


def test_the_plans_power_is_computed_at_the_loads_the_run_serves(tmp_path):
    """A pilot load the run will not serve does not set the plan's noise: the noisy 6 req/s cell leaves the paired
    SD when the run's rates leave it out."""
    rng = np.random.default_rng(0)
    values = {}
    for rate, spread in ((4.0, 0.01), (6.0, 0.5)):
        base = 3.0 + spread * rng.standard_normal(5)
        values[(rate, "base")] = [(g, 4.0) for g in base]
        values[(rate, "ours")] = [(g * (1 + spread * z), 4.0) for g, z in zip(base, rng.standard_normal(5))]
    speculation_cells(values).to_parquet(tmp_path / "cells.parquet")
    design = {"speculation": {"goals": {"ours": "ours", "no_worse_than": ["base"]}, "margins": {"goodput": 0.05}}}
    every = ss.power(tmp_path, 5, {"goodput": 0.1, "ttft": 0.3}, design)[0]
    served = ss.power(tmp_path, 5, {"goodput": 0.1, "ttft": 0.3}, design, rates={"speculation": [4]})[0]
    assert "margin 5%" in served and "MDD <= margin" in served
    assert "MDD > margin" in every


def test_a_no_worse_goal_met_below_zero_is_named_as_measurably_lower():
    from types import SimpleNamespace

    from rakv.experiments.report import met_but_lower_sentence
    from rakv.experiments.summary import Goal

    def goal(key, value, low, high, verdict="met"):
        return Goal(goal=key, key=key, value=value, ci_low=low, ci_high=high, verdict=verdict, rule="r",
                    family="speculation-draft", rival="k0", rate=32.0, unit="relative")

    lower = goal("speculation-draft/no_worse/k0", -0.099, -0.138, -0.058)
    straddles = goal("speculation-draft/no_worse/k2", -0.02, -0.05, 0.01)
    missed = goal("speculation-draft/no_worse/smartspec", -0.6, -0.7, -0.5, verdict="missed")
    text = met_but_lower_sentence(SimpleNamespace(goals=[lower, straddles, missed]))
    assert text.startswith("1 ``no worse'' goal is met") and "against k0" in text and "k2" not in text
    assert met_but_lower_sentence(SimpleNamespace(goals=[straddles])) == ""
