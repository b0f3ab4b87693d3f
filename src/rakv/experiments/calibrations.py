"""A results folder's calibrations: its cost tables by pair (calibration/<pair>-<proposer>[@<precision>].json) and by
configuration, the shared tables a sharded study reads (never writes) with their digests, and what they decide that
the study does not record in older runs (each controller run's tie set: the actions within the cost model's noise of
its choice, rakv.runtime.costmodel.tie_set).
"""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import pandas as pd

from rakv.experiments.oracle import adaptive_mask
from rakv.runtime.costmodel import CostTable
from rakv.runtime.run_layout import RunLayout, calibration_stem


def calibration_tables(results: Path) -> dict[str, CostTable]:
    """<pair>-<proposer>[@<precision>] (run_layout.calibration_stem) -> CostTable for every calibration kept in
    results/<name>/calibration/."""
    from rakv.runtime.costmodel import read_cost_table

    return {path.stem: read_cost_table(path) for path in RunLayout.of(results).calibrations()}


def table_digest(table: CostTable) -> str:
    """A cost table's content digest (its JSON, keys sorted): the study records it in every row, so a merge can tell
    that every shard decided under one table."""
    return hashlib.blake2b(json.dumps(table.to_json(), sort_keys=True).encode(), digest_size=8).hexdigest()


def host() -> str:
    """The machine a run was timed on (its host name), recorded in every row of a study."""
    return socket.gethostname()


def shared_table(results: Path, engine) -> CostTable:
    """The cost table the calibration job kept in `results` for the engine's pair and proposer, read only: a shard of
    a study never measures nor writes one (rakv.experiments.stages.calibrate does, once). Refused when missing or
    measured for another pair, proposer or method; a table from another machine class is used with a note (the
    decisions follow the table; the timings are this host's)."""
    from rakv.runtime.calibration import calibration_key, precision_of
    from rakv.runtime.costmodel import read_cost_table
    from rakv.runtime.errors import RakvError

    path = RunLayout.of(results).calibration(engine.pair.name, engine.proposer, precision_of(engine.pair))
    if not path.exists():
        raise RakvError(f"{path} is missing: a sharded study reads the calibration tables and never writes them; run "
                        "the calibration job first (scripts/run_stage.py calibrate with the same overrides)")
    try:
        table = read_cost_table(path)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise RakvError(f"cannot read calibration {path}: {exc}") from None
    key = calibration_key(engine.pair, engine.proposer)
    differs = [name for name in ("pair", "proposer", "method") if table.key.get(name) != key[name]]
    if differs:
        raise RakvError(f"{path} was measured for another {'/'.join(differs)}; rerun the calibration job")
    if table.key.get("hardware") != key["hardware"]:
        print(f"calibration: {path.name} was measured on another machine class than {host()}; decisions follow the "
              "table, timings are this host's", flush=True)
    return table


def configuration_stem(name: str) -> str:
    """The name of a configuration's kept calibration (run_layout.calibration_stem of its pair, proposer and
    precision): the key of `calibration_tables`."""
    from rakv.experiments.config import configuration

    chosen = configuration(name)
    return calibration_stem(chosen.pair, chosen.proposer, chosen.precision)


def tables_by_configuration(runs: pd.DataFrame, results: Path) -> dict[str, CostTable | None]:
    kept = calibration_tables(results)
    named = runs.assign(precision="fp32") if "precision" not in runs else runs  # a run before the column: fp32
    pairs = named[["configuration", "pair", "proposer", "precision"]].drop_duplicates()
    return {r.configuration: kept.get(calibration_stem(r.pair, r.proposer, r.precision))
            for r in pairs.itertuples(index=False)}


def proposer_tables(runs: pd.DataFrame, results: Path, configuration: str) -> dict[str, CostTable | None]:
    """A configuration of several proposers' kept calibration per proposer, in its configuration's order (the
    first is the engine's own; a tie goes to it): what its rakv-asd (rakv.runtime.controller.ProposerChoice)
    priced each proposer's actions with."""
    from rakv.experiments.config import configuration as configuration_entry

    kept = calibration_tables(results)
    mine = runs[runs.configuration == configuration]
    precision = mine.precision.iloc[0] if "precision" in mine else "fp32"
    return {name: kept.get(calibration_stem(mine.pair.iloc[0], name, precision))
            for name in configuration_entry(configuration).all_proposers}


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
