"""The paper's sentences worded from the summary alone (summary.json, the study's metadata and the stages' wall
times): the introduction's findings, the conclusion, the claims discussion, the limitations, the note
under the statistics table and the reproducibility appendix; and the feasibility verdict the summary carries
(rakv.experiments.analysis words it once, the paper and the README quote it).

Each sentence's wording (lower / higher / not distinguishable) follows the sign of the number and of its confidence
interval (rakv.experiments.verdicts), and the grid it describes is the one the profile actually ran. The sections
read from the run folders' calibrations are rakv.experiments.prose_machines'; serving's and sampling's are
rakv.experiments.prose_serving's and rakv.experiments.prose_sampling's.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rakv.experiments import runcompare
from rakv.experiments.claims import CLAIMS, REFERENCE, ClaimCounts, claim_counts
from rakv.experiments.formatting import ci_text, missing, num, pct, shown, tex_escape
from rakv.experiments.metadata import RunMetadata
from rakv.experiments.replication import pooled_summary
from rakv.experiments.summary import ClaimRow, Feasibility, PooledStatistic, Summary
from rakv.experiments.verdicts import GOAL_VERDICTS, ClaimVerdict, Side, ci_side, tally
from rakv.runtime.actions import AR, BEST_FIXED, JOINT_K4, KV_ONLY, ORACLE, SPEC_K4
from rakv.runtime.run_layout import RunLayout


def cost_side_sentence(feas: Feasibility) -> str:
    """What the twins say about the feasibility pair: the least break-even alpha over k, and the k that never pay."""
    rows = [r for r in feas.break_even if r.pair == feas.twin]
    paying = [r for r in rows if r.break_even_alpha is not None]
    never = [str(r.k) for r in rows if r.break_even_alpha is None]
    if paying:
        best = min(paying, key=lambda r: r.break_even_alpha)
        text = f"pays only above alpha = {best.break_even_alpha:.2f} (k = {best.k})"
    else:
        text = "never pays, for any k, even at alpha = 1"
    if never and paying:
        text += f", never for k = {', '.join(never)}"
    return f"cost side only (architecture twins): {text}; acceptance needs the real weights"


def feasibility_verdict(feas: Feasibility) -> str:
    """The feasibility study's answer to "does k != 0 ever beat k = 0 on the larger pair?"."""
    if feas.break_even:
        return cost_side_sentence(feas)
    if feas.status == "ran":
        return "crosses" if feas.crossed else "does not cross"
    return feas.status


BASELINE_TEXT = {JOINT_K4: "fixed Joint-k4", KV_ONLY: "KV-only", AR: "AR", SPEC_K4: "fixed spec-k4",
                 BEST_FIXED: "the best single fixed action", ORACLE: "the per-scenario oracle"}


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


def claim_of(summary: Summary, key: str, configuration: str | None = None) -> ClaimRow | None:
    """The claim row of `key` (on `configuration`), None if the run has none."""
    return next((r for r in summary.claims if r.key == key and configuration in (None, r.configuration)), None)


def regime_word(row: ClaimRow | None) -> str:
    """The regime in words, from the regime claim's direction: reversed (speculation pays here over all scenarios),
    the reference's (it does not), or undecided (the CI includes zero, or no scenario compared)."""
    if row is None:
        return "not measured"
    return {ClaimVerdict.NO: "reversed", ClaimVerdict.YES: "the reference's"}.get(row.direction, "undecided")


def regime_clause(row: ClaimRow | None) -> str | None:
    """The regime with its number: the best k > 0 against the best k = 0 over all scenarios, worded by its CI."""
    if row is None or missing(row.reproduced.value) or missing(row.reproduced.low):
        return None
    value, low, high = row.reproduced
    if row.direction == ClaimVerdict.NO:
        return (f"the regime is reversed: over all scenarios the best $k>0$ has {pct(-value)} lower latency than the "
                f"best $k=0$ (95\\% CI [{pct(-high)}, {pct(-low)}])")
    if row.direction == ClaimVerdict.YES:
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
    words = {ClaimVerdict.YES: "inside", ClaimVerdict.NO: "outside"}
    if form == "conclusion":
        placed = [f"{TWIN_NAMES.get(r.configuration, r.configuration)}'s twin "
                  + (f"at {num(r.reproduced.value)}, {words.get(r.magnitude, 'not placed')} it"
                     if r.reproduced.value is not None
                     else "nowhere (no $k$ pays)") for r in rows]
        return (f"On the cost side, the reference's crossover range ({num(REFERENCE['crossover_alpha_min'])} to "
                f"{num(REFERENCE['crossover_alpha_max'])}, widened by 0.05) has " + " and ".join(placed) + ".")
    if form == "abstract":
        inside = [TWIN_NAMES.get(r.configuration, r.configuration) for r in rows if r.magnitude == ClaimVerdict.YES]
        outside = [TWIN_NAMES.get(r.configuration, r.configuration) for r in rows if r.magnitude != ClaimVerdict.YES]
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


def conclusion(summary: Summary) -> str:
    """The paper's conclusion: what was reproduced, by the rules stated, and what was not; worded by the CIs (pooled
    over the shipped runs of this commit and machine class where there are several)."""
    summary = pooled_summary(summary)
    text = []
    for name, s in summary.per_configuration.items():
        first, second, third = (f"{verdict(s.latency_reduction.against(b))} {BASELINE_TEXT[b]}"
                                for b in (JOINT_K4, KV_ONLY, BEST_FIXED))
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


def pooled_statistics(summary: Summary) -> dict[str, PooledStatistic]:
    """The summary's statistics pooled over the shipped runs, by name (empty with one run)."""
    return {p.name: p for p in summary.replication.statistics} if summary.replication else {}


def yes_no_inconclusive(counts: dict) -> tuple[int, int, int]:
    """A claim count's rows per verdict (rakv.experiments.claims.ClaimCounts): reproduced, reversed or outside,
    inconclusive."""
    return tuple(counts.get(v, 0) for v in (ClaimVerdict.YES, ClaimVerdict.NO, ClaimVerdict.INCONCLUSIVE))


def counts_sentence(counts: ClaimCounts) -> str:
    """The one wording of the claim counts (rakv.experiments.claims.claim_counts), for the introduction and
    Section "Claims"."""
    (d_yes, d_no, d_open), (m_yes, m_no, m_open) = map(yes_no_inconclusive, (counts.direction, counts.magnitude))
    return (f"Of {counts.rows} claim rows (each reference claim per configuration), {counts.signed} are signed "
            f"effects, whose direction is reproduced for {d_yes}, reversed for {d_no} and "
            f"inconclusive for {d_open}; {counts.banded} have a tolerance band: "
            f"{m_yes} inside it, {m_no} outside and {m_open} "
            "straddling an edge; "
            f"{counts.unjudged} (extremes over scenarios without an interval, and findings) carry no such verdict")


def counts_brief(counts: ClaimCounts) -> str:
    """The claim counts in one clause, for the abstract (Section "Claims" gives them in full, `counts_sentence`)."""
    (d_yes, d_no, d_open), (m_yes, _, _) = map(yes_no_inconclusive, (counts.direction, counts.magnitude))
    return (f"Of the reference's {counts.signed} signed effects (per configuration) this run reproduces the "
            f"direction of {d_yes}, reverses {d_no} and leaves {d_open} "
            f"undecided; {m_yes} of {counts.banded} banded claims "
            f"{'falls' if m_yes == 1 else 'fall'} inside their tolerance band")


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
        reversed_ = part[part.direction == ClaimVerdict.NO].claim.tolist()
        if reversed_:
            parts.append(f"Reversed on \\texttt{{{tex_escape(name)}}}: " + "; ".join(tex_escape(c) for c in reversed_)
                         + ".")
    return " ".join(parts) + "\n"


def verdict(triple) -> str:
    """A latency reduction's CI in two words: faster than / slower than / not distinguishable from."""
    side = ci_side(triple, 0.0, point_if_no_interval=False)
    if missing(triple[0]):
        return "not compared with"
    return {Side.ABOVE: "faster than", Side.BELOW: "slower than"}.get(side, "not distinguishable from")


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
                                for b in (JOINT_K4, KV_ONLY, BEST_FIXED))
        verdicts = f"{first}, {second}, and {third}"
        text.append(f"On \\texttt{{{tex_escape(name)}}}, RAKV-ASD is {verdicts} (95\\% CIs in "
                    "Section~\\ref{sec:results}), and the regime of speculation against $k=0$ is "
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
    path = RunLayout.of(results).stage_times
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[1].isdigit():
            out[fields[0]] = int(fields[1])
    return out


def reproducibility(summary: Summary, meta: RunMetadata, times: dict[str, int]) -> str:
    """The reproducibility appendix: machine, versions, commit, the commands, the stages' wall times."""
    hardware = meta.hardware
    profile = tex_escape(meta.profile_name)
    versions = ", ".join(f"{tex_escape(name)} {tex_escape(version)}" for name, version in meta.packages.installed())
    commit = tex_escape(meta.short_commit)
    shipped = summary.results.startswith("data/reference/")
    paragraphs = [
        ("\\paragraph{Raw data.} The run this paper reports ships with the artifact: " if shipped else
         "\\paragraph{Raw data.} The run this paper reports is a results folder of its own: ")
        + f"\\texttt{{{tex_escape(summary.results)}/}} holds the study's \\texttt{{runs.parquet}} and "
        "\\texttt{metadata.json}, the calibrations, the sensitivity and feasibility tables and \\texttt{summary.json}. "
        "The analysis stage recomputes every statistic, table, figure and generated sentence here from them"
        + (", and a test fails when the shipped numbers and today's analysis disagree." if shipped else "."),
        f"\\paragraph{{Machine and software.}} {tex_escape(hardware.processor)} ({tex_escape(hardware.device)}, "
        f"{hardware.threads or 'GPU'} threads, {tex_escape(hardware.dtype)}); {versions}. Model forwards use "
        f"the \\texttt{{{tex_escape(meta.kernels)}}} kernels.",
        "\\paragraph{Provenance.} The study was measured "
        f"at commit \\texttt{{{commit}}} with profile \\texttt{{{profile}}} and seed {meta.seed}: "
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


def limitations(summary: Summary, meta: RunMetadata) -> str:
    grid = summary.grid
    hardware = meta.hardware
    text = [
        f"Timings depend on the machine ({tex_escape(hardware.processor)}, {tex_escape(hardware.device)}): "
        "a speculative round's cost relative to a target step differs between machines, so the break-even "
        "acceptance and the value of speculation differ from the reference's.",
        f"The grid is the profile's (\\texttt{{{tex_escape(meta.profile_name)}}}): "
        + ", ".join(f"{n} {tex_escape(d)} prompts" for d, n in grid.prompts.items())
        + f" over {len(grid.length_bins)} length bin{'s' if len(grid.length_bins) != 1 else ''}, "
        f"{grid.new_tokens} new tokens, "
        f"{grid.measurements_per_action_min} measurements per action and {grid.controller_repeats} "
        "controller runs per scenario; confidence intervals resample prompts, so with few prompts they are wide.",
    ]
    undecided = [r for r in pooled_summary(summary).claims if r.direction == ClaimVerdict.INCONCLUSIVE]
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
        words = {Side.BELOW: "lower than", Side.ABOVE: "higher than"}.get(side, "not distinguishable from")
        text.append(f"On \\texttt{{{tex_escape(name)}}} the cost model's MAPE, {pct(s.mape[0])}, is {words} the "
                    f"action-blind predictor's, {pct(s.mape_null)} (paired difference {100 * diff[0]:.1f} "
                    f"percentage points, 95\\% CI [{100 * diff[1]:.1f}, {100 * diff[2]:.1f}]); its mean per-scenario "
                    "Spearman "
                    f"$\\rho$, {num(s.spearman[0])}, is the ranking the controller acts on.")
    return " ".join(text) + "\n"


def goal_tally(goals) -> str:
    """The serving goals' verdicts counted, one each so they sum to the goals (rakv.experiments.verdicts.tally):
    "a met, b missed, c inconclusive, d underpowered and e missing"."""
    counts = tally([g.verdict for g in goals])
    return ", ".join(f"{counts[v]} {v}" for v in GOAL_VERDICTS[:-1]) + f" and {counts['missing']} missing"
