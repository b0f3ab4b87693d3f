"""The sensitivity and feasibility stages as independent jobs (docs/cluster.md): shards on the calibration job's table
produce what one process produces (timings aside; rakv.experiments.shard_compare), a merge loads no model, and a
deliberately different shard plan is caught. On the tiny seeded pair, in-process."""

import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import rakv.runtime.calibration as calibration
import rakv.runtime.engine as engine_module
from rakv.experiments.config import CONF_DIR, validate
from rakv.experiments.sensitivity import run_sensitivity, sensitivity_units
from rakv.experiments.shard_compare import differences, stage_outputs
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import RunLayout

SMALL_SENSITIVITY = ["profile.sensitivity.trace_requests=4", "profile.sensitivity.budgets_mib=[0.5,64]",
                     "profile.sensitivity.output_lengths=[4]", "profile.sensitivity.prompt_lengths=[32]",
                     "profile.sensitivity.reuse_rates=[0.0,0.9]", "profile.sensitivity.reuse_output_lengths=[4]",
                     "profile.sensitivity.reuse_prompts=1", "profile.sensitivity.controlled_alphas=[0.9]",
                     "experiment.controlled_k=[2]", "experiment.betas=[0.0,0.9]", "experiment.lambdas=[0.0]"]
STAGE = ["profile=smoke", "configurations=[tiny]", "datasets=[humaneval]", "calibration.recalibrate=auto",
         "study.learning=per_block"]


def stage_cfg(name, *overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name=name, overrides=STAGE + list(overrides))
    validate(cfg)
    return cfg


def refuse_models(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the merge loaded a model or calibrated")

    monkeypatch.setattr(engine_module, "load_pair", refuse)
    monkeypatch.setattr(calibration, "calibrate", refuse)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """The seeded tiny table (tests/test_sharding.py's), as the calibration job keeps it, and a finished study."""
    from test_sharding import composed, write_seeded_table

    from rakv.experiments.config import configuration, engine_for, keep_calibration
    from rakv.experiments.study import run_main_study

    folder = tmp_path_factory.mktemp("calibrations")
    patch = pytest.MonkeyPatch()
    patch.setenv("RAKV_CALIBRATION_DIR", str(folder))
    table = write_seeded_table(folder)
    base = tmp_path_factory.mktemp("base")
    cfg = composed(f"results_dir={base}", "study.learning=per_block")
    keep_calibration(cfg, engine_for(cfg, configuration("tiny")), table)  # the calibration job's kept table
    run_main_study(cfg)  # the beta/lambda replay reads the study's runs
    yield base
    patch.undo()


def results_from(base: Path, folder: Path) -> Path:
    """A results folder holding the base's kept table and study (what the earlier stages left)."""
    shutil.copytree(base / "calibration", folder / "calibration")
    shutil.copytree(base / "study", folder / "study")
    return folder


def sensitivity_jobs(results: Path, count: int, *overrides_of_shard) -> None:
    for index in range(count):
        extra = overrides_of_shard[index] if index < len(overrides_of_shard) else []
        run_sensitivity(stage_cfg("sensitivity", f"results_dir={results}", *SMALL_SENSITIVITY,
                                  f"study.num_shards={count}", f"study.shard_index={index}", *extra))


def test_sensitivity_as_jobs_gives_one_process_outputs(tables, tmp_path, monkeypatch):
    one = results_from(tables, tmp_path / "one")
    run_sensitivity(stage_cfg("sensitivity", f"results_dir={one}", *SMALL_SENSITIVITY))
    jobs = results_from(tables, tmp_path / "jobs")
    units = sensitivity_units(stage_cfg("sensitivity", f"results_dir={jobs}", *SMALL_SENSITIVITY))
    assert len(units) == 4  # tiny has a draft model: controlled is a unit
    sensitivity_jobs(jobs, 3)
    assert not RunLayout.of(jobs).sensitivity_complete.exists()  # a shard never merges
    refuse_models(monkeypatch)
    run_sensitivity(stage_cfg("sensitivity", f"results_dir={jobs}", *SMALL_SENSITIVITY, "study.num_shards=3",
                              "study.merge_only=true"))
    mine, theirs = stage_outputs(jobs, "sensitivity"), stage_outputs(one, "sensitivity")
    assert {"sensitivity/controlled", "sensitivity/cache_budget", "sensitivity/output_length",
            "sensitivity/reuse_output_length", "sensitivity/beta_lambda", "sensitivity/alpha_model"} <= set(mine)
    assert all(len(frame) for frame in mine.values())
    assert differences(mine, theirs) == []


def test_sensitivity_merge_refuses_unfinished_and_catches_another_plan(tables, tmp_path, monkeypatch):
    """The positive controls: a merge before every unit is done stops with one line; a shard that ran its units under
    another plan (here another seed: another cache trace) is caught by the comparison."""
    one = results_from(tables, tmp_path / "one")
    run_sensitivity(stage_cfg("sensitivity", f"results_dir={one}", *SMALL_SENSITIVITY))
    jobs = results_from(tables, tmp_path / "jobs")
    merge = stage_cfg("sensitivity", f"results_dir={jobs}", *SMALL_SENSITIVITY, "study.num_shards=2",
                      "study.merge_only=true")
    sensitivity_jobs(jobs, 2, [], ["seed=7"])  # shard 1 (cache_budget, reuse_output_length) on another seed
    (RunLayout.of(jobs).stage_units("sensitivity") / "tiny.reuse_output_length.json").rename(tmp_path / "held.json")
    with pytest.raises(RakvError, match="1 of 4 units are not finished"):
        run_sensitivity(merge)
    (tmp_path / "held.json").rename(RunLayout.of(jobs).stage_units("sensitivity") / "tiny.reuse_output_length.json")
    refuse_models(monkeypatch)
    run_sensitivity(merge)
    found = differences(stage_outputs(jobs, "sensitivity"), stage_outputs(one, "sensitivity"))
    assert any(line.startswith("sensitivity/cache_budget") for line in found), found


def feasibility_cfg(results, *overrides):
    return stage_cfg("feasibility", f"results_dir={results}", "profile.feasibility.prompts_per_bin=3",
                     "experiment.scenarios=[cold,exact]", "controller.k_set=[0,2]", *overrides)


def test_feasibility_as_jobs_gives_one_process_outputs(tables, tmp_path, monkeypatch):
    from rakv.experiments.feasibility import run_feasibility

    one = results_from(tables, tmp_path / "one")
    run_feasibility(feasibility_cfg(one))
    jobs = results_from(tables, tmp_path / "jobs")
    for index in range(2):
        run_feasibility(feasibility_cfg(jobs, "study.num_shards=2", f"study.shard_index={index}"))
    assert not RunLayout.of(jobs).feasibility_summary.exists()  # a shard never merges
    other = results_from(tables, tmp_path / "other")  # the positive control: shard 1 on another seed's plan
    for index, seed in ((0, 0), (1, 7)):
        run_feasibility(feasibility_cfg(other, "study.num_shards=2", f"study.shard_index={index}", f"seed={seed}"))
    refuse_models(monkeypatch)
    merge = ["study.num_shards=2", "study.merge_only=true"]
    run_feasibility(feasibility_cfg(jobs, *merge))
    mine, theirs = stage_outputs(jobs, "feasibility"), stage_outputs(one, "feasibility")
    assert set(mine) == {"feasibility sweep outputs", "feasibility/gap"} and len(mine["feasibility/gap"])
    assert differences(mine, theirs) == []
    with pytest.raises(RakvError, match="runs are missing"):  # the other plan's runs never complete the plan
        run_feasibility(feasibility_cfg(other, *merge))


def test_feasibility_cost_side_as_jobs_assembles_what_one_process_writes(tables, tmp_path, monkeypatch):
    """Without the pair's weights: each shard's twin pairs as units, merged into one process's tables and summary.
    The twins' measurement is replaced by the seeded table's cost model (the shard/merge logic is what is tested)."""
    import json

    import rakv.experiments.feasibility as feasibility
    import rakv.experiments.study as study
    from rakv.runtime.costmodel import break_even_rows, read_cost_table
    from rakv.runtime.errors import WeightsUnavailable
    from rakv.runtime.models import twin_of

    table = read_cost_table(tables / "calibration" / "tiny-draft.json")

    def no_weights(*args, **kwargs):
        raise WeightsUnavailable("not here (the test's)")

    def twin_unit(cfg, feas, pair, main_pair):
        rows = break_even_rows(twin_of(pair), table, feas.cost_side.prompt_tokens, feas.new_tokens)
        controlled = [{"configuration": twin_of(pair), "prompt_id": "p0", "prompt_tokens": 64, "repeat": 0, "k": 2,
                       "alpha": 0.5, "measured_alpha": 0.5, "ar_latency_s": 1.0, "spec_latency_s": 0.8,
                       "measured_speedup": 1.25, "predicted_speedup": 1.2, "predicted_speedup_at_measured_alpha": 1.2,
                       "equal_to_ar": True}] if pair == main_pair else []
        return rows, controlled, table

    monkeypatch.setattr(study, "engine_for", no_weights)
    monkeypatch.setattr(feasibility, "twin_unit", twin_unit)
    pairs = ["profile.feasibility.configuration=gpt2-distilgpt2",
             "profile.feasibility.cost_side.pairs=[gpt2medium-gpt2,gpt2-distilgpt2,gpt2large-gpt2medium]"]
    one, jobs = tmp_path / "one", tmp_path / "jobs"
    feasibility.run_feasibility(feasibility_cfg(one, *pairs))
    for index in range(2):
        feasibility.run_feasibility(feasibility_cfg(jobs, *pairs, "study.num_shards=2", f"study.shard_index={index}"))
    units = sorted(p.stem for p in RunLayout.of(jobs).stage_units("feasibility").glob("*.json"))
    assert len(units) == 3
    merge = feasibility_cfg(jobs, *pairs, "study.num_shards=2", "study.merge_only=true")
    held = RunLayout.of(jobs).stage_units("feasibility") / f"{units[0]}.json"
    held.rename(tmp_path / "held.json")  # the positive control: a unit not finished
    with pytest.raises(RakvError, match="1 of 3 units are not finished"):
        feasibility.run_feasibility(merge)
    (tmp_path / "held.json").rename(held)
    refuse_models(monkeypatch)
    feasibility.run_feasibility(merge)
    assert json.loads(RunLayout.of(jobs).feasibility_summary.read_text()) == \
        json.loads(RunLayout.of(one).feasibility_summary.read_text())
    assert differences(stage_outputs(jobs, "feasibility"), stage_outputs(one, "feasibility")) == []


def test_compare_sharded_stages_reports_a_differing_output(tmp_path):
    import subprocess
    import sys

    import pandas as pd

    rows = [{"configuration": "tiny", "budget_mib": b, "hit_rate": 0.5, "evictions": 2, "mean_latency_s": 0.1 * b}
            for b in (1, 2)]
    for name, changed in (("one", {}), ("same", {"mean_latency_s": 9.0}), ("other", {"evictions": 3})):
        frame = pd.DataFrame(rows)
        for column, value in changed.items():
            frame.loc[1, column] = value
        RunLayout.of(tmp_path / name).sensitivity_dir.mkdir(parents=True)
        frame.to_parquet(RunLayout.of(tmp_path / name).sensitivity_table("cache_budget"))
    script = [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "compare_sharded.py"),
              "--stages", "sensitivity", "--compare", tmp_path / "one"]
    same = subprocess.run([*script, tmp_path / "same"], capture_output=True, text=True)  # a timing differs only
    assert same.returncode == 0 and "sensitivity: 1 of 1 tables identical" in same.stdout, same.stdout + same.stderr
    other = subprocess.run([*script, tmp_path / "other"], capture_output=True, text=True)
    assert other.returncode == 1 and "0 of 1 tables" in other.stdout and "'evictions'" in other.stdout, other.stdout


def test_slurm_submit_chains_calibrate_shards_and_merges(tmp_path):
    """scripts/slurm/submit.sh against a stand-in sbatch that records its arguments and answers job ids."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\nwc -l < {log} | tr -d " "\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    done = subprocess.run([str(root / "scripts/slurm/submit.sh"), "3", "profile=smoke"], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 1 + 2 * 5 and "RAKV_JOB=calibrate" in calls[0] and calls[0].endswith("profile=smoke")
    for index, stage in enumerate(("study", "serving", "sensitivity", "sampling", "feasibility")):
        shards, merge = calls[1 + 2 * index], calls[2 + 2 * index]
        # the shards after the previous job (the calibration, or the previous stage's merge): job ids count calls
        assert f"--dependency=afterok:{1 + 2 * index} --array=0-2" in shards and f"RAKV_STAGE={stage}" in shards
        assert f"--dependency=afterok:{2 + 2 * index} " in merge and "RAKV_JOB=merge" in merge
    refused = subprocess.run([str(root / "scripts/slurm/submit.sh"), "1"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1  # one line, no job submitted
    assert len(log.read_text().splitlines()) == len(calls)
    bad = subprocess.run(["bash", str(root / "scripts/slurm/job.sbatch")], capture_output=True, text=True,
                         env={**env, "RAKV_JOB": "everything", "SLURM_SUBMIT_DIR": str(root)})
    assert bad.returncode == 2 and "RAKV_JOB must be calibrate, shard or merge" in bad.stderr


SMALL_SAMPLING = ["profile.sampling.seeds=1", "profile.sampling.distribution.prompts=2",
                  "profile.sampling.distribution.seeds=2", "profile.sampling.structured.records=1",
                  "profile.sampling.long_context.per_bin=1", "profile.sampling.long_context.questions=1",
                  "experiment.temperatures=[0.0,1.0]", "experiment.ks=[2]"]


@pytest.mark.heavy
def test_sampling_as_jobs_gives_one_process_outputs(tables, tmp_path, monkeypatch):
    from rakv.experiments.sampling import run_sampling, sampling_units

    def sampling_cfg(results, *overrides):
        return stage_cfg("sampling", f"results_dir={results}", *SMALL_SAMPLING, *overrides)

    one = results_from(tables, tmp_path / "one")
    run_sampling(sampling_cfg(one))
    jobs, other = results_from(tables, tmp_path / "jobs"), results_from(tables, tmp_path / "other")
    units = sampling_units(sampling_cfg(jobs), ["runs", "distribution", "structured", "long_context"])
    assert units == ["tiny.runs", "tiny.distribution.0", "tiny.distribution.1", "tiny.structured",
                     "tiny.long_context"]
    for index in range(3):
        run_sampling(sampling_cfg(jobs, "study.num_shards=3", f"study.shard_index={index}"))
        # the positive control: shard 1 (a distribution prompt, long_context) on another seed
        run_sampling(sampling_cfg(other, "study.num_shards=3", f"study.shard_index={index}", f"seed={7 * index}"))
    assert not RunLayout.of(jobs).sampling_table("runs").exists()  # a shard never merges
    refuse_models(monkeypatch)
    for results in (jobs, other):
        run_sampling(sampling_cfg(results, "study.num_shards=3", "study.merge_only=true"))
    mine, theirs = stage_outputs(jobs, "sampling"), stage_outputs(one, "sampling")
    assert set(mine) == {f"sampling/{p}" for p in ("runs", "distribution", "structured", "long_context",
                                                   "acceptance")} and all(len(f) for f in mine.values())
    assert differences(mine, theirs) == []
    found = differences(stage_outputs(other, "sampling"), theirs)
    assert any(line.startswith("sampling/distribution") for line in found), found
