#!/usr/bin/env bash
# Ship the vLLM peer's results of this machine (results/peer/: bench_vllm_serve.py's summary, tune_vllm.py's
# tune.json) as data/reference/peer/, which the paper's "Against vLLM" rows read when results/peer/ is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
for part in bench_vllm_serve/summary.json tune_vllm/tune.json; do
    if [ -f "results/peer/$part" ]; then
        mkdir -p "data/reference/peer/$(dirname "$part")"
        cp "results/peer/$part" "data/reference/peer/$part"
        echo "ship_peer: data/reference/peer/$part"
    fi
done
