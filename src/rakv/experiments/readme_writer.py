"""README.md's generated parts, each between its <!-- name --> and <!-- /name --> markers: the claims table, the
serving study's goals, and the shipped run's sizes and times (tests/test_reference_run.py holds them to the shipped
files; the paper stage rewrites them, rakv.experiments.stages).
"""

from __future__ import annotations

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


BATCH_ONE_STAGES = ("calibrate", "study", "sensitivity", "feasibility", "analysis", "paper")


def readme_facts(results: Path) -> dict[str, str]:
    """The README's sizes and times of a shipped run, from its files: the raw tables' and the outputs' tracked bytes
    (MB), and from its stage_times.tsv the whole run, the batch-one stages, the serving and sampling stages
    (minutes), the regeneration from the shipped tables (analysis + paper, seconds) and each stage's seconds."""
    results = Path(results).resolve()
    times = stage_times(results)
    relative = str(results.relative_to(ROOT))
    layout = RunLayout.of(results)
    outputs = [str(path.relative_to(ROOT)) for path in (layout.figures, layout.generated, layout.pdf)]
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

    machine = hardware(Path(results))
    isa = (machine.isa or None) if machine else None
    threads = machine.threads if machine else None
    cores = f"{threads}-core " if threads else ""
    vnni = " with VNNI" if "avx512_vnni" in (isa or "").split("+") else ""
    sets = {"AVX-512": f"AVX2, FMA and AVX-512{vnni}", "AVX2": "AVX2 and FMA, no AVX-512"}.get(
        isa_label(isa), "its instruction sets not recorded")
    return f"{cores}{(machine.processor if machine else None) or 'machine'} with {sets}"


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
