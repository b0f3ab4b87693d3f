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

# Each stage's wall time is kept in results/<profile>/stage_times.tsv: printed as the estimate before the
# stage runs again, and as a table at the end.
times_file="results/$profile/stage_times.tsv"
last_time() { [ -f "$times_file" ] || return 0; awk -F'\t' -v s="$1" '$1 == s {t = $2} END {if (t != "") print t}' "$times_file"; }
start=$(date +%s)
summary=()
for stage in "${stages[@]}"; do
    case " ${ALL_STAGES[*]} " in *" $stage "*) ;; *)
        echo "reproduce: unknown stage '$stage' (stages: ${ALL_STAGES[*]})" >&2; exit 2 ;;
    esac
done
for stage in "${stages[@]}"; do
    script="scripts/run_${stage}.py"
    previous=$(last_time "$stage")
    echo "reproduce: stage $stage ($(date +%H:%M:%S))${previous:+; it took ${previous} s last time}"
    stage_start=$(date +%s)
    if ! .venv/bin/python "$script" "${overrides[@]+"${overrides[@]}"}"; then
        echo "reproduce: stage '$stage' failed; fix the cause and rerun the same command to resume" >&2
        exit 1
    fi
    took=$(( $(date +%s) - stage_start ))
    mkdir -p "results/$profile"
    printf '%s\t%s\t%s\n' "$stage" "$took" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$times_file"
    summary+=("$(printf '  %-12s %5d s' "$stage" "$took")")
done
echo "reproduce: time per stage"
printf '%s\n' "${summary[@]}"
echo "reproduce: done in $(( $(date +%s) - start )) s. Outputs:"
echo "  results/$profile/calibration/   cost tables used (one per configuration)"
echo "  results/$profile/study/         runs.parquet (one row per timed run), metadata.json, plan.txt"
echo "  results/$profile/sensitivity/   alpha_model, crossover, controlled, cache_budget, output_length, prompt_length, reuse_rate, beta_lambda (.parquet)"
echo "  results/$profile/feasibility/   summary.json; gap.parquet with the weights, else break_even.parquet and controlled.parquet (twins)"
if [ -f scripts/run_analysis.py ]; then
    echo "  results/$profile/summary.json   every statistic;  figures/$profile/ (PNG + PDF);  paper/generated/$profile/ (macros, tables);  paper/build/$profile/main.pdf (with LaTeX)"
fi
