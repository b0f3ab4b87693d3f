"""The one rule every verdict is read from, and the words each kind of verdict is written in.

    ci_side((value, low, high), threshold) -> Side.ABOVE | BELOW | STRADDLES | MISSING

ABOVE / BELOW: the whole interval lies strictly on that side; an interval touching or containing the threshold
STRADDLES it. Without finite bounds the point value decides (`point_if_no_interval`, for statistics computed
once, without resampling), or the side is MISSING. Every rule below is symmetric about its threshold: reflecting
a CI about it swaps met and missed and keeps inconclusive (a property test in tests/test_serving_stats.py).

Each kind of verdict has one vocabulary, declared here as a string enum (a member equals its text and json.dumps
writes the text, so summary.json is what it was when these were plain strings):
- `Verdict`, a serving goal's (docs/serving.md, "Goals"): met, missed or inconclusive from its CIs under the
  family's Holm correction; underpowered where the plan, before the run, found its minimum detectable difference at
  the profile's repeats above its margin (decided from the pilot, never from the run); missing where the data cannot
  answer it (a load of the design not measured, a baseline's goodput of 0, no load where any policy missed an SLO),
  each with its reason. `GOAL_VERDICTS` are the five a goal ends with; `tally` counts them, so the counts sum to the
  goals. "not judged" is the word summary.json files written before these five used for missing (read back only).
- `ClaimVerdict`, a reference claim's (rakv.experiments.claims, paper/main.tex "Claims"): whether the reproduced
  CI shows the reference's finding (yes / no / inconclusive), n/a where the claim's kind has no such verdict,
  missing without a value, not tested where the pair could not run. Another question than a goal's (a published
  figure reproduced, not a goal fixed before the run met), so other words.
- `Payoff`, whether speculating on top of a reused prefix lowers latency (rakv.experiments.study_stats), or lowers
  it against AR at a sampling temperature (rakv.experiments.sampling_stats): the sign of an effect with no goal or
  margin behind it, so neither met nor yes.
- `CheckVerdict`, a closed-form acceptance check's (rakv.experiments.sampling_stats; docs/sampling.md, "What counts
  as agreement"): the measurement agrees with what its rule must accept or differs from it, or the check cannot
  fail (identity) or has no interval (not judged).
- `BlockAcceptance`, whether block verification accepts more or fewer candidates per round than token-wise
  (rakv.experiments.sampling_stats.block_vs_token).
The serving goals (rakv.experiments.serving_goals), the claims and the paper's wording (README.md, paper/) read
these; none re-implements the rule.
"""

from __future__ import annotations

import enum
import math


class Side(enum.StrEnum):
    """Where a CI lies against a threshold (`ci_side`)."""
    ABOVE = "above"
    BELOW = "below"
    STRADDLES = "straddles"
    MISSING = "missing"


class Verdict(enum.StrEnum):
    """A serving goal's verdict (GOAL_VERDICTS), and each load's under a goal's rule (met, missed, inconclusive,
    missing)."""
    MET = "met"
    MISSED = "missed"
    INCONCLUSIVE = "inconclusive"
    UNDERPOWERED = "underpowered"
    MISSING = "missing"
    NOT_JUDGED = "not judged"  # summary.json files written before MISSING: read back, counted as missing


GOAL_VERDICTS = (Verdict.MET, Verdict.MISSED, Verdict.INCONCLUSIVE, Verdict.UNDERPOWERED, Verdict.MISSING)
DECIDED = (Verdict.MET, Verdict.MISSED)  # the answers a test decides (a goal's p-value is the least alpha giving one)


class ClaimVerdict(enum.StrEnum):
    """A reference claim's verdict on its direction or its magnitude (rakv.experiments.claims)."""
    YES = "yes"
    NO = "no"
    INCONCLUSIVE = "inconclusive"
    NOT_APPLICABLE = "n/a"  # the claim's kind has no such verdict
    MISSING = "missing"  # no reproduced value
    NOT_TESTED = "not tested"  # the claim's pair could not be run, or never pays at any k


class Payoff(enum.StrEnum):
    """Whether speculating pays on top of a reused prefix: the sign of its latency reduction's CI."""
    PAYS = "pays"
    COSTS = "costs"
    INCONCLUSIVE = "inconclusive"
    NO_INTERVAL = "no interval"


class CheckVerdict(enum.StrEnum):
    """A closed-form acceptance check's verdict (rakv.experiments.sampling_stats.check_verdict)."""
    AGREES = "agrees"  # the difference's CI includes 0
    DIFFERS = "differs"  # it excludes 0
    IDENTITY = "identity"  # the difference has no variance: the check cannot fail, never counted as agreement
    NOT_JUDGED = "not judged"  # no interval (one request)
    # block cells of summary.json files written before the block rule's expectation given the drafts: read back,
    # counted as not judged (rakv.experiments.sampling_stats.counted_verdict)
    BOUND = "bound"


class BlockAcceptance(enum.StrEnum):
    """Block verification against token-wise: the side of 0 of their difference in accepted candidates per round."""
    MORE = "more"
    FEWER = "fewer"
    INCONCLUSIVE = "inconclusive"  # the CI includes 0, or there is none


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def ci_side(ci, threshold: float, *, point_if_no_interval: bool = True) -> Side:
    value, low, high = ci
    if not _finite(value):
        return Side.MISSING
    if not (_finite(low) and _finite(high)):
        if not point_if_no_interval:
            return Side.MISSING
        low = high = value
    if low > threshold:
        return Side.ABOVE
    if high < threshold:
        return Side.BELOW
    return Side.STRADDLES


def _read(side: Side, met: Side) -> Verdict:
    """A goal's verdict from the side its CI lies on: met on `met`'s side, missed on the other, inconclusive
    straddling, missing without an interval."""
    if side in (Side.MISSING, Side.STRADDLES):
        return Verdict.MISSING if side == Side.MISSING else Verdict.INCONCLUSIVE
    return Verdict.MET if side == met else Verdict.MISSED


def below(ci, threshold: float) -> Verdict:
    """A goal "below `threshold`": met when the CI lies wholly below it, missed when wholly above, else
    inconclusive (no interval: missing)."""
    return _read(ci_side(ci, threshold, point_if_no_interval=False), Side.BELOW)


def non_inferior(ci, margin: float, worse: Side = Side.BELOW) -> Verdict:
    """"No worse than the baseline" with an equivalence margin, on a difference (ours - baseline, relative): met
    when the CI excludes a loss as large as the margin, missed when it lies wholly beyond it, else inconclusive.
    `worse`: the direction of a loss (below for goodput, above for a latency)."""
    bound = -margin if worse == Side.BELOW else margin
    better = Side.ABOVE if worse == Side.BELOW else Side.BELOW
    return _read(ci_side(ci, bound, point_if_no_interval=False), better)


def higher(ci, threshold: float = 0.0) -> Verdict:
    """"Higher than the baseline" on a difference (ours - baseline): met when the CI lies wholly above
    `threshold` (0: any gain), missed when wholly below it, else inconclusive: the mirror image of `below`, so a CI
    straddling the threshold is never read as a loss."""
    return _read(ci_side(ci, threshold, point_if_no_interval=False), Side.ABOVE)


def payoff(ci) -> Payoff:
    """Whether a latency reduction's CI says speculating pays (wholly above 0), costs (wholly below), neither
    (it includes 0), or has no interval."""
    side = ci_side(ci, 0.0, point_if_no_interval=False)
    return {Side.ABOVE: Payoff.PAYS, Side.BELOW: Payoff.COSTS, Side.STRADDLES: Payoff.INCONCLUSIVE}.get(
        side, Payoff.NO_INTERVAL)


def tally(verdicts: list[str]) -> dict[Verdict, int]:
    """How many goals end with each of GOAL_VERDICTS (every one counted once: the counts sum to the goals)."""
    verdicts = [Verdict.MISSING if v == Verdict.NOT_JUDGED else v for v in verdicts]
    unknown = sorted(set(verdicts) - set(GOAL_VERDICTS))
    if unknown:
        raise ValueError(f"goal verdicts outside {[str(v) for v in GOAL_VERDICTS]}: {unknown}")
    return {v: sum(x == v for x in verdicts) for v in GOAL_VERDICTS}


def all_of(each: list[Verdict], once: list[Verdict] | None = None, complete: bool = True) -> Verdict:
    """A goal that must hold at every load: missed if missed at some load, met if met at every load, else
    inconclusive (missing without a load, or where a load lacks an interval and nothing is decided).
    `once`: each load read at the level at which one load of several decides (a Bonferroni-corrected reading; by
    default `each`), which is what "missed at some load" needs; `complete` False: loads of the design were not
    measured, so the goal cannot be met."""
    once = each if once is None else once
    if not each:
        return Verdict.MISSING
    if Verdict.MISSED in once:
        return Verdict.MISSED
    if complete and all(v == Verdict.MET for v in each):
        return Verdict.MET
    return Verdict.MISSING if Verdict.MISSING in each else Verdict.INCONCLUSIVE


def any_of(each: list[Verdict], once: list[Verdict] | None = None, complete: bool = True) -> Verdict:
    """A goal that must hold at some load: met if met at some load (read in `once`, as `all_of`), missed if missed
    at every load (`complete` False: not every load of the design was measured, so it cannot be missed), else
    inconclusive (missing without a load with an interval)."""
    once = each if once is None else once
    if not each:
        return Verdict.MISSING
    if Verdict.MET in once:
        return Verdict.MET
    if complete and all(v == Verdict.MISSED for v in each):
        return Verdict.MISSED
    return Verdict.MISSING if all(v == Verdict.MISSING for v in each) else Verdict.INCONCLUSIVE
