"""A run of the serving study (rakv.experiments.serving): its cells/.../summary.json, the served run's own summary
(rakv.serving.metrics.RunSummary) with the study's keys after it, and its row of cells.parquet.

The serving layer writes a run's summary.json knowing nothing of the study; the study rewrites it with the cell the
run served, its check against batch-one AR and its SLOs (docs/serving.md), through `StudyRunSummary` alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import from_json, inline, to_json
from rakv.serving.metrics import RunSummary


@dataclass(frozen=True)
class StudyRunSummary:
    """One run of one cell (family x rate x policy) at one repeat: the served run's summary, how many of its
    outputs equal the batch-one AR reference, the cell, its trace, the run's wall time, its mean concurrency
    (rakv.experiments.serving.mean_concurrency) and the SLOs it was served under (ms). The served run's summary is
    `inline()`: its keys come first in the same flat object."""

    run: RunSummary = inline()
    outputs_equal_ar: int
    family: str
    rate: float
    policy: str
    repeat: int
    configuration: str
    trace: str
    wall_s: float
    concurrency: float
    slo_itl_ms: float
    slo_ttft_ms: float
    slo_tpot_ms: float

    def to_json(self) -> dict:
        """summary.json's object: the served run's keys, then the study's in declaration order."""
        return to_json(self)

    def row(self) -> dict:
        """Its row of cells.parquet: every key of summary.json but the maps (the goodput SLOs)."""
        return {k: v for k, v in self.to_json().items() if not isinstance(v, dict)}


def read_study_run(path: Path) -> StudyRunSummary:
    """A study run's summary.json; RakvError naming the file and the key where it is not one."""
    try:
        return from_json(StudyRunSummary, json.loads(Path(path).read_text()))
    except ValueError as exc:  # not JSON, or a SchemaError naming the field
        raise RakvError(f"{path}: not a serving study run's summary.json ({exc})") from None
