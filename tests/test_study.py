"""Study infrastructure: the plan's size, crash-safe journal, and kill -9 then resume of a real study process."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from test_sharding import write_seeded_table

from rakv.experiments.config import CONF_DIR
from rakv.experiments.metadata import read_run_metadata
from rakv.experiments.records import Journal
from rakv.experiments.study import PlannedRun
from rakv.runtime.run_layout import RunLayout, StudyLayout

ROOT = Path(__file__).resolve().parents[1]


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=False)


def test_paper_profile_multiplies_out_to_3600_strategy_runs():
    cfg = composed("profile=paper")
    grid = cfg.profile.study
    count = (len(cfg.experiment.strategies) * len(cfg.configurations) * len(cfg.datasets)
             * len(cfg.experiment.scenarios) * len(grid.length_bins) * grid.prompts_per_bin * grid.repeats)
    assert count == 3600
    assert list(cfg.configurations) == ["gpt2-distilgpt2", "gpt2medium-gpt2"]
    assert composed("profile=offline-full").profile.study == grid  # the same grid, offline configurations


def test_journal_recovers_from_a_torn_last_line(tmp_path):
    path = StudyLayout(tmp_path).journal
    rows = [{"run_id": f"r{i}", "x": i} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"run_id": "r3", "x"')
    journal = Journal(path)
    assert [r["run_id"] for r in journal.rows] == ["r0", "r1", "r2"] and journal.done == {"r0", "r1", "r2"}
    journal.append({"run_id": "r3", "x": 3})
    assert [json.loads(line)["run_id"] for line in path.read_text().splitlines()] == ["r0", "r1", "r2", "r3"]


def test_run_ids_are_stable_and_distinct():
    a = PlannedRun("tiny", "humaneval", "HumanEval/1", "cold", "strategy", "ar", 0)
    assert a.run_id == PlannedRun("tiny", "humaneval", "HumanEval/1", "cold", "strategy", "ar", 0).run_id
    assert a.run_id != PlannedRun("tiny", "humaneval", "HumanEval/1", "cold", "strategy", "ar", 1).run_id


def study_command(results_dir):
    return [sys.executable, str(ROOT / "scripts" / "run_stage.py"), "study", "profile=smoke",
            f"results_dir={results_dir}", "configurations=[tiny]", "datasets=[humaneval]",
            "calibration.recalibrate=auto"]


@pytest.mark.heavy
def test_study_killed_with_sigkill_resumes_without_loss_duplicates_or_other_decisions(tmp_path):
    interrupted, uninterrupted = tmp_path / "interrupted", tmp_path / "uninterrupted"
    command = study_command(interrupted)
    study = RunLayout.of(interrupted).study
    journal = study.journal
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_bytes().count(b"\n") >= 40:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the study finished before it could be killed"
    # a second study on the same folder, started while the first runs, refuses at once; the first is paused
    # meanwhile, so that it cannot finish (and release the folder) while the second starts up
    os.killpg(proc.pid, signal.SIGSTOP)
    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 2 and "in use by a running study (pid" in second.stderr, second.stderr[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = journal.read_bytes().count(b"\n")
    assert not study.runs.exists()

    finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-2000:]
    planned = int(study.plan.read_text().split()[1])
    runs = pd.read_parquet(study.runs)
    assert len(runs) == planned and runs.run_id.is_unique and runs.equal_to_ar.all()
    lines = journal.read_text().splitlines()
    assert len(lines) == planned == len({json.loads(line)["run_id"] for line in lines})
    assert f"{planned} runs planned here, {done_before} already done" in finished.stdout  # nothing redone
    assert read_run_metadata(RunLayout.of(interrupted)).runs == planned

    # the controller resumed exactly: every rakv-asd decision equals the uninterrupted study's
    assert subprocess.run(study_command(uninterrupted), capture_output=True, timeout=600).returncode == 0
    reference = pd.read_parquet(RunLayout.of(uninterrupted).study.runs)
    columns = ["run_id", "action", "predictions", "alpha_before", "alpha_after", "ewma_accepted", "ewma_by_match"]
    mine, theirs = (r[r.strategy == "rakv-asd"][columns].sort_values("run_id").reset_index(drop=True)
                    for r in (runs, reference))
    resumed_after = runs.set_index("run_id").order[mine.run_id].ge(done_before).sum()
    assert resumed_after > 0, "no rakv-asd run came after the resume"
    pd.testing.assert_frame_equal(mine, theirs)


LAUNCHERS = {
    "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=1"],  # one job at a time, in this machine's processes
    # hydra-submitit-launcher's local executor: the plugin and keys of conf/hydra/launcher/slurm.yaml, each shard
    # submitted as a pickled job and collected as on a cluster
    "submitit_local": ["hydra/launcher=local"],
}


LAUNCHED_GRID = ["profile=smoke", "configurations=[tiny]", "datasets=[humaneval]", "profile.study.repeats=1",
                 "profile.study.sweep_repeats=1", "study.learning=per_block"]  # the merge, not the size, is under test


@pytest.fixture(scope="module")
def unsharded_study(tmp_path_factory) -> tuple[Path, dict]:
    """The unsharded study every launcher's merge is compared with (one for both launchers), on one seeded table
    (a calibration on a loaded machine is refused as noisy), and the environment that names that table."""
    root = tmp_path_factory.mktemp("unsharded")
    tables = root / "calibrations"
    tables.mkdir()
    write_seeded_table(tables)
    env = {**os.environ, "RAKV_CALIBRATION_DIR": str(tables)}
    single = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_stage.py"), "study", *LAUNCHED_GRID,
                             f"results_dir={root / 'results'}"], capture_output=True, text=True, timeout=600, env=env)
    assert single.returncode == 0, single.stderr[-2000:]
    return root / "results", env


@pytest.mark.heavy
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_sharded_study_through_a_launcher_merges_to_the_unsharded_plan(tmp_path, launcher, unsharded_study):
    """Two shards as a Hydra multirun on the unsharded study's calibration table, then the merge step: the merged
    runs.parquet holds exactly the run ids of an unsharded study of the same grid, and the same rakv-asd actions."""
    sharded, (unsharded, env) = tmp_path / "sharded", unsharded_study
    grid = LAUNCHED_GRID
    script = str(ROOT / "scripts" / "run_stage.py")
    shutil.copytree(RunLayout.of(unsharded).calibration_dir, RunLayout.of(sharded).calibration_dir)  # one table
    shards = subprocess.run([sys.executable, script, "study", "-m", *LAUNCHERS[launcher],
                             f"hydra.sweep.dir={tmp_path / 'multirun'}", *grid, f"results_dir={sharded}",
                             "study.num_shards=2", "study.shard_index=0,1"], capture_output=True, text=True,
                            timeout=600, env=env)
    assert shards.returncode == 0, shards.stderr[-2000:]
    study = RunLayout.of(sharded).study
    journals = study.journals()
    assert journals == [study.shard_journal(0, 2), study.shard_journal(1, 2)]
    merge = subprocess.run([sys.executable, script, "study", *grid, f"results_dir={sharded}", "study.num_shards=2",
                            "study.merge_only=true"], capture_output=True, text=True, timeout=600, env=env)
    assert merge.returncode == 0, merge.stderr[-2000:]
    merged = pd.read_parquet(study.runs)
    reference = pd.read_parquet(RunLayout.of(unsharded).study.runs)
    assert merged.run_id.is_unique and len(merged) == len(reference)
    assert set(merged.run_id) == set(reference.run_id)
    shard_rows = [len(path.read_text().splitlines()) for path in journals]
    assert sum(shard_rows) == len(reference) and min(shard_rows) > 0  # split, nothing doubled
    decided = [r[r.kind == "strategy"].set_index("run_id").sort_index()[["action", "alpha_before"]]
               for r in (merged, reference)]
    pd.testing.assert_frame_equal(*decided)
