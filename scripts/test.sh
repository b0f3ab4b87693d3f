#!/usr/bin/env bash
# The test command of the README: sets up .venv when missing, then runs pytest on every core (pytest-xdist; a test
# file stays on one worker, so that its module fixtures load once) — extra args pass through and win (-n 0: serial).
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh || exit 1
.venv/bin/python -m pytest -n "${RAKV_TEST_WORKERS:-auto}" --dist loadfile "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests for these arguments; nothing failed"
    exit 0
fi
exit "$rc"
