"""The reference study's claims beside the reproduced statistics, with verdicts (paper/main.tex, "Claims").

`claims` sets each reproduced statistic beside the reference study's value, judged by its kind (Claim.kind):
an *effect* gets two verdicts, *direction reproduced* (the CI lies on the reference's side of the statistic's
null value) and *magnitude within band* (the CI lies inside a two-sided tolerance band around the reference;
the bands are defined once, in TOLERANCE, with their rationale); an *equivalence* claim ("within 0.45 % of
KV-only") and an *estimate* (a share, an error) only the band (a direction means nothing for them); an
*extreme* over cells (a least or most) is one value with no interval, shown without a verdict; the reference's
qualitative claim on the larger pair is a *finding* read from the feasibility stage. Each verdict is yes, no,
inconclusive (the CI straddles the boundary), or n/a where the kind has none (rakv.experiments.verdicts.ClaimVerdict,
the one vocabulary); `claim_counts` is the one count the paper and the README quote. Which side of a threshold a CI
lies on is rakv.experiments.verdicts' rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rakv.experiments.summary import BreakEven, ClaimRow, ConfigurationStatistics, Crossover, Feasibility
from rakv.experiments.verdicts import ClaimVerdict, Side, ci_side
from rakv.runtime.json_records import CI

# Reference figures of the reproduced study (paper/main.tex, "Claims").
REFERENCE = {
    "latency_reduction_vs_joint_k4": 0.640,
    "throughput_gain_vs_joint_k4": 1.708,
    "latency_reduction_vs_kv_only": 0.0045,
    "throughput_gain_vs_kv_only": 0.0081,
    "exact_share": 1.0,
    "accuracy_k": 1.0,
    "accuracy_action": 0.833,
    "mape": 0.321,
    "spearman": 0.780,
    "mean_regret": 0.0032,
    "spec_slowdown_min": 0.14,
    "spec_slowdown_max": 2.35,
    "crossover_alpha_min": 0.894,
    "crossover_alpha_max": 0.973,
}


# Two-sided tolerance bands around a reference value, one rule per kind of statistic. Rationale: the
# reproduction differs from the reference in hardware, models and grid, so only the order of magnitude
# of an effect is expected to carry over -- a relative change may be half to one and a half times the
# reference's, and an effect near zero within 2 percentage points (the run-to-run spread of a mean
# latency here); a share, an accuracy or a correlation within 0.10 (one scenario in ten); a break-even
# acceptance within 0.05 (the step of the controlled-acceptance grid); a prediction error within half
# of the reference's.
TOLERANCE = {
    "effect": lambda ref: (ref - max(0.5 * abs(ref), 0.02), ref + max(0.5 * abs(ref), 0.02)),
    "share": lambda ref: (ref - 0.10, ref + 0.10),
    "alpha": lambda ref: (ref - 0.05, ref + 0.05),
    "error": lambda ref: (0.5 * ref, 1.5 * ref),
}


KINDS = ("effect", "equivalence", "estimate", "extreme", "finding")


@dataclass(frozen=True)
class Claim:
    label: str
    reference: float | None
    band: str | None  # a key of TOLERANCE (None: no band)
    null: float | None  # the value meaning "no effect"; direction = the reference's side of it
    unit: str = "%"
    kind: str = "effect"  # KINDS: which verdicts the claim gets
    side: str | None = None  # the reference's side of `null` where it gave a range, not one value ("above")


CLAIMS = {
    "latency_reduction_vs_joint_k4": Claim("RAKV-ASD vs Joint-k4: latency reduction", 0.640, "effect", 0.0),
    "throughput_gain_vs_joint_k4": Claim("RAKV-ASD vs Joint-k4: throughput gain", 1.708, "effect", 0.0),
    # the reference: "within 0.45 % of KV-only": an equivalence, judged by the band alone
    "latency_reduction_vs_kv_only": Claim("RAKV-ASD vs KV-only: latency reduction (equivalence)", 0.0045, "effect",
                                          None, kind="equivalence"),
    "throughput_gain_vs_kv_only": Claim("RAKV-ASD vs KV-only: throughput gain (equivalence)", 0.0081, "effect", None,
                                        kind="equivalence"),
    "accuracy_k": Claim("controller: oracle's k chosen (in-sample oracle)", 1.0, "share", None, kind="estimate"),
    "accuracy_action": Claim("controller: oracle's action chosen (strict, in-sample oracle)", 0.833, "share", None,
                             kind="estimate"),
    "mape": Claim("latency prediction MAPE", 0.321, "error", None, kind="estimate"),
    "spearman": Claim("Spearman rho, predicted vs measured (mean per scenario)", 0.780, "share", 0.0, ""),
    "mean_regret": Claim("mean regret vs the cross-fitted oracle", 0.0032, "effect", None, kind="estimate"),
    "spec_slowdown_min": Claim("best k > 0 vs best k = 0: slowdown, least over scenarios", 0.14, None, None,
                               kind="extreme"),
    "spec_slowdown_max": Claim("best k > 0 vs best k = 0: slowdown, most over scenarios", 2.35, None, None,
                               kind="extreme"),
    # the reference's slowdowns, 14 % to 235 % in every scenario, put speculation on one side of k = 0: the sum over
    # scenarios of the best k > 0's latency against the best k = 0's says on which side this run is (the regime)
    "spec_regime": Claim("best k > 0 vs best k = 0: slowdown over all scenarios (reference: slower in every one)",
                         None, None, 0.0, side="above"),
    "crossover_alpha_min": Claim("break-even acceptance (cost model), least", 0.894, None, None, "", kind="extreme"),
    "crossover_alpha_max": Claim("break-even acceptance (cost model), most", 0.973, None, None, "", kind="extreme"),
    # the reference's pairs as architecture twins (cost side only): their crossover (least break-even over k) against
    # the reference's range over its settings, judged by the point (a cost-model value has no CI over prompts)
    "twin_crossover": Claim("crossover acceptance of the reference's pair (architecture twin, cost side only)", 0.894,
                            None, None, "", kind="finding"),
    "larger_pair": Claim("GPT-2 Large/Medium: the gap narrows, speculation does not cross k = 0", None, None, None,
                         "", kind="finding"),
}


def verdict_direction(claim: Claim, ci: list) -> ClaimVerdict:
    """yes: the CI lies on the reference's side of the null; no: on the other side; else inconclusive (n/a: the
    claim's kind has no direction)."""
    if claim.null is None or claim.kind != "effect":
        return ClaimVerdict.NOT_APPLICABLE
    side = ci_side(ci, claim.null)
    if side == Side.MISSING:
        return ClaimVerdict.INCONCLUSIVE
    expected = claim.side or (Side.ABOVE if claim.reference > claim.null else
                              Side.BELOW if claim.reference < claim.null else None)
    if expected is None or side == Side.STRADDLES:
        return ClaimVerdict.INCONCLUSIVE
    return ClaimVerdict.YES if side == expected else ClaimVerdict.NO


def verdict_band(claim: Claim, ci: list) -> ClaimVerdict:
    """yes: the CI lies inside the tolerance band; no: it lies wholly outside; else inconclusive. A value without
    an interval is not judged (n/a)."""
    value, low, high = ci
    if claim.band is None or not (np.isfinite(low) and np.isfinite(high)):
        return ClaimVerdict.NOT_APPLICABLE
    lo, hi = TOLERANCE[claim.band](claim.reference)
    if lo <= low and high <= hi:
        return ClaimVerdict.YES
    if high < lo or low > hi:
        return ClaimVerdict.NO
    return ClaimVerdict.INCONCLUSIVE


def claim_row(key: str, configuration: str, ci, text: str | None = None) -> ClaimRow:
    """One claim's row: a CI [value, low, high] (an extreme: one value, no interval), or for a finding its `text`
    and verdict (`ci` then the verdict string)."""
    claim = CLAIMS[key]
    if claim.kind == "finding":
        return ClaimRow(claim=claim.label, key=key, configuration=configuration, unit=claim.unit, kind=claim.kind,
                        reference=None, reproduced=CI(None, None, None), band_low=None, band_high=None,
                        null=None, text=text, direction=ci, magnitude=ClaimVerdict.NOT_APPLICABLE)
    if claim.kind == "extreme" or not isinstance(ci, (list, tuple)):
        ci = [ci, None, None]  # one value: no interval is invented for it
    ci = [float("nan") if v is None else float(v) for v in ci]
    if not np.isfinite(ci[0]):
        direction = band = ClaimVerdict.MISSING if text is None else ClaimVerdict.NOT_APPLICABLE
    else:
        direction, band = verdict_direction(claim, ci), verdict_band(claim, ci)
    lo, hi = TOLERANCE[claim.band](claim.reference) if claim.band else (None, None)
    return ClaimRow(claim=claim.label, key=key, configuration=configuration, unit=claim.unit, kind=claim.kind,
                    reference=claim.reference, reproduced=CI(*ci), band_low=lo,
                    band_high=hi, null=claim.null, text=text, direction=direction, magnitude=band)


REFERENCE_PAIRS = ("gpt2-distilgpt2-twin", "gpt2medium-gpt2-twin")  # the reference study's two pairs, as twins


def twin_crossover_rows(break_even: list[BreakEven]) -> list[ClaimRow]:
    """Per twin of the reference's study pairs: its crossover (least break-even alpha over k of `break_even`, this
    run's calibrations priced at one cold request, rakv.experiments.analysis.cost_request) beside the reference's
    range over its settings, widened by a break-even acceptance's tolerance (TOLERANCE["alpha"]): inside it (yes),
    outside (no), or never paying at any k (not tested: no crossover)."""
    lo = TOLERANCE["alpha"](REFERENCE["crossover_alpha_min"])[0]
    hi = min(1.0, TOLERANCE["alpha"](REFERENCE["crossover_alpha_max"])[1])
    rows = []
    for pair in REFERENCE_PAIRS:
        points = [b for b in break_even if b.pair.removesuffix("-draft") == pair]
        if not points:
            continue
        paying = [b for b in points if b.break_even_alpha is not None]
        claim = CLAIMS["twin_crossover"]
        if not paying:
            text, band = "never pays at any k", ClaimVerdict.NOT_TESTED
        else:
            least = min(paying, key=lambda b: b.break_even_alpha)
            alphas = [b.break_even_alpha for b in paying]
            text = (f"{least.break_even_alpha:.3f} (k = {least.k}; over k {min(alphas):.3f}-{max(alphas):.3f}; "
                    f"{least.prompt_tokens}-token prompt, {least.new_tokens} new tokens)")
            band = ClaimVerdict.YES if lo <= least.break_even_alpha <= hi else ClaimVerdict.NO
        value = None if not paying else least.break_even_alpha
        rows.append(ClaimRow(claim=claim.label, key="twin_crossover", configuration=pair, unit=claim.unit,
                             kind=claim.kind, reference=claim.reference, reproduced=CI(value, None, None),
                             band_low=lo, band_high=hi, null=None, text=text, direction=ClaimVerdict.NOT_APPLICABLE,
                             magnitude=band))
    return rows


def larger_pair_row(feasibility: Feasibility, verdict: str | None) -> ClaimRow:
    """The reference's claim on GPT-2 Large/Medium, from the feasibility stage: reproduced where the pair ran
    (yes if speculation did not cross k = 0), not tested where only its cost side could be measured (`verdict`: the
    feasibility verdict's sentence)."""
    name = feasibility.configuration or "gpt2large-gpt2medium"
    if feasibility.status == "ran":
        return claim_row("larger_pair", name, ClaimVerdict.NO if feasibility.crossed else ClaimVerdict.YES,
                         "crosses" if feasibility.crossed else "does not cross")
    return claim_row("larger_pair", name, ClaimVerdict.NOT_TESTED, verdict or "not run")


def claims(per_configuration: dict[str, ConfigurationStatistics], crossovers: dict[str, Crossover],
           feasibility: Feasibility, feasibility_verdict: str, twins: list[BreakEven] = ()) -> list[ClaimRow]:
    """Per configuration: each reference figure beside the reproduced one, its CI, band and verdicts by kind
    (`crossovers`: the cost model's per configuration, empty without the sensitivity stage); then the reference
    pairs' twins' crossovers (`twins`: break-even rows of their calibrations) and the larger pair's."""
    rows = []
    for name, s in per_configuration.items():
        values = {
            "latency_reduction_vs_joint_k4": s.latency_reduction.joint_k4,
            "throughput_gain_vs_joint_k4": s.throughput_gain.joint_k4,
            "latency_reduction_vs_kv_only": s.latency_reduction.kv_only,
            "throughput_gain_vs_kv_only": s.throughput_gain.kv_only,
            "accuracy_k": s.accuracy_k, "accuracy_action": s.accuracy_action, "mape": s.mape,
            "spearman": s.spearman, "mean_regret": s.mean_regret,
        }
        rows.extend(claim_row(key, name, value) for key, value in values.items())
        for key, value in (("spec_slowdown_min", s.spec_slowdown.min), ("spec_slowdown_max", s.spec_slowdown.max)):
            # no scenario where both a k > 0 and a k = 0 action were measured: nothing to compare
            rows.append(claim_row(key, name, value, None if value is not None else "no scenario compared"))
        if s.spec_slowdown.pooled:
            rows.append(claim_row("spec_regime", name, s.spec_slowdown.pooled))
        cross = crossovers.get(name)
        if cross:
            for key, value in (("crossover_alpha_min", cross.min), ("crossover_alpha_max", cross.max)):
                rows.append(claim_row(key, name, value, None if value is not None else "never (not even alpha = 1)"))
    rows.extend(twin_crossover_rows(list(twins)))
    rows.append(larger_pair_row(feasibility, feasibility_verdict))
    return rows


VERDICTS = (ClaimVerdict.YES, ClaimVerdict.NO, ClaimVerdict.INCONCLUSIVE)  # the verdicts a judged claim gets


@dataclass(frozen=True)
class ClaimCounts:
    """How many claim rows there are, how many are signed (effects) and banded, and per verdict how many of each."""
    rows: int
    signed: int
    banded: int
    unjudged: int
    direction: dict[str, int]  # verdict -> signed claims
    magnitude: dict[str, int]  # verdict -> banded claims


def claim_counts(rows: list[ClaimRow]) -> ClaimCounts:
    """The one count of claims the paper and the README quote: rows, and per verdict the direction's (signed claims:
    effects) and the magnitude's (banded claims)."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return ClaimCounts(0, 0, 0, 0, {}, {})
    signed = frame[frame.direction.isin(VERDICTS)]
    banded = frame[frame.magnitude.isin(VERDICTS)]
    unjudged = frame[~frame.index.isin(signed.index) & ~frame.index.isin(banded.index)]
    return ClaimCounts(rows=int(len(frame)), signed=int(len(signed)), banded=int(len(banded)),
                       unjudged=int(len(unjudged)),
                       direction={v: int((signed.direction == v).sum()) for v in VERDICTS},
                       magnitude={v: int((banded.magnitude == v).sum()) for v in VERDICTS})
