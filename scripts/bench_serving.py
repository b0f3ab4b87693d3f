"""Serving benchmark: output tokens/s at several concurrencies, side by side in one run on the same requests.

    .venv/bin/python scripts/bench_serving.py [--pair smollm2] [--requests 16] [--new-tokens 32]
        [--concurrency 1 4 8 16] [--strategy ar] [--overload 1000] [--json] [--out FILE.json]

Every request arrives at the start; concurrency c is `rakv serve`'s --max-batch c (continuous batching refills a
finished request's place at once). Printed per c, each a median of `--repeats` runs:
- ours: output tokens/s through rakv.serving (the scheduler's share of the iteration time, mean batch rows);
- sequential: the same requests one after another through the batch-one engine (`Engine.run`), same strategy;
- transformers: `generate` on batches of c left-padded prompts (greedy, exactly --new-tokens each), on a second
  copy of the pair loaded with stock kernels (transformers as shipped);
- the ratios ours / sequential (goals: >= 5 at 8, >= 8 at 16) beside Amdahl's estimate (decode rows free beside
  the first, prefill unbatched, from the sequential run's share of time before first tokens), ours / transformers
  (goal at 8: >= 1.5), and whether every served output equals the request's output alone;
- the machine's bound for the trace at each c (rakv.bench.roofline.trace_bound: prefill FLOPs at the FMA peak
  measured here, then each decode step's weights and K/V at the measured streaming bandwidth) and ours as a
  fraction of it (goal >= 60 % at 8 and 16); c = 16 / c = 8 (goal >= 1.2) judged met, missed, or out of reach at
  this baseline (the bound at c = 16 over ours at c = 8 itself below the goal: rakv.bench.roofline.goal_verdict),
  the bound's own ratio beside as context;
  a decode step of 1-32 requests by kernel beside its floor (CPU).
`--peer vllm`: the same requests (their token ids) through vLLM's CPU build on the same fp32 weights, offline
`LLM.generate` with max_num_seqs = c (scripts/vllm_peer.py in the peer's venv; scripts/setup_vllm_peer.sh builds it):
its tok/s (median of --repeats after a warm-up), ours / vLLM (goals: >= 2 at c = 1, >= 1.5 at 8 and 16), and how
many of its greedy outputs equal ours token for token, with the first divergence of any that do not.
`--overload N`: N requests arriving faster than the engine serves them (Poisson at --overload-rate) under a
small K/V budget: all complete, the peak K/V held stays under the budget, preemptions and peak RSS printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rakv.bench.roofline import format_row_costs, goal_verdict, trace_bound
from rakv.bench.serving import concurrency_row, ours, overload, requests_of, trace_roofline, vllm_peer
from rakv.runtime.errors import RakvError
from rakv.runtime.models import load_pair
from rakv.runtime.paths import conf_file
from rakv.runtime.workloads import dataset_texts

SCALING_GOAL = 1.2  # output tokens/s at c = 16 / at c = 8, at least


def parse_args() -> argparse.Namespace:
    serving = conf_file("serving/default.yaml")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--proposer", default=serving.proposer)
    parser.add_argument("--strategy", default="ar")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--token-budget", type=int, default=serving.token_budget)
    parser.add_argument("--kv-budget-mib", type=float, default=serving.kv_budget_mib)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-peer", action="store_true", help="skip transformers' batched generate")
    parser.add_argument("--peer", choices=("vllm",), default=None,
                        help="also serve the requests through vLLM (scripts/setup_vllm_peer.sh)")
    parser.add_argument("--vllm-venv", default=".venv-vllm")
    parser.add_argument("--vllm-weights", default="results/peer/smollm2-fp32")
    parser.add_argument("--vllm-eager", action="store_true", help="vLLM without torch.compile (a faster start)")
    parser.add_argument("--vllm-threads", type=int, default=None, metavar="N",
                        help="OMP_NUM_THREADS for vLLM (default: its own choice, which on 2 cores is 1 thread)")
    parser.add_argument("--vllm-ngram", type=int, default=0, metavar="K",
                        help="vLLM speculates K tokens by n-gram lookup (method ngram, n-grams of 1-3 tokens as "
                             "rakv's prompt lookup); compare with --strategy spec-kK --proposer prompt-lookup")
    parser.add_argument("--overload", type=int, default=0, metavar="N", help="also serve N requests above capacity")
    parser.add_argument("--overload-rate", type=float, default=8.0)
    parser.add_argument("--overload-tokens", type=int, default=8)
    parser.add_argument("--overload-kv-mib", type=float, default=24.0)
    parser.add_argument("--max-batch-overload", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None, metavar="FILE.json",
                        help="also write the result, with these arguments and each repeat's tok/s, to FILE.json "
                             "(scripts/ship_peer.sh ships results/peer/bench_serving/*.json; docs/peers.md's table "
                             "is rendered from the shipped files)")
    return parser.parse_args()


def measure(args) -> dict:
    pair = load_pair(args.pair, device=args.device, threads=args.threads, kernels="compact")
    stock = None if args.no_peer else load_pair(args.pair, device=args.device, threads=args.threads, kernels="stock")
    texts = dataset_texts(args.dataset)
    trace = requests_of(texts, args.requests, args.new_tokens, args.prompt_words, args.seed)
    peer = vllm_peer(pair, trace, args) if args.peer == "vllm" else {}
    ours(pair, args.proposer, trace[:2], args.strategy, 2, args.token_budget, args.kv_budget_mib)  # warm-up
    rows, equal = [], True
    roofline = trace_roofline(pair, trace, args.new_tokens) if pair.device.type == "cpu" else None
    for c in args.concurrency:
        row, same = concurrency_row(pair, stock, trace, c, peer, args)
        if roofline is not None:
            bound = trace_bound(roofline["geometry"], roofline["limits"], roofline["prompt_tokens"], args.new_tokens, c)
            row |= {"bound_tok_s": bound["tok_s"], "of_bound": row["ours_tok_s"] / bound["tok_s"],
                    "bound_prefill_s": bound["prefill_s"], "bound_decode_s": bound["decode_s"]}
        rows.append(row)
        equal &= same
    result = {"pair": args.pair, "strategy": args.strategy, "proposer": args.proposer, "requests": args.requests,
              "new_tokens": args.new_tokens, "token_budget": args.token_budget, "rows": rows,
              "outputs_equal_alone": equal,
              "limits": None if roofline is None else vars(roofline["limits"]),
              "row_costs": None if roofline is None else {str(b): r for b, r in roofline["row_costs"].items()}}
    if peer:
        result["vllm"] = next(iter(peer.values()))["version"]
        result["vllm_ngram"] = args.vllm_ngram
    if args.overload:
        result["overload"] = overload(pair, args.proposer, texts, args)
    return result


def print_rows(args, result: dict) -> None:
    rows, equal = result["rows"], result["outputs_equal_alone"]
    print(f"{args.pair} / {args.strategy} ({args.proposer}): {args.requests} requests x {args.new_tokens} new tokens, "
          f"all arriving at once; token budget {args.token_budget}; output tokens/s, median of {args.repeats}")
    print(f"{'c':>3} {'ours':>8} {'sequential':>10} {'transformers':>12} {'ours/seq':>9} {'amdahl':>6} {'ours/hf':>8} "
          f"{'sched share':>11} {'batch rows':>10}")
    for r in rows:
        hf = f"{r['transformers_tok_s']:12.1f}" if r["transformers_tok_s"] else f"{'-':>12}"
        ratio = f"{r['ours_over_transformers']:8.2f}" if r["ours_over_transformers"] else f"{'-':>8}"
        print(f"{r['concurrency']:>3} {r['ours_tok_s']:8.1f} {r['sequential_tok_s']:10.1f} {hf} "
              f"{r['ours_over_sequential']:9.2f} {r['amdahl_over_sequential']:6.2f} {ratio} "
              f"{r['scheduler_share']:11.1%} {r['mean_batch_rows']:10.1f}")
    print(f"amdahl: what c requests gain over sequential if their decode rows cost one's and prefill (here "
          f"{rows[0]['sequential_prefill_share']:.0%} of the sequential time) gains nothing from batching")
    goals = {8: 5.0, 16: 8.0}
    for r in rows:
        if r["concurrency"] in goals:
            print(f"at {r['concurrency']} concurrent: ours / sequential {r['ours_over_sequential']:.2f} "
                  f"(goal >= {goals[r['concurrency']]:g}, Amdahl estimate {r['amdahl_over_sequential']:.2f}), "
                  "ours / transformers "
                  + (f"{r['ours_over_transformers']:.2f}" if r["ours_over_transformers"] else "-") + " (goal >= 1.5); "
                  f"scheduler {r['scheduler_share']:.1%} of an iteration (goal <= 5 %)")
    print(f"every served output equal to the request alone: {equal}")
    if result["limits"] is None:
        return
    limits = result["limits"]
    print(f"the machine's bound for this trace (rakv.bench.roofline.trace_bound: every prefill at the FMA peak "
          f"measured here, {limits['fma_peak_gflops']:.0f} GFLOPS, then waves of c requests decoding, each step's "
          f"weights and K/V at the streaming bandwidth, {limits['stream_gb_s']:.1f} GB/s):")
    for r in rows:
        goal = " (goal >= 60 %)" if r["concurrency"] in (8, 16) else ""
        print(f"  c = {r['concurrency']:>2}: bound {r['bound_tok_s']:7.1f} tok/s (prefill "
              f"{r['bound_prefill_s']:.2f} s, decode {r['bound_decode_s']:.2f} s); ours {r['ours_tok_s']:.1f} = "
              f"{r['of_bound']:.0%} of it{goal}")
    print_scaling(result)
    print("a decode step of b requests at this trace's prompt lengths, by kernel (rakv.bench.roofline.row_costs):")
    print("\n".join("  " + line for line in format_row_costs({int(b): r for b, r in result["row_costs"].items()})))


def print_scaling(result: dict) -> None:
    """c = 16 / c = 8 and its verdict: judged from the bound at c = 16 over ours at c = 8 (a faster c = 8 only lowers
    the ratio), the bound's own ratio beside as context (rakv.bench.roofline.goal_verdict)."""
    by_c = {r["concurrency"]: r for r in result["rows"]}
    if 8 not in by_c or 16 not in by_c:
        return
    ours, bound = (by_c[16][k] / by_c[8][k] for k in ("ours_tok_s", "bound_tok_s"))
    # the bound is one for plain decoding only: drafts (several tokens a step) or reuse (prefill skipped) beat it
    bound_16 = by_c[16]["bound_tok_s"] if result["strategy"] == "ar" else None
    verdict = goal_verdict(by_c[16]["ours_tok_s"], by_c[8]["ours_tok_s"], SCALING_GOAL, bound_16, higher_is_better=True)
    print(f"  c = 16 / c = 8: ours {ours:.2f} (goal >= {SCALING_GOAL}): {verdict} (the bound at c = 16 over ours at "
          f"c = 8 {by_c[16]['bound_tok_s'] / by_c[8]['ours_tok_s']:.2f}; the bound's own ratio, context only, "
          f"{bound:.2f})")


def print_peer_and_overload(args, result: dict) -> None:
    for r in result["rows"]:
        if "vllm_tok_s" in r:
            ngram = f", n-gram k = {args.vllm_ngram}" if args.vllm_ngram else ""
            print(f"vLLM {result['vllm']}{ngram} at c = {r['concurrency']}: {r['vllm_tok_s']:.1f} tok/s (engine start "
                  f"{r['vllm_start_s']:.0f} s); ours / vLLM {r['ours_over_vllm']:.2f} (goal >= "
                  f"{2.0 if r['concurrency'] == 1 else 1.5:g}); greedy outputs equal to ours on {r['vllm_equal']} of "
                  f"{args.requests}" + (f" (first divergences: {', '.join(r['vllm_divergences'])})"
                                        if r["vllm_divergences"] else ""))
    if args.overload:
        o = result["overload"]
        print(f"overload: {o['requests']} requests arriving over {o['arrival_span_s']:.0f} s, served in "
              f"{o['duration_s']:.0f} s: {o['completed']} completed, {o['failed']} refused; peak K/V "
              f"{o['peak_kv_mib']:.1f} MiB of a {o['kv_budget_mib']:g} MiB budget, {o['preemptions']} preemptions, "
              f"max concurrency {o['max_concurrency']}, p99 TTFT {o['p99_ttft_ms']:.0f} ms; peak RSS "
              f"{o['peak_rss_mib']:.0f} MiB")


def main() -> int:
    args = parse_args()
    try:
        result = measure(args)
    except RakvError as exc:
        print(f"bench_serving: error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result | {"args": vars(args)}, indent=1))
    if args.json:
        print(json.dumps(result))
        return 0
    print_rows(args, result)
    print_peer_and_overload(args, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
