"""LaTeX macros and tables for the paper, written from summary.json and the study metadata only."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from rakv import analysis

BASELINE_NAMES = {"joint-k4": "Joint", "kv-only": "KvOnly", "ar": "Ar", "spec-k4": "Spec"}


def tex_escape(text) -> str:
    out = str(text)
    for char, repl in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                       ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        out = out.replace(char, repl)
    return out


def pct(value, digits: int = 1) -> str:
    return "n/a" if value is None or value != value else f"{100 * value:.{digits}f}\\%"


def num(value, digits: int = 3) -> str:
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


def macros(summary: dict, meta: dict) -> dict[str, str]:
    m = {"ProfileName": tex_escape(meta["config"]["profile"]["name"]), "RunsTotal": str(summary["runs"]),
         "StrategyRuns": str(summary["strategy_runs"]), "SweepRuns": str(summary["sweep_runs"]),
         "Configurations": tex_escape(", ".join(summary["configurations"])),
         "Hardware": tex_escape(f"{meta['hardware']['processor']} ({meta['hardware']['device']}, "
                                f"{meta['hardware']['threads'] or 'GPU'} threads, {meta['hardware']['dtype']})"),
         "TorchVersion": tex_escape(meta["packages"]["torch"]),
         "TransformersVersion": tex_escape(meta["packages"]["transformers"]),
         "GitCommit": tex_escape((meta.get("git_commit") or "unknown")[:12]),
         "NewTokens": str(meta["config"]["profile"]["study"]["new_tokens"]),
         "KernelsMode": tex_escape(meta["config"].get("kernels", "stock")),
         "ExactEqual": str(summary["exact"]["equal"]), "ExactTotal": str(summary["exact"]["total"]),
         "AccK": pct(summary["accuracy_k"]), "AccAction": pct(summary["accuracy_action"]),
         "Mape": pct(summary["mape"]), "SpearmanPooled": num(summary["spearman_pooled"]),
         "SpearmanPerScenario": num(summary["spearman_per_scenario"]),
         "MeanRegret": pct(summary["mean_regret"], 2), "WorstRegret": pct(summary["worst_regret"], 1),
         "SlowdownMin": pct(summary["spec_slowdown"]["min"], 0), "SlowdownMax": pct(summary["spec_slowdown"]["max"], 0),
         "ShareSlower": pct(summary["spec_slowdown"]["share_slower"], 0),
         "CrossoverMin": num((summary.get("crossover_model_draft") or summary["crossover_model"])["min"]),
         "CrossoverMax": num((summary.get("crossover_model_draft") or summary["crossover_model"])["max"]),
         "CrossoverMeasured": tex_escape(", ".join(f"{k}: {num(v)}" for k, v in summary["crossover_measured"].items())
                                         or "n/a"),
         "FeasibilityStatus": tex_escape(summary["feasibility"].get("status", "missing"))}
    for baseline, name in BASELINE_NAMES.items():
        value, low, high = summary["latency_reduction"][baseline]
        m[f"LatRed{name}"] = pct(value)
        m[f"LatRed{name}CI"] = f"[{pct(low)}, {pct(high)}]"
        value, low, high = summary["throughput_gain"][baseline]
        m[f"ThrGain{name}"] = pct(value)
        m[f"ThrGain{name}CI"] = f"[{pct(low)}, {pct(high)}]"
    feas = summary["feasibility"]
    if feas.get("break_even"):
        m["FeasibilityGap"] = tex_escape(analysis.cost_side_sentence(feas))
    elif feas.get("status") == "ran":
        m["FeasibilityGap"] = (f"the best $k \\neq 0$ action is {pct(feas['gap_min'], 0)} to {pct(feas['gap_max'], 0)} "
                               "slower than the best $k = 0$ one across scenarios (negative: faster)")
    else:
        m["FeasibilityGap"] = tex_escape(feas.get("reason", "no result"))
    return m


def holds(value) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def claims_table(rows: list[dict]) -> str:
    lines = [r"\begin{tabular}{p{6.2cm}rrrc}", r"\toprule",
             r"Claim & Reference & Reproduced & Difference & Holds \\", r"\midrule"]
    for row in rows:
        unit = r"\%" if row["unit"] == "%" else ""

        def cell(v):
            return "--" if v is None else (f"{v}{unit}" if isinstance(v, (int, float)) else tex_escape(v))

        lines.append(f"{tex_escape(row['claim'])} & {cell(row['reference'])} & {cell(row['reproduced'])} & "
                     f"{cell(row['difference'])} & {holds(row['holds'])} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def strategy_table(runs: pd.DataFrame) -> str:
    table = analysis.strategy_table(runs)
    lines = [r"\begin{tabular}{llrrrr}", r"\toprule",
             r"Configuration & Strategy & Runs & Latency (s) & TTFT (ms) & Throughput (tok/s) \\", r"\midrule"]
    for row in table.itertuples():
        lines.append(f"{tex_escape(row.configuration)} & {tex_escape(row.strategy)} & {row.runs} & "
                     f"{row.latency_s:.3f} & {row.ttft_s * 1e3:.1f} & {row.tokens_per_s:.1f} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_generated(summary: dict, results: Path, out_dir: Path) -> list[Path]:
    """paper/generated/: macros.tex, claims_table.tex, strategy_table.tex."""
    results, out_dir = Path(results), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = json.loads((results / "study" / "metadata.json").read_text())
    runs = pd.read_parquet(results / "study" / "runs.parquet")
    files = {
        "macros.tex": "% generated by rakv.report from summary.json; do not edit\n" + "".join(
            f"\\newcommand{{\\{name}}}{{{value}}}\n" for name, value in macros(summary, meta).items()),
        "claims_table.tex": claims_table(summary["claims"]),
        "strategy_table.tex": strategy_table(runs),
    }
    paths = []
    for name, text in files.items():
        (out_dir / name).write_text(text)
        paths.append(out_dir / name)
    return paths
