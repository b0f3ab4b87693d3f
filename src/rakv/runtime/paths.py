"""Where the repository's own files are: the package runs from its checkout (an editable install), so the
config tree, the bundled data and the output folders are found relative to it, here and nowhere else."""

from __future__ import annotations

from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # src/rakv/runtime/paths.py -> the repository
CONF_DIR = ROOT / "conf"
DATA_DIR = ROOT / "data"
PAPER_DIR = ROOT / "paper"
# The shipped reference run: raw tables of one full run per profile (data/reference/<profile>/), laid out as a
# results folder; ./reproduce.sh writes results/<profile>/ and never this folder (README: "A reviewer's first minute").
REFERENCE_DIR = DATA_DIR / "reference"


def shown(path: Path) -> str:
    """A path as a reader of this checkout would type it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@cache
def conf_file(relative: str):
    """A file of conf/ as an OmegaConf node (read once per process), e.g. `conf_file("controller/default.yaml")`."""
    from omegaconf import OmegaConf

    return OmegaConf.load(CONF_DIR / relative)
