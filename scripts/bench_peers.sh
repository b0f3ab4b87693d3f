#!/usr/bin/env bash
# Every vLLM peer measurement that ships (data/reference/peer/, docs/peers.md, the paper's "Against vLLM"), in one
# go, then shipped: run on a quiet machine after scripts/setup_vllm_peer.sh. About an hour on the 2-core reference
# machine (vLLM compiles its model at each engine start). tune_vllm.py is separate (scripts/tune_vllm.py --vllm-eager).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_vllm_peer.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
out=results/peer
rm -rf "$out/bench_serving" "$out/bench_vllm_serve"
# under load, through vLLM's own client: rakv, vLLM at its default threads and at 2 (rakv's count), 3 repeats
.venv/bin/python scripts/bench_vllm_serve.py --rates 1 2 --strategy kv-only --repeats 3 --vllm-threads 0 2 \
    --out "$out/bench_vllm_serve"
# all at once: greedy AR at vLLM's default threads and at 2; prompt lookup against vLLM's n-gram drafts
serving=(.venv/bin/python scripts/bench_serving.py --peer vllm --no-peer --repeats 3)
"${serving[@]}" --concurrency 1 4 8 16 --out "$out/bench_serving/ar.json"
"${serving[@]}" --concurrency 1 8 16 --vllm-threads 2 --out "$out/bench_serving/ar-2threads.json"
for k in 2 4; do
    "${serving[@]}" --concurrency 1 8 --strategy "spec-k$k" --proposer prompt-lookup --vllm-ngram "$k" \
        --out "$out/bench_serving/ngram-k$k.json"
done
./scripts/ship_peer.sh
