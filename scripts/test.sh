#!/usr/bin/env bash
# The test command of the README: sets up .venv when missing, then runs pytest (extra args pass through).
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests for these arguments; nothing failed"
    exit 0
fi
exit "$rc"
