"""`./reproduce.sh jobs=N`'s jobs path (scripts/stage_jobs.sh: a Hydra multirun of N shards through
hydra-submitit-launcher's local executor, then the merge) on the tiny seeded pair, for the study and the serving
stage with N = 2: the merged run decides and serves what one process does on the same tables
(scripts/compare_sharded.py --compare), and a run that differs in one decision is caught (docs/cluster.md)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_sharding import GRID, SERVING, composed, serving_cfg, write_seeded_batch_cost, write_seeded_table

from rakv.experiments import stages
from rakv.experiments.serving import run_serving
from rakv.experiments.study import run_main_study
from rakv.runtime.run_layout import RunLayout

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]
STUDY = [*GRID, "study.learning=per_block"]
SERVED = ["profile=smoke", *SERVING, "study.learning=per_block"]


def stage_jobs(stage: str, overrides: list[str], sweep: Path, env: dict) -> None:
    done = subprocess.run([str(ROOT / "scripts" / "stage_jobs.sh"), stage, "2", "local", *overrides,
                           f"hydra.sweep.dir={sweep}"], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]


def compare(one: Path, jobs: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_sharded.py"), "--stages", "study,serving",
                           "--compare", str(one), str(jobs)], capture_output=True, text=True, timeout=300)


def test_the_jobs_path_of_reproduce_decides_and_serves_as_one_process(tmp_path, monkeypatch):
    tables = tmp_path / "calibrations"  # seeded tables: a calibration on a loaded machine is refused as noisy
    tables.mkdir()
    monkeypatch.setenv("RAKV_CALIBRATION_DIR", str(tables))
    write_seeded_table(tables)
    write_seeded_batch_cost(tables, serving_cfg(f"results_dir={tables}"))
    one, jobs = tmp_path / "one", tmp_path / "jobs"
    run_main_study(composed(f"results_dir={one}", "study.learning=per_block"))  # one process, in this one
    run_serving(serving_cfg(f"results_dir={one}", "study.learning=per_block"))
    # the calibration job (reproduce.sh's calibrate stage): keeps the tables in the jobs' results folder
    stages.calibrate(composed(f"results_dir={jobs}", "configurations=[tiny,tiny-lookup]", *SERVING))
    env = {**os.environ, "RAKV_CALIBRATION_DIR": str(tables)}
    stage_jobs("study", [*STUDY, f"results_dir={jobs}"], tmp_path / "multirun" / "study", env)
    stage_jobs("serving", [*SERVED, f"results_dir={jobs}"], tmp_path / "multirun" / "serving", env)
    study = RunLayout.of(jobs).study
    assert study.journals() == [study.shard_journal(0, 2), study.shard_journal(1, 2)]  # two jobs ran
    same = compare(one, jobs)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "rakv-asd decisions identical" in same.stdout and "serving: 1 of 1 tables identical" in same.stdout
    # positive control: the merged run with one rakv-asd decision changed is reported, exit status 1
    other = tmp_path / "other"
    shutil.copytree(jobs, other)
    runs = pd.read_parquet(RunLayout.of(other).study.runs)
    row = runs.index[runs.kind == "strategy"][0]
    runs.loc[row, "action"] = "changed"
    runs.to_parquet(RunLayout.of(other).study.runs)
    differs = compare(one, other)
    assert differs.returncode == 1 and f"differs: {runs.at[row, 'run_id']}" in differs.stdout, differs.stdout
