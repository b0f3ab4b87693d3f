"""Where the repository's own files are: the package runs from its checkout (an editable install), so the
config tree, the bundled data and the output folders are found relative to it, here and nowhere else."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
DATA_DIR = ROOT / "data"
PAPER_DIR = ROOT / "paper"


@lru_cache(maxsize=None)
def conf_file(relative: str):
    """A file of conf/ as an OmegaConf node (read once per process), e.g. `conf_file("controller/default.yaml")`."""
    from omegaconf import OmegaConf

    return OmegaConf.load(CONF_DIR / relative)
