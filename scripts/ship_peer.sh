#!/usr/bin/env bash
# Ship the vLLM peer's results of this machine (results/peer/: bench_vllm_serve.py's summary, bench_serving.py
# --out files under bench_serving/, tune_vllm.py's tune.json) as data/reference/peer/, which the paper's
# "Against vLLM" rows read when results/peer/ is absent, then render docs/peers.md's tables from the shipped copy.
set -euo pipefail
cd "$(dirname "$0")/.."
for part in bench_vllm_serve/summary.json tune_vllm/tune.json; do
    if [ -f "results/peer/$part" ]; then
        mkdir -p "data/reference/peer/$(dirname "$part")"
        cp "results/peer/$part" "data/reference/peer/$part"
        echo "ship_peer: data/reference/peer/$part"
    fi
done
if compgen -G "results/peer/bench_serving/*.json" > /dev/null; then
    rm -rf data/reference/peer/bench_serving
    mkdir -p data/reference/peer/bench_serving
    cp results/peer/bench_serving/*.json data/reference/peer/bench_serving/
    echo "ship_peer: data/reference/peer/bench_serving/ ($(ls results/peer/bench_serving/*.json | wc -l) files)"
fi
.venv/bin/python scripts/peer_tables.py
