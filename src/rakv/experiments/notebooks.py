"""The analysis notebooks' shared set-up, and their headless execution (nbclient).

Every notebook starts with one parameters cell (`PROFILE`, `RESULTS`) and one call of `setup`, which
resolves where a profile's results, figures and LaTeX fragments live:

    results/<name>/            what the pipeline measured (read)
    figures/<name>/            PNG + PDF figures (written)
    paper/generated/<name>/    macros.tex and tables for the paper (written)

where <name> is the results folder's name: the profile's name unless `results_dir` was overridden.
So one profile's outputs are never overwritten by another's. Opened without results of one's own, a notebook
reads the shipped reference run, data/reference/<profile>/, laid out as a results folder (its figures and LaTeX
are the ones committed under figures/<profile>/ and paper/generated/<profile>/), and says so in its first output.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pandas as pd
from jupyter_client import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from rakv.experiments.metadata import run_metadata_if_any
from rakv.runtime.errors import RakvError
from rakv.runtime.paths import ROOT, shown
from rakv.runtime.run_layout import RunLayout

NOTEBOOK_DIR = ROOT / "notebooks"


@dataclass(frozen=True)
class NotebookContext:
    profile: str
    layout: RunLayout  # the results folder read, and where its figures and LaTeX go
    runs: pd.DataFrame

    @property
    def results(self) -> Path:
        return self.layout.root

    @property
    def figures(self) -> Path:
        return self.layout.figures

    @property
    def generated(self) -> Path:
        return self.layout.generated


def study_of(results: Path) -> Path:
    return RunLayout.of(results).study.runs


def results_to_read(profile: str, results: str | Path | None = None) -> tuple[Path, str]:
    """Which results folder a notebook reads, and the sentence that says which: the one given; else this
    checkout's own results/<profile>/; else the shipped reference run of the profile."""
    own, reference = RunLayout.own(profile).root, RunLayout.reference(profile).root
    if results is not None:
        if not study_of(results).exists():
            raise SystemExit(f"No results in {shown(results)} ({study_of(results)} is missing). Produce them with "
                             f"`./reproduce.sh profile={profile}` (results_dir={shown(results)}).")
        return Path(results), f"Reading {shown(results)}."
    if study_of(own).exists():
        return own, (f"Reading your own run, {shown(own)}/ (the shipped reference run is {shown(reference)}/; "
                     f"`scripts/compare_runs.py {shown(reference)} {shown(own)}` compares them).")
    if study_of(reference).exists():
        return reference, (f"Reading the shipped reference run, {shown(reference)}/: there is no {shown(own)}/ of "
                           f"your own yet. `./reproduce.sh profile={profile}` measures one, and the notebooks then "
                           "read it instead.")
    present = [run.name for run in RunLayout.own_runs()]
    hint = f" Results present for: {', '.join(present)} (set PROFILE to one of them)." if present else ""
    raise SystemExit(f"No results for profile '{profile}' ({study_of(own)} is missing, and no reference run ships "
                     f"for it). Produce them with `./reproduce.sh profile={profile}`.{hint}")


def provenance(results: Path) -> str:
    """Where and from which commit a results folder's study was measured (its metadata.json)."""
    meta = run_metadata_if_any(RunLayout.of(results))
    if meta is None:
        return "no metadata.json beside its runs"
    hardware = meta.hardware
    isa = f", {hardware.isa}" if hardware.isa else ""
    return (f"measured on {hardware.processor} ({hardware.device}{isa}, "
            f"{hardware.threads or 'GPU'} threads), commit {meta.short_commit}")


def setup(profile: str = "offline", results: str | None = None, figures: str | None = None,
          generated: str | None = None, quiet: bool = False) -> NotebookContext:
    """Paths of one profile's outputs, its study runs and the figure style; says which run it reads."""
    from rakv.experiments import figures as figure_module

    folder, sentence = results_to_read(profile, results)
    layout = RunLayout.of(folder, figures, generated)
    if not quiet:
        print(f"{sentence} Its study was {provenance(layout.root)}.", flush=True)
    figure_module.style()
    return NotebookContext(profile, layout, pd.read_parquet(layout.study.runs))


def show(paths: list[Path]) -> None:
    """Display the PNG of a figure that `rakv.experiments.figures` wrote (it returns [png, pdf])."""
    from IPython.display import Image, display

    display(Image(filename=str(paths[0])))


def execute(notebook: Path, params: dict, out_path: Path, timeout: int = 1200) -> None:
    """Run `notebook` top to bottom with `params` injected after its `parameters` cell; save the executed copy."""
    nb = nbformat.read(notebook, as_version=4)
    index = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), -1)
    injected = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in params.items()),
                                         metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, injected)
    with tempfile.TemporaryDirectory(prefix="rakv-kernel-") as sockets:
        # a local kernel over unix sockets: no TCP ports opened on the machine
        manager = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel"))
        client = NotebookClient(nb, km=manager, timeout=timeout, kernel_name="python3", shutdown_kernel="immediate",
                                resources={"metadata": {"path": str(notebook.parent)}})
        _execute_or_explain(client, nb, notebook, out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_path)


def _execute_or_explain(client, nb, notebook: Path, out_path: Path) -> None:
    try:
        # the kernel's own log lines (start-up and shut-down chatter) are not the user's business; a failing
        # cell still surfaces as CellExecutionError with its message
        client.execute(stderr=subprocess.DEVNULL)
    except CellExecutionError as exc:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_path)
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise RakvError(f"notebook {notebook.name} failed: {last} (executed copy: {out_path})") from None


def run_all(profile: str, layout: RunLayout, progress=None) -> RunLayout:
    """Execute every analysis notebook on the results folder `layout`, writing figures and LaTeX where it says."""
    notebooks = sorted(NOTEBOOK_DIR.glob("[0-9]*.ipynb"))
    for notebook in notebooks:
        target = layout.executed_notebook(notebook.name)
        execute(notebook, {"PROFILE": profile, "RESULTS": str(layout.root), "FIGURES": str(layout.figures),
                           "GENERATED": str(layout.generated)}, target)
        print(f"analysis: executed {notebook.name} -> {target}", flush=True)
        if progress is not None:
            progress.update(1)
    return layout
