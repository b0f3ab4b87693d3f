"""Headless execution of the analysis notebooks (nbclient), parameterised by results path."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from rakv.errors import RakvError

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"


def execute(notebook: Path, params: dict, out_path: Path, timeout: int = 1200) -> None:
    """Run `notebook` top to bottom with `params` injected after its `parameters` cell; save the executed copy."""
    nb = nbformat.read(notebook, as_version=4)
    index = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), -1)
    injected = nbformat.v4.new_code_cell("\n".join(f"{k} = {str(v)!r}" for k, v in params.items()),
                                         metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, injected)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.parent)}})
    try:
        client.execute()
    except CellExecutionError as exc:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_path)
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise RakvError(f"notebook {notebook.name} failed: {last} (executed copy: {out_path})") from None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_path)


def run_all(results: Path, figures: Path, generated: Path) -> list[Path]:
    out = []
    for notebook in sorted(NOTEBOOK_DIR.glob("[0-9]*.ipynb")):
        target = Path(results) / "notebooks" / notebook.name
        execute(notebook, {"RESULTS": str(results), "FIGURES": str(figures), "GENERATED": str(generated)}, target)
        print(f"analysis: executed {notebook.name} -> {target}", flush=True)
        out.append(target)
    return out
