"""The shipped reference run cannot drift from the code: today's analysis, run on the raw tables in
data/reference/offline/, gives exactly the shipped summary.json, the generated LaTeX under paper/generated/offline/
and the README's claims table. A change to the analysis or the report therefore regenerates them in the same
commit:

    ./reproduce.sh stages=analysis,paper results_dir=data/reference/offline
"""

import json
import math

import pandas as pd
import pytest

from rakv.experiments import ablation, analysis, enginecompare, formatting, latex, readme_writer
from rakv.experiments.figures import FIGURES, SAMPLING_FIGURES
from rakv.experiments.metadata import read_run_metadata
from rakv.experiments.summary import Summary, read_summary
from rakv.runtime.paths import ROOT
from rakv.runtime.run_layout import RunLayout

LAYOUT = RunLayout.reference("offline")
REFERENCE = LAYOUT.root
GENERATED = LAYOUT.generated
BEFORE_ENGINES = [RunLayout.reference(name).root for name in ("offline-fast-kernels", "offline-skinny-kernels")]
REGENERATE = "regenerate with ./reproduce.sh stages=analysis,paper results_dir=data/reference/offline"


def differences(shipped, recomputed, where: str = "") -> list[str]:
    """Where two JSON values differ: floats within 1e-9 relative (summation order), everything else exactly."""
    if isinstance(shipped, dict) and isinstance(recomputed, dict):
        out = [f"{where}.{key}: only in {'summary.json' if key in shipped else 'the recomputed summary'}"
               for key in sorted(set(shipped) ^ set(recomputed))]
        for key in sorted(set(shipped) & set(recomputed)):
            out += differences(shipped[key], recomputed[key], f"{where}.{key}" if where else key)
        return out
    if isinstance(shipped, list) and isinstance(recomputed, list):
        if len(shipped) != len(recomputed):
            return [f"{where}: {len(shipped)} items shipped, {len(recomputed)} recomputed"]
        return [d for i, (a, b) in enumerate(zip(shipped, recomputed)) for d in differences(a, b, f"{where}[{i}]")]
    numbers = (int, float)
    if (isinstance(shipped, numbers) and isinstance(recomputed, numbers) and not isinstance(shipped, bool)
            and not isinstance(recomputed, bool)):
        return [] if math.isclose(shipped, recomputed, rel_tol=1e-9, abs_tol=1e-12) else [
            f"{where}: shipped {shipped!r}, recomputed {recomputed!r}"]
    return [] if shipped == recomputed else [f"{where}: shipped {shipped!r}, recomputed {recomputed!r}"]


@pytest.fixture(scope="module")
def recomputed() -> Summary:
    assert LAYOUT.study.runs.exists(), f"the reference run is missing from {REFERENCE}"
    return analysis.summarize(REFERENCE)


@pytest.fixture(scope="module")
def shipped() -> Summary:
    return read_summary(REFERENCE)


@pytest.mark.heavy
def test_the_shipped_summary_is_what_todays_analysis_computes_from_the_shipped_tables(recomputed):
    found = differences(json.loads(LAYOUT.summary.read_text()), recomputed.to_json())
    assert not found, f"{len(found)} difference(s), first: {found[:5]}; {REGENERATE}"


@pytest.fixture(scope="module")
def ablations() -> pd.DataFrame:
    return ablation.study_ablations(REFERENCE)


@pytest.mark.heavy
def test_the_shipped_latex_is_what_todays_report_writes(recomputed, ablations, tmp_path):
    written = latex.write_generated(recomputed, REFERENCE, tmp_path)
    written.append(latex.write_ablation(ablations, tmp_path))
    written += enginecompare.write_engine_comparison(BEFORE_ENGINES, REFERENCE, tmp_path)
    stale = [path.name for path in written if not (GENERATED / path.name).exists()
             or (GENERATED / path.name).read_text() != path.read_text()]
    assert not stale, f"paper/generated/offline/ differs from today's report in {stale}; {REGENERATE}"


def test_the_shipped_ablation_csv_is_todays_replay(ablations):
    assert LAYOUT.ablation.read_text() == ablations.to_csv(index=False), REGENERATE


def generated_text() -> str:
    """README.md and docs/results.md, the files whose generated blocks the analysis stage refreshes."""
    return "\n".join((ROOT / name).read_text() for name in readme_writer.GENERATED_DOCS)


def block(text: str, name: str) -> str:
    assert text.count(f"<!-- {name} -->") == 1, f"expected one <!-- {name} --> in README.md and docs/results.md"
    return text.split(f"<!-- {name} -->")[1].split(f"<!-- /{name} -->")[0]


def test_the_claims_table_is_the_reference_runs(shipped):
    table = block((ROOT / "docs" / "results.md").read_text(), "claims").removeprefix("\n")
    assert table == readme_writer.claims_markdown(shipped), f"docs/results.md's claims table is stale; {REGENERATE}"
    rows, _ = formatting.headline_claims(shipped)  # pooled over the shipped runs of the commit where there are several
    assert len(table.splitlines()) == 2 + len(rows) > 2


def test_the_readmes_generated_blocks_are_the_reference_runs(shipped):
    """The bottom line, the map with its times and the serving goals stand between markers and equal what today's
    code writes from the shipped run."""
    blocks, _ = readme_writer.generated_blocks(shipped, REFERENCE)
    text = generated_text()
    for name, body in blocks.items():
        assert block(text, name).removeprefix("\n") == body, f"the {name} block is stale; {REGENERATE}"
    assert "faster" in blocks["bottom-line"] or "slower" in blocks["bottom-line"] or "not distinguishable" in \
        blocks["bottom-line"]


def test_the_readme_sizes_and_times_are_the_reference_runs():
    """Every size and time the README and docs/results.md quote for the reference run stands between markers and
    equals what its files give (tracked bytes, stage_times.tsv, stage_rss.tsv)."""
    text = generated_text()
    facts = readme_writer.readme_facts(REFERENCE)
    for name, value in facts.items():
        shown = [part.split(f"<!-- /{name} -->")[0] for part in text.split(f"<!-- {name} -->")[1:]]
        assert shown, f"no <!-- {name} --> in README.md or docs/results.md"
        assert set(shown) == {value}, f"the {name} is {shown!r}, the shipped files give {value!r}; {REGENERATE}"
    assert facts["reference-raw-mb"] != "0.0 MB" and facts["reference-total-min"] != "0.0 min"
    assert facts["reference-peak-memory"] != "not recorded"


def test_the_readme_is_short_and_says_how_to_set_up_first():
    """README.md at most 150 lines, its prerequisites and set-up within its first 40 (issue 60)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    head = "\n".join(lines[:40])
    for needed in ("Prerequisites", "Python >= 3.11", "C++ compiler", "download.pytorch.org/whl/cpu",
                   "./reproduce.sh", "./scripts/test.sh", "reference-peak-memory"):
        assert needed in head, needed


def test_the_reference_run_ships_its_raw_tables_and_outputs_and_nothing_else():
    for path in (LAYOUT.study.runs, LAYOUT.study.metadata, LAYOUT.study.plan, LAYOUT.summary, LAYOUT.stage_times,
                 LAYOUT.feasibility_summary, LAYOUT.sensitivity_table("crossover"),
                 LAYOUT.sensitivity_table("controlled")):
        assert path.exists(), path
    assert LAYOUT.calibrations(), "no calibration shipped"
    runs = pd.read_parquet(LAYOUT.study.runs)
    meta = read_run_metadata(LAYOUT)
    assert len(runs) == meta.runs and runs.equal_to_ar.all()
    assert not meta.git_commit.endswith("-dirty"), "the reference run was measured from uncommitted code"
    shipped = FIGURES + (SAMPLING_FIGURES if LAYOUT.sampling_table("runs").exists() else ())
    for name in shipped:
        for suffix in ("png", "pdf"):
            assert (LAYOUT.figures / f"{name}.{suffix}").exists(), f"{name}.{suffix}"
    assert LAYOUT.pdf.exists()
    # what ships: the executed notebooks an analysis leaves beside the tables are git-ignored (.gitignore), not shipped
    size = sum(p.stat().st_size for p in REFERENCE.rglob("*") if p.is_file() and "notebooks" not in p.parts)
    assert size < 8 * 2**20, f"the reference run has grown to {size / 2**20:.1f} MiB"
