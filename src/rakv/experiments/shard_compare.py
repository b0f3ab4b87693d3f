"""What a stage decided and produced, timings left out, so that a stage run as jobs can be compared with one
process on the same calibration (docs/cluster.md; scripts/compare_sharded.py, tests/test_sharding*.py).

`stage_outputs(results, stage)` reads one finished stage's files into named tables of the columns that do not depend
on a clock: the study's rakv-asd decisions (action, acceptance before and after), every served output's tokens, the
sensitivity and sampling parts' rows without their measured times (and without the beta/lambda replay's scores,
which rank the study's measured latencies), the feasibility sweep's actions and output hashes.
`differences(one, other)` lists where two such readings differ, one line each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from rakv.runtime.json_records import read_json
from rakv.runtime.run_layout import RunLayout, ServedRunLayout

# stages whose outputs stage_outputs reads, in pipeline order
COMPARED_STAGES = ("study", "serving", "sensitivity", "sampling", "feasibility")
# columns that hold a clock's reading, or a statistic ranked by one
TIMED_MARKERS = ("latency", "ttft", "speedup", "tokens_per_s", "regret", "accuracy", "prefill_s", "_time", "seconds")
STUDY_DECIDED = ["run_id", "action", "alpha_before", "alpha_after"]
SWEEP_OUTPUT = ["run_id", "action", "output_hash"]


def timed(column: str) -> bool:
    return column.endswith("_s") or any(marker in column for marker in TIMED_MARKERS)


def untimed(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame's columns that no clock moves, rows in their order, index reset; a list in a cell as its JSON."""
    frame = frame[[c for c in frame.columns if not timed(c)]].reset_index(drop=True)
    for column in [c for c in frame.columns if frame[c].dtype.kind == "O"]:
        frame[column] = [json.dumps(v.tolist() if hasattr(v, "tolist") else v) if isinstance(v, (list, tuple))
                         or hasattr(v, "tolist") else v for v in frame[column]]
    return frame


def _study(folder: Path, columns: list[str], strategy_only: bool) -> pd.DataFrame:
    runs = pd.read_parquet(folder)
    if strategy_only:
        runs = runs[runs.kind == "strategy"]
    return runs[[c for c in columns if c in runs]].sort_values("run_id").reset_index(drop=True)


def served(results: Path) -> pd.DataFrame:
    """Every served request's status and output tokens, by served run and request id."""
    from rakv.serving.records import read_records

    serving = RunLayout.of(results).serving
    rows = [{"run": str(run.root.relative_to(serving.root)), "id": r.id, "status": r.status,
             "tokens": json.dumps(r.token_ids)}
            for run in ServedRunLayout.found_under(serving.cells_dir) for r in read_records(run.requests)]
    frame = pd.DataFrame(rows, columns=["run", "id", "status", "tokens"])
    return frame.sort_values(["run", "id"]).reset_index(drop=True)


def stage_outputs(results: Path | str, stage: str) -> dict[str, pd.DataFrame]:
    """Named tables of what `stage` decided and produced in `results`, timings left out; {} when it wrote nothing."""
    layout = RunLayout.of(results)
    if stage == "study":
        return {"rakv-asd decisions": _study(layout.study.runs, STUDY_DECIDED, True)} if layout.study.runs.exists() \
            else {}
    if stage == "serving":
        return {"served outputs": served(layout.root)} if layout.serving.cells_dir.exists() else {}
    if stage == "sensitivity":
        out = {}
        for path in layout.sensitivity_tables():
            frame = untimed(pd.read_parquet(path))
            out[f"sensitivity/{path.stem}"] = frame
        return out
    if stage == "sampling":
        out = {}
        for part in ("runs", "distribution", "structured", "long_context"):
            path = layout.sampling_table(part)
            if path.exists():
                out[f"sampling/{part}"] = untimed(pd.read_parquet(path))
        if layout.sampling_acceptance.exists():  # where each temperature's controller started
            out["sampling/acceptance"] = pd.json_normalize(read_json(layout.sampling_acceptance))
        return out
    if stage == "feasibility":
        out = {}
        if layout.feasibility_study.runs.exists():
            out["feasibility sweep outputs"] = _study(layout.feasibility_study.runs, SWEEP_OUTPUT, False)
        for part in ("gap", "break_even", "controlled"):
            path = layout.feasibility_table(part)
            if path.exists():
                out[f"feasibility/{part}"] = untimed(pd.read_parquet(path))
        if "feasibility/gap" in out:  # which action was fastest is a clock's reading
            out["feasibility/gap"] = out["feasibility/gap"].drop(columns=["best_spec_action", "gap"], errors="ignore")
        return out
    raise ValueError(f"no comparison for stage '{stage}' (compared: {', '.join(COMPARED_STAGES)})")


def differences(one: dict[str, pd.DataFrame], other: dict[str, pd.DataFrame]) -> list[str]:
    """One line per table that is missing on a side or differs (its first differing row); [] when all are equal."""
    out = []
    for name in sorted(set(one) | set(other)):
        if name not in one or name not in other:
            out.append(f"{name}: only in the {'first' if name in one else 'second'}")
            continue
        a, b = one[name], other[name]
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            out.append(f"{name}: {len(a)} rows x {len(a.columns)} columns against {len(b)} x {len(b.columns)}")
            continue
        same = (a == b) | (a.isna() & b.isna())
        bad = ~same.all(axis=1)
        if bad.any():
            row = int(bad.to_numpy().argmax())
            column = same.columns[~same.iloc[row]][0]
            out.append(f"{name}: {int(bad.sum())} of {len(a)} rows differ, first row {row} in '{column}' "
                       f"({a.iloc[row][column]!r:.40} against {b.iloc[row][column]!r:.40})")
    return out
