#!/usr/bin/env bash
# The main job: set up .venv, then run the pipeline stage by stage (each stage resumes where it stopped).
#   ./reproduce.sh [stages=calibrate,study,...] [Hydra overrides...]
#   ./reproduce.sh                                   # profile=offline: SmolLM2 pairs, every stage
#   ./reproduce.sh profile=smoke                     # tiny random pair, a few minutes
#   ./reproduce.sh profile=offline controller.k_set=[0,2,4] cache.budget_mib=64
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
profile=offline
for arg in "${overrides[@]+"${overrides[@]}"}"; do
    case "$arg" in profile=*) profile=${arg#profile=} ;; esac
done

start=$(date +%s)
for stage in "${stages[@]}"; do
    case " ${ALL_STAGES[*]} " in *" $stage "*) ;; *)
        echo "reproduce: unknown stage '$stage' (stages: ${ALL_STAGES[*]})" >&2; exit 2 ;;
    esac
    script="scripts/run_${stage}.py"
    if [ ! -f "$script" ]; then
        echo "reproduce: stage '$stage' is not built yet ($script is missing); stopping here" >&2
        exit 3
    fi
    echo "reproduce: stage $stage ($(date +%H:%M:%S))"
    if ! .venv/bin/python "$script" "${overrides[@]+"${overrides[@]}"}"; then
        echo "reproduce: stage '$stage' failed; fix the cause and rerun the same command to resume" >&2
        exit 1
    fi
done
echo "reproduce: done in $(( $(date +%s) - start )) s. Outputs:"
echo "  results/$profile/calibration/   cost tables used (one per configuration)"
echo "  results/$profile/study/         runs.parquet (one row per timed run), metadata.json, plan.txt"
echo "  results/$profile/sensitivity/   alpha_model, crossover, controlled, cache_budget, output_length, prompt_length, reuse_rate, beta_lambda (.parquet)"
echo "  results/$profile/feasibility/   summary.json (+ runs and gap.parquet when the weights were available)"
if [ -f scripts/run_analysis.py ]; then
    echo "  results/$profile/summary.json   every statistic;  figures/ (PNG + PDF);  paper/generated/ (macros, tables);  paper/main.pdf"
fi
