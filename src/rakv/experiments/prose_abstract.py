"""The paper's abstract: one template of at most ABSTRACT_WORDS words whose slots are filled from the run.

The template says, in order, the question, the setting and what it substitutes (the machine's cores, the target, the
int8 self-draft, prompt lookup), three findings each beside the reference's figure (RAKV-ASD against fixed Joint-k4,
against KV-only, and speculation against k = 0), and what decides the regime: verify(k + 1) / step and draft / step
on the engine at hand, with the same profile's runs on the artifact's earlier engines (conf/profile:
profile.before_engines) beside today's. Every comparative word is read from a confidence interval's side
(rakv.experiments.verdicts.ci_side), never written in the template; the enumerations the abstract once held are in
the paper's sections and appendix tables.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rakv.experiments.claims import REFERENCE
from rakv.experiments.formatting import missing, num, pct, tex_escape
from rakv.experiments.metadata import RunMetadata
from rakv.experiments.prose import claim_of
from rakv.experiments.replication import pooled_summary
from rakv.experiments.summary import Summary
from rakv.experiments.verdicts import Side, ci_side
from rakv.runtime.actions import JOINT_K4
from rakv.runtime.paths import ROOT, conf_file
from rakv.runtime.run_layout import RunLayout

ABSTRACT_WORDS = 250  # the most words the abstract may have (issue 60: a reader finds the findings)
VERIFY_K = 4  # the k whose verify(k + 1) the abstract prices (the reference's fixed Joint-k4 speculates k = 4)


def words(tex: str) -> int:
    """Words of a LaTeX paragraph as a reader counts them: commands, braces and math markers dropped, a number with
    its unit or an interval's bracket one word."""
    text = re.sub(r"\\[a-zA-Z]+\*?", " ", tex)
    text = re.sub(r"[{}$\\]", " ", text)
    return len([w for w in text.split() if re.search(r"[A-Za-z0-9]", w)])


def versus(triple, better: str = "faster", worse: str = "slower", interval: bool = True) -> str:
    """A latency reduction (positive: RAKV-ASD or the first strategy is better) in a word from its CI's side, with
    the number and the CI turned the same way as the word (without the CI: `interval=False`)."""
    value, low, high = triple
    if missing(value):
        return "not compared"
    if missing(low):
        return f"{pct(value)} (no interval)"
    side = ci_side(triple, 0.0, point_if_no_interval=False)
    if side == Side.ABOVE:
        return f"{pct(value)} {better}" + (f" [{pct(low)}, {pct(high)}]" if interval else "")
    if side == Side.BELOW:
        return f"{pct(-value)} {worse}" + (f" [{pct(-high)}, {pct(-low)}]" if interval else "")
    return "not distinguishable" + (f" ({pct(value)} [{pct(low)}, {pct(high)}])" if interval else "")


def precisions_part(summary: Summary) -> str:
    """' at fp32 and at q4_1 (the shipped 4-bit file)' where the run measured the target at several
    precisions, '' where at one."""
    from rakv.experiments.config import configuration
    from rakv.runtime.models import PRECISIONS

    seen = {configuration(name).precision for name in summary.configurations}
    if len(seen) < 2:
        return ""
    named = " and at ".join(tex_escape(p) for p in PRECISIONS if p in seen)
    return f" at {named} (the shipped 4-bit file)" if "q4_1" in seen else f" at {named}"


def grouped(parts: list[tuple[str, object]]) -> str:
    """Latency reductions of several configurations, those with the same word from their CI's side together:
    'faster on a (x) and b (y), and not distinguishable on c', each with its point estimate where its CI lies on one
    side of 0 (the intervals are in the paper's claims and precision tables; a part whose reduction is missing says
    'not measured'). Groups keep the order in which their first configuration comes."""
    groups: dict[str, list[str]] = {}
    for name, triple in parts:
        label = f"\\texttt{{{tex_escape(name)}}}"
        if triple is None or missing(triple[0]):
            groups.setdefault("not measured on", []).append(label)
            continue
        value, low, high = triple
        if missing(low):
            groups.setdefault("without an interval on", []).append(f"{label} ({pct(value)})")
            continue
        side = ci_side(triple, 0.0, point_if_no_interval=False)
        if side == Side.ABOVE:
            groups.setdefault("faster on", []).append(f"{label} ({pct(value)})")
        elif side == Side.BELOW:
            groups.setdefault("slower on", []).append(f"{label} ({pct(-value)})")
        else:  # no point estimate: a number beside "not distinguishable" reads as a direction
            groups.setdefault("not distinguishable on", []).append(label)
    return ", and ".join(f"{word} {' and '.join(items)}" for word, items in groups.items())


def across(summary: Summary, statistic) -> str:
    """One latency reduction on every configuration, grouped by the word its CI's side gives (grouped)."""
    return grouped([(name, statistic(s)) for name, s in summary.per_configuration.items()])


def regime_part(summary: Summary) -> str:
    """The best k > 0 against the best k = 0 over all scenarios on every configuration (the regime claim rows; the
    claim's statistic is a latency change of speculation, so its sign is turned to read as a reduction)."""
    parts = []
    for name in summary.per_configuration:
        row = claim_of(summary, "spec_regime", name)
        if row is None or missing(row.reproduced.value):
            parts.append((name, None))
            continue
        value, low, high = row.reproduced
        parts.append((name, (-value, None if missing(high) else -high, None if missing(low) else -low)))
    return grouped(parts)


def before_engines(meta: RunMetadata) -> list[Path]:
    """The same profile's runs on the artifact's earlier engines, oldest first (conf/profile: before_engines), those
    shipped; [] for a profile that names none."""
    path = Path("profile") / f"{meta.profile_name}.yaml"
    if not (ROOT / "conf" / path).exists():
        return []
    names = conf_file(str(path)).get("profile", {}).get("before_engines", []) or []
    return [ROOT / n for n in names if RunLayout.of(ROOT / n).summary.exists()]


def engine_prices(folder: Path, configuration: str) -> tuple[float, float | None, float | None] | None:
    """verify(VERIFY_K + 1) / step and draft / step of one run's configuration (rakv.experiments.enginecompare's
    reading of its calibration), and the share of its RAKV-ASD runs that speculated; None without them."""
    from rakv.experiments.enginecompare import engine_rows

    row = next((r for r in engine_rows(folder) if r["configuration"] == configuration), None)
    if row is None or VERIFY_K not in row["verify_over_step"]:
        return None
    draft = None if row["draft_step_ms"] is None else row["draft_step_ms"] / row["target_step_ms"]
    return row["verify_over_step"][VERIFY_K], draft, row["controller_speculates"]


def joint_k4_of(folder: Path, configuration: str):
    """RAKV-ASD's latency reduction against Joint-k4 in a run's summary.json, read as JSON (an earlier engine's
    summary predates today's record), None where absent."""
    data = json.loads(RunLayout.of(folder).summary.read_text())
    reductions = data.get("per_configuration", {}).get(configuration, {}).get("latency_reduction", {})
    triple = reductions.get(JOINT_K4, reductions.get(JOINT_K4.replace("-", "_")))
    return tuple(triple) if triple else None


def direction_word(triple) -> str:
    """RAKV-ASD against Joint-k4 read against the reference's sign (it reported lower latency)."""
    side = ci_side(triple, 0.0, point_if_no_interval=False)
    return {Side.ABOVE: "the reference's direction", Side.BELOW: "the reverse of the reference's"}.get(
        side, "no direction")


def cause_part(summary: Summary, results: Path, befores: list[Path]) -> str:
    """What decides the regime: today's prices of every configuration with a draft (each precision's) beside each
    earlier engine's, and what the earlier engines' studies found against Joint-k4 (each word from its CI)."""
    from rakv.experiments.config import configuration

    # a configuration of several proposers prices its draft as its single-proposer configuration does
    drafted = [(n, engine_prices(results, n)) for n in summary.per_configuration
               if not configuration(n).chooses_proposer]
    drafted = [(n, p) for n, p in drafted if p is not None and p[1] is not None]
    if not drafted:
        return ""
    prices = [f"{num(v, 2)} and {num(d, 2)}" + (" target steps" if i == 0 else "")
              + (f" on \\texttt{{{tex_escape(n)}}}" if len(drafted) > 1 else "")
              for i, (n, (v, d, _)) in enumerate(drafted)]
    shares = " and ".join(pct(s, 0) for _, (_, _, s) in drafted)
    text = (f"The engine sets the regime: verifying {VERIFY_K + 1} tokens and a draft step cost {', '.join(prices)}, "
            f"where RAKV-ASD speculates in {shares} of its runs")
    first = drafted[0][0]
    earlier = [(engine_prices(f, first), joint_k4_of(f, first)) for f in befores]
    earlier = [(p, t) for p, t in earlier if p is not None and t is not None]
    if not earlier:
        return text + "."
    before = "; ".join(f"{num(v, 2)} and {num(d, 2)}" for (v, d, _), _ in earlier)
    shares = " and ".join(pct(s, 0) for (_, _, s), _ in earlier)
    results_ = " and ".join(versus(t, interval=False) for _, t in earlier)
    directions = sorted({direction_word(t) for _, t in earlier})
    return (text + f"; the artifact's earlier engines ({before} on \\texttt{{{tex_escape(first)}}}) speculated in "
            f"{shares} and were {results_} than Joint-k4: {' and '.join(directions)}.")


def reference_proposers(summary: Summary) -> tuple[Summary, str]:
    """The summary restricted to the configurations of one proposer of the kinds the reference question is about
    (a draft, prompt lookup), and the clause that points to the others (the learned heads, the proposer chosen per
    request: the paper's "Three proposer families"), '' without them: the abstract keeps its word limit."""
    from dataclasses import replace

    from rakv.experiments.config import configuration

    kept = [n for n in summary.configurations
            if not configuration(n).chooses_proposer and not configuration(n).proposer_type.needs_target_hidden]
    if len(kept) == len(summary.configurations):
        return summary, ""
    return (replace(summary, configurations=kept, per_configuration={n: summary.per_configuration[n] for n in kept}),
            " (learned heads: Section~\\ref{sec:proposers})")


def abstract(summary: Summary, meta: RunMetadata, results: Path) -> str:
    """The abstract (pooled over the shipped runs of this commit and machine class where there are several)."""
    summary, later = reference_proposers(pooled_summary(summary))
    hardware = meta.hardware
    cores = f"{hardware.cores}-core " if isinstance(hardware.cores, int) else ""
    ref = REFERENCE
    text = [
        "Does a cost model measured on the machine, choosing per request whether to reuse a cached prompt prefix and "
        "how many tokens to speculate ($k \\ge 0$), beat fixed policies, as a reference study found with GPT-2 on a "
        "laptop GPU?",
        f"We reproduce it offline on a {cores}{tex_escape(hardware.processor)} {tex_escape(hardware.device.upper())} "
        f"with SmolLM2-135M as the target{precisions_part(summary)}, its int8 copy as self-draft and prompt "
        f"lookup as proposers{later}: {summary.runs} timed requests, "
        f"{summary.exact.equal}/{summary.exact.total} identical to greedy decoding.",
        f"Against fixed Joint-k4 (the reference: {pct(ref['latency_reduction_vs_joint_k4'])} lower latency), RAKV-ASD "
        "is " + across(summary, lambda s: s.latency_reduction.joint_k4) + ".",
        f"Against KV-only (the reference: within {pct(ref['latency_reduction_vs_kv_only'], 2)}), it is "
        + across(summary, lambda s: s.latency_reduction.kv_only) + ".",
        f"Where the reference's best $k>0$ was {pct(ref['spec_slowdown_min'], 0)} to "
        f"{pct(ref['spec_slowdown_max'], 0)} slower than $k=0$ in every scenario, here it is "
        + regime_part(summary) + " (each word from a 95\\,\\% CI over prompts).",
    ]
    cause = cause_part(summary, results, before_engines(meta))
    if cause:
        text.append(cause)
    return " ".join(text) + "\n"
