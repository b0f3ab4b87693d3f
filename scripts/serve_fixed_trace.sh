#!/usr/bin/env bash
# Serve one all-at-once trace on the tiny pair under five configurations (speculation with the draft under a K/V
# budget that preempts, the no-chunking baseline, rakv-asd with prompt lookup, the load-aware policy with prefix-keyed
# acceptance, sampled speculation), so that two versions of the code can be compared with
# scripts/compare_served.py: with every request arriving at 0 s, which requests share an iteration does not depend
# on the clock, so requests.jsonl and iterations.jsonl are the same line for line but for their times.
#   scripts/serve_fixed_trace.sh OUT        (about a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/serve_fixed_trace.sh OUT}
mkdir -p "$out"
.venv/bin/rakv trace --out "$out/trace.jsonl" --kind shared-prefix --requests 16 --groups 2 --system-words 60 \
    --max-new-tokens 12 --prompt-words 30 --seed 3 > /dev/null
.venv/bin/python - "$out" <<'PY'
import json, sys
path = f"{sys.argv[1]}/trace.jsonl"
lines = [dict(json.loads(line), arrival_s=0) for line in open(path)]
lines += [dict(lines[0], id="rep0"), dict(lines[1], id="rep1")]  # exact repeats: store hits with stored logits
open(path, "w").write("".join(json.dumps(line) + "\n" for line in lines))
PY
run() { name=$1; shift; .venv/bin/rakv serve --pair tiny --trace "$out/trace.jsonl" --out "$out/$name" --ignore-eos \
    --quiet "$@" > /dev/null; }
run joint-k2-preempting --strategy joint-k2 --token-budget 24 --kv-budget-mib 1.6
run ar-no-chunking --strategy ar --no-chunking --max-batch 4
run rakv-asd-lookup --strategy rakv-asd --proposer prompt-lookup --token-budget 32
run load-aware-prefix --strategy joint-k4 --proposer prompt-lookup --speculation load-aware --acceptance prefix
run spec-k2-sampled --strategy spec-k2 --temperature 0.8 --top-p 0.9 --seed 7 --max-batch 3
echo "serve_fixed_trace: $out/{joint-k2-preempting,ar-no-chunking,rakv-asd-lookup,load-aware-prefix,spec-k2-sampled}"
