"""Precision as a factor of the study: each pair and proposer measured at several target precisions (fp32, q4_1:
rakv.runtime.models.PRECISIONS) set side by side, with the regime, the prices and RAKV-ASD against AR at each.

For SmolLM2 the configurations at two precisions (smollm2 and smollm2-q4_1) have one acceptance (the q4_1 target's
logits are the fp32 target's, the GGUF's de-quantised values: docs/engine.md, "Precision") and two sets of prices, so
what differs between their rows is what the prices make of the same acceptance. Read from the
summary (per configuration: the regime's CI, `spec_slowdown.pooled`, and RAKV-ASD's latency reduction against AR)
and the results folder's calibrations (rakv.experiments.calibrations: one per configuration's pair, proposer and
precision), at the price context of every price of the paper (rakv.experiments.analysis.price_context). Worded by
the CIs' signs, never presupposing one; Table tab:precision and the sentences of Section "The regime" come from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rakv.experiments.formatting import ci_text, missing, num, pct, tex_escape
from rakv.experiments.summary import Summary
from rakv.experiments.verdicts import Side, ci_side
from rakv.runtime.json_records import ABSENT

VERIFY_K = 4  # the verify of k + 1 = 5 tokens, as the regime map prices it (rakv.experiments.analysis.regime_points)


@dataclass(frozen=True)
class PrecisionRow:
    """One configuration of a pair and proposer measured at more than one precision in this run: the regime (the
    best k>0's latency against the best k=0's over all scenarios, relative: positive is slower; [value, low, high]),
    RAKV-ASD's latency reduction against AR (positive is faster), the target step (ms) and, in target steps, one
    draft step and the verify of k + 1 = 5 tokens, at the price context; None where not measured."""
    family: str  # <pair>-<proposer>: the configurations that differ only in their target's precision
    configuration: str
    precision: str
    regime: list | None
    asd_vs_ar: list | None
    step_ms: float | None
    draft_ratio: float | None
    verify_ratio: float | None


def _triple(ci) -> list | None:
    return None if ci is None or ci is ABSENT or missing(ci[0]) else [float(v) for v in ci]


def precision_rows(summary: Summary, tables: dict, context: float) -> list[PrecisionRow]:
    """The rows of every pair and proposer this run measured at two or more precisions, in family order and, within
    one, in PRECISIONS' order; `tables`: calibration name (rakv.runtime.run_layout.calibration_stem) -> CostTable."""
    from rakv.experiments.calibrations import configuration_stem
    from rakv.experiments.config import configuration
    from rakv.runtime.models import PRECISIONS

    families: dict[str, list] = {}
    for name in summary.configurations:
        chosen = configuration(name)
        if chosen.chooses_proposer:  # several proposers: no one proposer's family (Section "Three proposer families")
            continue
        families.setdefault(f"{chosen.pair}-{chosen.proposer}", []).append((chosen.precision, name))
    rows = []
    for family, members in families.items():
        if len({precision for precision, _ in members}) < 2:
            continue
        for precision, name in sorted(members, key=lambda m: PRECISIONS.index(m[0])):
            stats = summary.per_configuration[name]
            table = tables.get(configuration_stem(name))
            step = table.target_step(context) if table is not None else None
            rows.append(PrecisionRow(
                family=family, configuration=name, precision=precision,
                regime=_triple(stats.spec_slowdown.pooled), asd_vs_ar=_triple(stats.latency_reduction.ar),
                step_ms=None if step is None else 1e3 * step,
                draft_ratio=None if table is None else table.propose[1](context) / step,
                verify_ratio=(table.verify[VERIFY_K](context) / step
                              if table is not None and VERIFY_K in table.verify else None)))
    return rows


def precision_rows_of(summary: Summary, results: Path) -> list[PrecisionRow]:
    """precision_rows on a results folder's calibrations at its price context."""
    from rakv.experiments.analysis import price_context
    from rakv.experiments.calibrations import calibration_tables

    return precision_rows(summary, calibration_tables(results), price_context(results))


def regime_word(regime: list | None) -> str:
    """The best k>0 against the best k=0 in one word, from the CI of its relative latency change (positive:
    slower): faster, slower, or no difference (the CI includes zero, or has no interval)."""
    if regime is None:
        return "not measured"
    side = ci_side(regime, 0.0, point_if_no_interval=False)
    return {Side.ABOVE: "slower", Side.BELOW: "faster"}.get(side, "no difference")


COMPARED = {"faster": "faster than", "slower": "slower than", "no difference": "not distinguishable from"}


def ar_word(asd_vs_ar: list | None) -> str:
    """RAKV-ASD against AR, from the CI of its latency reduction (positive: faster)."""
    if asd_vs_ar is None:
        return "not compared with"
    side = ci_side(asd_vs_ar, 0.0, point_if_no_interval=False)
    return {Side.ABOVE: "faster than", Side.BELOW: "slower than"}.get(side, "not distinguishable from")


def precision_table(rows: list[PrecisionRow]) -> str:
    """Table tab:precision, or a LaTeX comment where no pair and proposer was measured at two precisions."""
    if not rows:
        return "% no pair and proposer of this run was measured at more than one precision: no Table tab:precision\n"
    body = []
    for row in rows:
        regime = ci_text(row.regime) if row.regime else "--"
        asd = ci_text(row.asd_vs_ar) if row.asd_vs_ar else "--"
        body.append(f"\\texttt{{{tex_escape(row.configuration)}}} & {tex_escape(row.precision)} & {regime} & "
                    f"{num(row.step_ms, 2)} & {num(row.draft_ratio, 2)} & {num(row.verify_ratio, 2)} & {asd} \\\\")
    return "\n".join([
        "\\begin{rakvtable}\\centering\\small",
        "\\fittable{\\begin{tabular}{llrrrrr}", "\\toprule",
        "Configuration & Precision & Best $k>0$ vs $k=0$ [95\\,\\% CI] & Step (ms) & Draft/step & "
        "Verify(5)/step & RAKV-ASD vs AR [95\\,\\% CI] \\\\", "\\midrule",
        *body, "\\bottomrule", "\\end{tabular}}",
        "\\caption{\\label{tab:precision}Each pair and proposer at each precision of its target: the best $k>0$'s "
        "latency against the best $k=0$'s over all scenarios (positive: speculation slower), the target's decode "
        "step and, in target steps, one draft step and the verify of 5 tokens (calibration, at the price context "
        "of Section~\\ref{sec:regime}), and RAKV-ASD's latency reduction against AR (positive: faster); 95\\,\\% "
        "CIs over prompts." + (" SmolLM2's q4\\_1 target computes the fp32 target's logits bit for bit (its fp32 "
                               "weights are the same file de-quantised), so its precisions share one acceptance and "
                               "only the prices differ." if any(r.family.startswith("smollm2-") for r in rows)
                               else "") + "}",
        "\\end{rakvtable}"]) + "\n"


def precision_sentences(rows: list[PrecisionRow]) -> list[str]:
    """Section "The regime"'s sentences on precision: per pair and proposer, the regime and RAKV-ASD against AR at
    each precision with the prices that set them, and whether the regime's verdict is the same at every precision.
    None where no pair and proposer was measured at two precisions (the caller says so once)."""
    families: dict[str, list[PrecisionRow]] = {}
    for row in rows:
        families.setdefault(row.family, []).append(row)
    text = []
    for family, members in families.items():
        parts = []
        for row in members:
            regime = (f"the best $k>0$ is {COMPARED[regime_word(row.regime)]} the best $k=0$ over all scenarios "
                      f"(latency change {pct(row.regime[0])}, 95\\% CI [{pct(row.regime[1])}, {pct(row.regime[2])}])"
                      if row.regime else "the regime was not measured")
            prices = (f"a target step of {num(row.step_ms, 2)} ms, a draft step of {num(row.draft_ratio, 2)} and a "
                      f"verify of 5 tokens of {num(row.verify_ratio, 2)} target steps" if row.step_ms is not None
                      else "no calibration")
            parts.append(f"at {tex_escape(row.precision)} (\\texttt{{{tex_escape(row.configuration)}}}: {prices}) "
                         f"{regime}, and RAKV-ASD is {ar_word(row.asd_vs_ar)} AR")
        words = {regime_word(row.regime) for row in members}
        same = (f"the regime's verdict is the same at every precision ({next(iter(words))})" if len(words) == 1
                else "the regime's verdict differs between the precisions")
        text.append(f"With the pair and proposer \\texttt{{{tex_escape(family)}}} (Table~\\ref{{tab:precision}}), "
                    + "; ".join(parts) + f": {same}.")
    return text
