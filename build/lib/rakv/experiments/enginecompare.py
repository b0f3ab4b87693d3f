"""The engine before and after: two full runs of one profile, measured with different kernels, side by side.

Read from each run's own tables (calibration/*.json, study/metadata.json, study/runs.parquet, summary.json,
feasibility/summary.json), nothing typed in: per configuration, the calibrated target step, draft step and
verify(k + 1) / step at 256 tokens of context, the break-even acceptance the cost model gives, the acceptance
measured in the study, the best fixed action, the action the controller chose most, and how often it
speculated. `paper` writes it as `engine_comparison.tex` when the profile names a before run
(conf/profile: paper.before_engine), and the sentences under it follow the signs of the differences.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from rakv.runtime.costmodel import Curve

CONTEXT = 256  # tokens of context at which steps are read off the calibration tables


def _at(curve: dict, x: float = CONTEXT) -> float:
    return Curve(**curve)(x)


def engine_rows(results: Path) -> list[dict]:
    """One row per study configuration (and per twin pair of the feasibility stage) of a finished run."""
    results = Path(results)
    meta = json.loads((results / "study" / "metadata.json").read_text())
    summary = json.loads((results / "summary.json").read_text())
    runs = pd.read_parquet(results / "study" / "runs.parquet")
    kernels = meta["config"].get("kernels", "stock")
    crossover = summary.get("crossover_model_per_configuration", {})
    acceptance = pd.DataFrame(summary.get("acceptance", []))
    rows = []
    for configuration, stats in summary["per_configuration"].items():
        proposer = "prompt-lookup" if configuration.endswith("-lookup") else "draft"
        pair = configuration.removesuffix("-lookup")
        table = json.loads((results / "calibration" / f"{pair}-{proposer}.json").read_text())
        step = _at(table["target_step"])
        chosen = runs[(runs.configuration == configuration) & (runs.strategy == "rakv-asd")]
        shares = chosen.action.value_counts(normalize=True)
        measured = acceptance[acceptance.configuration == configuration] if len(acceptance) else acceptance
        rows.append({
            "configuration": configuration, "kernels": kernels, "target_step_ms": step * 1e3,
            "draft_step_ms": _at(table["propose"]["1"]) * 1e3 if proposer == "draft" else None,
            "verify_over_step": {int(k): _at(table["verify"][str(k)]) / step for k in (1, 2, 4) if str(k) in table["verify"]},
            "break_even_alpha": crossover.get(configuration, {}).get("median"),
            "break_even_never": crossover.get(configuration, {}).get("never"),
            "break_even_settings": crossover.get(configuration, {}).get("settings"),
            "acceptance": float(measured.acceptance.mean()) if len(measured) else None,
            "best_fixed_action": stats["best_fixed_action"],
            "controller_action": shares.index[0] if len(shares) else None,
            "controller_share": float(shares.iloc[0]) if len(shares) else None,
            "controller_speculates": float((chosen.k > 0).mean()) if len(chosen) else None,
        })
    feasibility = results / "feasibility" / "summary.json"
    if feasibility.exists():
        feas = json.loads(feasibility.read_text())
        for pair in feas.get("twins", []):
            paying = [r["break_even_alpha"] for r in feas["break_even"] if r["pair"] == pair
                      and r["break_even_alpha"] is not None]
            path = results / "calibration" / f"{pair}-draft.json"
            table = json.loads(path.read_text()) if path.exists() else None
            step = _at(table["target_step"]) if table else None
            rows.append({"configuration": pair, "kernels": kernels,
                         "target_step_ms": step * 1e3 if step else None,
                         "draft_step_ms": _at(table["propose"]["1"]) * 1e3 if table else None,
                         "verify_over_step": {int(k): _at(table["verify"][str(k)]) / step for k in (1, 2, 4)
                                              if table and str(k) in table["verify"]},
                         "break_even_alpha": min(paying) if paying else None, "break_even_never": None,
                         "break_even_settings": None, "acceptance": None, "best_fixed_action": None,
                         "controller_action": None, "controller_share": None, "controller_speculates": None})
    return rows


def _fmt(value, spec: str = ".1f", missing: str = "--") -> str:
    return missing if value is None else format(value, spec)


def comparison_table(before: list[dict], after: list[dict]) -> str:
    """LaTeX tabular: one line per configuration and engine."""
    lines = [r"\begin{tabular}{llrrrrrrlll}", r"\toprule",
             r"configuration & kernels & step (ms) & draft (ms) & $v_1$ & $v_2$ & $v_4$ & $\alpha^\ast$ & "
             r"$\hat\alpha$ & best fixed & controller (share) \\", r"\midrule"]
    after_by = {r["configuration"]: r for r in after}
    for row in before:
        for r in (row, after_by.get(row["configuration"])):
            if r is None:
                continue
            v = r["verify_over_step"]
            share = (f"{r['controller_action']} ({r['controller_share']:.0%})".replace("%", r"\%")
                     if r["controller_action"] else "--")
            lines.append(" & ".join([
                r["configuration"].replace("_", r"\_"), r["kernels"], _fmt(r["target_step_ms"]),
                _fmt(r["draft_step_ms"]), _fmt(v.get(1), ".2f"), _fmt(v.get(2), ".2f"), _fmt(v.get(4), ".2f"),
                _fmt(r["break_even_alpha"], ".3f", "never"), _fmt(r["acceptance"], ".2f"),
                r["best_fixed_action"] or "--", share]) + r" \\")
        lines.append(r"\midrule")
    lines[-1] = r"\bottomrule"
    lines.append(r"\end{tabular}")
    return "\n".join(lines) + "\n"


def comparison_sentences(before: list[dict], after: list[dict]) -> str:
    """What moved, worded by the sign of each change; where the draft's break-even acceptance stays above the
    measured acceptance, by how much it still misses."""
    after_by = {r["configuration"]: r for r in after}
    text = []
    for b in before:
        a = after_by.get(b["configuration"])
        if a is None or a["target_step_ms"] is None or b["target_step_ms"] is None:
            continue
        ratio = a["target_step_ms"] / b["target_step_ms"]
        verb = "fell" if ratio < 1 else "rose" if ratio > 1 else "stayed"
        sentence = (f"For {b['configuration']}, the target step at {CONTEXT} tokens of context {verb} from "
                    f"{b['target_step_ms']:.1f} to {a['target_step_ms']:.1f} ms ({ratio:.2f}x)")
        if a["draft_step_ms"] is not None and b["draft_step_ms"] is not None:
            sentence += (f", the draft step from {b['draft_step_ms']:.1f} to {a['draft_step_ms']:.1f} ms "
                         f"({b['draft_step_ms'] / b['target_step_ms']:.2f} to "
                         f"{a['draft_step_ms'] / a['target_step_ms']:.2f} of a target step)")
        sentence += "."
        if a["break_even_alpha"] is None and a["break_even_settings"]:
            sentence += (f" The cost model now finds no k that pays in any of its {a['break_even_settings']} settings"
                         + (f" (before: a median break-even acceptance of {b['break_even_alpha']:.3f} over the "
                            f"{b['break_even_settings'] - b['break_even_never']} settings where one paid)"
                            if b["break_even_alpha"] is not None and b["break_even_settings"] else "")
                         + (f", although the study measured an acceptance of {a['acceptance']:.2f}"
                            if a["acceptance"] is not None else "") + ".")
        elif a["break_even_alpha"] is not None and b["break_even_alpha"] is not None:
            sentence += (f" Its break-even acceptance moved from {b['break_even_alpha']:.3f} to "
                         f"{a['break_even_alpha']:.3f}")
            if a["acceptance"] is not None:
                gap = a["break_even_alpha"] - a["acceptance"]
                sentence += (f"; the study measured an acceptance of {a['acceptance']:.2f}, "
                             + (f"{gap:.3f} below it: at that acceptance speculation does not pay."
                                if gap > 0 else f"{-gap:.3f} above it: at that acceptance speculation pays."))
            else:
                sentence += "."
        if a["controller_speculates"] is not None and b["controller_speculates"] is not None:
            sentence += (f" The controller speculated in {b['controller_speculates']:.0%} of its runs before and "
                         f"{a['controller_speculates']:.0%} after (most often {a['controller_action']}).")
        text.append(sentence.replace("%", r"\%"))
    return "\n\n".join(text) + "\n"


def write_engine_comparison(before: Path, after: Path, out_dir: Path) -> list[Path]:
    b, a = engine_rows(before), engine_rows(after)
    table, sentences = Path(out_dir) / "engine_comparison.tex", Path(out_dir) / "engine_comparison_text.tex"
    table.write_text(comparison_table(b, a))
    sentences.write_text(comparison_sentences(b, a))
    return [table, sentences]
