"""Study infrastructure: the plan's size, crash-safe journal, and kill -9 then resume of a real study process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir

from rakv.config import CONF_DIR
from rakv.records import Journal
from rakv.study import PlannedRun

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
    path = tmp_path / "runs.jsonl"
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


def test_study_killed_with_sigkill_resumes_without_loss_or_duplicates(tmp_path):
    command = [sys.executable, str(ROOT / "scripts" / "run_study.py"), "profile=smoke", f"results_dir={tmp_path}",
               "configurations=[tiny]", "datasets=[humaneval]", "calibration.recalibrate=auto"]
    journal = tmp_path / "study" / "runs.jsonl"
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_bytes().count(b"\n") >= 15:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the study finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = journal.read_bytes().count(b"\n")
    assert not (tmp_path / "study" / "runs.parquet").exists()

    finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-2000:]
    planned = int((tmp_path / "study" / "plan.txt").read_text().split()[1])
    runs = pd.read_parquet(tmp_path / "study" / "runs.parquet")
    assert len(runs) == planned and runs.run_id.is_unique and runs.equal_to_ar.all()
    lines = journal.read_text().splitlines()
    assert len(lines) == planned == len({json.loads(line)["run_id"] for line in lines})
    assert f"{planned} runs planned here, {done_before} already done" in finished.stdout  # nothing redone
    assert json.loads((tmp_path / "study" / "metadata.json").read_text())["runs"] == planned
