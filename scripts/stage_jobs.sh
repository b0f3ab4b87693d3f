#!/usr/bin/env bash
# One stage as N jobs (docs/cluster.md), as `./reproduce.sh jobs=N` runs each of its job stages: the N shards as a
# Hydra multirun through hydra-submitit-launcher (`local`: subprocesses of this machine; `slurm` or a site launcher
# of conf/local/), each on the calibration job's tables, then the stage's merge (reads what the shards wrote and the
# tables only; loads no model).
#   scripts/stage_jobs.sh STAGE N LAUNCHER [Hydra overrides...]
#   scripts/stage_jobs.sh study 4 local profile=smoke study.learning=per_block
set -euo pipefail
if [ "$#" -lt 3 ]; then
    echo "usage: $0 STAGE N LAUNCHER [Hydra overrides...]" >&2
    exit 2
fi
stage=$1 jobs=$2 launcher=$3
shift 3
case "$jobs" in ''|*[!0-9]*|0|1) echo "stage_jobs: N must be a whole number >= 2, got '$jobs'" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
python=${RAKV_PYTHON:-$root/.venv/bin/python}
"$python" "$root/scripts/run_stage.py" "$stage" -m "hydra/launcher=$launcher" "$@" \
    "study.num_shards=$jobs" "study.shard_index=range($jobs)"
"$python" "$root/scripts/run_stage.py" "$stage" "$@" "study.num_shards=$jobs" study.merge_only=true
