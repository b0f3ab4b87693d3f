"""Cost model and controller on synthetic cost tables, plus calibration keying on the tiny pair."""

import json
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rakv.runtime.actions import Action
from rakv.runtime.cache import Hit, PrefixKVStore
from rakv.runtime.calibration import CalibrationPlan, calibration_key, load_or_calibrate, load_table
from rakv.runtime.controller import AcceptanceTracker, Controller, ControllerConfig, choose
from rakv.runtime.costmodel import (
    CostTable,
    Curve,
    RequestFeatures,
    acceptance_estimate,
    break_even_alpha,
    estimate_latency,
    expected_tokens_per_round,
    non_decreasing,
    tokens_per_round,
)
from rakv.runtime.depth import RoundDepth
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.proposers import PROPOSERS
from rakv.runtime.strategies import run_strategy


def configured(**changes) -> ControllerConfig:
    """conf/controller/default.yaml with some settings changed (and checked again)."""
    return replace(ControllerConfig.default(), **changes)


def flat(seconds):
    return Curve([float(seconds)], 1.0, 0.0)


def table(step=0.020, verify=0.024, propose_per_token=0.004, prefill_per_token=0.002, copy_per_token=1e-6,
          alpha=0.6, kv_bytes=4096.0):
    return CostTable(
        key={}, target_prefill=Curve([prefill_per_token, 0.0], 1.0, 0.0), target_step=flat(step),
        verify={k: flat(verify) for k in (1, 2, 4, 6, 8)},
        propose={k: flat(propose_per_token * k) for k in (1, 2, 4, 6, 8)},
        proposer_prefill=Curve([prefill_per_token / 2, 0.0], 1.0, 0.0), kv_copy=Curve([copy_per_token, 0.0], 1.0, 0.0),
        target_kv_bytes_per_token=kv_bytes, proposer_kv_bytes_per_token=kv_bytes / 2, acceptance=alpha,
        acceptance_rounds=100)


def simulate_round(alpha, k, rng):
    accepted = 0
    while accepted < k and rng.random() < alpha:
        accepted += 1
    return accepted


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.6, 0.9, 0.99])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_expected_tokens_closed_form_matches_monte_carlo(alpha, k):
    rng = random.Random(k * 100 + int(alpha * 100))
    draws = [simulate_round(alpha, k, rng) + 1 for _ in range(40000)]
    assert abs(sum(draws) / len(draws) - expected_tokens_per_round(alpha, k)) < 0.03 * (k + 1)
    assert expected_tokens_per_round(1.0, k) == k + 1


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_tokens_per_round_limit_at_alpha_one(k):
    # E_k(alpha) -> k + 1 as alpha -> 1, and the alpha >= 1 branch returns that limit exactly
    assert tokens_per_round(1.0, k) == k + 1 == expected_tokens_per_round(1.0, k)
    assert abs(tokens_per_round(1 - 1e-9, k) - (k + 1)) < 1e-6 * (k + 1)
    assert tokens_per_round(0.0, k) == 1.0
    assert tokens_per_round(0.7, 0) == tokens_per_round(0.7, 0, 0.3) == 1.0


@settings(max_examples=300, deadline=None)
@given(alpha=st.floats(0.0, 1.0), other=st.floats(0.0, 1.0), k=st.integers(0, 12), match=st.floats(0.0, 1.0))
def test_tokens_per_round_is_the_restated_sum_and_determines_alpha(alpha, other, k, match):
    tokens = tokens_per_round(alpha, k, match)
    # bit-identical to the form the cost model, policies, admission and tune_vllm each wrote out
    assert tokens == (match * expected_tokens_per_round(alpha, k) + (1 - match) if k else 1.0)
    assert tokens_per_round(alpha, k) == expected_tokens_per_round(alpha, k)
    assert 1.0 - 1e-12 <= tokens <= k + 1 + 1e-12
    # strictly increasing in alpha when k > 0 (up to rounding), so observed tokens per round pin alpha down
    low, high = sorted((alpha, other))
    if k and high - low > 1e-6:
        assert expected_tokens_per_round(low, k) < expected_tokens_per_round(high, k)


def test_acceptance_estimate_recovers_alpha_from_truncated_rounds():
    rng = random.Random(0)
    for alpha in (0.3, 0.7, 0.95):
        log = [(4, simulate_round(alpha, 4, rng)) for _ in range(20000)]
        assert abs(acceptance_estimate(log) - alpha) < 0.01
        naive = sum(a for _, a in log) / sum(p for p, _ in log)
        assert naive < alpha - 0.05  # the ratio of means would be biased low


FEATURES = RequestFeatures(prompt_tokens=256, hit_tokens=0, new_tokens=64)


def test_costly_draft_or_low_alpha_chooses_no_speculation():
    costly = Controller(table(propose_per_token=0.019, alpha=0.9))
    assert costly.decide(256, Hit(256), 64).action.k == 0
    low_alpha = Controller(table(alpha=0.2))
    assert low_alpha.decide(256, Hit(256), 64).action.k == 0


def test_cheap_draft_and_high_alpha_speculates():
    decision = Controller(table(propose_per_token=0.001, alpha=0.99)).decide(256, Hit(256), 64)
    assert decision.action.k > 0 and decision.predictions["r0k0"] > decision.predicted_latency_s


def test_hit_reuses_when_copy_is_cheaper_than_prefill():
    hit = Hit(prompt_length=256, prefix_length=200)
    assert Controller(table(alpha=0.2)).decide(256, hit, 64).action == Action(True, 0)
    expensive_copy = Controller(table(alpha=0.2, copy_per_token=0.01))
    assert expensive_copy.decide(256, hit, 64).action == Action(False, 0)
    assert "r1k0" not in Controller(table()).decide(256, Hit(256), 64).predictions  # no hit, no r = 1


def test_infeasible_actions_are_never_chosen():
    config = configured(memory_budget_mib=(4096 * 320 + 2048 * 320) / 2**20)  # below any k > 0
    decision = Controller(table(propose_per_token=0.001, alpha=0.99), config).decide(256, Hit(256), 64)
    assert decision.action.k == 0 and set(decision.predictions) == {"r0k0"}
    with pytest.raises(RakvError, match="memory budget"):
        Controller(table(), configured(memory_budget_mib=0.1)).decide(256, Hit(256), 64)


def test_k_set_restricts_actions():
    decision = Controller(table(propose_per_token=0.001, alpha=0.99), configured(k_set=(0, 2))).decide(
        256, Hit(256), 64)
    assert set(decision.predictions) == {"r0k0", "r0k2"} and decision.action.k == 2


def test_ewma_moves_toward_observed_acceptance():
    tracker = AcceptanceTracker(alpha0=0.5, beta=0.8)
    tracker.observe([(4, 4)] * 10)
    high = tracker.alpha
    assert high > 0.9
    tracker.observe([(4, 0)] * 5)
    falling = tracker.alpha
    assert falling < high
    tracker.observe([(4, 0)] * 25)
    assert tracker.alpha < min(falling, 0.1)
    before = tracker.alpha
    tracker.observe([])  # no rounds ran: no change
    assert tracker.alpha == before


def test_break_even_alpha_is_where_costs_cross():
    t = table(propose_per_token=0.003)
    alpha = break_even_alpha(t, FEATURES, False, 4)
    assert 0 < alpha < 1
    k0 = estimate_latency(t, FEATURES, False, 0, 0)
    assert estimate_latency(t, FEATURES, False, 4, alpha) <= k0 < estimate_latency(t, FEATURES, False, 4, alpha - 0.01)
    assert break_even_alpha(table(propose_per_token=0.03), FEATURES, False, 4) is None


def test_exact_hit_costs_no_prefill():
    t = table()
    exact = RequestFeatures(256, 256, 64, exact_hit=True)
    assert estimate_latency(t, exact, True, 0, 0.5) < estimate_latency(t, exact, False, 0, 0.5) - 0.4


@pytest.mark.heavy
def test_stale_calibration_is_detected_and_not_used(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("RAKV_CALIBRATION_DIR", str(tmp_path))
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    quick = CalibrationPlan(prefill_lengths=(16, 64), contexts=(32, 64), copy_lengths=(16, 32), repeats=1,
                            acceptance_prompts=1, acceptance_new_tokens=8)
    prompts = [list(range(100, 140))]
    first = load_or_calibrate(engine, prompts, plan=quick, progress=False)
    path = next(tmp_path.glob("*.json"))
    assert load_table(path, calibration_key(tiny_pair, "draft")).key == first.key
    stale = json.loads(path.read_text())
    stale["key"]["hardware"]["torch"] = "0.0.1"
    path.write_text(json.dumps(stale))
    with pytest.raises(RakvError, match="another hardware"):
        load_or_calibrate(engine, prompts, plan=quick, recalibrate="never", progress=False)
    again = load_or_calibrate(engine, prompts, plan=quick, progress=False)  # stale: measured anew
    assert again.key == calibration_key(tiny_pair, "draft")
    assert json.loads(path.read_text())["key"]["hardware"]["torch"] != "0.0.1"


def test_rakv_asd_greedy_output_identical_to_ar_on_mixed_workload(tiny_pair):
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    base = list(range(1000, 1040))
    workload = [base, base, base[:30], base[:20] + list(range(5000, 5020)), list(range(7000, 7025)), base]
    # a table under which speculation wins, so that k > 0 actions run as well as k = 0
    controller = Controller(table(propose_per_token=0.0001, alpha=0.95), configured(k_set=(0, 2, 4)))
    reference = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    chosen = set()
    for i, ids in enumerate(workload):
        if i == 3:
            controller = Controller(table(alpha=0.1))  # and one under which it loses
        expected = reference.run(ids, Action.of_strategy("ar"), 12, ignore_eos=True).token_ids
        result = run_strategy(engine, "rakv-asd", ids, 12, controller=controller, ignore_eos=True)
        assert result.token_ids == expected
        assert result.predicted_latency_s == result.decision.predictions[result.action.label]
        chosen.add((result.reuse, result.k > 0))
    assert {(True, True), (False, False), (True, False)} <= chosen


@pytest.mark.parametrize("changes, message", [
    ({"k_set": (0, 3)}, "k_set values must be 0 or one of"),
    ({"k_set": ()}, "k_set values must be"),
    ({"beta": 1.5}, "beta must be in"),
    ({"beta": -0.1}, "beta must be in"),
    ({"memory_penalty_s_per_byte": -1.0}, "memory_penalty_s_per_byte must be >= 0"),
    ({"memory_budget_mib": 0}, "memory_budget_mib must be positive"),
    ({"tie_margin": 1.0}, "tie_margin must be in"),
    ({"explore_every": -1}, "explore_every must be a whole number"),
])
def test_controller_settings_are_checked_wherever_they_come_from(changes, message):
    with pytest.raises(RakvError, match=message):
        configured(**changes)


def test_table_curve_interpolates_extrapolates_and_is_made_non_decreasing():
    curve = Curve.table([64, 256, 512], [0.030, 0.028, 0.040])  # a dip at 256 is noise: pooled with 64
    assert curve.ys == pytest.approx([0.029, 0.029, 0.040]) and curve.max_rel_error == pytest.approx(1 / 28)
    assert curve(160) == pytest.approx(0.029) and curve(384) == pytest.approx(0.0345)
    assert curve(768) == pytest.approx(0.051)  # the last segment extended
    assert Curve.table([1, 16], [0.02, 0.05])(0) == pytest.approx(0.018)
    assert Curve.table([4], [0.5])(100) == 0.5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=12))
def test_non_decreasing_is_monotone_and_keeps_the_total(values):
    fitted = non_decreasing(values)
    assert all(a <= b + 1e-12 for a, b in zip(fitted, fitted[1:]))
    assert sum(fitted) == pytest.approx(sum(values))
    if all(a <= b for a, b in zip(values, values[1:])):
        assert list(fitted) == pytest.approx(values)


def test_ties_within_the_margin_go_to_less_speculation():
    predictions = {Action(False, 0): 1.00, Action(True, 0): 0.97, Action(True, 4): 0.93, Action(True, 8): 0.95}
    assert choose(predictions, 0.0) == Action(True, 4)
    assert choose(predictions, 0.05) == Action(True, 0)  # 0.97 is within 5 % of 0.93
    assert choose(predictions, 0.10) == Action(True, 0)  # k = 0 first, then reuse
    assert choose({Action(False, 0): 1.0, Action(False, 2): 0.5}, 0.05) == Action(False, 2)  # a real gain


def test_exploration_probes_speculation_on_schedule_and_only_then():
    controller = Controller(table(alpha=0.05), configured(explore_every=3, tie_margin=0.0))
    decisions = [controller.decide(256, Hit(256), 64) for _ in range(6)]
    assert [d.explored for d in decisions] == [False, False, True, False, False, True]
    assert all(d.action.k == 0 for d in decisions if not d.explored)
    assert all(d.action.k > 0 and d.action == min((a for a in map(Action.parse, d.predictions) if a.k),
                                                  key=lambda a: d.predictions[a.label])
               for d in decisions if d.explored)
    quiet = Controller(table(alpha=0.05), configured(explore_every=0))
    assert not any(quiet.decide(256, Hit(256), 64).explored for _ in range(6))


def test_noisy_calibration_points_are_measured_again_then_refused(monkeypatch):
    from rakv.runtime import calibration

    plan = CalibrationPlan(repeats=4, remeasure_passes=1)
    # per point: a warm-up, a pass of 4, and (if noisy) a second pass of 4
    scripted = {"quiet": iter([0.010] * 5),
                "spiky": iter([0.010] + [0.030, 0.010] * 2 + [0.010, 0.0101, 0.0099, 0.010]),
                "bad": iter([0.010] + [0.010, 0.050] * 4)}
    monkeypatch.setattr(calibration, "time_once", lambda point, device: next(scripted[point.run()]))
    points = {(name, 64): calibration.Point(lambda name=name: name) for name in scripted}
    calibration.measure_interleaved(points, None, plan)
    assert points["quiet", 64].spread == 0 and points["spiky", 64].spread < 0.05  # the quieter second set is kept
    assert points["bad", 64].spread > plan.refuse_spread
    with pytest.raises(RakvError, match=r"too noisy to use: bad/64 \(spread"):
        calibration.refuse_if_noisy(points, plan, "tiny", "draft")
    calibration.refuse_if_noisy({k: v for k, v in points.items() if k[0] != "bad"}, plan, "tiny", "draft")


def depth_for(alpha_unigram, alpha_ngram, verify=None, prior_rounds=4.0):
    t = table(verify=0.024)
    if verify is not None:
        t.verify = {k: flat(verify(k)) for k in (1, 2, 4, 6, 8)}
    return RoundDepth(t, (0, 1, 2, 4, 6, 8), {"unigram": alpha_unigram, "ngram": alpha_ngram}, prior_rounds)


def test_round_depth_speculates_as_deep_as_the_match_class_pays():
    depth = depth_for(0.05, 0.95)  # step 20 ms, verify 24 ms whatever k
    assert depth.choose(100, 8, "unigram") == 0  # 24 / 1.05 > 20: a plain step
    assert depth.choose(100, 8, "ngram") == 8  # flat verify: the deepest pays most
    assert depth.choose(100, 3, "ngram") == 2  # never more than the candidates offered (k in the calibrated set)
    assert depth.choose(100, 0, "ngram") == 0
    rising = depth_for(0.5, 0.5, verify=lambda k: 0.020 + 0.003 * k)  # deeper verification costs more
    per_token = {k: (0.020 + 0.003 * k) / expected_tokens_per_round(0.5, k) for k in (1, 2, 4, 6, 8)}
    assert rising.choose(100, 8, "ngram") == min(per_token, key=per_token.get) == 2


def test_round_depth_learns_from_the_requests_own_rounds_and_shadows():
    depth = depth_for(0.9, 0.9, prior_rounds=2.0)
    assert depth.choose(100, 8, "unigram") == 8
    for _ in range(20):  # twenty first candidates fail: this request's unigram matches are not to be trusted
        depth.observe("unigram", 1, 0)
    assert depth.alpha("unigram") == pytest.approx(1.8 / 22.0) and depth.choose(100, 8, "unigram") == 0
    assert depth.alpha("ngram") == 0.9  # the other class keeps its prior


def test_controller_round_depth_only_when_enabled_and_for_prompt_lookup():
    off = Controller(table(), configured(depth_per_round=False))
    on = Controller(table(), configured(depth_per_round=True))
    assert off.round_depth(PROPOSERS["prompt-lookup"]) is None and on.round_depth(PROPOSERS["draft"]) is None
    depth = on.round_depth(PROPOSERS["prompt-lookup"])
    assert depth.prior == {"unigram": 0.6, "ngram": 0.6} and depth.max_k == 8
    depth.observe("unigram", 1, 0)
    depth.observe("ngram", 4, 4)
    on.observe([(4, 4)], 0, depth)
    by_match = on.learned_at(0.0).by_match
    assert by_match["unigram"].alpha < 0.6 < by_match["ngram"].alpha
    resumed = Controller(table(), configured(depth_per_round=True))
    resumed.restore(on.tracker.state, json.loads(json.dumps(on.by_match_state)), 7)
    assert resumed.by_match_state == on.by_match_state and resumed.tracker.state == on.tracker.state
    assert resumed.decisions == 7
    with pytest.raises(RakvError, match="depth_prior_rounds"):
        configured(depth_prior_rounds=0)


def test_the_controller_learns_acceptance_per_temperature():
    """Acceptance under rejection sampling moves with the temperature: rounds at T = 1.0 teach T = 1.0 (and 1.00004,
    the same key) alone; a started temperature begins at its measured acceptance, greedy at the calibration's."""
    controller = Controller(table(alpha=0.6), configured())
    controller.start(1.0, 0.3)
    with pytest.raises(RakvError, match="already started"):
        controller.start(1.00004, 0.4)
    assert controller.tracker_at(1.0).alpha == pytest.approx(0.3) and controller.alpha == pytest.approx(0.6)
    for _ in range(80):
        controller.observe([(4, 0)], temperature=1.0)  # every first candidate rejected at T = 1.0
    assert controller.tracker_at(1.0).alpha < 0.05
    assert controller.alpha == pytest.approx(0.6) and controller.tracker_at(-1.0) is controller.tracker
    assert controller.tracker_at(0.7).alpha == pytest.approx(0.6)  # never started, never observed: the prior
    features = RequestFeatures(prompt_tokens=64, new_tokens=64, hit_tokens=0)
    at_one = controller.predict(features, Action(False, 4), temperature=1.0)
    greedy = controller.predict(features, Action(False, 4))
    assert at_one > greedy  # the same action priced at each temperature's own acceptance


def test_one_controller_across_temperatures_decides_as_one_controller_per_temperature():
    """The sampling stage's controller (one, started per temperature) against its earlier design (one controller per
    temperature, its table's acceptance replaced): the same decisions and estimates, rounds interleaved."""
    rng = random.Random(3)
    starts = {0.0: 0.6, 0.7: 0.45, 1.0: 0.3}
    shared = Controller(table(alpha=0.6), configured())
    apart = {t: Controller(replace(table(alpha=0.6), acceptance=a), configured()) for t, a in starts.items()}
    for t, a in starts.items():
        shared.start(t, a)
    for _ in range(60):
        t = rng.choice(list(starts))
        prompt, new = rng.randint(8, 200), rng.randint(8, 64)
        ours, theirs = shared.decide(prompt, Hit(prompt), new, temperature=t), apart[t].decide(prompt, Hit(prompt), new)
        assert ours.action == theirs.action and ours.predicted_latency_s == pytest.approx(theirs.predicted_latency_s)
        k = max(ours.action.k, 1)
        log = [(k, rng.randint(0, k)) for _ in range(rng.randint(1, 5))]
        shared.observe(log, temperature=t)
        apart[t].observe(log)
    for t in starts:
        assert shared.tracker_at(t).state == pytest.approx(apart[t].tracker.state)
