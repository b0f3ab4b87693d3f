"""A results folder's calibrations: its cost tables by pair (calibration/<pair>-<proposer>.json) and by
configuration, and what they decide that the study does not record in older runs (each controller run's tie set:
the actions within the cost model's noise of its choice, rakv.runtime.costmodel.tie_set).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from rakv.experiments.oracle import adaptive_mask
from rakv.runtime.costmodel import CostTable
from rakv.runtime.run_layout import RunLayout


def calibration_tables(results: Path) -> dict[str, CostTable]:
    """<pair>-<proposer> -> CostTable for every calibration kept in results/<name>/calibration/."""
    from rakv.runtime.costmodel import read_cost_table

    return {path.stem: read_cost_table(path) for path in RunLayout.of(results).calibrations()}


def tables_by_configuration(runs: pd.DataFrame, results: Path) -> dict[str, CostTable | None]:
    kept = calibration_tables(results)
    pairs = runs[["configuration", "pair", "proposer"]].drop_duplicates()
    return {r.configuration: kept.get(f"{r.pair}-{r.proposer}") for r in pairs.itertuples(index=False)}


def with_tie_sets(runs: pd.DataFrame, cost_tables: dict) -> pd.DataFrame:
    """The runs with every rakv-asd run's `tie_set` (JSON): as the controller recorded it, or for runs from before it
    was recorded recomputed from their `predictions` and their configuration's calibration (`cost_tables`:
    configuration -> CostTable; rakv.runtime.costmodel.tie_set), which is what the controller would have recorded."""
    from rakv.runtime.costmodel import prediction_noise, tie_set

    runs = runs.copy()
    if "tie_set" not in runs:
        runs["tie_set"] = None
    if "predictions" not in runs:  # no controller predictions recorded: nothing to recompute from
        return runs
    missing = adaptive_mask(runs) & runs.tie_set.isna() & runs.predictions.notna()
    noise = {name: prediction_noise(table) for name, table in cost_tables.items() if table is not None}
    runs.loc[missing, "tie_set"] = [
        json.dumps(tie_set(json.loads(p), noise[c])) if c in noise else None
        for p, c in zip(runs.predictions[missing], runs.configuration[missing])]
    return runs
