#!/usr/bin/env bash
# The stages that run as jobs, on SLURM without the Hydra launcher (docs/cluster.md): one calibration job, then per
# stage an array of N shards (each after the previous stage's merge: the sensitivity replay reads the merged study)
# and its merge (after every shard succeeded), every job `job.sbatch`.
#   SBATCH_PARTITION=gpu SBATCH_ACCOUNT=my-project scripts/slurm/submit.sh 8 profile=paper device=cuda
# Prints each job's id. The other stages (analysis, paper) run afterwards as one job each.
set -euo pipefail
cd "$(dirname "$0")/../.."
shards=${1:-}
case "$shards" in ''|*[!0-9]*|0|1) echo "submit.sh: usage: submit.sh SHARDS>=2 [Hydra overrides]" >&2; exit 2 ;; esac
shift
job=scripts/slurm/job.sbatch
previous=$(sbatch --parsable --export=ALL,RAKV_JOB=calibrate,RAKV_SHARDS="$shards" "$job" "$@")
echo "calibrate: job $previous"
for stage in study serving sensitivity sampling feasibility; do
    array=$(sbatch --parsable --dependency="afterok:$previous" --array="0-$((shards - 1))" \
        --export=ALL,RAKV_JOB=shard,RAKV_STAGE="$stage",RAKV_SHARDS="$shards" "$job" "$@")
    previous=$(sbatch --parsable --dependency="afterok:$array" \
        --export=ALL,RAKV_JOB=merge,RAKV_STAGE="$stage",RAKV_SHARDS="$shards" "$job" "$@")
    echo "$stage: shards $array (array 0-$((shards - 1))), merge $previous"
done
