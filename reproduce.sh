#!/usr/bin/env bash
# The main job: set up .venv, then run the pipeline stage by stage.
#   ./reproduce.sh [STAGES=calibrate,study,...] [hydra overrides, e.g. profile=smoke cache.budget_mib=64]
# Every stage is resumable; a stage that is not built yet stops the run with a clear message.
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup_venv.sh

ALL_STAGES=(calibrate study sensitivity feasibility analysis paper)
stages=("${ALL_STAGES[@]}")
overrides=()
for arg in "$@"; do
    case "$arg" in
        stages=*) IFS=, read -r -a stages <<< "${arg#stages=}" ;;
        *) overrides+=("$arg") ;;
    esac
done

for stage in "${stages[@]}"; do
    script="scripts/stage_${stage}.py"
    case " ${ALL_STAGES[*]} " in *" $stage "*) ;; *)
        echo "reproduce: unknown stage '$stage' (stages: ${ALL_STAGES[*]})" >&2; exit 2 ;;
    esac
    if [ ! -f "$script" ]; then
        echo "reproduce: stage '$stage' is not built yet ($script is missing); stopping here" >&2
        exit 3
    fi
    echo "reproduce: stage $stage"
    .venv/bin/python "$script" "${overrides[@]}"
done
