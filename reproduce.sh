#!/usr/bin/env bash
# The main job: set up .venv, then run the pipeline stage by stage (each stage resumes where it stopped).
#   ./reproduce.sh [stages=calibrate,study,...] [Hydra overrides...]
#   ./reproduce.sh                                   # profile=offline: SmolLM2 pairs, every stage
#   ./reproduce.sh profile=smoke                     # tiny random pair, a few minutes
#   ./reproduce.sh profile=offline controller.k_set=[0,2,4] cache.budget_mib=64
#   ./reproduce.sh profile=smoke jobs=4              # every measuring stage after calibrate as 4 jobs each
# jobs=N [launcher=local|slurm|<conf/local site>]: the study, serving, sensitivity, sampling and feasibility stages run as N
# shards through hydra-submitit-launcher (local: subprocesses of this machine), each on the calibrate stage's tables
# (the calibrate stage then also keeps the feasibility pair's), then a merge that loads no model (docs/cluster.md);
# study.learning=per_block is then set for every stage, so the decisions are those of a one-process run with it.
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup_venv.sh

# the stages in order, as rakv.experiments.stages declares them (a cheap import: no torch)
stage_list=$(.venv/bin/python -m rakv.experiments.stages --list)
read -r -a ALL_STAGES <<< "$stage_list"
stages=("${ALL_STAGES[@]}")
overrides=()
jobs=1
launcher=local
for arg in "$@"; do
    case "$arg" in
        stages=*) IFS=, read -r -a stages <<< "${arg#stages=}" ;;
        jobs=*) jobs=${arg#jobs=} ;;
        launcher=*) launcher=${arg#launcher=} ;;
        *) overrides+=("$arg") ;;
    esac
done
profile=offline
results_dir=
for arg in "${overrides[@]+"${overrides[@]}"}"; do
    case "$arg" in
        profile=*) profile=${arg#profile=} ;;
        results_dir=*) results_dir=${arg#results_dir=} ;;
    esac
done
results_dir=${results_dir:-results/$profile}
case "$jobs" in ''|*[!0-9]*|0) echo "reproduce: jobs must be a whole number >= 1, got '$jobs'" >&2; exit 2 ;; esac
if [ "$jobs" -gt 1 ]; then
    case " ${overrides[*]+"${overrides[*]}"} " in *" study.learning="*) ;; *) overrides+=(study.learning=per_block) ;; esac
fi
# the stages that run as jobs with jobs=N (the others run as one job each)
JOB_STAGES="study serving sensitivity sampling feasibility"
# a stage as `jobs` shards of a Hydra multirun, then the merge (reads what the shards wrote and the tables only):
# scripts/stage_jobs.sh, which tests/test_reproduce_jobs.py runs
stage_jobs() {
    ./scripts/stage_jobs.sh "$1" "$jobs" "$launcher" "${overrides[@]+"${overrides[@]}"}"
}

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
    previous=$(last_time "$stage")
    echo "reproduce: stage $stage ($(date +%H:%M:%S))${previous:+; it took ${previous} s last time}"
    stage_start=$(date +%s)
    if [ "$jobs" -gt 1 ] && case " $JOB_STAGES " in *" $stage "*) true ;; *) false ;; esac; then
        run=(stage_jobs "$stage")
    elif [ "$jobs" -gt 1 ] && [ "$stage" = calibrate ]; then  # the calibration job of the stages run as jobs
        run=(.venv/bin/python scripts/run_stage.py calibrate "${overrides[@]+"${overrides[@]}"}" "study.num_shards=$jobs")
    else
        run=(.venv/bin/python scripts/run_stage.py "$stage" "${overrides[@]+"${overrides[@]}"}")
    fi
    if ! "${run[@]}"; then
        echo "reproduce: stage '$stage' failed; fix the cause and rerun the same command to resume" >&2
        exit 1
    fi
    if [ "$stage" = calibrate ] && [ -d "data/reference/$profile/calibration" ]; then
        # what this machine's calibration predicts for the headline comparisons, before the study measures them
        .venv/bin/python scripts/predict_headlines.py "$results_dir" --reference "data/reference/$profile" \
            || echo "reproduce: no prediction from this calibration (see above)" >&2
    fi
    took=$(( $(date +%s) - stage_start ))
    mkdir -p "results/$profile"
    printf '%s\t%s\t%s\n' "$stage" "$took" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$times_file"
    summary+=("$(printf '  %-12s %5d s' "$stage" "$took")")
done
echo "reproduce: time per stage"
printf '%s\n' "${summary[@]}"
echo "reproduce: done in $(( $(date +%s) - start )) s. Outputs:"
echo "  $results_dir/calibration/   cost tables used (one per configuration)"
echo "  $results_dir/study/         runs.parquet (one row per timed run), metadata.json, plan.txt"
echo "  $results_dir/serving/     requests.parquet, cells.parquet, iterations.parquet (one row per request / run / iteration), traces/, plan.txt"
echo "  $results_dir/sensitivity/   alpha_model, crossover, controlled, cache_budget, output_length, prompt_length, reuse_rate, beta_lambda (.parquet)"
echo "  $results_dir/feasibility/   summary.json; gap.parquet with the weights, else break_even.parquet and controlled.parquet (twins)"
echo "  $results_dir/summary.json   every statistic;  figures/$(basename "$results_dir")/ (PNG + PDF);  paper/generated/$(basename "$results_dir")/ (macros, tables);  paper/build/$(basename "$results_dir")/main.pdf (with LaTeX)"

# A fresh run against the shipped reference run of its profile (data/reference/<profile>/): how many headline
# statistics fall outside the reference's 95 % CIs, which, and both machines. Reported, never a failure: another
# machine is expected to differ, and even the same one moves a little between runs.
reference="data/reference/$profile"
case "$results_dir" in *'$'*) exit 0 ;; esac   # an interpolated results_dir: compare by hand (README)
if [ -f "$reference/summary.json" ] && [ -f "$results_dir/summary.json" ] \
        && [ "$(realpath "$results_dir")" != "$(realpath "$reference")" ]; then
    report="$results_dir/compare_reference.txt"
    set +e
    .venv/bin/python scripts/compare_runs.py "$reference" "$results_dir" > "$report"
    rc=$?
    set -e
    echo "reproduce: this run against the shipped reference run ($reference); the full table is in $report"
    grep '^compare_runs:' "$report" | sed 's/^compare_runs:/ /'
    [ "$rc" -le 1 ] || echo "reproduce: the comparison could not read a summary (see $report)" >&2
    echo "reproduce: this machine's calibration's prediction of the headline comparisons beside what its study measured"
    .venv/bin/python scripts/predict_headlines.py "$results_dir" --reference "$reference" | grep -v '^ *$' | tail -n 12 \
        || true
fi
