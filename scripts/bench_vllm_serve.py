"""rakv serve --http and vLLM's OpenAI server driven by the same client, vLLM's own `benchmark_serving`
(`vllm bench serve`, from the peer's venv): the same prompts, the same seeded Poisson arrivals, the same metrics.

    scripts/setup_vllm_peer.sh            # once: .venv-vllm and the fp32 weights
    .venv/bin/python scripts/bench_vllm_serve.py [--rates 0.5 1] [--requests 32] [--new-tokens 32] [--out DIR]

Workloads (prompts from `rakv trace`'s generator, token counts as each engine's tokenizer gives them: the same):
- `plain` at each Poisson --rate: HumanEval prompts of --prompt-words words;
- `shared-prefix` at the first rate: --groups system prompts shared round-robin (prefix caching's case: vLLM
  caches blocks of 16 tokens, rakv's store hits at token granularity).
Both servers run with their defaults (vLLM's prefix caching is on by default, as rakv's store is), --max-batch /
max_num_seqs 16, greedy, --ignore-eos; vLLM's engine starts once (torch.compile; --vllm-eager skips it). Printed per
workload: completed / failed, output tok/s, TTFT / TPOT / ITL p50 and p99 (ms), prefix hit rate (ours: summary.json;
vLLM: its /metrics counters), and how many requests' outputs are equal token for token with the first divergences.
The client's JSON results are kept in --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rakv.bench.peers import agreement
from rakv.bench.vllm_serve import machine, run_engine, vllm_version, workloads
from rakv.runtime.errors import RakvError


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--strategy", default="ar", help="rakv serve's --strategy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm-venv", default=".venv-vllm")
    parser.add_argument("--vllm-weights", default="results/peer/smollm2-fp32")
    parser.add_argument("--vllm-eager", action="store_true")
    parser.add_argument("--vllm-threads", type=int, default=None, metavar="N",
                        help="OMP_NUM_THREADS for vLLM's server (default: its own choice, which on 2 cores is 1)")
    parser.add_argument("--out", default="results/peer/bench_vllm_serve")
    return parser.parse_args()


def text_agreement(ours: dict, theirs: dict, tokenizer) -> tuple[int, list[str]]:
    """Requests whose generated texts are equal, and where the others first differ (by token, re-tokenised)."""
    pairs = list(zip(ours["generated_texts"], theirs["generated_texts"]))
    return agreement({f"request {i}": a for i, (a, _) in enumerate(pairs)},
                     {f"request {i}": b for i, (_, b) in enumerate(pairs)}, tokenizer.encode)


def print_table(args, loads: dict, results: dict, tokenizer) -> dict:
    """The table per workload and engine, and each workload's agreement (returned)."""
    print(f"{args.requests} requests x {args.new_tokens} new tokens per workload, Poisson arrivals (seed {args.seed}), "
          f"greedy; client: vLLM's benchmark_serving; rakv --strategy {args.strategy}")
    print(f"{'workload':<20} {'engine':<5} {'done':>4} {'fail':>4} {'tok/s':>6} {'TTFT p50':>8} {'p99':>6} "
          f"{'TPOT p50':>8} {'p99':>6} {'ITL p50':>7} {'p99':>6} {'hit rate':>8}")
    agreed = {}
    for label in loads:
        for engine in ("rakv", "vllm"):
            r = results[engine][label]
            hit = "-" if r.get("prefix_hit_rate") is None else f"{r['prefix_hit_rate']:.1%}"
            print(f"{label:<20} {engine:<5} {r['completed']:>4} {r['failed']:>4} {r['output_throughput']:6.1f} "
                  f"{r['p50_ttft_ms']:8.0f} {r['p99_ttft_ms']:6.0f} {r['p50_tpot_ms']:8.0f} {r['p99_tpot_ms']:6.0f} "
                  f"{r['p50_itl_ms']:7.0f} {r['p99_itl_ms']:6.0f} {hit:>8}")
        same, divergences = text_agreement(results["rakv"][label], results["vllm"][label], tokenizer)
        agreed[label] = {"equal": same, "requests": args.requests, "divergences": divergences}
        print(f"{label:<20} outputs equal on {same} of {args.requests}"
              + (f"; first divergences: {', '.join(divergences[:4])}" if divergences else ""))
    return agreed


def main() -> int:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        if not Path(args.vllm_venv, "bin", "python").exists() or not Path(args.vllm_weights, "config.json").exists():
            raise RakvError("the vLLM peer is not set up: run scripts/setup_vllm_peer.sh")
        loads = workloads(args)
        results = {"rakv": run_engine("rakv", 8311, loads, args, out), "vllm": run_engine("vllm", 8312, loads, args,
                                                                                          out)}
    except RakvError as exc:
        print(f"bench_vllm_serve: error: {exc}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    agreed = print_table(args, loads, results, AutoTokenizer.from_pretrained(args.vllm_weights))
    summary = {"engines": {e: {k: {m: v for m, v in r.items() if not isinstance(v, list)} for k, r in res.items()}
                           for e, res in results.items()},
               "agreement": agreed, "workloads": {label: rate for label, (_, rate) in loads.items()},
               "requests": args.requests, "new_tokens": args.new_tokens, "strategy": args.strategy,
               "vllm": vllm_version(args), "machine": machine()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
