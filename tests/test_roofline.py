"""The benchmarks' floors (rakv.bench.roofline): a pass at the larger of its bytes and its FLOPs, the trace's bound,
and the per-row cost table's parts adding up to the step."""

import pytest
from conftest import THREADS
from hypothesis import given, settings
from hypothesis import strategies as st

from rakv.bench.roofline import Geometry, Limits, format_row_costs, goal_verdict, row_costs, trace_bound
from rakv.runtime.models import load_pair

# 1 GB of weights, 100 M multiply-adds per row in the layers, 10 M in the head, 1 KB of K/V per position
GEOMETRY = Geometry(weight_bytes=10**9, body_macs=10**8, head_macs=10**7, layers=2, heads=4, head_dim=8,
                    kv_bytes_per_position=1000)
LIMITS = Limits(fma_peak_gflops=100.0, stream_gb_s=10.0)


def test_a_decode_step_is_bound_by_bytes_until_rows_make_flops_the_larger():
    one = GEOMETRY.decode_step_s([100], LIMITS)
    assert one == pytest.approx((10**9 + 100 * 1000) / 10e9)  # 0.1 s of bytes; 2.2e8 FLOPs = 2.2 ms
    many = GEOMETRY.decode_step_s([100] * 1000, LIMITS)  # 2.2e11 FLOPs = 2.2 s > 0.11 s of bytes
    assert many == pytest.approx((2 * 1000 * 1.1e8 + 1000 * 4 * 2 * 4 * 8 * 100) / 100e9)


def test_a_prefill_computes_every_row_and_one_row_of_logits():
    flops = GEOMETRY.prefill_flops(10)
    assert flops == pytest.approx(2 * (10 * 10**8 + 2 * 2 * 4 * 8 * 10 * 11 / 2 + 10**7))


def test_the_trace_bound_reads_the_weights_once_per_step_for_every_running_request():
    prompts = [50, 60, 70, 80]
    alone, together = (trace_bound(GEOMETRY, LIMITS, prompts, 9, c) for c in (1, 4))
    assert alone.prefill_s == together.prefill_s
    # one request at a time: 4 x 8 steps, each the weights and its K/V; four together: 8 steps
    assert alone.decode_s == pytest.approx(sum(GEOMETRY.decode_step_s([n + t], LIMITS)
                                                  for n in prompts for t in range(1, 9)))
    assert together.decode_s == pytest.approx(sum(GEOMETRY.decode_step_s([n + t for n in prompts], LIMITS)
                                                     for t in range(1, 9)))
    assert together.decode_s < alone.decode_s / 3.5  # four requests share each read of the weights
    assert together.tok_s == pytest.approx(4 * 9 / together.seconds)


def test_the_per_row_table_splits_a_real_step_into_its_kernels():
    pair = load_pair("tiny", threads=THREADS, kernels="compact")
    model = pair.target.module
    contexts = [list(range(5 + i, 40 + i)) for i in range(4)]
    rows = row_costs(model, pair.device, contexts, (1, 2, 4), 2, Limits(100.0, 10.0))
    assert list(rows) == [1, 2, 4]
    for b, row in rows.items():
        assert row.step_ms > 0 and row.gemm_ms > 0 and row.attention_ms > 0
        assert row.other_ms == pytest.approx(row.step_ms - row.gemm_ms - row.attention_ms)
        assert row.kv_mb == pytest.approx(b * 34 * Geometry.of(model).kv_bytes_per_position / 1e6)
    assert rows[1].over_one == 1.0
    assert len(format_row_costs(rows)) == 4


def test_a_one_row_step_above_its_floor_leaves_the_16_row_goal_within_reach():
    # 16 rows FLOP-bound at 1.9x the one row's byte-bound floor: the floors' own ratio misses the 1.6 goal
    limits = Limits(fma_peak_gflops=18.5, stream_gb_s=10.0)
    floor_1, floor_16 = (GEOMETRY.decode_step_s([100] * b, limits) for b in (1, 16))
    assert floor_16 / floor_1 == pytest.approx(1.9, abs=0.01)
    one_row = 2 * floor_1  # an engine whose one-row step sits at twice its floor
    assert goal_verdict(2 * one_row, one_row, 1.6, floor_16) == "missed"  # not "out of reach"
    # what the old rule (the floors' ratio) called out of reach, an engine with a faster 16-row step meets
    faster_16 = 1.25 * one_row
    assert faster_16 >= floor_16 and goal_verdict(faster_16, one_row, 1.6, floor_16) == "met"
    # at its floor, no 16-row step beside this one-row step meets the goal
    at_floor = 1.02 * floor_1
    assert goal_verdict(2.2 * floor_1, at_floor, 1.6, floor_16).startswith("out of reach at this baseline")


def test_a_numerator_that_beats_its_own_limit_voids_the_third_verdict():
    assert goal_verdict(0.18, 0.1, 1.6, 0.19) == "missed"  # the 16-row step ran below its floor: no bound here
    assert goal_verdict(130.0, 100.0, 1.4, 120.0, higher_is_better=True) == "missed"  # above the trace's bound


def test_the_serving_ratio_is_judged_from_the_bound_at_16_over_ours_at_8():
    # ours 100 tok/s at c = 8 (the bound's own c = 8 is 140, its ratio 150 / 140 = 1.07 < 1.2): still reachable
    assert goal_verdict(105.0, 100.0, 1.2, 150.0, higher_is_better=True) == "missed"
    assert goal_verdict(125.0, 100.0, 1.2, 150.0, higher_is_better=True) == "met"
    assert goal_verdict(105.0, 100.0, 1.2, 110.0, higher_is_better=True).startswith("out of reach at this baseline")
    assert goal_verdict(105.0, 100.0, 1.2, None, higher_is_better=True) == "missed"  # no bound (no compact model)


positive = st.floats(min_value=0.01, max_value=100.0)
fraction = st.floats(min_value=0.0, max_value=1.0)


@settings(max_examples=500, deadline=None)
@given(positive, positive, positive, st.floats(min_value=0.1, max_value=10.0), st.booleans(), fraction, fraction)
def test_no_faster_engine_contradicts_out_of_reach(numerator, baseline, limit, goal, higher, toward_limit, faster):
    """Wherever the verdict is "out of reach", an engine faster in both terms (its numerator anywhere between the
    measured one and its limit, its baseline as fast or faster) misses the goal too."""
    verdict = goal_verdict(numerator, baseline, goal, limit, higher_is_better=higher)
    if not verdict.startswith("out of reach"):
        return
    their_numerator = numerator + toward_limit * (limit - numerator)
    their_baseline = baseline * (1 + faster) if higher else baseline * (1 - 0.99 * faster)
    ratio = their_numerator / their_baseline
    assert (ratio < goal) if higher else (ratio > goal)
