"""Stages as N jobs against one process (docs/cluster.md): both decide under one calibration, and each stage's
decisions and outputs are compared (timings aside), with each stage's wall time printed both ways.

    .venv/bin/python scripts/compare_sharded.py --jobs 4 profile=smoke          # the study: runs both, compares
    .venv/bin/python scripts/compare_sharded.py --jobs 4 --stages study,serving,sensitivity,feasibility profile=smoke
    .venv/bin/python scripts/compare_sharded.py --compare ONE_DIR SHARDED_DIR  # compares two finished results folders

It runs the calibrate stage into <out>/one/ and every stage of `--stages` there as one process, copies the tables it
kept (calibration/ and serving/batch_cost-*.json) to <out>/jobs/, and runs each stage there as a Hydra multirun of N
jobs through hydra-submitit-launcher's local executor (`--launcher`) and the merge, all with
study.learning=per_block. The study's rakv-asd decisions are compared run by run (action, acceptance before and
after); every stage's outputs through rakv.experiments.shard_compare (the study's decisions, every served output's
tokens, the sensitivity parts' and the feasibility sweep's untimed columns). Exit status 0 when all are identical, 1
when one is not, 2 on bad input. The wall times are this machine's at this moment: with N jobs on fewer free cores
than N they show the overhead of jobs, not a cluster's speed-up.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rakv.experiments.shard_compare import COMPARED_STAGES, differences, stage_outputs  # noqa: E402
from rakv.runtime.run_layout import RESULTS_DIR, RunLayout  # noqa: E402

DECIDED = ["action", "alpha_before", "alpha_after"]  # what the controller chose and what it had learned


def rakv_asd_rows(results: Path) -> pd.DataFrame:
    path = RunLayout.of(results).study.runs
    if not path.exists():
        raise SystemExit(f"compare_sharded: error: {path} is missing (the study of {results} did not finish)")
    runs = pd.read_parquet(path)
    return runs[runs.kind == "strategy"].set_index("run_id").sort_index()


def differing(one: pd.DataFrame, sharded: pd.DataFrame) -> list[str]:
    """Run ids whose decision differs, or that one side lacks."""
    ids = sorted(set(one.index) | set(sharded.index))
    out = []
    for run_id in ids:
        if run_id not in one.index or run_id not in sharded.index:
            out.append(run_id)
        elif any(one.at[run_id, c] != sharded.at[run_id, c] for c in DECIDED):
            out.append(run_id)
    return out


def compare(one_dir: Path, sharded_dir: Path) -> int:
    one, sharded = rakv_asd_rows(one_dir), rakv_asd_rows(sharded_dir)
    if one.empty:
        print(f"compare_sharded: error: {one_dir} has no rakv-asd runs to compare", file=sys.stderr)
        return 2
    bad = differing(one, sharded)
    both = pd.concat([one, sharded])
    if "calibration_digest" not in both:
        both["calibration_digest"] = None
    tables = both.dropna(subset=["calibration_digest"]).groupby("configuration").calibration_digest.nunique()
    mixed = sorted(tables[tables > 1].index)
    one_table = "no: " + ", ".join(mixed) if mixed else "yes"
    print(f"compare_sharded: {len(one) - len(bad)} of {len(one)} rakv-asd decisions identical (action, alpha before "
          f"and after); one calibration table per configuration on both sides: {one_table}; "
          f"hosts: {', '.join(sorted(set(sharded.get('host', pd.Series(dtype=str)).dropna()))) or 'unrecorded'}")
    for run_id in bad[:10]:
        print(f"  differs: {run_id}")
    return 1 if bad or mixed else 0


def compare_stages(one_dir: Path, sharded_dir: Path, stages: list[str]) -> int:
    """Every stage's outputs (rakv.experiments.shard_compare), and the study's decisions run by run."""
    status = 0
    for name in stages:
        if name == "study":
            status = max(status, compare(one_dir, sharded_dir))
            continue
        one, other = stage_outputs(one_dir, name), stage_outputs(sharded_dir, name)
        if not one:
            print(f"compare_sharded: error: {one_dir} has no {name} outputs to compare", file=sys.stderr)
            return 2
        found = differences(one, other)
        rows = sum(len(frame) for frame in one.values())
        print(f"compare_sharded: {name}: {len(one) - len({line.split(':')[0] for line in found})} of {len(one)} "
              f"tables identical ({rows} rows: {', '.join(sorted(one))})")
        for line in found[:10]:
            print(f"  differs: {line}")
        status = max(status, 1 if found else 0)
    return status


def stage(name: str, overrides: list[str], *extra: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_stage.py"), name, *extra, *overrides])
    if done.returncode != 0:
        raise SystemExit(f"compare_sharded: error: the {name} stage failed (status {done.returncode}; see above)")
    return time.perf_counter() - start


def copy_tables(one: Path, sharded: Path) -> None:
    """The tables the one-process run kept so far, so that both sides decide under the same ones."""
    shutil.copytree(RunLayout.of(one).calibration_dir, RunLayout.of(sharded).calibration_dir, dirs_exist_ok=True)
    serving = RunLayout.of(sharded).serving.root
    for path in RunLayout.of(one).serving.root.glob("batch_cost-*.json"):
        serving.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, serving / path.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4, help="shards of the multirun (default 4)")
    parser.add_argument("--launcher", default="local", help="conf/hydra/launcher/ option (default local)")
    parser.add_argument("--stages", default="study",
                        help=f"comma-separated stages to run and compare, in order (of: {','.join(COMPARED_STAGES)})")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "compare_sharded", help="results folders")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("ONE", "SHARDED"),
                        help="only compare two finished results folders")
    args, overrides = parser.parse_known_args()
    stages = [name for name in args.stages.split(",") if name]
    unknown = [name for name in stages if name not in COMPARED_STAGES]
    if unknown or not stages:
        print(f"compare_sharded: error: --stages takes {', '.join(COMPARED_STAGES)}; got {args.stages!r}",
              file=sys.stderr)
        return 2
    if args.compare:
        return compare_stages(*args.compare, stages)
    if args.jobs < 2:
        print("compare_sharded: error: --jobs must be >= 2", file=sys.stderr)
        return 2
    if any(o.startswith(("results_dir=", "study.")) for o in overrides):
        print("compare_sharded: error: results_dir and study.* are set by this script", file=sys.stderr)
        return 2
    one, sharded = args.out / "one", args.out / "jobs"
    for folder in (one, sharded):
        if folder.exists():
            shutil.rmtree(folder)
    common = [*overrides, "study.learning=per_block"]
    stage("calibrate", [*common, f"results_dir={one}"])
    status = 0
    for name in stages:  # each stage both ways, then its comparison (printed as soon as it is known)
        one_s = stage(name, [*common, f"results_dir={one}"])
        copy_tables(one, sharded)  # one table per configuration for both sides (feasibility's kept by its stage)
        jobs = [*common, f"results_dir={sharded}", f"study.num_shards={args.jobs}"]
        shards_s = stage(name, [*jobs, f"study.shard_index=range({args.jobs})", f"hydra/launcher={args.launcher}",
                                f"hydra.sweep.dir={args.out / 'multirun' / name}"], "-m")
        merge_s = stage(name, [*jobs, "study.merge_only=true"])
        status = max(status, compare_stages(one, sharded, [name]))
        print(f"compare_sharded: {name} wall time: one process {one_s:.1f} s; {args.jobs} jobs "
              f"({args.launcher} launcher) {shards_s:.1f} s + merge {merge_s:.1f} s = "
              f"{(shards_s + merge_s) / one_s:.2f} x one process", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
