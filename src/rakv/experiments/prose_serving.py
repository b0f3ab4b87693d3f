"""The paper's sentences on several requests at once, each worded from its CI: "Serving under load" (summary.json's
`serving`, docs/serving.md), speculation on top of reuse, and "Against vLLM" with its tables (the shipped peer
results, rakv.experiments.peer_tables, as docs/peers.md).
"""

from __future__ import annotations

import re
from pathlib import Path

from rakv.bench.peer_reports import SERVE_METRICS
from rakv.experiments import peer_tables as pt
from rakv.experiments.formatting import ci_text, missing, num, pct, tex_escape
from rakv.experiments.peer_tables import BatchFile
from rakv.experiments.prose import goal_tally
from rakv.experiments.serving_goal_ids import GoalKind
from rakv.experiments.summary import Summary
from rakv.experiments.summary_serving import ALL_ITERATIONS, Comparison
from rakv.experiments.verdicts import ci_side
from rakv.runtime.run_layout import PeerLayout, RunLayout

METRIC_NAMES = {"p99_itl_ms": "p99 inter-token latency", "median_ttft_ms": "median time to first token",
                "goodput": "goodput"}
SHORT_METRIC_NAMES = {"p99_itl_ms": "p99 ITL", "median_ttft_ms": "median TTFT", "goodput": "goodput"}  # in tables


def signed_change(row: Comparison) -> str:
    """'lowered X by 12.0 % [5.1, 20.3]', 'raised ...' or 'did not measurably change X (...)': from the CI's sign."""
    metric = METRIC_NAMES[row.metric]
    value, low, high = row.ci
    if low is not None and low > 0:
        return f"raised {metric} by {ci_text(row.ci)}"
    if high is not None and high < 0:
        return f"lowered {metric} by {ci_text([-value, -high, -low])}"
    return f"did not measurably change {metric} ({ci_text(row.ci)})"


FAMILY_TEXT = {"chunking": "Under the interference trace", "speculation": "Under the structured-output trace with "
               "prompt lookup", "speculation-draft": "With the draft model proposing"}


def serving_text(summary: Summary) -> str:
    """The paper's section "Serving under load", from summary.json's `serving` (its sentences follow the CIs)."""
    serving = summary.serving
    if not serving:
        return ("The serving stage did not run for this results folder (\\texttt{./reproduce.sh stages=serving}); "
                "its section is empty.\n")
    steps = serving.slo_steps
    text = [f"The serving study ran {serving.runs} served traces ({serving.repeats} repeats per cell, "
            f"{serving.requests} requests) on "
            + ", ".join(f"\\texttt{{{tex_escape(c)}}}" for c in serving.configurations)
            + f"; {serving.exact.equal} of {serving.exact.total} served outputs were identical to the "
            "request's batch-one greedy AR output. Each repeat ran a cell's policies back to back in a shuffled order; "
            "intervals are 95\\,\\% Student-t intervals over repeats of per-run values (paired by repeat for a "
            "difference). The SLOs are multiples of the machine's calibrated one-request decode step "
            f"(ITL {steps.itl}, TTFT {steps.ttft}, TPOT {steps.tpot} steps; Appendix~\\ref{{app:serving-tables}}). "
            f"The serving stage ran at commit \\texttt{{{tex_escape((serving.commit or 'unknown')[:12])}}}."]
    findings = []
    for family, name in FAMILY_TEXT.items():
        rows = [r for r in serving.comparisons if r.family == family]
        if rows:
            words = [signed_change(r).split(" ", 1)[0] for r in rows]
            metrics = sorted({METRIC_NAMES[r.metric] for r in rows})
            findings.append(f"{name}, of {len(rows)} comparisons of a policy against its baseline "
                            f"({' and '.join(metrics)}), {words.count('lowered')} lowered the metric, "
                            f"{words.count('raised')} raised it and {words.count('did')} did not measurably "
                            "change it (Appendix~\\ref{app:serving-tables}).")
    mape = serving.iteration_mape.get(ALL_ITERATIONS)
    if mape:
        findings.append(f"The batch cost model predicted the time of {mape.iterations} served iterations with a "
                        f"MAPE of {ci_text(mape.scaled)} with its online scale and {ci_text(mape.table)} from the "
                        "table alone; admission's predictions under load are in Appendix~\\ref{app:serving-tables}.")
    text = [" ".join(text), " ".join(findings)] if findings else [" ".join(text)]
    goals = []
    goals.append(f"Of the {len(serving.goals)} goals in Table~\\ref{{tab:serving-goals}}, "
                f"{goal_tally(serving.goals)}, "
                "family-wise at 95\\,\\% (Holm's step-down within each family; a goal met at some load of several "
                "read with its CIs Bonferroni-corrected for its loads). Goodput goals are judged only at loads where "
                "some policy missed an SLO for some request (elsewhere goodput is the arrival rate whatever the "
                "policy); each goal's rule, with its margin, is in the table. " + unanswered_sentence(serving) + " "
                f"Exactness is checked beside the goals, not counted among them: {serving.exact.equal} of "
                f"{serving.exact.total} served outputs were identical to the request decoded alone.")
    goals.append(serving_power_sentence(serving))
    goals.append(met_but_lower_sentence(serving))
    return "\n\n".join([*text, " ".join(g for g in goals if g)]) + "\n"


def serving_tables(summary: Summary) -> str:
    """The serving section's enumerations as the appendix's tables: every policy comparison with its 95 % CI and
    the cell's measured concurrency (Table tab:serving-comparisons), and admission's predictions under load
    (Table tab:serving-predictions), in one float; "" without a serving stage."""
    serving = summary.serving
    if not serving:
        return ""
    concurrency: dict = {}
    for cell in serving.cells:
        if cell.concurrency is not None:
            concurrency.setdefault((cell.family, cell.rate), []).append(cell.concurrency)
    rows = []
    for r in serving.comparisons:
        held = concurrency.get((r.family, r.rate))
        rows.append(f"{tex_escape(r.family)} & {r.rate:g} & \\texttt{{{tex_escape(r.policy)}}} & "
                    f"\\texttt{{{tex_escape(r.against)}}} & {SHORT_METRIC_NAMES[r.metric]} & {ci_text(r.ci)} & "
                    + (f"{min(held):.1f}--{max(held):.1f}" if held else "--") + " \\\\")
    out = ["\\begin{rakvtable}\\centering\\scriptsize",
           "\\caption{\\label{tab:serving-comparisons}Each policy against its baseline per trace family and arrival "
           "rate (requests/s): the change of the metric (ITL: inter-token latency; TTFT: time to first token) "
           "with its 95\\,\\% CI over repeats (paired by repeat), and "
           "the measured mean concurrency (requests in the system) over the cell's policies.}",
           "\\begin{tabular}{lrllllr}", "\\toprule",
           "Family & Rate & Policy & Against & Metric & Change [95\\,\\% CI] & Concurrency \\\\", "\\midrule",
           *rows, "\\bottomrule", "\\end{tabular}"]
    predictions = [f"service time, {tex_escape(family)} & {stats.requests} & {ci_text(stats.served)} & "
                   + ("--" if missing(stats.batch_one[0]) else ci_text(stats.batch_one)) + " \\\\"
                   for family, stats in serving.latency.items()]
    predictions += [f"acceptance, {tex_escape(name)} & -- & $|\\alpha$ error$|$ {num(stats.acceptance_error[0])} "
                    f"[{num(stats.acceptance_error[1])}, {num(stats.acceptance_error[2])}] & "
                    + ("--" if missing(stats.regret[0]) else f"regret {ci_text(stats.regret)}") + " \\\\"
                    for name, stats in serving.acceptance.items()]
    slos = [f"SLO, \\texttt{{{tex_escape(name)}}} & -- & ITL {v.slo_itl_ms:.0f}\\,ms, TTFT {v.slo_ttft_ms:.0f}\\,ms, "
            f"TPOT {v.slo_tpot_ms:.0f}\\,ms & -- \\\\" for name, v in serving.slos_ms.items()]
    if predictions or slos:
        out += ["\\bigskip",
                "\\caption{\\label{tab:serving-predictions}Admission's predictions under load ($n$: requests): the "
                "service-time prediction's MAPE per trace family beside the batch-one prediction's, the acceptance "
                "at admission's mean absolute error against the realised one with the ex-post regret (95\\,\\% CIs), "
                "and each configuration's SLOs (multiples of its calibrated one-request decode step).}",
                "\\begin{tabular}{lrll}", "\\toprule",
                "Prediction & $n$ & Under load & Batch-one \\\\", "\\midrule", *predictions, *slos,
                "\\bottomrule", "\\end{tabular}"]
    return "\n".join([*out, "\\end{rakvtable}"]) + "\n"  # one float: the two tables stand together


def met_but_lower_sentence(serving) -> str:
    """The "no worse" goals met within their margin while their CI lies wholly below zero: measurably lower than
    the baseline, by less than the margin (a margin wider than the run's noise lets such a goal be met)."""
    lower = [g for g in serving.goals if g.goal_id.kind in (GoalKind.NO_WORSE, GoalKind.THROUGHPUT)
             if g.verdict == "met" and not missing(g.ci.high) and g.ci.high < 0]
    if not lower:
        return ""
    shown = "; ".join(f"{tex_escape(g.family or '')} against {tex_escape(g.rival or '')} "
                      f"({'goodput' if g.goal_id.kind is GoalKind.NO_WORSE else 'throughput'} {pct(g.ci.value)} "
                      f"[{pct(g.ci.low)}, {pct(g.ci.high)}])" for g in lower)
    return (f"{len(lower)} ``no worse'' {'goal is' if len(lower) == 1 else 'goals are'} met within the margin "
            f"while {'its' if len(lower) == 1 else 'their'} CI lies wholly below zero, so RAKV-ASD is measurably "
            f"lower there, by less than the margin: {shown}.")


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


SCENARIO_TEXT = {"exact": "exact repeat", "partial-50": "50\\,\\% partial hit"}


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
    shipped = PeerLayout.shipped()
    own_run = not RunLayout.of(results).shipped
    for peer in ((PeerLayout.own(), shipped) if own_run else (shipped,)):
        if peer.vllm_serve_summary.exists():
            return peer.root
    return None


# the client metrics of the paper's table: docs/peers.md's (rakv.bench.peer_reports.SERVE_METRICS) but the ITL and
# hit-rate columns, which do not fit its width (the hit rate has its own column)
PEER_COLUMNS = [m for m in SERVE_METRICS if m.field in ("output_throughput", "p50_ttft_ms", "p99_ttft_ms",
                                                         "p50_tpot_ms", "mean_e2el_ms", "p99_e2el_ms")]


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
    if folder is None:
        return "% no vLLM peer results: scripts/bench_peers.sh (docs/peers.md)\n"
    serve = pt.read_serve_summary(PeerLayout(folder).vllm_serve_summary)
    machine, repeats = serve.machine, len(serve.repeats)
    rows = []
    for label, rate in serve.workloads.items():
        for i, key in enumerate(serve.settings):
            a = serve.aggregate[key][label]
            hit = a.prefix_hit_rate.value
            rows.append(f"{tex_escape(label.rsplit('-', 1)[0]) if i == 0 else ''} & {rate:g} & "
                        f"{tex_escape(pt.setting_name(serve, key))} & {a.completed} & {a.failed} & "
                        + " & ".join(peer_cell(a.metric(m), m.digits) for m in PEER_COLUMNS)
                        + f" & {'--' if hit is None else pct(hit, 0)} \\\\")
    agreed = [a for r in serve.repeats for a in pt.repeat_agreements(r)]
    text = (f"\\paragraph{{Against vLLM.}} The same prompts, at the same seeded Poisson arrivals, were sent by vLLM's "
            f"own benchmark client (\\texttt{{vllm bench serve}}) to \\texttt{{rakv serve --http}} (strategy "
            f"\\texttt{{{tex_escape(serve.strategy)}}}) and to vLLM {tex_escape(serve.vllm)}'s CPU build "
            f"serving the same fp32 weights, each with its defaults (prefix caching on in both), {serve.requests} "
            f"requests of {serve.new_tokens} new tokens per workload, {repeats} repeats each with its own prompts "
            f"and arrivals (Table~\\ref{{tab:peer}}; \\texttt{{scripts/bench\\_peers.sh}}, "
            f"{tex_escape(machine.cpu)}, {machine.cores} cores, {machine.date}). On {machine.cores} "
            "cores vLLM gives its model one thread by default (its front end the other) where rakv computes on "
            "both, so vLLM was measured at its default and with \\texttt{OMP\\_NUM\\_THREADS=2}. Greedy outputs "
            f"were equal token for token on {sum(a.equal for a in agreed)} of {sum(a.requests for a in agreed)} "
            "requests both engines completed"
            + (f" ({sum(a.failed for a in agreed)} comparisons left out: a request one engine failed)"
               if any(a.failed for a in agreed) else "")
            + ". rakv / vLLM per repeat, read from the CIs of the geometric mean of the paired ratios "
            "(docs/peers.md gives every ratio): " + " ".join(tex_escape(x) for x in pt.serve_sentences(serve)) + "\n")
    table = ("\\begin{rakvtable}\\centering\\scriptsize\n\\fittable{\\begin{tabular}{lllrr" + "r" * len(PEER_COLUMNS)
             + "r}\\toprule\nworkload & req/s & engine & done & failed & "
             + " & ".join(m.label for m in PEER_COLUMNS) + " & hits \\\\\n\\midrule\n" + "\n".join(rows)
             + "\n\\bottomrule\\end{tabular}}\n"
             f"\\caption{{rakv serve and vLLM under vLLM's benchmark client: means over {repeats} repeats $\\pm$ the "
             "half-width of their 95\\,\\% t interval (times in ms; done / failed: requests over all repeats; hits: "
             "prompt tokens reused, vLLM in blocks of 16 tokens, rakv at token granularity).}\\label{tab:peer}\n"
             "\\end{rakvtable}\n")
    return text + table + batch_peer_text(pt.batch_reports(folder)) + tune_text(folder)


def batch_peer_text(files: list[BatchFile]) -> str:
    """bench_serving.py --peer vllm's ratios (all requests at once), with their CIs and vLLM's threads."""
    if not files:
        return ""
    parts = []
    for f in files:
        a = f.report.args
        what = (f"rakv prompt lookup $k={a.vllm_ngram}$ against vLLM's n-gram drafts" if a.vllm_ngram
                else "greedy AR") + f", vLLM at {pt.threads_words(a.vllm_threads)}"
        cells = [f"{num(st.value, 2)} [{num(st.low, 2)}, {num(st.high, 2)}] at $c={r.concurrency}$"
                 for r in f.report.rows if r.has_vllm
                 for st in [pt.row_statistics(r).ours_over_vllm_ci]]
        parts.append(f"{what}: " + ", ".join(cells))
    return ("With every request arriving at once (\\texttt{scripts/bench\\_serving.py --peer vllm}: "
            f"{files[0].report.requests} requests, vLLM's offline engine with \\texttt{{max\\_num\\_seqs}} $=c$ beside "
            f"\\texttt{{rakv serve --max-batch}} $c$; {'/'.join(sorted({str(f.report.args.repeats) for f in files}))} "
            "repeats), rakv's output tok/s over vLLM's, the geometric mean over repeats with its 95\\,\\% CI, is "
            + "; ".join(parts) + ". " + tex_escape(pt.speculation_sentence(files)) + "\n")


def tune_text(folder: Path) -> str:
    """tune_vllm.py's schedule, its check (Table tab:tune) and the check read against its own run-to-run noise."""
    path = PeerLayout(folder).tune
    if not path.exists():
        return ""
    tune = pt.read_tune(path)
    model = tune.model
    configs = sorted({r.config for r in tune.check}, key=lambda c: (c != "tuned", c))
    cs = sorted({r.c for r in tune.check})
    rate = tune.rates()
    rows = [f"{tex_escape(config)} & " + " & ".join(f"{rate[(config, c)]:.1f}" for c in cs) + " \\\\"
            for config in configs]
    return (f"\\texttt{{scripts/tune\\_vllm.py}} measured vLLM's own step on this machine per batch size and $k$ apart "
            f"from acceptance, fitted the batch cost model's pass form to it (a step = "
            f"{1e3 * model.fixed_s:.1f} ms + "
            f"{1e3 * model.per_request_s:.2f} ms per request + {1e3 * model.per_row_s:.2f} ms per row) and chose "
            f"vLLM's \\texttt{{num\\_speculative\\_tokens\\_per\\_batch\\_size}} for acceptance "
            f"{tune.alpha:.2f} and n-gram match rate {tune.match_rate:.2f}: "
            + ", ".join(f"$k={k}$ for batches {a}--{b if b < 1024 else 'up'}" for a, b, k in tune.schedule)
            + ". Table~\\ref{tab:tune} serves the same requests through vLLM with it, with fixed $k$ and with a "
            "hand-set table.\n\\begin{rakvtable}\\centering\\scriptsize\n"
            "\\fittable{\\begin{tabular}{l" + "r" * len(cs)
            + "}\\toprule\nschedule & " + " & ".join(f"$c={c}$" for c in cs) + " \\\\\n\\midrule\n"
            + "\n".join(rows) + "\n\\bottomrule\\end{tabular}}\n\\caption{vLLM's output tokens/s with each "
            "speculation schedule, batches of $c$ requests (n-gram drafts, real acceptance).}\\label{tab:tune}\n"
            "\\end{rakvtable}\n" + tex_escape(pt.tune_sentence(pt.tune_reading(tune))) + "\n")
