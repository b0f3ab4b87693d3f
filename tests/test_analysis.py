"""Statistics on small hand-built tables whose answers are known."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rakv.experiments import analysis, claims, intervals, oracle, prose, study_stats
from rakv.experiments.notebooks import setup
from rakv.experiments.summary import Crossover, Feasibility
from rakv.runtime.json_records import load_record
from rakv.runtime.run_layout import RunLayout

ROOT = Path(__file__).resolve().parents[1]


def row(prompt, kind, strategy, action, latency, scenario, repeat=0, predicted=None, equal=True, configuration="c"):
    k = int(action[3:])
    return {"run_id": f"{configuration}-{prompt}-{scenario}-{strategy}-{repeat}", "configuration": configuration,
            "pair": "P", "proposer": "draft" if configuration == "c" else "prompt-lookup", "dataset": "d",
            "prompt_id": prompt, "scenario": scenario, "repeat": repeat, "kind": kind, "strategy": strategy,
            "action": action, "k": k, "reuse": action[1] == "1", "latency_s": latency, "ttft_s": latency / 10,
            "tokens_per_s": 10 / latency, "predicted_latency_s": predicted if predicted is not None else latency,
            "equal_to_ar": equal, "accepted": 3 * (k > 0), "rejections": 1 * (k > 0), "prompt_tokens": 100,
            "new_tokens": 10, "peak_kv_bytes": 1 << 20, "length_bin": "64-128"}


# Per prompt, three repeats of each action. r0 actions are measured under `cold` and stand in every scenario.
# In partial-50, r1k0 wins on the mean in-sample only because of one lucky repeat (1.0 among 2.0s); r1k4 is
# steady at 1.8. Cross-fitted, the oracle of fold 0 is r1k4 (mean of the other repeats 1.8 < 2.0).
SWEEP = {"cold": {"r0k0": (3.0, 3.0, 3.0), "r0k4": (3.3, 3.3, 3.3)},
         "partial-50": {"r1k0": (1.0, 2.0, 2.0), "r1k4": (1.8, 1.8, 1.8)}}
PREDICTED = {"r0k0": 3.0, "r0k4": 3.5, "r1k0": 1.9, "r1k4": 1.7}


@pytest.fixture
def runs():
    rows = []
    for prompt, scale in (("p1", 1.0), ("p2", 2.0)):
        for scenario, actions in SWEEP.items():
            for action, repeats in actions.items():
                rows += [row(prompt, "sweep", action, action, scale * t, scenario, i, scale * PREDICTED[action])
                         for i, t in enumerate(repeats)]
        # the controller: r0k0 when cold (the oracle), r1k4 at partial-50 (a tie with the in-sample oracle r1k0)
        rows += [row(prompt, "strategy", "rakv-asd", "r0k0", scale * 3.0, "cold", i) for i in range(3)]
        rows += [row(prompt, "strategy", "rakv-asd", "r1k4", scale * 1.8, "partial-50", i, equal=prompt == "p1")
                 for i in range(3)]
    return pd.DataFrame(rows)


def test_measurements_spread_no_reuse_actions_to_every_scenario(runs):
    meas = oracle.measurements(runs)
    assert set(meas[meas.scenario == "partial-50"].action) == {"r0k0", "r0k4", "r1k0", "r1k4"}
    assert set(meas[meas.scenario == "cold"].action) == {"r0k0", "r0k4"}
    assert len(meas) == 2 * (6 + 12)


def test_fixed_strategies_read_from_their_actions(runs):
    lat = oracle.strategy_latencies(runs).set_index(["prompt_id", "scenario", "repeat", "strategy"]).latency_s
    assert lat[("p1", "cold", 0, "kv-only")] == 3.0  # no hit when cold: KV-only computes as AR
    assert lat[("p1", "partial-50", 1, "kv-only")] == 2.0
    assert lat[("p2", "partial-50", 0, "joint-k4")] == 3.6
    assert oracle.best_fixed_action(oracle.measurements(runs)) == "r1k0"  # (3+3+1+2+2)/... < r1k4's


def test_cross_fitted_oracle_corrects_the_winners_curse(runs):
    assert oracle.oracle_table(oracle.measurements(runs)).set_index(["prompt_id", "scenario"]).oracle_action[
        ("p1", "partial-50")] == "r1k0"  # in-sample, the lucky repeat wins
    held = oracle.held_out_oracle(oracle.measurements(runs))
    p1 = held[(held.prompt_id == "p1") & (held.scenario == "partial-50")].set_index("repeat")
    assert p1.oracle_action.to_dict() == {0: "r1k4", 1: "r1k0", 2: "r1k0"}
    assert p1.oracle_s.tolist() == [1.8, 2.0, 2.0]
    choices = oracle.controller_choices(runs)
    partial = choices[choices.scenario == "partial-50"]
    assert partial.regret.tolist() == pytest.approx([0.0, -0.1, -0.1] * 2)
    assert not partial.correct.any() and partial.within_noise.all()  # strictly wrong, but a tie within noise
    cold = choices[choices.scenario == "cold"]
    assert cold.correct.all() and cold.regret.tolist() == pytest.approx([0.0] * 6)


def test_a_clear_loser_is_not_a_tie():
    assert not oracle.is_tie(np.array([1.0, 1.01, 0.99]), np.array([2.0, 2.02, 1.98]))
    assert oracle.is_tie(np.array([1.0, 2.0, 2.0]), np.array([1.8, 1.8, 1.8]))


def test_cluster_interval_takes_prompts_not_rows_as_units():
    # two prompts, 50 rows each: rows as units would give a narrow interval around 2; prompts are the unit
    clusters = ["a"] * 50 + ["b"] * 50
    value, low, high = intervals.cluster_interval(clusters, [1.0] * 50 + [3.0] * 50, scale="linear")
    rows = intervals.ratio_interval([1.0] * 50 + [3.0] * 50, scale="linear")
    assert value == 2.0 and high - low > 10 * (rows[2] - rows[1])
    assert np.isnan(intervals.cluster_interval(["a"] * 5, [1.0] * 5)[1])  # one cluster: no interval


def test_latency_reduction_pairs_instances_and_has_a_ci(runs):
    lat = oracle.strategy_latencies(runs)
    value, low, high = study_stats.latency_reduction(lat, "rakv-asd", "joint-k4")
    # rakv-asd = joint-k4 at partial-50 (r1k4); cold: rakv-asd r0k0 3.0 vs joint-k4 read as r0k4 3.3
    expected = 1 - (3 * 3.0 + 3 * 1.8) * 3 / ((3 * 3.3 + 3 * 1.8) * 3)
    assert value == pytest.approx(expected) and low <= value <= high


def test_mape_and_spearman_per_scenario(runs):
    meas = oracle.measurements(runs)
    errors = study_stats.mape_errors(meas)
    p1 = errors[(errors.prompt_id == "p1") & (errors.scenario == "partial-50")].set_index("action").error
    assert p1["r1k0"] == pytest.approx(abs(1.9 - 5 / 3) / (5 / 3)) and p1["r1k4"] == pytest.approx(0.1 / 1.8)
    rho = study_stats.spearman_table(meas).set_index(["prompt_id", "scenario"]).rho
    # partial-50: predicted r1k4 < r1k0 < r0k0 < r0k4, measured r1k0 < r1k4 < ...: one swap; cold: 2 actions
    assert rho[("p1", "partial-50")] == pytest.approx(0.8) and np.isnan(rho[("p1", "cold")])


def test_spec_slowdown(runs):
    slow = study_stats.spec_slowdown(oracle.measurements(runs))
    assert slow.min == pytest.approx(1.8 / (5 / 3) - 1) and slow.max == pytest.approx(0.1)
    o = oracle.oracle_table(oracle.measurements(runs)).dropna(subset=["best_spec_s", "best_k0_s"])
    assert slow.pooled[0] == pytest.approx(o.best_spec_s.sum() / o.best_k0_s.sum() - 1)  # the sums' slowdown


def test_the_regime_is_judged_by_the_side_of_its_interval():
    """The reference's best k > 0 was slower than k = 0 in every scenario: a pooled slowdown wholly below zero is the
    regime reversed (direction "no"), wholly above it the reference's, across it undecided."""
    from rakv.experiments.prose import regime_clause, regime_word

    reversed_ = claims.claim_row("spec_regime", "c", [-0.4, -0.5, -0.3])
    same = claims.claim_row("spec_regime", "c", [0.2, 0.1, 0.3])
    undecided = claims.claim_row("spec_regime", "c", [0.02, -0.05, 0.09])
    assert (reversed_.direction, same.direction, undecided.direction) == ("no", "yes", "inconclusive")
    assert [regime_word(r) for r in (reversed_, same, undecided)] == ["reversed", "the reference's", "undecided"]
    assert "40.0\\% lower latency" in regime_clause(reversed_) and "[30.0\\%, 50.0\\%]" in regime_clause(reversed_)
    assert "includes zero" in regime_clause(undecided)


def test_a_twins_crossover_is_placed_against_the_references_range():
    """The least break-even over k of a reference pair's twin, inside [0.894 - 0.05, 0.973 + 0.05] or not; a twin
    for which no k pays has no crossover to place."""
    from rakv.experiments.summary import BreakEven

    def rows(pair, alphas):
        return [BreakEven(pair, k, a, 0.5, 0.02, 128, 32) for k, a in zip((1, 2, 4), alphas)]

    inside = claims.twin_crossover_rows(rows("gpt2-distilgpt2-twin-draft", [None, 0.86, 0.93]))[0]
    below = claims.twin_crossover_rows(rows("gpt2medium-gpt2-twin", [0.47, 0.6, 0.7]))[0]
    never = claims.twin_crossover_rows(rows("gpt2-distilgpt2-twin", [None, None, None]))[0]
    assert (inside.magnitude, inside.reproduced.value, inside.band_low) == ("yes", 0.86, pytest.approx(0.844))
    assert below.magnitude == "no" and never.magnitude == "not tested" and never.reproduced.value is None
    assert claims.twin_crossover_rows(rows("gpt2large-gpt2medium-twin", [0.7, 0.8, 0.9])) == []  # not the study's


def test_the_decode_break_even_solves_its_closed_form():
    from rakv.runtime.costmodel import decode_break_even, expected_tokens_per_round

    alpha, k = decode_break_even(0.35, {1: 1.05, 2: 1.1, 4: 1.2})
    assert k == 1 and expected_tokens_per_round(alpha, 1) == pytest.approx(0.35 + 1.05, abs=1e-4)
    assert decode_break_even(0.0, {1: 0.9}) == (0.0, 1)  # a verify priced below a step pays at any acceptance
    assert decode_break_even(1.2, {1: 1.0, 2: 1.0}) == (None, None)  # a draft dearer than a step never pays


def test_claim_verdicts_can_fail():
    claim = claims.CLAIMS["latency_reduction_vs_joint_k4"]  # reference 64 %, band 32 % .. 96 %
    assert claims.verdict_direction(claim, [0.5, 0.4, 0.6]) == "yes"
    assert claims.verdict_direction(claim, [-0.1, -0.2, -0.05]) == "no"
    assert claims.verdict_direction(claim, [0.05, -0.02, 0.1]) == "inconclusive"
    assert claims.verdict_band(claim, [0.5, 0.4, 0.6]) == "yes"
    assert claims.verdict_band(claim, [0.1, 0.05, 0.2]) == "no"
    assert claims.verdict_band(claim, [0.3, 0.2, 0.4]) == "inconclusive"
    near_zero = claims.CLAIMS["latency_reduction_vs_kv_only"]  # reference 0.45 %: band +-2 points
    assert claims.verdict_band(near_zero, [0.0, -0.01, 0.01]) == "yes"
    assert claims.verdict_band(near_zero, [0.10, 0.08, 0.12]) == "no"


def test_crossovers():
    controlled = pd.DataFrame({"configuration": "c", "k": 4, "alpha": [0.5, 0.7, 0.9],
                               "measured_speedup": [0.5, 0.9, 1.1]})
    assert study_stats.measured_crossover(controlled) == {"c/k4": pytest.approx(0.8)}
    crossover = pd.DataFrame({"configuration": "c", "scenario": ["cold"] * 4, "prompt_tokens": [64, 64, 128, 128],
                              "k": [2, 4, 2, 4], "break_even_alpha": [0.9, 0.85, np.nan, np.nan]})
    assert study_stats.model_crossover(crossover) == Crossover(min=0.85, max=0.85, median=0.85, settings=2, never=1)


def test_summary_claims_and_exactness(runs, tmp_path):
    study = RunLayout.of(tmp_path).study
    study.root.mkdir()
    runs.to_parquet(study.runs)
    summary = analysis.summarize(tmp_path)
    assert summary.exact.equal == len(runs) - 3 and summary.exact.total == len(runs)
    rows = {r.key: r for r in summary.claims}
    assert rows["latency_reduction_vs_joint_k4"].direction == "yes"
    assert rows["latency_reduction_vs_kv_only"].reproduced.value < 0  # the tie r1k4 is slower than r1k0 on average
    assert summary.feasibility == Feasibility("missing") and summary.feasibility_verdict == "missing"
    assert summary.per_configuration["c"].accuracy_within_noise[0] == 1.0
    assert summary.per_configuration["c"].accuracy_action[0] == 0.5


def test_notebook_setup_names_the_command_when_results_are_missing(tmp_path):
    with pytest.raises(SystemExit, match=r"\./reproduce\.sh profile=nothing-here"):
        setup("nothing-here", str(tmp_path / "nothing-here"))
    with pytest.raises(SystemExit, match=r"no reference run ships for it.*\./reproduce\.sh profile=nothing-here"):
        setup("nothing-here")


def test_cost_side_feasibility_is_labelled_and_never_claims_a_verdict(runs, tmp_path):
    costs = {"draft_target_cost_ratio": 0.5, "target_step_s": 0.1, "prompt_tokens": 128, "new_tokens": 24}
    rows = [{"pair": "big-twin", "k": 2, "break_even_alpha": 0.93},
            {"pair": "big-twin", "k": 4, "break_even_alpha": 0.88},
            {"pair": "big-twin", "k": 8, "break_even_alpha": None},
            {"pair": "other-twin", "k": 2, "break_even_alpha": 0.5}]
    rows = [{**r, **costs} for r in rows]
    feas = {"status": "cost side only: weights unavailable", "configuration": "big", "twin": "big-twin",
            "twins": ["big-twin", "other-twin"], "break_even": rows}
    sentence = prose.cost_side_sentence(load_record(Feasibility, feas, "feasibility"))
    assert sentence == ("cost side only (architecture twins): pays only above alpha = 0.88 (k = 4), never for k = 8; "
                        "acceptance needs the real weights")
    nothing_pays = {**feas, "break_even": [{**r, "break_even_alpha": None} for r in rows]}
    never = prose.cost_side_sentence(load_record(Feasibility, nothing_pays, "feasibility"))
    assert "never pays, for any k, even at alpha = 1" in never
    layout = RunLayout.of(tmp_path)
    layout.study.root.mkdir()
    runs.to_parquet(layout.study.runs)
    layout.feasibility_dir.mkdir()
    layout.feasibility_summary.write_text(json.dumps(feas))
    summary = analysis.summarize(tmp_path)
    assert summary.feasibility_verdict == sentence
    assert not any("feasibility" in r.claim for r in summary.claims)  # no verdict without the weights


def test_generated_sentences_follow_the_sign_of_the_interval():
    from rakv.experiments.prose import comparison

    assert comparison([0.2, 0.1, 0.3], "kv-only").startswith("20.0\\% lower latency than KV-only (95\\% CI [10.0\\%")
    assert comparison([-0.2, -0.3, -0.1], "kv-only") == \
        "20.0\\% higher latency than KV-only (95\\% CI [10.0\\%, 30.0\\%])"
    assert comparison([0.01, -0.02, 0.04], "kv-only").startswith("a latency not distinguishable from KV-only's")


def test_the_introductions_verdicts_follow_the_sign_of_the_interval():
    from rakv.experiments.prose import verdict

    assert verdict([0.2, 0.1, 0.3]) == "faster than"
    assert verdict([-0.2, -0.3, -0.1]) == "slower than"
    assert verdict([0.01, -0.02, 0.04]) == "not distinguishable from"
    assert verdict([float("nan")] * 3) == "not compared with"


def test_acceptance_mape_separates_the_requests_acceptance_from_the_costs():
    """Latencies made exactly by the cost model at each prompt's own acceptance and match rate: with those the
    re-evaluated model is exact; with the one calibrated acceptance it is not."""
    from rakv.runtime.costmodel import CostTable, Curve, RequestFeatures, estimate_latency

    flat = lambda v: Curve([v], 1.0, 0.0)  # noqa: E731
    table = CostTable(key={}, target_prefill=Curve([0.002, 0.0], 1.0, 0.0), target_step=flat(0.02),
                      verify={k: flat(0.024) for k in (1, 4)}, propose={k: flat(0.0) for k in (1, 4)},
                      proposer_prefill=flat(0.0), kv_copy=flat(0.0), target_kv_bytes_per_token=0.0,
                      proposer_kv_bytes_per_token=0.0, acceptance=0.5, acceptance_rounds=10)
    rows = []
    for prompt, alpha, match in (("p1", 0.2, 1.0), ("p2", 0.5, 1.0), ("p3", 0.9, 0.5)):
        for k in (0, 1, 4):
            latency = estimate_latency(table, RequestFeatures(100, 0, 32), False, k, alpha, 0.0, match)
            for repeat in range(2):
                rows.append({"run_id": f"{prompt}-{k}-{repeat}", "configuration": "c", "dataset": "d",
                             "prompt_id": prompt, "scenario": "cold", "action": f"r0k{k}", "k": k, "reuse": False,
                             "repeat": repeat, "latency_s": latency, "predicted_latency_s": latency,
                             "accepted": 90 * alpha * (k > 0), "rejections": 90 * (1 - alpha) * (k > 0),
                             "rounds": 90 * (k > 0), "empty_rounds": 90 * (1 / match - 1) * (k > 0),
                             "prompt_tokens": 100, "available_hit_tokens": 0, "exact_hit": False, "new_tokens": 32,
                             "peak_kv_bytes": 0})
    result = study_stats.acceptance_mape(pd.DataFrame(rows), {"c": table})["c"]
    assert result.prompt[0] == pytest.approx(0.0, abs=1e-12)
    assert result.calibrated[0] > 0.05  # p1 and p3 are mispredicted at alpha 0.5 (p2 is exact)


def joint_rows(joint_factor, reprefilled_factor=None, prompts=6, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(prompts):
        base = 1.0 + 0.2 * p
        for repeat in range(2):
            latencies = {"kv-only": base, "joint-k4": base * joint_factor}
            if reprefilled_factor is not None:
                latencies["joint-k4-draft-reprefilled"] = base * reprefilled_factor
            for strategy, latency in latencies.items():
                rows.append({"configuration": "c", "dataset": "d", "prompt_id": f"p{p}", "scenario": "exact",
                             "new_tokens": 32, "strategy": strategy, "repeat": repeat,
                             "latency_s": latency * (1 + noise * rng.standard_normal()),
                             "draft_prefill_s": 0.01, "hit_tokens": 100,
                             "draft_hit_tokens": 100 if strategy == "joint-k4" else 0, "reuse_draft": True})
    return pd.DataFrame(rows)


def test_speculation_on_top_of_reuse_is_judged_by_its_ci_both_ways():
    from rakv.experiments.study_stats import joint_reuse_by_length

    pays = joint_reuse_by_length(joint_rows(0.8, 1.1))[0]
    assert pays.verdict == "pays" and pays.latency_reduction[0] == pytest.approx(0.2)
    assert pays.latency_reduction[1] > 0 and pays.draft_reuse_reduction[1] > 0
    assert pays.draft_hit_share == 1.0 and pays.reprefilled_s > pays.joint_s
    assert joint_reuse_by_length(joint_rows(1.25))[0].verdict == "costs"
    unclear = joint_reuse_by_length(joint_rows(1.0, noise=0.2, seed=3))[0]
    assert unclear.verdict == "inconclusive" and unclear.reprefilled_s is None
    assert joint_reuse_by_length(joint_rows(0.8, prompts=1))[0].verdict == "no interval"


def test_claims_are_judged_by_their_kind():
    """An equivalence claim has no direction, only its band; an extreme over scenarios (one value) gets no interval
    and no verdict; a finding is read from the stage that tests it; one count covers them all."""
    equivalence = claims.claim_row("latency_reduction_vs_kv_only", "c", [0.15, 0.12, 0.18])
    assert equivalence.direction == "n/a" and equivalence.magnitude == "no"  # +15 % is not "within 0.45 %"
    extreme = claims.claim_row("spec_slowdown_min", "c", -0.5)
    assert extreme.reproduced.low is None or np.isnan(extreme.reproduced.low)
    assert extreme.direction == extreme.magnitude == "n/a"
    never = claims.claim_row("crossover_alpha_min", "c", None, "never (not even alpha = 1)")
    assert never.text.startswith("never") and never.magnitude == "n/a"
    effect = claims.claim_row("latency_reduction_vs_joint_k4", "c", [0.5, 0.4, 0.6])
    assert (effect.direction, effect.magnitude) == ("yes", "yes")
    cost_only = claims.larger_pair_row(Feasibility("cost side only: weights unavailable"), "cost side only")
    ran = claims.larger_pair_row(Feasibility("ran", crossed=True, configuration="l"), None)
    assert cost_only.direction == "not tested" and ran.direction == "no" and ran.text == "crosses"
    counts = claims.claim_counts([equivalence, extreme, never, effect, cost_only])
    assert counts == claims.ClaimCounts(rows=5, signed=1, banded=2, unjudged=3,
                                        direction={"yes": 1, "no": 0, "inconclusive": 0},
                                        magnitude={"yes": 1, "no": 1, "inconclusive": 0})
