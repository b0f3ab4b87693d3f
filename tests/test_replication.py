"""rakv.experiments.replication and the tie sets: pooling shipped runs, the run-level variance, a held-out run's
coverage, Holm's adjustment, and the actions the cost model cannot tell apart."""

import math
import shutil
from dataclasses import replace

import pytest

from rakv.experiments import replication
from rakv.experiments.metadata import Hardware, read_run_metadata, write_run_metadata
from rakv.experiments.summary import read_summary
from rakv.runtime.costmodel import Curve, prediction_noise, tie_set
from rakv.runtime.paths import REFERENCE_DIR
from rakv.runtime.run_layout import RunLayout

REFERENCE = REFERENCE_DIR / "offline"
NAME = "per_configuration.smollm2.latency_reduction.joint-k4"


def test_holm_adjusts_step_down_and_keeps_order():
    assert replication.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert replication.holm([0.5]) == [0.5]


def test_runs_that_agree_pool_to_their_own_interval_with_no_run_variance():
    ci = [0.10, 0.04, 0.16]  # symmetric on the regret's (linear) scale
    pooled = replication.pool([ci, ci], "per_configuration.smollm2.mean_regret", df=7)
    assert pooled.run_sd == 0.0 and pooled.heterogeneity_p == pytest.approx(1.0)
    assert pooled.pooled == pytest.approx(ci)  # shared prompts: pooling does not narrow the prompts' error


def test_runs_that_disagree_get_a_run_level_variance_and_a_wider_pooled_interval():
    a, b = [0.30, 0.25, 0.35], [0.05, 0.0, 0.10]
    pooled = replication.pool([a, b], NAME, df=7)
    assert pooled.run_sd > 0 and pooled.heterogeneity_p < 0.01
    assert pooled.pooled[1] < b[1] and pooled.pooled[2] > a[2]  # both runs' estimates inside, wider than either
    assert b[0] < pooled.pooled[0] < a[0]


def test_every_scale_reads_back_what_it_was_given():
    for name, ci in ((NAME, [0.1, 0.04, 0.17]), ("pooled.throughput_gain.ar", [0.7, 0.5, 0.9]),
                     ("per_configuration.x.mape", [0.2, 0.15, 0.27]),
                     ("per_configuration.x.accuracy_k", [0.3, 0.1, 0.6]),
                     ("per_configuration.x.spearman", [0.8, 0.7, 0.9])):
        scale = replication.scale_of(name)
        for value in ci:
            assert scale.back(scale.forward(value)) == pytest.approx(value)


def test_held_out_coverage_counts_each_run_against_the_others():
    runs = [{"a": [0.0, -1.0, 1.0], "b": [0.0, -1.0, 1.0]}, {"a": [0.5, -0.5, 1.5], "b": [3.0, 2.0, 4.0]}]
    got = replication.held_out_coverage(runs, df=7)
    assert (got.inside, got.total) == (2, 4)  # "a" inside both ways, "b" outside both ways
    assert 0.8 < got.expected < 0.9 and replication.held_out_coverage(runs[:1], df=7) is None


def test_the_tie_set_holds_the_estimates_within_the_cost_models_noise():
    predictions = {"r1k6": 1.00, "r1k4": 1.02, "r1k2": 1.10, "r0k0": 2.0}
    assert tie_set(predictions, noise=0.01) == ["r1k6", "r1k4"]  # 1.96 * sqrt(2) * 1 % = 2.8 %
    assert tie_set(predictions, noise=0.0) == ["r1k6"]
    assert tie_set(predictions, noise=0.05) == ["r1k6", "r1k4", "r1k2"]


def test_the_noise_is_read_from_the_calibrations_spreads():
    from rakv.runtime.costmodel import read_cost_table

    table = read_cost_table(RunLayout.of(REFERENCE).calibration("smollm2", "draft"))
    noise = prediction_noise(table)
    assert 0 < noise < 0.1
    quiet = Curve.table([1.0, 2.0], [1.0, 2.0], spread=[0.0, 0.0], samples=[5, 5])
    loud = Curve.table([1.0, 2.0], [1.0, 2.0], spread=[0.1, 0.1], samples=[4, 4])
    base = replace(table, target_prefill=quiet, target_step=quiet, verify={1: quiet}, propose={1: quiet})
    assert prediction_noise(base) == 0.0
    noisy = prediction_noise(replace(base, target_prefill=loud, target_step=loud, verify={1: loud}))
    assert noisy == pytest.approx(replication_noise(0.1, 4))


def replication_noise(spread: float, samples: int) -> float:
    return 1.2533 * 1.4826 * spread / math.sqrt(samples)


def test_a_sibling_run_of_another_commit_or_machine_is_not_pooled(tmp_path):
    from rakv.experiments.runcompare import sibling_runs

    shipped = RunLayout.of(REFERENCE)

    def run(name: str, commit: str, processor: str = "CPU X"):
        layout = RunLayout.of(tmp_path / name)
        layout.study.root.mkdir(parents=True)
        shutil.copy(shipped.summary, layout.summary)
        machine = Hardware(processor=processor, device="cpu", dtype="float32", threads=2, torch="2", transformers="5")
        write_run_metadata(replace(read_run_metadata(shipped), git_commit=commit, hardware=machine), layout.study)
        return layout.root

    first = run("offline", "abc")
    run("offline-rerun", "abc")
    run("offline-rerun-2", "def")
    run("offline-rerun-3", "abc", "CPU Y")
    assert [p.name for p in sibling_runs(first)] == ["offline-rerun"]


def test_the_pooled_view_replaces_pooled_intervals_and_claims(tmp_path):
    """A run with its rerun beside it (the shipped reference twice: one commit, one machine) gets a replication
    record, and the pooled view puts its pooled intervals and claims in place of the run's own."""
    from rakv.experiments.runcompare import replication_summary

    for name in ("offline", "offline-rerun"):
        shutil.copytree(REFERENCE, tmp_path / name)
    summary = read_summary(tmp_path / "offline")
    found = replication_summary(tmp_path / "offline", summary)
    assert found is not None and set(found.decisions_same.values()) == {1.0}  # a copy decides as its original
    summary = replace(summary, replication=found)
    view = replication.pooled_summary(summary)
    pooled = {p.name: p.pooled for p in found.statistics}
    assert view.per_configuration["smollm2"].latency_reduction.joint_k4 == pytest.approx(pooled[NAME])
    assert view.claims == found.claims
    assert len(found.claim_runs) == len(summary.claims)


def test_zero_width_intervals_pool_to_their_value_not_to_nan():
    """A statistic with no spread over prompts (a regret of exactly 0 in every prompt) has a zero-width CI."""
    pooled = replication.pool([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], "per_configuration.x.mean_regret", df=7)
    assert pooled.pooled == pytest.approx([0.0, 0.0, 0.0], abs=1e-5)
    mixed = replication.pool([[0.0, 0.0, 0.0], [0.1, 0.05, 0.15]], "per_configuration.x.mean_regret", df=7)
    assert all(math.isfinite(v) for v in mixed.pooled)
