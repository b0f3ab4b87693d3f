"""Coverage of every interval method the analysis uses (rakv.experiments.intervals), simulated at the counts the
shipped profiles have on data shaped like the study's (the cases and their shapes: rakv.experiments.coverage),
with a positive control that the simulation catches an interval that under-covers."""

import math

import numpy as np
import pandas as pd
import pytest

from rakv.experiments import coverage, intervals
from rakv.runtime.run_layout import INTERVAL_COVERAGE

LEVEL = 0.93
CASES = coverage.cases()
# the paper's coverage table (scripts/interval_coverage.py writes it): each row must be what the code now gives
SHIPPED = pd.read_csv(INTERVAL_COVERAGE)


def shipped_row(statistic, units, shape):
    rows = SHIPPED[(SHIPPED.statistic == statistic) & (SHIPPED.units == units) & (SHIPPED["shape"] == shape)]
    assert len(rows) == 1, f"paper/interval_coverage.csv has no row for {statistic} / {units} / {shape}: rerun " \
                           "scripts/interval_coverage.py"
    return float(rows.coverage.iloc[0])


@pytest.mark.parametrize("case", CASES, ids=[f"{c.statistic}|{c.units}|{c.shape}" for c in CASES])
def test_every_interval_method_holds_its_level_at_the_shipped_counts(case):
    got = coverage.simulate(case)
    assert got >= LEVEL, (case.statistic, case.units, case.shape, got)
    assert shipped_row(case.statistic, case.units, case.shape) == pytest.approx(got, abs=1e-9)


def test_the_closed_form_checks_normal_interval_holds_its_level():
    got = coverage.closed_form_coverage()
    assert got >= LEVEL, got
    assert shipped_row("closed-form acceptance check", "12 requests x 8 rounds", "alpha_j ~ Beta(3, 1.5)") == \
        pytest.approx(got, abs=1e-9)
    assert len(SHIPPED) == len(CASES) + 3  # the cases, the closed-form check, the stress case, the control


def test_the_simulation_catches_an_interval_that_under_covers():
    """Positive control: the percentile bootstrap over the offline profile's 8 prompts, on the normal shape the
    delta method passes, covers well under its 0.95."""
    control = coverage.percentile_control(coverage.counts()["offline"])
    got = coverage.simulate(control)
    assert got < 0.91, got
    assert shipped_row(control.statistic, control.units, control.shape) == pytest.approx(got, abs=1e-9)


def test_a_reduction_never_passes_100_percent_nor_a_gain_minus_100():
    rng = np.random.default_rng(4)
    for _ in range(200):
        ours, baseline = coverage.paired_latencies(rng, 8, log_sd=1.5, skewness=0.0)
        _, low, high = intervals.ratio_interval(ours, baseline, transform=lambda r: 1.0 - r)
        assert high < 1.0 and low <= high
        _, low, _ = intervals.ratio_interval(baseline, ours, transform=lambda r: r - 1.0)
        assert low > -1.0


def test_a_proportion_interval_stays_in_0_1_and_the_skew_generator_has_its_sign():
    _, low, high = intervals.ratio_interval([15.0] * 8, [15.0] * 8, scale="proportion")
    assert 0.9 < low < high == 1.0
    x = coverage.skewed(np.random.default_rng(0), 1.0, -1.0, 200_000)
    assert abs(x.std() - 1.0) < 0.02 and -1.1 < float(((x - x.mean()) ** 3).mean()) < -0.9
    assert math.isclose(float(x.mean()), 0.0, abs_tol=0.02)


def test_scales_are_named():
    with pytest.raises(ValueError, match="interval scale"):
        intervals.ratio_interval([1.0, 2.0], scale="percentile")
