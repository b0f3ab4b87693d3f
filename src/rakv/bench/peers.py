"""The vLLM peer's rakv side (docs/peers.md): output agreement, the job files scripts/vllm_peer.py runs in the
peer's own venv (vLLM pins another transformers: the two engines meet in JSON files), and scripts/tune_vllm.py's
step model and speculation schedule.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from rakv.bench.peer_reports import SpeculativeConfig, StepModel, StepPoint
from rakv.runtime.costmodel import tokens_per_round
from rakv.runtime.json_records import load_record, to_json
from rakv.runtime.paths import ROOT
from rakv.serving.policies import most_goodput

PEER_SCRIPT = ROOT / "scripts" / "vllm_peer.py"


def agreement(ours: Mapping, theirs: Mapping, tokens: Callable = list) -> tuple[int, list[str]]:
    """How many of `ours`' outputs equal `theirs` (same key), and where each other one first diverges: the index of
    the first differing token of `tokens(output)` (outputs that are texts: a tokenizer's encode)."""
    equal, divergences = 0, []
    for key, output in ours.items():
        other = theirs[key]
        if output == other:
            equal += 1
            continue
        a, b = tokens(output), tokens(other)
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        divergences.append(f"{key} at token {at}")
    return equal, divergences


def run_peer_job(job, result_type: type, python: Path, env: dict | None = None) -> tuple[object | None, str]:
    """scripts/vllm_peer.py on `job` (a record of rakv.bench.peer_reports) by the peer venv's `python`: its answer as
    a `result_type` record, or None; and its stderr."""
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "job.json").write_text(json.dumps(to_json(job)))
        done = subprocess.run([str(python), str(PEER_SCRIPT), f"{folder}/job.json", f"{folder}/result.json"],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            return None, done.stderr
        answer = json.loads(Path(folder, "result.json").read_text())
        return load_record(result_type, answer, "scripts/vllm_peer.py's result"), done.stderr


def fit(steps: list[StepPoint]) -> np.ndarray:
    """(fixed, per request, per row) seconds of one vLLM step, NNLS over the measured (b, k) points."""
    design = np.array([[1.0, s.b, s.b + s.draft_rows_per_step] for s in steps])
    coefficients, _ = nnls(design, np.array([s.step_s for s in steps]))
    return coefficients


def step_model(coefficients: np.ndarray) -> StepModel:
    """The fitted coefficients as tune.json's record."""
    return StepModel(*map(float, coefficients))



def step_s(model: np.ndarray, b: int, k: int, match: float) -> float:
    return float(model @ [1.0, b, b * (1 + match * k)])



def rate(model: np.ndarray, b: int, k: int, alpha: float, match: float) -> float:
    """Expected tokens per second of b requests speculating k by n-gram lookup."""
    return b * tokens_per_round(alpha, k, match) / step_s(model, b, k, match)



def schedule(model: np.ndarray, ks: list[int], alpha: float, match: float, max_batch: int) -> list[list[int]]:
    """vLLM's (batch_start, batch_end, k) ranges: the best k for each batch size (policies.Goodput's rule on vLLM's
    fitted step), runs of equal k merged."""
    best = [most_goodput(ks, lambda k, b=b: rate(model, b, k, alpha, match)) for b in range(1, max_batch + 1)]
    ranges: list[list[int]] = []
    for b, k in enumerate(best, 1):
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = b
        else:
            ranges.append([b, b, k])
    ranges[-1][1] = 1024  # larger batches than measured keep the last choice
    return ranges



def k_of(table: list[list[int]], b: int) -> int:
    return next(k for start, end, k in table if start <= b <= end)



def config(k_or_table, max_ngram: int) -> SpeculativeConfig | None:
    """vLLM's speculative_config for a fixed k (an int) or a schedule (ranges); None: no speculation."""
    if isinstance(k_or_table, int):
        if k_or_table == 0:
            return None
        return SpeculativeConfig("ngram", k_or_table, 1, max_ngram)
    deepest = max(k for _, _, k in k_or_table)
    if deepest == 0:
        return None
    return SpeculativeConfig("ngram", deepest, 1, max_ngram, k_or_table)
