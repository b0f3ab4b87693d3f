#!/usr/bin/env bash
# The test command of the README: sets up .venv when missing, then runs pytest on every core (pytest-xdist; a test
# file stays on one worker, so that its module fixtures load once). Without --all it leaves out the tests marked
# `heavy` (each 20 s or more on a 2-core machine: the pipeline end to end, the real model against transformers, the
# distribution tests; pyproject.toml's markers), so that a fresh clone's check stays within minutes; `--all` (CI,
# .ci/run) runs every test. Extra args pass through and win (-n 0: serial; -m '...': another selection).
set -uo pipefail
cd "$(dirname "$0")/.."
selection=(-m "not heavy")
if [ "${1:-}" = "--all" ]; then
    selection=()
    shift
fi
./scripts/setup_venv.sh || exit 1
.venv/bin/python -m pytest -n "${RAKV_TEST_WORKERS:-auto}" --dist loadfile "${selection[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests for these arguments; nothing failed"
    exit 0
fi
exit "$rc"
