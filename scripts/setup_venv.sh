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
want=$( (cat pyproject.toml requirements-nodeps.txt requirements-lock.txt; echo "locked=${RAKV_LOCKED:-0}") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing rakv and its pinned dependencies into .venv (first time: a few minutes)"
    # pip byte-compiles what it installs (a third of a fresh set-up's time), and that is kept: where
    # PYTHONDONTWRITEBYTECODE is set (as on the shipped runs' machine) nothing imported later is ever cached, and every
    # process of the tests would compile torch's modules again (measured: without it the test command took 12.5 min)
    .venv/bin/python -m pip install --quiet --upgrade pip
    if [ "${RAKV_LOCKED:-0}" = 1 ]; then
        # the exact files of requirements-lock.txt (scripts/write_lock.py), each checked against its sha256
        .venv/bin/python -m pip install --quiet --require-hashes --no-deps -r requirements-lock.txt
        .venv/bin/python -m pip install --quiet --no-deps -e .
    fi
    # torch's CPU build on a machine without CUDA (PyPI's Linux x86-64 wheel of the pin is the multi-GB CUDA one);
    # a torch already installed that meets the pin is kept
    if ! .venv/bin/python -c "import torch" 2>/dev/null && ! command -v nvidia-smi >/dev/null 2>&1; then
        torch_pin=$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')
        # the CPU wheel from the configured indexes where they hold it (a local mirror), else PyTorch's CPU index
        # (its dependencies come with the project's install below)
        .venv/bin/python -m pip install --quiet --no-deps "${torch_pin}+cpu" 2>/dev/null \
            || .venv/bin/python -m pip install --quiet "$torch_pin" --index-url https://download.pytorch.org/whl/cpu
    fi
    .venv/bin/python -m pip install --quiet -e '.[test,dev]'  # the tests' and the linter's extras too
    .venv/bin/python -m pip install --quiet --no-deps -r requirements-nodeps.txt
    echo "$want" > "$stamp"
fi
