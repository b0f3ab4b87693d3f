"""The one rule every verdict is read from: on which side of a threshold a confidence interval lies.

    ci_side((value, low, high), threshold) -> "above" | "below" | "straddles" | "missing"

"above" / "below": the whole interval lies strictly on that side; an interval touching or containing the threshold
"straddles" it. Without finite bounds the point value decides (`point_if_no_interval`, for statistics computed
once, without resampling), or the side is "missing". Every rule below is symmetric about its threshold: reflecting
a CI about it swaps met and missed and keeps inconclusive (a property test in tests/test_serving_stats.py). The
claims (rakv.experiments.claims), the serving goals (rakv.experiments.serving_stats) and the paper's wording
(rakv.experiments.report) map these four answers to their own words.

A serving goal ends with exactly one of `GOAL_VERDICTS` (docs/serving.md, "Goals"): met, missed or inconclusive from
its CIs under the family's Holm correction; "underpowered" where the plan, before the run, found its minimum
detectable difference at the profile's repeats above its margin (decided from the pilot, never from the run); and
"missing" where the data cannot answer it (a load of the design not measured, a baseline's goodput of 0, no load
where any policy missed an SLO), each with its reason. `tally` counts them, so the counts sum to the goals.
"""

from __future__ import annotations

import math


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def ci_side(ci, threshold: float, *, point_if_no_interval: bool = True) -> str:
    value, low, high = ci
    if not _finite(value):
        return "missing"
    if not (_finite(low) and _finite(high)):
        if not point_if_no_interval:
            return "missing"
        low = high = value
    if low > threshold:
        return "above"
    if high < threshold:
        return "below"
    return "straddles"


def below(ci, threshold: float) -> str:
    """A goal "below `threshold`": met when the CI lies wholly below it, missed when wholly above, else
    inconclusive (no interval: missing)."""
    side = ci_side(ci, threshold, point_if_no_interval=False)
    return {"below": "met", "above": "missed", "missing": "missing"}.get(side, "inconclusive")


def non_inferior(ci, margin: float, worse: str = "below") -> str:
    """"No worse than the baseline" with an equivalence margin, on a difference (ours - baseline, relative): met
    when the CI excludes a loss as large as the margin, missed when it lies wholly beyond it, else inconclusive.
    `worse`: the direction of a loss ("below" for goodput, "above" for a latency)."""
    bound = -margin if worse == "below" else margin
    side = ci_side(ci, bound, point_if_no_interval=False)
    if side == "missing":
        return "missing"
    better = "above" if worse == "below" else "below"
    return {better: "met", worse: "missed"}.get(side, "inconclusive")


def higher(ci, threshold: float = 0.0) -> str:
    """"Higher than the baseline" on a difference (ours - baseline): met when the CI lies wholly above
    `threshold` (0: any gain), missed when wholly below it, else inconclusive: the mirror image of `below`, so a CI
    straddling the threshold is never read as a loss."""
    side = ci_side(ci, threshold, point_if_no_interval=False)
    return {"above": "met", "below": "missed", "missing": "missing"}.get(side, "inconclusive")


UNDERPOWERED = "underpowered"
GOAL_VERDICTS = ("met", "missed", "inconclusive", UNDERPOWERED, "missing")  # a serving goal's answers, in that order


def tally(verdicts: list[str]) -> dict[str, int]:
    """How many goals end with each of GOAL_VERDICTS (every one counted once: the counts sum to the goals)."""
    # "not judged" (no load where a policy missed an SLO), in summary.json files written before these five, is a
    # goal the data could not answer: missing
    verdicts = ["missing" if v == "not judged" else v for v in verdicts]
    unknown = sorted(set(verdicts) - set(GOAL_VERDICTS))
    if unknown:
        raise ValueError(f"goal verdicts outside {GOAL_VERDICTS}: {unknown}")
    return {v: sum(x == v for x in verdicts) for v in GOAL_VERDICTS}


def all_of(verdicts: list[str]) -> str:
    """A goal that must hold at every load: met if met everywhere, missed if missed anywhere, else inconclusive."""
    if not verdicts or "missing" in verdicts:
        return "missing"
    if "missed" in verdicts:
        return "missed"
    return "met" if all(v == "met" for v in verdicts) else "inconclusive"


def any_of(verdicts: list[str]) -> str:
    """A goal that must hold at some load: met if met anywhere, missed if missed everywhere, else inconclusive."""
    if not verdicts or all(v == "missing" for v in verdicts):
        return "missing"
    if "met" in verdicts:
        return "met"
    return "missed" if all(v == "missed" for v in verdicts) else "inconclusive"
