"""The paper's "Three proposer families" (paper/main.tex): the learned heads beside the int8 self-draft and prompt
lookup, and rakv-asd choosing (reuse, proposer, k) per request, from the analysed run's own study where its
configurations include one of several proposers (the offline profile's `smollm2-all`), else the shipped all-proposer
study (data/reference/proposer-choice/), both through rakv.experiments.proposer_choice (the table
scripts/proposer_choice.py prints), and,
where shipped, the served choice under load (data/reference/served-choice/*.json,
rakv.experiments.served_choice). Every number is read from those files; every verdict is the goal's rule on its
interval (met, missed or inconclusive), and the sentences carry no sign of their own.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rakv.experiments.calibrations import calibration_tables
from rakv.experiments.formatting import ci_text, num, tex_escape
from rakv.experiments.proposer_choice import POOLED, ChoiceRow, all_proposer_configurations, choice_rows, prices
from rakv.experiments.served_choice import CHOICE, read_report
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import RunLayout, calibration_stem

PROPOSER_STUDY = RunLayout.reference("proposer-choice")
SERVED_CHOICE = RunLayout.reference("served-choice").root  # scripts/served_choice.py's reports, one per load
PRICE_CONTEXT = 256  # where `rakv calibrate` quotes its step
OWNER = {"draft": "the self-draft's", "heads": "the heads'", "prompt-lookup": "prompt lookup's"}


def study_rows(folder: Path) -> tuple[str, list[ChoiceRow], list] | None:
    """(configuration, rows, shares) of the study's configuration of several proposers; None without one."""
    path = RunLayout.of(folder).study.runs
    if not path.exists():
        return None
    runs = pd.read_parquet(path)
    names = all_proposer_configurations(runs)
    if not names:
        return None
    rows, shares = choice_rows(runs, names[0])
    return names[0], rows, shares


def choice_table(rows: list[ChoiceRow]) -> str:
    body = [f"{tex_escape(r.workload)} & {tex_escape(r.baseline)} & \\texttt{{{tex_escape(r.action)}}} & "
            f"{r.instances} & {ci_text(r.regret)} & {tex_escape(r.goal)} & {tex_escape(r.verdict)} \\\\" for r in rows]
    return ("\\begin{rakvtable}\\centering\\scriptsize\n\\fittable{\\begin{tabular}{lllrlll}\\toprule\n"
            "workload & against & action & $n$ & latency ratio $-1$ [95\\,\\% CI] & goal & verdict \\\\\n\\midrule\n"
            + "\n".join(body) + "\n\\bottomrule\\end{tabular}}\n"
            "\\caption{The proposer chosen per request (rakv-asd of the configuration of all three proposers) against "
            "the best fixed (proposer, $r$, $k$) of each workload and against each single-proposer configuration's "
            "rakv-asd on the same instances; in the rows `$p$ vs draft', $p$'s best fixed action against the "
            "self-draft's. The ratio is a mean latency over another's, its CI over prompts.}\\label{tab:proposers}\n"
            "\\end{rakvtable}\n")


def price_sentence(folder: Path, shipped: bool, configuration: str) -> str:
    """The prices of `configuration`'s proposers by the study's calibrations (its pair and precision's, not the
    run's other pairs'); `shipped`: the older all-proposer study, which predates the heads' proposal through the
    engine's own GEMM, so the sentence says so."""
    from rakv.experiments.config import configuration as entry

    chosen = entry(configuration)
    stems = {calibration_stem(chosen.pair, name, chosen.precision) for name in chosen.all_proposers}
    try:
        rows = prices({stem: table for stem, table in calibration_tables(folder).items() if stem in stems},
                      PRICE_CONTEXT)
    except RakvError:
        return ""
    parts = [f"{OWNER.get(r.calibration.split('-', 1)[1], tex_escape(r.calibration))} four candidates cost "
             f"{num(r.propose_4, 3)} target steps, each accepted with probability {num(r.alpha, 3)}" for r in rows]
    dated = ("; the study predates the heads' proposal through the engine's own GEMM, docs/heads.md has the later "
             "measurements" if shipped else "")
    return f" By the study's calibrations (at {PRICE_CONTEXT} tokens of context{dated}), " + "; ".join(parts) + "."


def verdict_sentence(rows: list[ChoiceRow]) -> str:
    best = [r for r in rows if r.baseline == "best fixed"]
    single = [r for r in rows if r.baseline.startswith("rakv-asd of")]
    parts = [f"against the best fixed action, {tex_escape(r.workload)} ({tex_escape(r.goal)}), "
             f"{ci_text(r.regret)}, {tex_escape(r.verdict)}" for r in best]
    parts += [f"against the {tex_escape(r.baseline)} {ci_text(r.regret)}, {tex_escape(r.verdict)}" for r in single]
    return "Its latency ratios, with each goal's verdict: " + "; ".join(parts) + "."


def served_sentence(folder: Path = SERVED_CHOICE) -> str:
    """The served choice under load, from scripts/served_choice.py's shipped reports (one per load, by rate)."""
    reports = sorted((read_report(p) for p in sorted(Path(folder).glob("*.json"))),
                     key=lambda r: r.options.rate) if Path(folder).is_dir() else []
    if not reports:
        return ""
    o = reports[0].options
    loads = []
    for report in reports:
        against = "; ".join(f"against {tex_escape(name)} alone {ci_text(ci)}" for name, ci in report.against.items())
        shares = ", ".join(f"{tex_escape(k)} {v}" for k, v in sorted(report.setups[CHOICE].proposer_share.items()))
        at_load = "".join(
            f"; chosen by the predicted service time under load instead ({tex_escape(other.setup)}, which ran "
            + ", ".join(f"{tex_escape(k)} {v}" for k, v in sorted(report.setups[other.setup].proposer_share.items()))
            + f"), {ci_text(other.regret)} against the same, {tex_escape(other.verdict)}" for other in report.others)
        loads.append(f"at {report.options.rate:g} requests/s, {against} (the choice ran {shares} of "
                     f"{report.setups[CHOICE].total} requests), so against the best fixed proposer "
                     f"({tex_escape(report.best_fixed)}, in hindsight) the goal of at most 5\\,\\% regret is "
                     f"{tex_escape(report.verdict)}{at_load}{service_clause(report)}")
    return (f" Served under load (\\texttt{{scripts/served\\_choice.py}}, its machine and commit in "
            f"data/reference/served-choice/README.md: {o.requests} Poisson requests per trace, "
            f"{o.repeats} repeats, every server rakv-asd with the load-aware policy, intervals over repeats), the "
            "mean end-to-end latency of the choice over one proposer per server is " + "; ".join(loads) + ".")


def service_clause(report) -> str:
    """How far admission's service predictions were from the service measured, per proposer on its own server
    (measured over predicted, summed over its requests): what the choice at load compares proposers by."""
    own = [(name, report.setups[name].service.get(name)) for name in report.setups
           if report.setups[name].service and name in report.setups[name].service]
    own = [(name, s) for name, s in own if s.requests]
    if not own:
        return ""
    return ("; on each proposer's own server the measured service time over admission's prediction was "
            + ", ".join(f"{num(s.measured_s / s.predicted_s, 2)} for {tex_escape(name)} (acceptance priced "
                        f"{num(s.alpha_priced / s.requests, 3)}, realised "
                        f"{num(s.alpha_realised / s.realised, 3) if s.realised else 'none'})" for name, s in own))


def proposers_section(results: Path | None = None, served: Path = SERVED_CHOICE,
                      shipped: Path = PROPOSER_STUDY.root) -> str:
    """The section's text and table from the run at `results` where its study holds a configuration of several
    proposers, else from the shipped all-proposer study (empty, with a comment, when neither has one)."""
    found = study_rows(Path(results)) if results is not None else None
    own = found is not None
    folder = Path(results) if own else Path(shipped)
    found = found if own else study_rows(folder)
    if found is None:
        return "% no study of a configuration of several proposers: data/reference/proposer-choice/ (docs/heads.md)\n"
    configuration, rows, shares = found
    where = "this run's study" if own else "data/reference/proposer-choice/"
    ran = ", ".join(f"{tex_escape(s.proposer)} {s.share:.0%}".replace("%", "\\%") for s in shares
                    if s.workload == POOLED)
    text = (f"The study of \\texttt{{{tex_escape(configuration)}}} (the self-draft, prompt lookup and learned heads "
            f"of one target; {where}) sets rakv-asd choosing (reuse, proposer, $k$) per "
            f"request against every fixed choice on the same instances (Table~\\ref{{tab:proposers}}). "
            + verdict_sentence(rows) + f" rakv-asd ran {ran} of its requests."
            + price_sentence(folder, not own, configuration) + "\n")
    served_text = served_sentence(served).strip()  # its own paragraph after the table, which stays by its reference
    return text + choice_table(rows) + (f"\n{served_text}\n" if served_text else "")
