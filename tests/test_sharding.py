"""A study as independent jobs (docs/cluster.md): calibrate once, shards that read the tables and decide as one
process does (study.learning=per_block), and a merge that loads no model. On the tiny seeded pair, in-process."""

import json
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

import rakv.runtime.calibration as calibration
import rakv.runtime.engine as engine_module
from rakv.experiments import stages
from rakv.experiments.config import CONF_DIR, configuration, engine_for, validate
from rakv.experiments.study import run_main_study
from rakv.runtime.costmodel import CostTable, Curve
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import RunLayout, ServedRunLayout

# a small grid: 3 prompts (3 blocks), two scenarios, rakv-asd and the sweep of k in {0, 2}
GRID = ["profile=smoke", "configurations=[tiny]", "datasets=[humaneval]", "profile.study.prompts_per_bin=3",
        "profile.study.sweep_repeats=1", "profile.study.model_warmup_requests=0", "experiment.scenarios=[cold,exact]",
        "experiment.strategies=[rakv-asd]", "controller.k_set=[0,2]", "calibration.recalibrate=auto"]
SERVING = ["~profile.serving.rates.chunking", "~profile.serving.rates.speculation",
           "~profile.serving.rates.speculation-draft", "profile.serving.rates.acceptance=[16]",
           "profile.serving.repeats=2", "profile.serving.requests=3",
           "profile.serving.pilot=null"]  # the serving test's grid
DECISIONS = ["run_id", "action", "predictions", "alpha_before", "alpha_after", "ewma_accepted", "ewma_by_match",
             "calibration_digest"]


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=GRID + list(overrides))
    validate(cfg)
    return cfg


def flat(seconds):
    return Curve([float(seconds)], 1.0, 0.0)


def write_seeded_table(folder) -> CostTable:
    """A cost table for the tiny pair on this machine, written into `folder` as the calibration of its key (set
    RAKV_CALIBRATION_DIR to it): not measured, since a calibration on a loaded test machine is refused as noisy."""
    engine = engine_for(composed(f"results_dir={folder}"), configuration("tiny"))
    key = calibration.calibration_key(engine.pair, engine.proposer)
    table = CostTable(key=key, target_prefill=Curve([2e-4, 0.0], 1.0, 0.0), target_step=flat(0.004),
                      verify={k: flat(0.0045 + 0.0002 * k) for k in (1, 2, 4, 6, 8)},
                      propose={k: flat(0.0004 * k) for k in (1, 2, 4, 6, 8)},
                      proposer_prefill=Curve([1e-5, 0.0], 1.0, 0.0), kv_copy=Curve([1e-7, 0.0], 1.0, 0.0),
                      target_kv_bytes_per_token=4096.0, proposer_kv_bytes_per_token=2048.0, acceptance=0.5,
                      acceptance_rounds=100)
    calibration.save_table(table, Path(folder) / calibration.calibration_path(key).name)
    return table


@pytest.fixture(scope="module")
def seeded_table(tmp_path_factory):
    """Every study here decides under one seeded table (write_seeded_table)."""
    folder = tmp_path_factory.mktemp("calibrations")
    patch = pytest.MonkeyPatch()
    patch.setenv("RAKV_CALIBRATION_DIR", str(folder))
    table = write_seeded_table(folder)
    write_seeded_batch_cost(folder, serving_cfg(f"results_dir={folder}"))  # the calibrate stage's serving part
    yield table
    patch.undo()


def strategy_rows(results):
    runs = pd.read_parquet(RunLayout.of(results).study.runs)
    return runs[runs.kind == "strategy"][DECISIONS].sort_values("run_id").reset_index(drop=True)


@pytest.fixture(scope="module")
def one_process(seeded_table, tmp_path_factory):
    results = tmp_path_factory.mktemp("one")
    run_main_study(composed(f"results_dir={results}", "study.learning=per_block"))
    return results


@pytest.mark.heavy
def test_shards_decide_as_one_process_and_merge_without_models(one_process, tmp_path, monkeypatch):
    sharded = tmp_path / "sharded"
    shard = [f"results_dir={sharded}", "study.learning=per_block", "study.num_shards=3"]
    with pytest.raises(RakvError, match="run the calibration job first"):  # shards never calibrate
        run_main_study(composed(*shard, "study.shard_index=0"))
    stages.calibrate(composed(f"results_dir={sharded}", *SERVING))  # the calibration job: writes the shared table
    table_file = RunLayout.of(sharded).calibration("tiny", "draft")
    written = table_file.stat().st_mtime_ns
    for index in range(3):
        run_main_study(composed(*shard, f"study.shard_index={index}"))
    assert table_file.stat().st_mtime_ns == written  # read, never written by a shard
    study = RunLayout.of(sharded).study
    journals = study.journals()
    assert len(journals) == 3 and all(path.read_text() for path in journals)  # every shard had blocks

    def refuse(*args, **kwargs):
        raise AssertionError("the merge loaded a model or calibrated")

    study.runs.unlink()  # merge from the journals alone
    monkeypatch.setattr(engine_module, "load_pair", refuse)
    monkeypatch.setattr(calibration, "calibrate", refuse)
    run_main_study(composed(*shard, "study.merge_only=true"))
    merged, reference = strategy_rows(sharded), strategy_rows(one_process)
    assert len(merged) == len(reference) > 0
    pd.testing.assert_frame_equal(merged, reference)  # every rakv-asd decision and learned state, same table
    assert merged.calibration_digest.nunique() == 1
    assert pd.read_parquet(study.runs).host.notna().all()


def test_per_configuration_learning_differs_and_is_refused_sharded(one_process, tmp_path):
    """The positive control of the comparison above: one controller per configuration learns across blocks, and the
    same comparison catches it; sharding it is refused with one line."""
    with pytest.raises(RakvError, match="needs study.learning=per_block"):
        composed(f"results_dir={tmp_path}", "study.num_shards=2")
    run_main_study(composed(f"results_dir={tmp_path}"))
    with pytest.raises(AssertionError):
        pd.testing.assert_frame_equal(strategy_rows(tmp_path), strategy_rows(one_process))


def test_merge_refuses_runs_decided_under_two_tables(one_process, tmp_path):
    import shutil

    shutil.copytree(one_process / "study", tmp_path / "study")
    journal = RunLayout.of(tmp_path).study.journal
    lines = journal.read_text().splitlines()
    lines[0] = lines[0].replace('"calibration_digest": "', '"calibration_digest": "0')
    journal.write_text("\n".join(lines) + "\n")
    with pytest.raises(RakvError, match="different calibration tables"):
        run_main_study(composed(f"results_dir={tmp_path}", "study.merge_only=true"))


def test_compare_sharded_reports_a_differing_decision(tmp_path):
    import subprocess
    import sys

    rows = [{"run_id": f"r{i}", "kind": "strategy", "action": "r1k2", "alpha_before": 0.5 + i / 100,
             "alpha_after": 0.6, "configuration": "tiny" if i else "tiny-lookup", "calibration_digest": f"abc{i > 0}",
             "host": "node1"} for i in range(3)]
    rows.append({**rows[0], "run_id": "s0", "kind": "sweep", "action": "r0k0"})
    script = [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "compare_sharded.py"), "--compare"]
    for name, changed in (("one", {}), ("same", {}), ("other", {"action": "r1k0"}),
                          ("table", {"calibration_digest": "abcother"})):
        frame = pd.DataFrame(rows)
        for column, value in changed.items():
            frame.loc[1, column] = value
        RunLayout.of(tmp_path / name).study.root.mkdir(parents=True)
        frame.to_parquet(RunLayout.of(tmp_path / name).study.runs)
    same = subprocess.run([*script, tmp_path / "one", tmp_path / "same"], capture_output=True, text=True)
    assert same.returncode == 0 and "3 of 3 rakv-asd decisions identical" in same.stdout, same.stdout + same.stderr
    other = subprocess.run([*script, tmp_path / "one", tmp_path / "other"], capture_output=True, text=True)
    assert other.returncode == 1 and "2 of 3" in other.stdout and "differs: r1" in other.stdout, other.stdout
    table = subprocess.run([*script, tmp_path / "one", tmp_path / "table"], capture_output=True, text=True)
    assert table.returncode == 1 and "3 of 3" in table.stdout and "no: tiny" in table.stdout, table.stdout


def serving_cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="serving_study", overrides=["profile=smoke", *SERVING, *overrides])
    validate(cfg)
    return cfg


def write_seeded_batch_cost(folder, cfg) -> None:
    """A batch cost table and a cost table for the serving configuration, as write_seeded_table."""
    from dataclasses import replace

    from rakv.experiments.serving import serving_configurations
    from rakv.serving.batchcost import BatchCost, batch_cost_key, batch_cost_path

    for name in serving_configurations(cfg):
        engine = engine_for(cfg, configuration(name))
        key = calibration.calibration_key(engine.pair, engine.proposer)
        table = replace(write_seeded_table(folder), key=key)
        calibration.save_table(table, Path(folder) / calibration.calibration_path(key).name)
        batch = BatchCost(key=batch_cost_key(engine), rows=Curve([2e-4, 4e-3], 1.0, 0.0), segment_s=2e-4, kv_s=1e-6,
                          attend_s=1e-8, proposer=engine.proposer, proposer_step=Curve([1e-4, 2e-4], 1.0, 0.0))
        (Path(folder) / batch_cost_path(batch.key).name).write_text(json.dumps(batch.to_json()))


def served_outputs(results) -> pd.DataFrame:
    """Every served request's output tokens, by cell, repeat and request id (from each run's requests.jsonl)."""
    from rakv.serving.records import read_records

    serving = RunLayout.of(results).serving
    rows = [{"run": str(run.root.relative_to(serving.root)), "id": r.id, "status": r.status,
             "tokens": json.dumps(r.token_ids)}
            for run in ServedRunLayout.found_under(serving.cells_dir) for r in read_records(run.requests)]
    return pd.DataFrame(rows).sort_values(["run", "id"]).reset_index(drop=True)


@pytest.mark.heavy
def test_serving_cells_as_jobs_serve_what_one_process_serves(tmp_path, monkeypatch):
    from rakv.experiments.serving import run_serving

    tables = tmp_path / "calibrations"
    tables.mkdir()
    monkeypatch.setenv("RAKV_CALIBRATION_DIR", str(tables))
    one, jobs = tmp_path / "one", tmp_path / "jobs"
    write_seeded_batch_cost(tables, serving_cfg(f"results_dir={one}"))
    run_serving(serving_cfg(f"results_dir={one}"))
    shard = [f"results_dir={jobs}", "study.learning=per_block", "study.num_shards=2"]
    with pytest.raises(RakvError, match="run the calibration job first"):
        run_serving(serving_cfg(*shard, "study.shard_index=0"))
    stages.calibrate(composed(f"results_dir={jobs}", "configurations=[tiny-lookup]", *SERVING))
    for index in range(2):
        run_serving(serving_cfg(*shard, f"study.shard_index={index}"))
    assert not RunLayout.of(jobs).serving.requests.exists()  # a shard never merges

    def refuse(*args, **kwargs):
        raise AssertionError("the merge loaded a model or calibrated")

    monkeypatch.setattr(engine_module, "load_pair", refuse)
    monkeypatch.setattr(calibration, "calibrate", refuse)
    run_serving(serving_cfg(*shard, "study.merge_only=true"))
    mine, theirs = served_outputs(jobs), served_outputs(one)
    assert len(mine) == len(theirs) > 0 and (mine.status == "ok").all()
    pd.testing.assert_frame_equal(mine, theirs)  # every served output, token for token
    cells = pd.read_parquet(RunLayout.of(jobs).serving.cells)
    assert len(cells) == len(pd.read_parquet(RunLayout.of(one).serving.cells))
    assert cells.outputs_equal_ar.sum() == len(mine)
