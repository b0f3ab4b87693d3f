"""What the study writes, and how it survives a crash: the fsynced journal, atomic writes, provenance.

Each finished run is appended to a JSONL journal and fsynced, so a run killed at any moment loses at
most the run in flight; a torn last line is cut off on recovery. Tables and JSON files are written
to a temporary file and renamed, so a reader never sees half a file. What produced a results folder (the
composed config, the git commit, the package versions) is rakv.experiments.metadata's records.

A stage run as jobs (docs/cluster.md) splits into named independent units: each shard runs the units dealt to it
(`units_dealt`) and writes each unit's tables and then its `ShardUnit` record (`write_unit`), the unit's completion;
the merge reads those files alone (`read_units`).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rakv.runtime.errors import RakvError
from rakv.runtime.paths import ROOT


@contextmanager
def exclusive(lock_path: Path):
    """Hold an exclusive lock on `lock_path` for the block, or refuse at once: one writer per results folder.

    Two studies timing runs on one folder would double every run and time each against the other's load.
    The lock is the kernel's (flock), so a killed process never leaves a stale one behind."""
    handle = open(lock_path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RakvError(f"{lock_path.parent} is in use by a running study ({holder}); wait for it to finish or "
                        "use another results_dir") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Journal:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rows = self._recover()
        self.done = {row["run_id"] for row in self.rows}

    def _recover(self) -> list[dict]:
        """Read complete lines; a torn last line (killed mid-write) is cut off so appends stay clean."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        good = data.rfind(b"\n") + 1
        if good < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good)
        rows, seen = [], set()
        for line in data[:good].splitlines():
            row = json.loads(line)
            if row["run_id"] not in seen:  # cannot happen with one writer; kept as a guard
                seen.add(row["run_id"])
                rows.append(row)
        return rows

    def append(self, row: dict) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.rows.append(row)
        self.done.add(row["run_id"])


def write_parquet(rows: list[dict], path: Path) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return frame


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=ROOT).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else None
    except OSError:
        return None


@dataclass(frozen=True)
class ShardUnit:
    """One finished unit of a stage run as jobs: which shard ran it, the rows of each part it wrote (a table of its
    own beside this record), and the cost table it ran under (its digest and its JSON, so the merge needs nothing
    else), on which host."""

    stage: str
    unit: str
    shard_index: int
    num_shards: int
    parts: dict[str, int]
    calibration_digest: str
    host: str
    table: dict
    note: str = ""  # what the merge should carry into the stage's summary (the feasibility cost side's reason)
    extra: dict = field(default_factory=dict)  # what else the merge needs of the unit (sampling: its machine, commit)


def units_dealt(units: list[str], num_shards: int, shard_index: int) -> list[str]:
    """The units of shard `shard_index`: every `num_shards`-th of the plan's list, a function of the plan alone."""
    return [unit for i, unit in enumerate(units) if i % num_shards == shard_index]


def unit_part(folder: Path, unit: str, part: str) -> Path:
    return folder / f"{unit}.{part}.parquet"


def unit_record(folder: Path, unit: str) -> Path:
    return folder / f"{unit}.json"


def write_unit(folder: Path, record: ShardUnit, parts: dict[str, list[dict]]) -> None:
    """A unit's tables, then its record (written last: with it the unit is done)."""
    from rakv.runtime.json_records import to_json

    folder.mkdir(parents=True, exist_ok=True)
    for part, rows in parts.items():
        write_parquet(rows, unit_part(folder, record.unit, part))
    write_atomic(unit_record(folder, record.unit), json.dumps(to_json(record), indent=1))


def _rows(path: Path) -> list[dict]:
    """A unit's table as the rows it was written from (a missing value None, as the measuring code had it)."""
    frame = pd.read_parquet(path)
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def read_units(folder: Path, stage: str, units: list[str]) -> dict[str, tuple[ShardUnit, dict[str, list[dict]]]]:
    """Every planned unit's record and rows, read from the shards' files alone; a missing unit stops with one line."""
    from rakv.runtime.json_records import read_record

    missing = [unit for unit in units if not unit_record(folder, unit).exists()]
    if missing:
        raise RakvError(f"{stage}: {len(missing)} of {len(units)} units are not finished (other shards?), e.g. "
                        f"{missing[0]}; merge once every shard is done")
    out = {}
    for unit in units:
        record = read_record(ShardUnit, unit_record(folder, unit))
        out[unit] = record, {part: _rows(unit_part(folder, unit, part)) if count else []
                             for part, count in record.parts.items()}
    return out
