"""rakv.experiments.prediction: the headline comparisons a calibration predicts before the study, and how a measured
one is judged against them."""

import json
import math
import shutil
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from rakv.experiments import prediction
from rakv.runtime.actions import Action
from rakv.runtime.costmodel import read_cost_table
from rakv.runtime.run_layout import RunLayout

LAYOUT = RunLayout.reference("offline")
REFERENCE = LAYOUT.root
ACTIONS = [Action.parse(a) for a in ("r0k0", "r1k0", "r0k4", "r1k4", "r1k6")]


def test_the_comparisons_follow_the_studys_definitions():
    costs = np.array([[4.0, 2.0, 3.0, 1.0, 1.5],
                      [4.0, 4.0, 2.0, 2.0, 1.0]])  # request 2 offers no hit: r1 costs what r0 does
    chosen = costs.argmin(axis=1)  # r1k4, r1k6
    got = prediction.comparisons(chosen, costs, ACTIONS)
    assert got["vs Joint-k4"] == pytest.approx(1 - 2.0 / 3.0)
    assert got["vs KV-only"] == pytest.approx(1 - 2.0 / 6.0)
    assert got["vs best fixed"] == pytest.approx(1 - 2.0 / 2.5)  # r1k6's sum, the least of any one action
    assert got["best k>0 vs k=0"] == pytest.approx(2.0 / 6.0 - 1)


def test_a_measurement_is_judged_with_its_own_interval():
    predicted = [0.10, 0.05, 0.15]
    assert prediction.inside(predicted, [0.12, 0.10, 0.14])
    assert not prediction.inside(predicted, [0.30, 0.28, 0.32])
    assert prediction.inside(predicted, [0.20, 0.05, 0.35])  # outside the prediction, but its own CI is wide
    assert prediction.inside(predicted, None) is None


def test_the_run_to_run_shift_of_a_calibration_is_read_from_a_pair(tmp_path):
    a, b = RunLayout.of(tmp_path / "a"), RunLayout.of(tmp_path / "b")
    shutil.copytree(LAYOUT.calibration_dir, a.calibration_dir)
    shutil.copytree(LAYOUT.calibration_dir, b.calibration_dir)
    assert prediction.calibration_run_sd([(a, b)]) == 0.0
    for path in b.calibrations():
        table = read_cost_table(path)
        for curve in prediction.curves(table):
            curve.ys = [1.2 * y for y in curve.ys]
        path.write_text(json.dumps(table.to_json()))
    assert prediction.calibration_run_sd([(a, b)]) == pytest.approx(math.log(1.2) / math.sqrt(2))
    assert prediction.calibration_run_sd([]) is None


def test_the_prediction_is_seeded_and_its_interval_holds_its_point():
    runs = pd.read_parquet(LAYOUT.study.runs)
    shapes = prediction.request_shapes(runs)
    part = shapes[shapes.configuration == "smollm2"]
    table = prediction.configuration_table(REFERENCE, "smollm2")
    actions = [Action.parse(a) for a in ("r0k0", "r0k4", "r1k0", "r1k4", "r1k6")]
    first = prediction.predict(table, part, actions, run_sd=0.1, draws=30, seed=3)
    assert first == prediction.predict(table, part, actions, run_sd=0.1, draws=30, seed=3)
    for name, (point, low, high) in first.items():
        assert low <= point <= high, name
    exact = replace(table, acceptance_rounds=0)  # no run-to-run spread, no acceptance draw: every draw the same
    still = prediction.predict(exact, part, actions, run_sd=0.0, draws=5, seed=3)
    base = prediction.action_costs(exact, part, actions, exact.acceptance, exact.match_rate)
    for name, value in prediction.comparisons(base.argmin(axis=1), base, actions).items():
        assert still[name] == pytest.approx([value] * 3), name


def test_a_planted_miss_is_refused_and_named(tmp_path):
    """A run whose study 'measured' far more than its calibration allows (planted in its summary): the comparison is
    outside, and named by its cause; the others of the run stay as they were."""
    run = RunLayout.of(tmp_path / "offline")
    shutil.copytree(LAYOUT.calibration_dir, run.calibration_dir)
    summary = json.loads(LAYOUT.summary.read_text())
    summary["per_configuration"]["smollm2"]["latency_reduction"]["joint-k4"] = [0.9, 0.89, 0.91]
    run.summary.write_text(json.dumps(summary))
    shapes = prediction.request_shapes(pd.read_parquet(LAYOUT.study.runs))
    rows = {(r.configuration, r.comparison): r for r in prediction.run_predictions(run.root, shapes, run_sd=0.05,
                                                                                   draws=20)}
    planted = rows["smollm2", "vs Joint-k4"]
    assert planted.inside is False and planted.cause == "cost model"
    assert set(prediction.COMPARISONS) == {c for _, c in rows}
    assert all(r.cause is None for r in rows.values() if r.inside)


def test_a_comparison_whose_baseline_was_not_priced_is_nan_not_an_error():
    actions = [Action.parse(a) for a in ("r0k0", "r0k4")]  # no r1k4, no r1k0
    got = prediction.comparisons(np.array([1]), np.array([[2.0, 1.0]]), actions)
    assert math.isnan(got["vs Joint-k4"]) and math.isnan(got["vs KV-only"])
    assert got["best k>0 vs k=0"] == pytest.approx(-0.5)
