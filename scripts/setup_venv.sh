#!/usr/bin/env bash
# Create .venv when missing and install the project into it (idempotent; reinstalls when the pins change).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.rakv-installed
want=$(cat pyproject.toml requirements-nodeps.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing rakv and its pinned dependencies into .venv (first time: a few minutes)"
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[test,dev]'  # the tests' and the linter's extras too
    .venv/bin/python -m pip install --quiet --no-deps -r requirements-nodeps.txt
    echo "$want" > "$stamp"
fi
