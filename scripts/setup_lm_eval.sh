#!/usr/bin/env bash
# lm-evaluation-harness in a venv of its own (.venv-lm-eval), never part of the default set-up or CI's tests:
#   1. .venv-lm-eval: lm-eval==0.4.13 from the package registry with its `api` (local-completions) and `hf` (the HF
#      backend the comparison runs) extras, on the project's own torch / transformers pins (the CPU torch on disk).
#   2. results/peer/smollm2-fp32: the smollm2 target's fp32 weights as a transformers folder (scripts/peer_weights.py,
#      shared with the vLLM peer): lm-eval's HF backend loads it, and local-completions reads its tokenizer.
# Idempotent. scripts/run_lm_eval.sh runs the evaluation; tests/test_lm_eval.py runs a small slice when this exists.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${LM_EVAL_VENV:-.venv-lm-eval}
PINS="lm-eval[api,hf]==0.4.13 torch==2.13.0 transformers==5.24.0 accelerate==1.15.0"
stamp="$VENV/.rakv-lm-eval-installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "$PINS" ]; then
    echo "setup_lm_eval: installing $PINS into $VENV (several minutes)"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install --quiet $PINS
    "$VENV/bin/python" -c "import lm_eval, transformers, torch; print('setup_lm_eval: lm_eval', \
lm_eval.__version__ if hasattr(lm_eval, '__version__') else '0.4.13', 'transformers', transformers.__version__, \
'torch', torch.__version__)"
    echo "$PINS" > "$stamp"
fi
WEIGHTS=${LM_EVAL_WEIGHTS:-results/peer/smollm2-fp32}
if [ ! -f "$WEIGHTS/config.json" ]; then
    [ -x .venv/bin/python ] || ./scripts/setup_venv.sh
    .venv/bin/python scripts/peer_weights.py "$WEIGHTS"
fi
