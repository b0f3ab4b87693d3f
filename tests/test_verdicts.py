"""The one CI-side rule (rakv.experiments.verdicts) and the vocabularies read from it."""

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rakv.experiments import prose
from rakv.experiments.claims import Claim, verdict_direction
from rakv.experiments.verdicts import (
    GOAL_VERDICTS,
    ClaimVerdict,
    Payoff,
    Verdict,
    below,
    ci_side,
    higher,
    non_inferior,
    payoff,
    tally,
)

NAN = float("nan")


@pytest.mark.parametrize("ci, threshold, side", [
    ((1.0, 0.5, 1.5), 0.0, "above"), ((-1.0, -2.0, -0.5), 0.0, "below"), ((0.1, -0.1, 0.3), 0.0, "straddles"),
    ((0.5, 0.0, 1.0), 0.0, "straddles"), ((-0.5, -1.0, 0.0), 0.0, "straddles"), ((NAN, 0.1, 0.2), 0.0, "missing"),
    ((0.2, NAN, NAN), 0.1, "above"), ((0.05, None, None), 0.1, "below"), ((0.1, NAN, NAN), 0.1, "straddles"),
])
def test_which_side_of_the_threshold_the_interval_lies(ci, threshold, side):
    assert ci_side(ci, threshold) == side


def test_without_an_interval_the_point_decides_only_when_asked():
    assert ci_side((0.3, NAN, NAN), 0.0) == "above"
    assert ci_side((0.3, NAN, NAN), 0.0, point_if_no_interval=False) == "missing"


finite = st.floats(-10, 10, allow_nan=False)


@given(finite, finite, finite)
def test_claims_goals_and_prose_agree_on_every_interval(a, b, c):
    value, low, high = sorted((a, b, c))[1], min(a, b, c), max(a, b, c)
    ci = (value, low, high)
    side = ci_side(ci, 0.0)
    claim = Claim("a positive effect", 0.2, "effect", 0.0)
    assert verdict_direction(claim, ci) == {"above": "yes", "below": "no"}.get(side, "inconclusive")
    assert higher(list(ci), 0.0) == {"above": "met", "below": "missed"}.get(side, "inconclusive")
    assert prose.verdict(ci) == {"above": "faster than", "below": "slower than"}.get(side, "not distinguishable from")
    assert non_inferior(list(ci), 0.0) == {"above": "met", "below": "missed"}.get(side, "inconclusive")
    assert not math.isnan(value)


def test_each_vocabulary_is_written_as_its_words():
    """A verdict is an enum member that equals its text and is written as it (summary.json unchanged), and each
    kind's words are its own: a goal's, a claim's, the payoff of speculating on a reused prefix."""
    assert json.dumps([Verdict.MET, ClaimVerdict.NOT_APPLICABLE, Payoff.NO_INTERVAL]) == '["met", "n/a", "no interval"]'
    assert GOAL_VERDICTS == ("met", "missed", "inconclusive", "underpowered", "missing")
    assert tally(["met", "not judged", "underpowered"]) == {"met": 1, "missed": 0, "inconclusive": 0,
                                                           "underpowered": 1, "missing": 1}
    assert [payoff(ci) for ci in ([0.2, 0.1, 0.3], [-0.2, -0.3, -0.1], [0.0, -0.1, 0.1], [0.1, NAN, NAN])] == [
        "pays", "costs", "inconclusive", "no interval"]
    assert all(isinstance(v, Verdict) for v in (higher([1, 0.5, 2]), below([1, 0.5, 2], 0), non_inferior([0, 1, 2], 1)))
