"""paper/generated/<name>/, written from summary.json, the study metadata and runs.parquet only: the macros, the
tables that stand in files of their own, and every generated section (rakv.experiments.prose and its siblings
word them; this module only writes them).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rakv.experiments.formatting import (
    ci_text,
    claim_cells,
    goal_value,
    headline_claims,
    missing,
    num,
    pct,
    shows_text,
    tex_escape,
    verdict_cells,
)
from rakv.experiments.longtable import as_longtable
from rakv.experiments.metadata import RunMetadata, read_run_metadata
from rakv.experiments.oracle import NOISE_LEVEL
from rakv.experiments.precision_factor import precision_rows_of, precision_table
from rakv.experiments.prose import (
    claims_discussion,
    conclusion,
    introduction_findings,
    limitations,
    mape_note,
    reproducibility,
    stage_times,
)
from rakv.experiments.prose_abstract import abstract
from rakv.experiments.prose_machines import (
    across_machines,
    machine_pairs_table,
    regime_text,
    run_to_run,
    substitutions,
)
from rakv.experiments.prose_proposers import proposers_section
from rakv.experiments.prose_sampling import sampling_tables, sampling_text
from rakv.experiments.prose_serving import (
    SCENARIO_TEXT,
    joint_reuse_text,
    peer_folder,
    peer_section,
    serving_tables,
    serving_text,
)
from rakv.experiments.replication import pooled_summary
from rakv.experiments.speculate_accuracy import speculate_table
from rakv.experiments.study_stats import BASELINES, strategy_means
from rakv.experiments.summary import AcceptanceRow, PeakKv, Summary
from rakv.experiments.verdicts import ClaimVerdict
from rakv.runtime.actions import AR, BEST_FIXED, JOINT_K4, KV_ONLY, ORACLE, SPEC_K4
from rakv.runtime.run_layout import INTERVAL_COVERAGE, RunLayout

BASELINE_NAMES = {JOINT_K4: "Joint", KV_ONLY: "KvOnly", AR: "Ar", SPEC_K4: "Spec", BEST_FIXED: "BestFixed",
                  ORACLE: "Oracle"}


def macros(summary: Summary, meta: RunMetadata) -> dict[str, str]:
    hardware = meta.hardware
    m = {"ProfileName": tex_escape(meta.profile_name), "RunsTotal": str(summary.runs),
         "StrategyRuns": str(summary.strategy_runs), "SweepRuns": str(summary.sweep_runs),
         "Configurations": tex_escape(", ".join(summary.configurations)),
         "Hardware": tex_escape(f"{hardware.processor} ({hardware.device}, "
                                f"{hardware.threads or 'GPU'} threads, {hardware.dtype})"),
         "TorchVersion": tex_escape(meta.packages.torch),
         "TransformersVersion": tex_escape(meta.packages.transformers),
         "GitCommit": tex_escape(meta.short_commit),
         "NewTokens": str(meta.new_tokens),
         "KernelsMode": tex_escape(meta.kernels),
         "MeasurementsPerAction": str(summary.grid.measurements_per_action_min),
         "ControllerRepeats": str(summary.grid.controller_repeats),
         "ExactEqual": str(summary.exact.equal), "ExactTotal": str(summary.exact.total),
         "NoiseLevel": pct(NOISE_LEVEL, 0),
         "CrossoverMeasured": tex_escape(", ".join(f"{k}: {num(v)}" for k, v in summary.crossover_measured.items())
                                         or "n/a"),
         "FeasibilityStatus": tex_escape(summary.feasibility.status),
         "FeasibilityGap": tex_escape(summary.feasibility_verdict)}
    for baseline, name in BASELINE_NAMES.items():
        m[f"LatRedPooled{name}"] = ci_text(summary.pooled.latency_reduction.against(baseline))
    return m


def coverage_table(path: Path = INTERVAL_COVERAGE) -> str:
    """The simulated coverage of every interval method (paper/interval_coverage.csv, written by
    scripts/interval_coverage.py from rakv.experiments.coverage; the code and the shipped profiles', not a run's)."""
    lines = ["\\begin{tabular}{p{4.3cm}p{3.9cm}p{2.6cm}p{4.4cm}r}", "\\toprule",
             "Statistic & Interval & Units & Simulated shape & Coverage \\\\", "\\midrule"]
    if not Path(path).exists():
        lines.append(f"\\multicolumn{{5}}{{l}}{{{tex_escape(Path(path).name)} is missing}} \\\\")
    else:
        for row in pd.read_csv(path).itertuples(index=False):
            lines.append(f"{tex_escape(row.statistic)} & {tex_escape(row.method)} & {tex_escape(row.units)} & "
                         f"{tex_escape(row.shape)} & {row.coverage:.3f} \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def statistics_table(summary: Summary) -> str:
    """Per configuration: the controller's statistics with their CIs (pooled over the shipped runs of this commit and
    machine class where there are several)."""
    summary = pooled_summary(summary)
    names = list(summary.per_configuration)
    rows = [
        ("accuracy, strict", lambda s: ci_text(s.accuracy_action)),
        ("accuracy, within noise", lambda s: ci_text(s.accuracy_within_noise)),
        ("accuracy of $k$", lambda s: ci_text(s.accuracy_k)),
        ("oracle's action in the controller's tie set", lambda s: ci_text(s.accuracy_tie_set) if s.accuracy_tie_set
         else "--"),
        ("accuracy of a random choice", lambda s: pct(s.accuracy_chance)),
        ("mean regret (cross-fitted)", lambda s: ci_text(s.mean_regret)),
        ("worst per-scenario regret", lambda s: pct(s.worst_regret)),
        ("mean regret of a random choice", lambda s: ci_text(s.random_regret)),
        ("MAPE", lambda s: ci_text(s.mape)),
        ("MAPE, action-blind predictor", lambda s: pct(s.mape_null)),
        ("MAPE minus action-blind (points)", lambda s: ci_text(s.mape_minus_null) if s.mape_minus_null else "--"),
        ("Spearman $\\rho$, mean per scenario", lambda s: ci_text(s.spearman, num)),
        ("Spearman $\\rho$, pooled", lambda s: num(s.spearman_pooled)),
        ("best fixed action (hindsight)", lambda s: f"\\texttt{{{s.best_fixed_action}}}"),
        *[(f"latency reduction vs {tex_escape(b)}", lambda s, b=b: ci_text(s.latency_reduction.against(b)))
          for b in BASELINES],
        ("best $k\\neq0$ vs $k=0$, slowdown", lambda s: f"{pct(s.spec_slowdown.min, 0)} to "
                                                     f"{pct(s.spec_slowdown.max, 0)}"),
    ]
    lines = [r"\begin{tabular}{l" + "r" * len(names) + "}", r"\toprule",
             "Statistic & " + " & ".join(f"\\texttt{{{tex_escape(n)}}}" for n in names) + r" \\", r"\midrule"]
    for label, get in rows:
        lines.append(label + " & " + " & ".join(get(summary.per_configuration[n]) for n in names) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


CLAIMS_CAPTION = (
    "\\label{tab:claims}Reference figures beside the reproduced values with 95\\% CIs over prompts (pooled over the "
    "shipped runs of this commit and machine class where there are several; a verdict in parentheses lists each "
    "run's where any run's differs from the pooled one), judged by kind (in brackets), by the rules stated once in "
    "Section~\\ref{sec:claims}; inc.: inconclusive.")


def claims_table(summary: Summary) -> str:
    """The claims table: each reference claim beside this run's value and verdicts, grouped by configuration (its
    name heads its rows once, not in every row); the rules by kind are stated once, in Section "Claims". A longtable
    that runs on over pages (its head repeated) instead of shrinking: the rows of a run with several configurations
    do not fit one page at a readable size."""
    rows, across = headline_claims(summary)
    pooled = " (runs)" if across else ""
    ragged = r">{\raggedright\arraybackslash}"
    # with several runs a verdict cell lists each run's ("yes (inc., inc.)"): narrow columns that wrap
    verdicts = f"{ragged}p{{1.45cm}}{ragged}p{{1.6cm}}" if across else "ll"
    columns = f"{{@{{}}{ragged}p{{{'4.9' if across else '5.4'}cm}}r{ragged}p{{3.6cm}}r{verdicts}@{{}}}}"
    head = (r"Claim [kind] & Reference & Reproduced [95\% CI] & Band & "
            f"Direction{pooled} & Magnitude{pooled} \\\\")
    lines = [r"\begin{longtable}" + columns, f"\\caption{{{CLAIMS_CAPTION}}}\\\\", r"\toprule", head,
             r"\endfirsthead", r"\toprule", head, r"\endhead", r"\bottomrule", r"\endfoot"]
    configuration = None
    for row in rows:
        if row.configuration != configuration:
            configuration = row.configuration
            lines += [r"\midrule", f"\\multicolumn{{6}}{{@{{}}l}}{{\\texttt{{{tex_escape(configuration)}}}}} \\\\*"]
        fmt = (lambda v: pct(v)) if row.unit == "%" else (lambda v: num(v))
        reference, reproduced, band = claim_cells(row, fmt)
        if row.key.startswith("crossover_alpha") and row.reproduced.value == 0:  # explained where it is printed
            reproduced += " (pays at any acceptance: Section~\\ref{sec:regime})"
        # "inc.": inconclusive, as the table's caption says
        direction, magnitude = (cell.replace(ClaimVerdict.INCONCLUSIVE, "inc.") for cell in verdict_cells(row, across))
        lines.append(f"{tex_escape(row.claim)} [{row.kind}] & {reference} & "
                     f"{tex_escape(reproduced) if shows_text(row) else reproduced} & "
                     f"{band} & {direction} & {magnitude} \\\\")
    if not rows:
        lines.append("\\midrule\n\\multicolumn{6}{l}{no claim} \\\\")
    lines.append(r"\end{longtable}")
    return "\n".join(lines) + "\n"


def acceptance_table(rows: list[AcceptanceRow]) -> str:
    lines = [r"\begin{tabular}{llrrrc}", r"\toprule",
             r"Configuration & Dataset & Measured $\alpha$ [95\% CI] & Break-even $\alpha$ (least $k$) & "
             r"Break-even $\alpha$, $k=4$ & Pays \\", r"\midrule"]
    for r in rows:
        least = "never" if missing(r.break_even_alpha) else f"{num(r.break_even_alpha)} ($k={r.break_even_k}$)"
        pays = "n/a" if r.speculation_pays is None else ("yes" if r.speculation_pays else "no")
        lines.append(f"\\texttt{{{tex_escape(r.configuration)}}} & {tex_escape(r.dataset)} & "
                     f"{ci_text((r.acceptance, r.acceptance_low, r.acceptance_high), num)} & {least} & "
                     f"{'never' if missing(r.break_even_alpha_k4) else num(r.break_even_alpha_k4)} & {pays} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


STRATEGY_NAMES = {ORACLE: "oracle (cross-fitted)", BEST_FIXED: "best fixed action (in hindsight)"}


def strategy_table(runs: pd.DataFrame) -> str:
    """Table 1: mean latency and throughput per strategy with 95 % CIs over prompts."""
    table = strategy_means(runs)
    lines = [r"\begin{tabular}{llrrr}", r"\toprule",
             r"Configuration & Strategy & Instances & Latency (s) [95\% CI] & Throughput (tok/s) [95\% CI] \\",
             r"\midrule"]
    for row in table.itertuples():
        latency = ci_text((row.latency_s, row.latency_s_low, row.latency_s_high), lambda v: num(v, 3))
        throughput = ci_text((row.tokens_per_s, row.tokens_per_s_low, row.tokens_per_s_high), lambda v: num(v, 1))
        lines.append(f"{tex_escape(row.configuration)} & {tex_escape(STRATEGY_NAMES.get(row.strategy, row.strategy))} "
                     f"& {row.instances} & {latency} & {throughput} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def memory_table(rows: list[PeakKv]) -> str:
    lines = [r"\begin{tabular}{lrrr}", r"\toprule",
             r"Configuration & $k$ & Peak K/V, mean (MiB) & Peak K/V, max (MiB) \\", r"\midrule"]
    for r in rows:
        lines.append(f"\\texttt{{{tex_escape(r.configuration)}}} & {r.k} & {r.peak_kv_mib:.2f} & "
                     f"{r.peak_kv_mib_max:.2f} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


ABLATION_CAPTION = ("\\label{tab:ablation}The study's live RAKV-ASD runs and controller variants replayed on this "
                    "study (\\texttt{scripts/ablate\\_controller.py}), 95\\% CIs over prompts.")


def stacked(cell: str) -> str:
    """A value and its interval ('3.3\\% [-3.1\\%, 9.8\\%]') on two lines of a p-column, so that a table of many
    intervals fits the text's width upright."""
    return cell.replace(" [", "\\newline[", 1)


def ablation_table(frame: pd.DataFrame) -> str:
    """The controller ablations (rakv.experiments.ablation.ablation_table) as a LaTeX longtable: upright, each
    interval under its value, its rows running on over pages (its head repeated) instead of shrinking."""
    ragged = "\\raggedright\\arraybackslash"
    columns = f"{{@{{}}>{{{ragged}}}p{{3.4cm}}*{{5}}{{>{{{ragged}}}p{{1.75cm}}}}rr@{{}}}}"
    head = (r"Variant & Mean regret & Acc.\ strict & Acc.\ within noise & Spearman & vs best fixed & Worst & "
            r"Spec.\ share \\")
    lines = [f"\\begin{{longtable}}{columns}", f"\\caption{{{ABLATION_CAPTION}}}\\\\", r"\toprule", head,
             r"\midrule", r"\endfirsthead", r"\toprule", head, r"\midrule", r"\endhead", r"\bottomrule", r"\endfoot"]
    for name, part in frame.groupby("configuration", sort=False):
        lines.append(f"\\multicolumn{{8}}{{@{{}}l}}{{\\texttt{{{tex_escape(name)}}}}} \\\\*")
        for row in part.to_dict("records"):
            cells = [ci_text(row["mean_regret"]), ci_text(row["accuracy_action"], lambda v: pct(v, 0)),
                     ci_text(row["accuracy_within_noise"], lambda v: pct(v, 0)), ci_text(row["spearman"], num),
                     ci_text(row["vs_best_fixed"])]
            lines.append(f"{tex_escape(row['variant'])} & {' & '.join(stacked(c) for c in cells)} & "
                         f"{pct(row['worst_regret'])} & {pct(row['speculative_share'], 0)} \\\\")
    lines.append(r"\end{longtable}")
    return "\n".join(lines) + "\n"


def write_ablation(frame: pd.DataFrame, out_dir: Path) -> Path:
    path = Path(out_dir) / "ablation_table.tex"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ablation_table(frame))
    return path


SERVING_GOALS_CAPTION = (
    "The serving study's goals with 95\\,\\% CIs over repeats (each repeat its own trace; paired by repeat for a "
    "difference); each goal's rule is stated once, under the table, and named by its letter; where a goal is "
    "underpowered or missing, why. The verdicts are family-wise (Holm); the baselines and margins were named in the "
    "design before the run.")


def rule_letters(goals) -> dict[str, str]:
    """Each distinct rule of the serving goals, in the order first met, named by a letter (A, B, ...)."""
    letters: dict[str, str] = {}
    for g in goals:
        letters.setdefault(g.rule or "", chr(ord("A") + len(letters)))
    return letters


def serving_goals_table(summary: Summary) -> str:
    """The serving goals as a longtable (it breaks across pages at the text's size instead of shrinking): one row
    per goal with its rule's letter, and each rule once, at the foot."""
    goals = summary.serving.goals if summary.serving else []
    letters = rule_letters(goals)
    head = "Goal & Value & 95\\,\\% CI & Verdict & Rule & Why \\\\"
    ragged = "\\raggedright\\arraybackslash"
    lines = [f"\\begin{{longtable}}{{@{{}}>{{{ragged}}}p{{5.6cm}}rrlc>{{{ragged}}}p{{3.6cm}}@{{}}}}",
             f"\\caption{{\\label{{tab:serving-goals}}{SERVING_GOALS_CAPTION}}}\\\\", "\\toprule", head,
             "\\midrule", "\\endfirsthead", "\\toprule", head, "\\midrule", "\\endhead",
             "\\bottomrule", "\\endfoot"]
    for g in goals:
        value, interval = goal_value(g)
        why = tex_escape(g.reason) if g.reason else ""  # why underpowered or missing
        lines.append(f"{tex_escape(g.goal)} & {value} & {interval} & {g.verdict} & {letters[g.rule or '']} & "
                     f"{why} \\\\")
    if not goals:
        lines.append("\\multicolumn{6}{l}{the serving stage did not run} \\\\")
    lines.append("\\end{longtable}")
    if goals:  # each rule once, under the table
        lines.append("\\noindent Rules of Table~\\ref{tab:serving-goals}. " + " ".join(
            f"\\textbf{{{letter}}}: {tex_escape(rule)}." for rule, letter in letters.items()))
    return "\n".join(lines) + "\n"


JOINT_REUSE_CAPTION = (
    "Speculation once the prefix is reused: mean latency of $r{=}1, k{=}0$ and $r{=}1, k{=}4$ on the same store state "
    "and prompts (the sensitivity stage's \\texttt{reuse\\_output\\_length} part), and the latency reduction of "
    "$k = 4$ with its 95\\,\\% CI over prompts.\\label{tab:joint-reuse}")


def joint_reuse_table(summary: Summary) -> str:
    """Speculation on top of reuse, by output length: r = 1 with k = 4 against r = 1 with k = 0."""
    rows = summary.joint_reuse
    lines = ["\\begin{tabular}{llrrrlrl}", "\\toprule",
             "Configuration & Store hit & $N$ & $r{=}1,k{=}0$ (s) & $r{=}1,k{=}4$ (s) & "
             "$k{=}4$ vs $k{=}0$ [95\\,\\% CI] "
             "& draft re-prefilled (s) & draft reuse saves [95\\,\\% CI] \\\\", "\\midrule"]
    for r in rows:
        ablated = r.reprefilled_s is not None
        reprefilled = f"{r.reprefilled_s:.3f}" if ablated else "--"
        saved = ci_text(r.draft_reuse_reduction) if ablated else "--"
        lines.append(f"{tex_escape(r.configuration)} & {SCENARIO_TEXT.get(r.scenario, r.scenario)} & "
                     f"{r.new_tokens} & {r.reuse_s:.3f} & {r.joint_s:.3f} & "
                     f"{ci_text(r.latency_reduction)} ({r.verdict}) & {reprefilled} & {saved} \\\\")
    if not rows:
        lines.append("\\multicolumn{8}{l}{the sensitivity stage did not run} \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{JOINT_REUSE_CAPTION}}}"]
    return as_longtable("\n".join(lines))  # a row per configuration, length and hit: long as well as wide


def write_generated(summary: Summary, results: Path, out_dir: Path) -> list[Path]:
    """paper/generated/<name>/: macros, tables, and the generated abstract, claims discussion and limitations."""
    results, out_dir = Path(results), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layout = RunLayout.of(results)
    meta = read_run_metadata(layout)
    runs = pd.read_parquet(layout.study.runs)
    files = {
        "macros.tex": "% generated by rakv.experiments.latex from summary.json; do not edit\n" + "".join(
            f"\\newcommand{{\\{name}}}{{{value}}}\n" for name, value in macros(pooled_summary(summary), meta).items()),
        "abstract.tex": abstract(summary, meta, results),
        "substitutions.tex": substitutions(summary, meta, results),
        "conclusion.tex": conclusion(summary),
        "claims_discussion.tex": claims_discussion(summary),
        "limitations.tex": limitations(summary, meta),
        "introduction.tex": introduction_findings(summary),
        "reproducibility.tex": reproducibility(summary, meta, stage_times(results)),
        "claims_table.tex": claims_table(summary),
        "statistics_table.tex": statistics_table(summary),
        "statistics_note.tex": mape_note(summary),
        "coverage_table.tex": coverage_table(),
        "across_machines.tex": across_machines(results),
        "machine_pairs_table.tex": machine_pairs_table(results),
        "run_to_run.tex": run_to_run(results),
        "acceptance_table.tex": acceptance_table(summary.acceptance),
        "memory_table.tex": memory_table(summary.peak_kv),
        "strategy_table.tex": strategy_table(runs),
        "serving.tex": serving_text(summary),
        "serving_goals_table.tex": serving_goals_table(summary),
        "serving_tables.tex": serving_tables(summary),
        "joint_reuse_table.tex": joint_reuse_table(summary),
        "joint_reuse.tex": joint_reuse_text(summary),
        "peer.tex": peer_section(peer_folder(results)),
        "regime.tex": regime_text(summary, results),
        "precision_table.tex": precision_table(precision_rows_of(summary, results)),
        "sampling.tex": sampling_text(summary),
        "sampling_tables.tex": sampling_tables(summary),
        "speculate_table.tex": speculate_table(summary, results),
        "proposers.tex": proposers_section(results),
    }
    paths = []
    for name, text in files.items():
        (out_dir / name).write_text(text)
        paths.append(out_dir / name)
    return paths
