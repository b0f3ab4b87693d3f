"""README.md's and docs/results.md's generated parts, each between its <!-- name --> and <!-- /name --> markers: the
bottom line, the reviewer's map with its times, the claims table, the serving study's goals, and the shipped run's
sizes, times and peak memory (tests/test_reference_run.py holds them to the shipped files; the analysis stage
rewrites them, rakv.experiments.stages).
"""

from __future__ import annotations

import re
from pathlib import Path

from rakv.experiments.formatting import claim_cells, goal_value, headline_claims, isa_label, missing, verdict_cells
from rakv.experiments.prose import goal_tally, stage_times
from rakv.experiments.summary import Summary
from rakv.runtime.paths import ROOT
from rakv.runtime.run_layout import RunLayout


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


def readme_facts(results: Path) -> dict[str, str]:
    """The README's sizes and times of a shipped run, from its files: the raw tables' and the outputs' tracked bytes
    (MB), and from its stage_times.tsv the whole run (minutes), the regeneration from the shipped tables (analysis +
    paper, seconds) and each stage's seconds; its machine; its largest stage's peak memory (stage_rss.tsv)."""
    results = Path(results).resolve()
    times = stage_times(results)
    relative = str(results.relative_to(ROOT))
    layout = RunLayout.of(results)
    outputs = [str(path.relative_to(ROOT)) for path in (layout.figures, layout.generated, layout.pdf)]
    facts = {"reference-raw-mb": f"{tracked_bytes([relative]) / 1e6:.1f} MB",
             "reference-outputs-mb": f"{tracked_bytes(outputs) / 1e6:.1f} MB",
             "reference-total-min": f"{sum(times.values()) / 60:.1f} min",
             "reference-regeneration-s": f"{times.get('analysis', 0) + times.get('paper', 0)} s",
             "reference-stage-times": ", ".join(f"{stage} {seconds:,} s" for stage, seconds in times.items()),
             "reference-machine": machine_words(results),
             "reference-peak-memory": peak_memory(results)}
    return facts


def peak_memory(results: Path) -> str:
    """The largest peak resident memory of the run's stages (stage_rss.tsv: the stage or a worker), in words."""
    path = RunLayout.of(results).stage_rss
    peaks: dict[str, int] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        fields = line.split("\t")
        if len(fields) == 2 and fields[1].isdigit():
            peaks[fields[0]] = max(peaks.get(fields[0], 0), int(fields[1]))
    if not peaks:
        return "not recorded"
    stage = max(peaks, key=peaks.get)
    return f"{peaks[stage] / 1e9:.1f} GB ({stage} stage)"


# The reviewer's map: each result of the paper, what it is, the command that regenerates it from scratch and the
# stages whose shipped wall times (stage_times.tsv) that command runs.
MAP_ROWS = (
    ("Tables of strategies, statistics, acceptance, precision; Figures 1-3", "the controller against the oracle, "
     "the cost model's error and ranking, acceptance against break-even, the regime at fp32 and at q4_1",
     "./reproduce.sh stages=calibrate,study,analysis,paper",
     ("calibrate", "study", "analysis", "paper")),
    ("speculation on top of reuse, cache budget, speedup against acceptance", "the sensitivity stage",
     "./reproduce.sh stages=sensitivity,analysis,paper", ("sensitivity", "analysis", "paper")),
    ("the larger pair's claim row and figure", "GPT-2 Large/Medium's cost side on architecture twins",
     "./reproduce.sh stages=feasibility,analysis,paper", ("feasibility", "analysis", "paper")),
    ('Section "Serving under load"', "the serving study: goals, figures",
     "./reproduce.sh stages=serving,analysis,paper", ("serving", "analysis", "paper")),
    ('Section "Sampling and workloads"', "temperatures, distribution tests, structured outputs, long contexts",
     "./reproduce.sh stages=sampling,analysis,paper", ("sampling", "analysis", "paper")),
    ("every table, figure and the PDF, from the shipped tables", "the analysis and paper stages alone",
     "./reproduce.sh stages=analysis,paper results_dir=data/reference/offline", ("analysis", "paper")),
    ("everything", "the whole pipeline", "./reproduce.sh", None),
)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def map_markdown(results: Path) -> str:
    """The reviewer's map as a Markdown table, each row's time the shipped run's stage_times.tsv sum of its stages."""
    times = stage_times(results)
    lines = ["| paper | what | command | time (shipped run) |", "|---|---|---|---|"]
    for paper, what, command, stages in MAP_ROWS:
        seconds = sum(times.values()) if stages is None else sum(times.get(stage, 0) for stage in stages)
        lines.append(f"| {paper} | {what} | `{command}` | {minutes(seconds) if times else 'not recorded'} |")
    return "\n".join(lines) + "\n"


def markdown(tex: str) -> str:
    """A generated LaTeX sentence as Markdown: \\texttt{x} as `x`, $...$ as its text, LaTeX's escapes undone."""
    text = re.sub(r"\\texttt\{([^}]*)\}", r"`\1`", tex)
    text = re.sub(r"\$([^$]*)\$", lambda m: m.group(1).replace("\\ge", ">=").replace(">", " > ").replace(
        "=", " = ").replace("  ", " "), text)
    return text.replace("\\,", " ").replace("\\%", "%").replace("\\_", "_").replace("\\ ", " ").replace("~", " ")


def bottom_line(summary: Summary, results: Path) -> str:
    """The README's bottom line in three sentences, from the paper's abstract (rakv.experiments.prose_abstract):
    against fixed Joint-k4 and KV-only, speculation against k = 0, and what sets the regime."""
    from rakv.experiments.metadata import read_run_metadata
    from rakv.experiments.prose_abstract import abstract

    sentences = re.split(r"(?<=[.?])\s+(?=[A-Z])", abstract(summary, read_run_metadata(RunLayout.of(results)),
                                                         results).strip())
    findings = [s for s in sentences if s.startswith(("Against fixed Joint-k4", "Where the reference's best"))]
    cause = [s for s in sentences if s.startswith("The engine sets the regime")]
    against_kv = next((s for s in sentences if s.startswith("Against KV-only")), "")
    first = findings[0].rstrip(".") + ("; a" + against_kv[1:] if against_kv else ".")
    return " ".join(markdown(s) for s in [first, *findings[1:], *cause]) + "\n"


def machine_words(results: Path) -> str:
    """The machine of a run in words, from its hardware record (study/metadata.json): cores, processor and the
    instruction sets that choose the kernels' path."""
    from rakv.experiments.runcompare import hardware

    machine = hardware(Path(results))
    isa = (machine.isa or None) if machine else None
    threads = machine.threads if machine else None
    cores = f"{threads}-core " if threads else ""
    vnni = " with VNNI" if "avx512_vnni" in (isa or "").split("+") else ""
    sets = {"AVX-512": f"AVX2, FMA and AVX-512{vnni}", "AVX2": "AVX2 and FMA, no AVX-512"}.get(
        isa_label(isa), "its instruction sets not recorded")
    return f"{cores}{(machine.processor if machine else None) or 'machine'} with {sets}"


GENERATED_DOCS = ("README.md", "docs/results.md")  # the files whose generated blocks refresh_readme writes


def generated_blocks(summary: Summary, results: Path | None) -> tuple[dict[str, str], dict[str, str]]:
    """Every generated block (name -> body on lines of its own) and inline fact (name -> text) of GENERATED_DOCS."""
    blocks = {"claims": claims_markdown(summary), "serving-goals": serving_goals_markdown(summary)}
    if results is not None:
        blocks |= {"map": map_markdown(results), "bottom-line": bottom_line(summary, results)}
    return blocks, (readme_facts(results) if results is not None else {})


def refresh_readme(summary: Summary, readme: Path, results: Path | None = None) -> bool:
    """Write the generated blocks and facts (`generated_blocks`) of `summary` and of the run in `results` between
    their markers, in the README and in docs/results.md beside it (each file holds the markers it names); True when
    a file changed."""
    blocks, facts = generated_blocks(summary, results)
    changed = False
    for path in (Path(readme), Path(readme).parent / "docs" / "results.md"):
        if not path.exists():
            continue
        text = path.read_text()
        updated = text
        for name, body in blocks.items():
            if f"<!-- {name} -->" in updated:
                updated = between_markers(updated, name, body)
        for name, value in facts.items():
            if f"<!-- {name} -->" in updated:
                updated = between_markers(updated, name, value, inline=True)
        if updated != text:
            path.write_text(updated)
            changed = True
    return changed
