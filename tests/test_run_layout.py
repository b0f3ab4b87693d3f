"""The run's layout has one owner (rakv.runtime.run_layout): a results folder's, a served run's and the shipped
runs' file and folder names are spelled there and nowhere else in the code, and they are the names the shipped runs
have on disk (docs/outputs.md describes the files)."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from rakv.experiments.metadata import check_shipped
from rakv.runtime.paths import REFERENCE_DIR, ROOT
from rakv.runtime.proposers import PROPOSERS
from rakv.runtime.run_layout import (
    FIGURES_DIR,
    GENERATED_DIR,
    INTERVAL_COVERAGE,
    OTHER_MACHINES_DIR,
    RESULTS_DIR,
    PeerLayout,
    RunLayout,
    ServedRunLayout,
    ServingStudyLayout,
    StudyLayout,
    split_calibration_stem,
    trace_settings,
)

LAYOUT_MODULE = ROOT / "src" / "rakv" / "runtime" / "run_layout.py"

# String constants that stay where they are although they spell a layout name, each with its reason.
EXCEPTIONS = {
    # the repository's notebook sources (notebooks/*.ipynb), not a results folder's executed copies
    ("src/rakv/experiments/notebooks.py", "notebooks"): "the notebook sources of the repository",
}
# Shell scripts keep their paths (they run before or beside Python and print the layout for a reader); each one that
# names a layout file or folder is listed here with its reason.
SHELL_SCRIPTS = {
    "reproduce.sh": "appends results/<profile>/stage_times.tsv, prints the layout at the end and compares with the "
                    "shipped run's summary.json",
    "scripts/ship_reference.sh": "copies a finished run's raw tables into data/reference/<profile>/",
    "scripts/ship_peer.sh": "copies results/peer/ into data/reference/peer/",
    "scripts/serve_fixed_trace.sh": "serves one fixed trace per configuration into folders of its own",
    "scripts/write_compare_files.sh": "writes each shipped run's compare_reference.txt",
}
PATH_CALLS = {"Path", "PurePath", "open", "glob", "rglob", "joinpath", "with_name"}
NOT_LAYOUT = {"paper", "data", "reference"}  # rakv.runtime.paths' folders, above the layout


def _paths_of(layout, depth: int = 0) -> list[Path]:
    """Every path a layout record gives without arguments (its properties; nested layouts followed), and its
    parametrised ones at sample arguments."""
    found: list[Path] = []
    for name in dir(type(layout)):
        if name.startswith("_") or not isinstance(getattr(type(layout), name), property):
            continue
        value = getattr(layout, name)
        if isinstance(value, Path):
            found.append(value)
        elif is_dataclass(value) and depth < 2:
            found += _paths_of(value, depth + 1)
    samples = {"calibration": ("pair", "draft"), "sensitivity_table": ("part",), "sampling_table": ("part",),
               "feasibility_table": ("part",), "executed_notebook": ("x.ipynb",), "batch_cost": ("conf",),
               "trace": ("family", 1.5, 0), "shard_journal": (0, 2), "lock": (0,)}
    for name, args in samples.items():
        method = getattr(type(layout), name, None)
        if callable(method) and not isinstance(method, property):
            found.append(getattr(layout, name)(*args))
    served = getattr(type(layout), "served_run", None)
    if callable(served):
        found.append(layout.served_run("family", 1.5, "policy", 0).requests)
    return found


def layout_names() -> set[str]:
    """Every file and folder name of the layouts, as a path component (a parametrised name's fixed part is not one:
    `batch_cost-<configuration>.json` is matched by its folder)."""
    root = Path("/layout-root")
    layouts = [RunLayout(root), StudyLayout(root), ServingStudyLayout(root), ServedRunLayout(root), PeerLayout(root)]
    names: set[str] = set()
    for layout in layouts:
        for path in _paths_of(layout):
            base = root if path.is_relative_to(root) else ROOT
            names.update(path.relative_to(base).parts)
    for path in (FIGURES_DIR, GENERATED_DIR, INTERVAL_COVERAGE, OTHER_MACHINES_DIR, RESULTS_DIR):
        names.update(path.relative_to(ROOT).parts)
    samples = {"pair-draft.json", "part.parquet", "x.ipynb", "batch_cost-conf.json", "family-1.5-r0.jsonl", "family",
               "1.5", "policy", "r0", "runs.shard0of2.jsonl", ".lock.shard0", "layout-root"}
    return names - samples - NOT_LAYOUT


def _constants(node) -> list[ast.Constant]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.JoinedStr):
        return [v for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return []


def path_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of the string constants used to build a path: an operand of `/`, or an argument of Path(),
    open(), .glob(), .rglob(), .joinpath(), .with_name() (an f-string's literal parts included). Docstrings, help
    texts, messages and dict keys are not path expressions, so they are not read."""
    found = []
    for node in ast.walk(ast.parse(source)):
        operands = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            operands = [node.left, node.right]
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in PATH_CALLS:
                operands = list(node.args)
        for operand in operands:
            found += [(c.lineno, c.value) for c in _constants(operand)]
    return found


def layout_spellings(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every layout name spelled as a component of a path literal in `source`."""
    return [(line, part) for line, text in path_literals(source) for part in re.split(r"/", text) if part in names]


def notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def scanned_sources() -> dict[str, str]:
    files = {p: p.read_text() for p in [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.py"))]
             if p != LAYOUT_MODULE}
    files.update({p: notebook_code(p) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))})
    return {str(p.relative_to(ROOT)): text for p, text in files.items()}


def test_the_layout_names_are_the_files_of_a_results_folder():
    names = layout_names()
    assert {"summary.json", "study", "runs.parquet", "metadata.json", "calibration", "serving", "cells.parquet",
            "requests.jsonl", "iterations.jsonl", "traces", "cells", "complete.json", "feasibility", "sensitivity",
            "sampling", "design.json", "figures", "generated", "build", "layout.json", "stage_times.tsv",
            "notebooks", "about.json", "other-machines", "interval_coverage.csv", "tune.json"} <= names


def test_a_layout_name_is_spelled_in_a_path_only_in_run_layout():
    names = layout_names()
    found = [f"{name}:{line}: {part!r}" for name, text in scanned_sources().items()
             for line, part in layout_spellings(text, names) if (name, part) not in EXCEPTIONS]
    assert not found, ("results-folder paths built outside rakv.runtime.run_layout (use RunLayout, StudyLayout, "
                       "ServingStudyLayout, ServedRunLayout or PeerLayout):\n" + "\n".join(found))


def test_each_exception_still_applies():
    names, sources = layout_names(), scanned_sources()
    stale = [key for key in EXCEPTIONS
             if key[1] not in {part for _, part in layout_spellings(sources.get(key[0], ""), names)}]
    assert not stale, f"exceptions no longer needed: {stale}"


def test_the_scan_finds_a_planted_path_and_not_a_key_or_a_docstring():
    names = layout_names()
    planted = '''
def f(results, cfg):
    """Reads results/<name>/study/runs.parquet."""
    a = Path(results) / "study" / "runs.parquet"
    b = open(f"{results}/summary.json")
    c = sorted(Path(results).glob("calibration/*.json"))
    d = {"study": 1, "serving": cfg["serving"]}
    print("study/metadata.json is missing")
    return a, b, c, d
'''
    spelled = layout_spellings(planted, names)
    assert sorted(part for _, part in spelled) == ["calibration", "runs.parquet", "study", "summary.json"]


def test_every_shell_script_that_names_the_layout_is_listed():
    names = layout_names() - {"build", "generated", "cells", "figures", "notebooks", "results"}  # common words
    scripts = [ROOT / "reproduce.sh", *sorted((ROOT / "scripts").glob("*.sh"))]
    naming = {str(p.relative_to(ROOT)) for p in scripts
              if any(re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", p.read_text()) for n in names if "." in n)}
    listed = set(SHELL_SCRIPTS)
    assert naming == listed, (f"shell scripts naming the layout, unlisted: {sorted(naming - listed)}; "
                              f"listed but naming none: {sorted(listed - naming)}")


# --- the layout against the shipped runs -----------------------------------------------------------------------------

def _split_calibration(stem: str) -> tuple[str, str, str]:
    name, precision = split_calibration_stem(stem)
    proposer = next(p for p in sorted(PROPOSERS, key=len, reverse=True) if name.endswith(f"-{p}"))
    return name[: -len(proposer) - 1], proposer, precision


def run_paths(layout: RunLayout, files: list[Path]) -> set[Path]:
    """What the layout spells for the files of a shipped results folder: its fixed paths, and each parametrised one
    at the arguments read off the file's name."""
    spelled = set(_paths_of(layout))
    for path in files:
        folder = path.parent
        if folder == layout.calibration_dir:
            spelled.add(layout.calibration(*_split_calibration(path.stem)))
        elif folder == layout.sensitivity_dir:
            spelled.add(layout.sensitivity_table(path.stem))
        elif folder == layout.sampling_dir:
            spelled.add(layout.sampling_table(path.stem))
        elif folder == layout.feasibility_dir:
            spelled.add(layout.feasibility_table(path.stem))
        elif folder == layout.notebooks:
            spelled.add(layout.executed_notebook(path.name))
        elif folder == layout.serving.root and path.name.startswith("batch_cost-"):
            spelled.add(layout.serving.batch_cost(path.stem.removeprefix("batch_cost-")))
        elif folder == layout.serving.traces:
            found = re.fullmatch(r"(?P<family>.+)-(?P<rate>[0-9.]+)-r(?P<repeat>\d+)\.jsonl(\.meta\.json)?", path.name)
            assert found, path
            trace = layout.serving.trace(found["family"], float(found["rate"]), int(found["repeat"]))
            spelled |= {trace, trace_settings(trace)}
    return spelled


SHIPPED_RUNS = sorted(p for p in [*REFERENCE_DIR.glob("offline*"), *OTHER_MACHINES_DIR.glob("*")] if p.is_dir())


@pytest.mark.parametrize("folder", SHIPPED_RUNS, ids=lambda p: str(p.relative_to(REFERENCE_DIR)))
def test_every_file_of_a_shipped_run_is_a_layout_path(folder):
    layout = RunLayout.reference(str(folder.relative_to(REFERENCE_DIR)))
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".")]
    spelled = run_paths(layout, files)
    strays = [str(p.relative_to(folder)) for p in files if p not in spelled]
    assert not strays, f"files of {folder.relative_to(ROOT)} the layout does not spell: {strays}"
    assert layout.summary.exists() and layout.calibrations()


def test_the_shipped_pilots_and_peer_are_layout_paths():
    for pilot in sorted(REFERENCE_DIR.glob("serving-pilot*")):
        serving = ServingStudyLayout(pilot)
        spelled = {serving.cells, serving.requests, serving.plan, pilot / "README.md"}  # a pilot's notes beside it
        assert {p for p in pilot.iterdir() if p.is_file()} <= spelled, pilot
    peer = PeerLayout.shipped()
    assert peer.vllm_serve_summary.exists() and peer.tune.exists() and any(peer.bench_serving_dir.glob("*.json"))


def test_every_shipped_metadata_file_reads_through_its_record():
    errors = [error for folder in SHIPPED_RUNS for error in check_shipped(RunLayout.of(folder))]
    assert not errors, "\n".join(errors)


def test_a_layout_is_its_folder_and_the_figures_follow_its_name(tmp_path):
    layout = RunLayout.of(tmp_path / "smoke")
    assert layout.figures == FIGURES_DIR / "smoke" and layout.generated == GENERATED_DIR / "smoke"
    moved = RunLayout.of(tmp_path / "smoke", tmp_path / "f", tmp_path / "g")
    assert (moved.figures, moved.generated) == (tmp_path / "f", tmp_path / "g")
    assert RunLayout.of(layout) is layout and not layout.shipped and RunLayout.reference("offline").shipped
    assert [f.name for f in fields(RunLayout)] == ["root", "figures_dir", "generated_dir"]
