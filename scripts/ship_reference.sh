#!/usr/bin/env bash
# Make a finished offline run the shipped reference run: copy its raw tables into data/reference/<profile>/
# (journals, locks, executed notebooks and derived files stay out), then regenerate everything derived from
# them in place: summary.json, ablation.csv, figures/<profile>/, paper/generated/<profile>/, the PDF and the
# README's claims table. Run it whenever the measurements change (a faster engine, a new stage), in the same
# change, from a run of committed code on a clean clone with nothing else running:
#   git clone . /tmp/run && (cd /tmp/run && ./reproduce.sh) && ./scripts/ship_reference.sh /tmp/run/results/offline
# A second full run of the same commit (another clean clone, another process) ships beside it under NAME, analysed
# but without a paper of its own; the reference's paper then reads it (prose_machines.run_to_run), so ship it first:
#   ./scripts/ship_reference.sh /tmp/run2/results/offline offline offline-rerun
#   ./scripts/ship_reference.sh /tmp/run/results/offline
set -euo pipefail
cd "$(dirname "$0")/.."
source_dir=${1:?usage: scripts/ship_reference.sh RESULTS_DIR [PROFILE] [NAME]}
profile=${2:-offline}
name=${3:-$profile}
stages=analysis,paper
[ "$name" = "$profile" ] || stages=analysis
[ -f "$source_dir/study/runs.parquet" ] || { echo "ship_reference: $source_dir/study/runs.parquet is missing" >&2; exit 2; }
for meta in "$source_dir/study/metadata.json" "$source_dir/serving/metadata.json" "$source_dir/sampling/design.json"; do
    if [ -f "$meta" ] && grep -q -- '-dirty"' "$meta"; then
        echo "ship_reference: $meta says it was measured from uncommitted code; measure committed code" >&2
        exit 2
    fi
done
target="data/reference/$name"
rm -rf "$target"
mkdir -p "$target"
# the serving study: its tables, traces (inputs, kept as JSONL) and batch cost table; each run's own folder
# (cells/) stays out, its requests and iterations being in the tables
(cd "$source_dir" && find . -type f \( ! -name '*.jsonl' -o -path './serving/traces/*' \) ! -name '.lock*' \
    ! -path './notebooks/*' ! -path './serving/cells/*' \
    ! -name summary.json ! -name ablation.csv ! -name compare_reference.txt ! -name '.*.tmp*' -print0) |
    while IFS= read -r -d '' file; do
        mkdir -p "$target/$(dirname "$file")"
        cp "$source_dir/$file" "$target/$file"
    done
# the feasibility stage's own summary is a raw table (the analysis reads it), unlike the study's summary.json
[ ! -f "$source_dir/feasibility/summary.json" ] || cp "$source_dir/feasibility/summary.json" "$target/feasibility/"
./reproduce.sh "stages=$stages" "profile=$profile" "results_dir=$target"
echo "ship_reference: $target holds $(du -sh "$target" | cut -f1) ($(find "$target" -type f | wc -l) files)"
# the shipped reruns and other machines' runs against the reference they sit beside
[ "$name" != "$profile" ] || ./scripts/write_compare_files.sh "$profile"
