"""The paper's section on sampling and workloads (the sampling stage, rakv.experiments.sampling_stats): its
sentences, each worded by its verdict, and the tables the section prints after them.
"""

from __future__ import annotations

import re

import numpy as np

from rakv.experiments.formatting import ci_text, missing, num, pct, tex_escape
from rakv.experiments.sampling_stats import agreement_tally, counted_verdict
from rakv.experiments.summary import Summary
from rakv.experiments.summary_sampling import DISTRIBUTION_SAMPLES, EXPECTED_GIVEN_DRAFT, FIRST_ROUNDS
from rakv.experiments.verdicts import BlockAcceptance, CheckVerdict, Side, ci_side
from rakv.runtime.actions import ADAPTIVE, KV_ONLY
from rakv.runtime.json_records import ABSENT

JUDGED = (CheckVerdict.AGREES, CheckVerdict.DIFFERS)  # the checks that can fail
BLOCK_WORDS = {BlockAcceptance.MORE: "accepts more candidates per round than",
               BlockAcceptance.FEWER: "accepts fewer candidates per round than",
               BlockAcceptance.INCONCLUSIVE: "is not distinguishable in candidates accepted per round from"}


def ratio_text(triple) -> str:
    """A latency ratio (ours / theirs) with its CI, e.g. 0.91 [0.85, 0.97]."""
    return ci_text(triple, fmt=lambda v: num(v, 2))


def ratio_words(triple, baseline: str) -> str:
    """A latency ratio worded by the side of 1 its CI lies on."""
    side = ci_side(triple, 1.0, point_if_no_interval=False)
    if side == Side.BELOW:
        return f"faster than {baseline} (latency ratio {ratio_text(triple)})"
    if side == Side.ABOVE:
        return f"slower than {baseline} (latency ratio {ratio_text(triple)})"
    return f"not distinguishable from {baseline} (latency ratio {ratio_text(triple)})"


def temperature_label(t: float) -> str:
    return "greedy" if t == 0 else f"$T={t:g}$"


TABLE_SENTENCES = {
    "tab:sampling": "Table~\\ref{tab:sampling} gives speculation by temperature.",
    "tab:acceptance-checks": "Table~\\ref{tab:acceptance-checks} has every check of the measured acceptance against "
                             "what its rule must accept.",
    "tab:sampling-tests": "Table~\\ref{tab:sampling-tests} gives the distribution tests and block verification "
                          "against token-wise verification.",
    "tab:workloads": "Table~\\ref{tab:workloads} gives the structured-output workload.",
    "tab:long-context": "Table~\\ref{tab:long-context} gives the long retrieved contexts.",
}
TABLE_ORDER = ("tab:sampling", "tab:workloads", "tab:long-context", "tab:acceptance-checks", "tab:sampling-tests")


def sampling_tables(summary: Summary) -> str:
    """The sampling stage's tables (the paper's appendix "Sampling and workloads: the tables") in TABLE_ORDER, each
    after its sentence and set as an upright longtable (rakv.experiments.longtable: with a row per configuration,
    temperature and rule they are long and wide; as floats they queued far from their sentences); a table whose
    label TABLE_ORDER does not name comes last."""
    from rakv.experiments.longtable import as_longtable

    if not summary.sampling:
        return ""
    blocks = _sampling_tables(summary).split("\\begin{rakvtable}")
    by_label: dict[str, str] = {}
    for block in blocks[1:]:
        label = re.search(r"\\label\{(tab:[^}]*)\}", block)
        by_label[label.group(1) if label else f"unlabelled-{len(by_label)}"] = "\\begin{rakvtable}" + block
    order = [label for label in TABLE_ORDER if label in by_label] + [n for n in by_label if n not in TABLE_ORDER]
    out = [blocks[0]] if blocks[0].strip() else []
    for label in order:
        sentence = TABLE_SENTENCES.get(label, "")
        out.append((sentence + "\n" if sentence else "") + as_longtable(by_label[label]) + "\n")
    return "".join(out)


def _sampling_tables(summary: Summary) -> str:
    s = summary.sampling
    lines = ["\\begin{rakvtable}\\centering\\scriptsize", "\\fittable{%",
             "\\begin{tabular}{llrrllllll}", "\\toprule",
             "Configuration & Decoding & $\\alpha$ measured [95\\,\\% CI] & closed form & check & "
             "spec-k4 / AR & RAKV-ASD / AR & RAKV-ASD / best fixed & best fixed & $\\alpha_0$ / break-even \\\\",
             "\\midrule"]
    checks = {(c.configuration, c.temperature, c.k): c for c in s.closed_form if c.verify in ("token", "greedy")}
    for t in s.temperatures:
        check = checks.get((t.configuration, t.temperature, 4))
        measured = ci_text(check.measured, fmt=lambda v: num(v, 3)) if check else "--"
        closed = num(check.closed_form, 3) if check else "--"
        lines.append(f"{tex_escape(t.configuration)} & {temperature_label(t.temperature)} & {measured} & {closed} & "
                     f"{check.verdict if check else '--'} & {ratio_text(t.spec_k4_vs_ar)} & {ratio_text(t.vs_ar)} & "
                     f"{ratio_text(t.vs_best_fixed)} & {tex_escape(t.best_fixed)} & {t.controller_alpha0:.3f} / "
                     + (f"{t.break_even_alpha:.3f}" if t.break_even_alpha is not None else "--") + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}}",
              "\\caption{Speculation by temperature (sampling stage). $\\alpha$: spec-k4's accepted candidates per "
              "position reached, token-wise verification (greedy: the target's argmax), with the mean of its closed "
              "form $\\sum_x\\min(p(x),q(x))$ over the same positions (agrees: the CI of the difference includes "
              "0; identity: greedy, where measured equals its closed form by construction, a check that cannot "
              "fail; the table of acceptance checks below has every cell). Latency ratios: geometric means over "
              "prompts of paired (prompt, seed) ratios with 95\\,\\% t CIs; below 1 is faster. $\\alpha_0$: the "
              "acceptance RAKV-ASD's controller started from, measured at that temperature, beside the break-even "
              "acceptance of $k=4$.}"
              "\\label{tab:sampling}", "\\end{rakvtable}"]
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
    lines = ["\\begin{rakvtable}\\centering\\scriptsize", "\\fittable{%", "\\begin{tabular}{llrrrrrlrll}",
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
              "check told the two rules apart.}\\label{tab:acceptance-checks}", "\\end{rakvtable}"]
    return "\n".join(lines) + "\n"


def sampling_tests_table(s) -> str:
    """The distribution tests and block against token-wise verification."""
    lines = []
    if s.block_vs_token or s.distribution:
        lines += ["\\begin{rakvtable}\\centering\\scriptsize", "\\fittable{%", "\\begin{tabular}{llrrrlll}",
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
                  "\\end{rakvtable}"]
    return "\n".join(lines) + "\n" if lines else ""


def workloads_table(s) -> str:
    """Structured outputs and long retrieved contexts."""
    lines = []
    if s.structured:
        lines += ["\\begin{rakvtable}\\centering\\scriptsize", "\\begin{tabular}{llrrrl}", "\\toprule",
                  "Configuration & Strategy & parses & valid & latency (s) & same tokens as AR \\\\", "\\midrule"]
        for r in s.structured:
            lines.append(f"{tex_escape(r.configuration)} & {tex_escape(r.strategy)} & {pct(r.parse_rate, 0)} & "
                         f"{pct(r.valid_rate, 0)} & {r.latency_s:.2f} & {'yes' if r.same_as_ar else 'no'} \\\\")
        lines += ["\\bottomrule", "\\end{tabular}",
                  "\\caption{Structured outputs (JSON following a schema; greedy).}\\label{tab:workloads}",
                  "\\end{rakvtable}"]
    if s.long_context:
        lines += ["\\begin{rakvtable}\\centering\\scriptsize", "\\fittable{%",
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
                  "\\end{rakvtable}"]
    return "\n".join(lines) + "\n" if lines else ""


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

    judged = [c for c in checks if c.control is not True and counted_verdict(c) in JUDGED]
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
            "checks that can fail, at 95\\,\\% each (Appendix~\\ref{app:sampling}): token-wise cells against "
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
                        f"{'rejects' if counted_verdict(c) == CheckVerdict.DIFFERS else 'does not reject'} the "
                        f"token-wise closed form (difference {ci_text(c.difference, fmt=lambda v: num(v, 3))}).")
    blocks = [c for c in checks if c.verify == "block" and counted_verdict(c) in JUDGED]
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
    told = [c for c in compared if ci_side(c.versus_token, 0.0, point_if_no_interval=False) in (Side.ABOVE, Side.BELOW)]
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
    paragraphs = [" ".join(text)]
    text = []
    if s.temperatures:
        text.append(temperature_sentence(s.temperatures))
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
                    + " (Appendix~\\ref{app:sampling}).")
    if s.block_vs_token:
        text.append(block_sentence(s.block_vs_token))
    paragraphs.append(" ".join(text))
    if s.long_context:
        paragraphs.append(long_context_sentence(s.long_context))
    return "\n\n".join(p for p in paragraphs if p) + "\n"


def _faster(triple) -> int:
    """-1, 0 or 1: the latency ratio's CI lies below 1 (faster), across it, or above it (slower), as `ratio_words`
    reads it."""
    side = ci_side(triple, 1.0, point_if_no_interval=False)
    return -1 if side == Side.BELOW else 1 if side == Side.ABOVE else 0


def _cells(rows) -> str:
    return ", ".join(f"{tex_escape(r.configuration)} at {temperature_label(r.temperature)}" for r in rows) or "none"


def temperature_sentence(rows) -> str:
    """Speculation by temperature in one sentence: over Table tab:sampling's cells, how often spec-k4 and RAKV-ASD
    are faster than AR (each from its CI) and RAKV-ASD against the best fixed strategy, naming the cells where
    spec-k4 is not faster."""
    spec = [_faster(t.spec_k4_vs_ar) for t in rows]
    asd = [_faster(t.vs_ar) for t in rows]
    fixed = [_faster(t.vs_best_fixed) for t in rows]
    return (f"Over the {len(rows)} configurations and temperatures tested (Appendix~\\ref{{app:sampling}}), spec-k4 is "
            "faster "
            f"than AR in {spec.count(-1)} and slower in {spec.count(1)}, RAKV-ASD is faster than AR in "
            f"{asd.count(-1)} and slower in {asd.count(1)}, and RAKV-ASD is not distinguishable from the best fixed "
            f"strategy in {fixed.count(0)} (faster in {fixed.count(-1)}, slower in {fixed.count(1)}); spec-k4 is "
            f"not faster than AR in: {_cells([t for t, v in zip(rows, spec) if v != -1])}.")


def block_sentence(rows) -> str:
    """Block against token-wise verification in one sentence, from the verdicts of Table tab:sampling-tests."""
    words = [BLOCK_WORDS[b.verdict] for b in rows]
    counts = "; ".join(f"in {words.count(w)}, block verification {w} token-wise verification"
                       for w in dict.fromkeys(words))
    return (f"Of {len(rows)} comparisons of block with token-wise verification (Appendix~\\ref{{app:sampling}}): "
            f"{counts}.")


def long_context_sentence(rows) -> str:
    """Long retrieved contexts in one sentence: how often reuse beats AR and speculation on top of reuse beats
    reuse, over Table tab:long-context's (configuration, store budget, document length) cells."""
    by = {(r.configuration, r.budget_mib, r.length_bin, r.strategy): r for r in rows}
    cells = [(r, by.get((r.configuration, r.budget_mib, r.length_bin, ADAPTIVE))) for r in rows
             if r.strategy == KV_ONLY and r.length_bin]
    cells = [(r, asd) for r, asd in cells if asd is not None]
    if not cells:
        return ""
    reuse = [_faster(r.vs_ar) for r, _ in cells]
    on_top = [_faster(asd.vs_reuse) for _, asd in cells]
    return (f"On long retrieved contexts (Appendix~\\ref{{app:sampling}}, {len(cells)} cells of configuration, "
            f"store budget and document length), reuse (kv-only) is faster than AR in {reuse.count(-1)}, not "
            f"distinguishable in {reuse.count(0)} and slower in {reuse.count(1)}; RAKV-ASD on top of it is faster "
            f"than kv-only in {on_top.count(-1)}, not distinguishable in {on_top.count(0)} and slower in "
            f"{on_top.count(1)}.")
