#!/usr/bin/env bash
# lm-evaluation-harness drives `rakv serve --http` through `local-completions` on the two tasks of conf/lm_eval/
# (a generation task with `until` stops, a multiple-choice log-likelihood one; their data in data/lm_eval/), then the
# same tasks through lm-eval's HF backend on the same fp32 weights, then scripts/compare_lm_eval.py: every choice's
# log-likelihood within 1e-3 of the HF backend's, every generated answer equal to batch-one AR's.
#   scripts/run_lm_eval.sh [LIMIT]     (LIMIT: documents per task, default all; OUT=results/lm_eval, PORT=8391)
#   SHIP=data/lm_eval/run scripts/run_lm_eval.sh 12     (the shipped run: comparison.json and lm-eval's two results)
# Offline: the tasks read local files, the hub is never asked (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE).
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=${1:-}
OUT=${OUT:-results/lm_eval}
PORT=${PORT:-8391}
STRATEGY=${STRATEGY:-joint-k2}  # the server speculates: a stop falls inside accepted runs too
VENV=${LM_EVAL_VENV:-.venv-lm-eval}
WEIGHTS=${LM_EVAL_WEIGHTS:-results/peer/smollm2-fp32}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
./scripts/setup_lm_eval.sh
rm -rf "$OUT/served" "$OUT/hf"
mkdir -p "$OUT"
limit=()
[ -n "$LIMIT" ] && limit=(--limit "$LIMIT")
tasks=rakv_humaneval_gen,rakv_wikitext_mc

.venv/bin/rakv serve --pair smollm2 --http "127.0.0.1:$PORT" --served-model-name smollm2 --strategy "$STRATEGY" \
    --no-calibrate --quiet > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $server 2>/dev/null || { echo "run_lm_eval: the server stopped (see $OUT/server.log)"; exit 1; }
    sleep 1
done
echo "run_lm_eval: rakv serve --http up on port $PORT (strategy $STRATEGY); lm-eval local-completions ..."
"$VENV/bin/lm_eval" --model local-completions --tasks "$tasks" --include_path conf/lm_eval "${limit[@]}" \
    --model_args "model=smollm2,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=huggingface,tokenizer=$WEIGHTS,num_concurrent=1,max_retries=1,tokenized_requests=True" \
    --batch_size 4 --output_path "$OUT/served" --log_samples > "$OUT/served.log" 2>&1
tail -n 8 "$OUT/served.log"
kill -TERM $server; wait $server 2>/dev/null || true; trap - EXIT
echo "run_lm_eval: lm-eval hf on $WEIGHTS (fp32) ..."
"$VENV/bin/lm_eval" --model hf --model_args "pretrained=$WEIGHTS,dtype=float32" --device cpu --batch_size 1 \
    --tasks "$tasks" --include_path conf/lm_eval "${limit[@]}" --output_path "$OUT/hf" --log_samples \
    > "$OUT/hf.log" 2>&1
tail -n 8 "$OUT/hf.log"
.venv/bin/python scripts/compare_lm_eval.py "$OUT/served" "$OUT/hf" "$OUT/comparison.json"
if [ -n "${SHIP:-}" ]; then
    mkdir -p "$SHIP"
    cp "$OUT/comparison.json" "$SHIP/comparison.json"
    cp "$(ls "$OUT"/served/*/results_*.json | tail -n 1)" "$SHIP/results_served.json"
    cp "$(ls "$OUT"/hf/*/results_*.json | tail -n 1)" "$SHIP/results_hf.json"
    echo "run_lm_eval: shipped in $SHIP"
fi
