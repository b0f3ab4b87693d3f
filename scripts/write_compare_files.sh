#!/usr/bin/env bash
# Every shipped run compared with the shipped reference run of its profile, into its compare_reference.txt: the
# reference's reruns (data/reference/<profile>-rerun*/) and the other machines' runs (data/reference/other-machines/*/).
# scripts/ship_reference.sh runs it after shipping a reference; tests/test_reference_run.py fails when a file is stale.
#   ./scripts/write_compare_files.sh [PROFILE]
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-offline}
reference="data/reference/$profile"
for run in "$reference"-rerun* data/reference/other-machines/*/; do
    run=${run%/}
    [ -f "$run/summary.json" ] || continue
    set +e
    .venv/bin/python scripts/compare_runs.py "$reference" "$run" > "$run/compare_reference.txt"
    rc=$?
    set -e
    [ "$rc" -le 1 ] || { echo "write_compare_files: $run: the comparison could not read a summary" >&2; exit 2; }
    echo "write_compare_files: $run/compare_reference.txt ($(grep -c . "$run/compare_reference.txt") lines, exit $rc)"
done
