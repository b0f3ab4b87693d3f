"""Speculate-or-not accuracy beside exact-k accuracy: the share of RAKV-ASD's runs whose decision to speculate
(k > 0) is the in-sample oracle's, the decision the reference's 100 % measured (paper/main.tex, "Results").

Exact-k accuracy (the summary's accuracy_k) asks more: the oracle's k itself. Both are scenario means with the
summary's interval (rakv.experiments.study_stats.scenario_mean), computed from the study's runs table alone.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rakv.experiments.claims import REFERENCE
from rakv.experiments.formatting import ci_text, pct, tex_escape
from rakv.experiments.oracle import ScenarioTables, controller_choices, measurements
from rakv.experiments.study_stats import scenario_mean
from rakv.experiments.summary import Summary
from rakv.runtime.run_layout import RunLayout


def speculate_accuracy(runs: pd.DataFrame) -> dict[str, tuple[list[float], list[float]]]:
    """Per configuration: (exact-k accuracy, speculate-or-not accuracy), each [value, low, high] over scenarios."""
    out = {}
    for name in sorted(runs.configuration.unique()):
        part = runs[runs.configuration == name]
        choices = controller_choices(part, tables=ScenarioTables.of(measurements(part)))
        choices["correct_speculate"] = (choices.k > 0) == (choices.oracle_k > 0)
        out[name] = (scenario_mean(choices, "correct_k"), scenario_mean(choices, "correct_speculate"))
    return out


def speculate_table(summary: Summary, results: Path) -> str:
    """Table tab:speculate: per configuration, the reference's figure, exact-k accuracy and speculate-or-not
    accuracy with their 95 % CIs."""
    runs = pd.read_parquet(RunLayout.of(results).study.runs)
    rows = [f"\\texttt{{{tex_escape(name)}}} & {pct(REFERENCE['accuracy_k'], 0)} & "
            f"{ci_text(exact, lambda v: pct(v, 0))} & {ci_text(speculate, lambda v: pct(v, 0))} \\\\"
            for name, (exact, speculate) in speculate_accuracy(runs).items() if name in summary.per_configuration]
    return "\n".join([
        "\\begin{rakvtable}\\centering\\small",
        "\\fittable{\\begin{tabular}{lrrr}", "\\toprule",
        "Configuration & Reference & Exact $k$ [95\\,\\% CI] & Speculate or not [95\\,\\% CI] \\\\", "\\midrule",
        *rows, "\\bottomrule", "\\end{tabular}}",
        "\\caption{\\label{tab:speculate}The controller's choice against the in-sample oracle's: the same $k$ (exact), "
        "and the same decision to speculate or not ($k>0$ for both, or $k=0$ for both), the decision the reference's "
        "100\\,\\% measured; scenario means, 95\\,\\% CIs over prompts (this run's study alone).}",
        "\\end{rakvtable}"]) + "\n"
