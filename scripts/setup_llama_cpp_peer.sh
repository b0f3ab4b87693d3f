#!/usr/bin/env bash
# The optional llama.cpp peer of bench_engine.py, never part of the default set-up or CI: llama-cpp-python (the pin
# of pyproject's `peers` extra) built from source into a venv of its own (.venv-llama, or $LLAMA_VENV) with the vector
# extensions named one by one from /proc/cpuinfo and GGML_NATIVE off. A CPU flag list is not a grant: on a VM that
# lists amx_tile, GGML_NATIVE=ON built AMX kernels that died with SIGILL at the first token (docs/engine.md,
# "Precision"), so every GGML_AMX_* is off. --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS, and a cached wheel
# built with other flags would be reused. Idempotent (a stamp records the pin and the flags it was built with).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${LLAMA_VENV:-.venv-llama}
PIN=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml | head -1)
[ -n "$PIN" ] || { echo "setup_llama_cpp_peer: no llama-cpp-python pin in pyproject.toml's peers extra" >&2; exit 1; }
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
for need in avx2 fma f16c; do
    has "$need" || { echo "setup_llama_cpp_peer: this CPU lacks $need (the peer's minimum build)" >&2; exit 1; }
done
args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
args+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }
args+=" -DGGML_AVX512=$(onoff avx512f) -DGGML_AVX512_VNNI=$(onoff avx512_vnni)"
args+=" -DGGML_AVX512_BF16=$(onoff avx512_bf16) -DGGML_AVX_VNNI=$(onoff avx_vnni)"
stamp="$VENV/.rakv-peer-installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "$PIN $args" ]; then
    echo "setup_llama_cpp_peer: building $PIN into $VENV with CMAKE_ARGS=\"$args\" (10-30 minutes)"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
        "$VENV/bin/python" -m pip install --no-cache-dir --force-reinstall --no-binary llama-cpp-python "$PIN"
    "$VENV/bin/python" -c "import llama_cpp; print('setup_llama_cpp_peer: llama_cpp', llama_cpp.__version__)"
    echo "$PIN $args" > "$stamp"
fi
echo "setup_llama_cpp_peer: $VENV/bin/python has $PIN ($(cat "$stamp"))"
