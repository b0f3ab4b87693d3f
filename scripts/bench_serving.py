"""Serving benchmark: output tokens/s at several concurrencies, side by side in one run on the same requests.

    .venv/bin/python scripts/bench_serving.py [--pair smollm2] [--requests 16] [--new-tokens 32]
        [--concurrency 1 4 8 16] [--strategy ar] [--overload 1000] [--json] [--out FILE.json]

Every request arrives at the start; concurrency c is `rakv serve`'s --max-batch c (continuous batching refills a
finished request's place at once). Printed per c, each a median of `--repeats` runs:
- ours: output tokens/s through rakv.serving (the scheduler's share of the iteration time, mean batch rows);
- sequential: the same requests one after another through the batch-one engine (`Engine.run`), same strategy;
- transformers: `generate` on batches of c left-padded prompts (greedy, exactly --new-tokens each), on a second
  copy of the pair loaded with stock kernels (transformers as shipped);
- the ratios ours / sequential beside Amdahl's estimate (decode rows free beside the first, prefill unbatched, from
  the sequential run's share of time before first tokens), ours / transformers, and whether every served output
  equals the request's output alone;
- the machine's bound for the trace at each c (rakv.bench.roofline.trace_bound: prefill FLOPs at the FMA peak
  measured here, then each decode step's weights and K/V at the measured streaming bandwidth) and ours as a
  fraction of it; c = 16 / c = 8 judged met, missed, or out of reach at this baseline (the bound at c = 16 over
  ours at c = 8 itself below the goal: rakv.bench.roofline.goal_verdict), the bound's own ratio beside as context;
  a decode step of 1-32 requests by kernel beside its floor (CPU).
`--peer vllm`: the same requests (their token ids) through vLLM's CPU build on the same fp32 weights, offline
`LLM.generate` with max_num_seqs = c (scripts/vllm_peer.py in the peer's venv; scripts/setup_vllm_peer.sh builds it):
its tok/s (median of --repeats after a warm-up), ours / vLLM, and how many of its greedy outputs equal ours token for
token, with the first divergence of any that do not.
`--overload N`: N requests arriving faster than the engine serves them (Poisson at --overload-rate) under a
small K/V budget: all complete, the peak K/V held stays under the budget, preemptions and peak RSS printed.
Each goal (listed below, from rakv.bench.goals) is printed with its verdict beside the value it judges.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from rakv.bench.goals import (
    OF_BOUND,
    OVER_SEQUENTIAL,
    OVER_TRANSFORMERS,
    OVER_VLLM,
    SCALING,
    SCHEDULER_SHARE,
    SERVING_GOALS,
    goals_text,
    judge,
)
from rakv.bench.options import ServingBenchOptions, add_flags, options_from
from rakv.bench.peer_reports import ServingBenchArgs, ServingBenchReport
from rakv.bench.roofline import format_row_costs
from rakv.bench.serving import measure
from rakv.runtime.actions import AR
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import to_json, write_record


def parse_args(argv=None) -> tuple[ServingBenchOptions, argparse.Namespace]:
    """The measurement's options, and the script's own flags (--json, --out)."""
    parser = argparse.ArgumentParser(description=__doc__, epilog=goals_text(SERVING_GOALS),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser, ServingBenchOptions)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None, metavar="FILE.json",
                        help="also write the result, with these arguments and each repeat's tok/s, to FILE.json "
                             "(scripts/ship_peer.sh ships results/peer/bench_serving/*.json; docs/peers.md's table "
                             "is rendered from the shipped files)")
    args = parser.parse_args(argv)
    return options_from(ServingBenchOptions, args), args


def ratio_text(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_rows(options: ServingBenchOptions, result: ServingBenchReport) -> None:
    rows = result.rows
    print(f"{options.pair} / {options.strategy} ({options.proposer}): {options.requests} requests x "
          f"{options.new_tokens} new tokens, all arriving at once; token budget {options.token_budget}; output "
          f"tokens/s, median of {options.repeats}")
    print(f"{'c':>3} {'ours':>8} {'sequential':>10} {'transformers':>12} {'ours/seq':>9} {'amdahl':>6} {'ours/hf':>8} "
          f"{'sched share':>11} {'batch rows':>10}")
    for r in rows:
        hf = f"{r.transformers_tok_s:12.1f}" if r.transformers_tok_s else f"{'-':>12}"
        ratio = f"{r.ours_over_transformers:8.2f}" if r.ours_over_transformers else f"{'-':>8}"
        print(f"{r.concurrency:>3} {r.ours_tok_s:8.1f} {r.sequential_tok_s:10.1f} {hf} "
              f"{r.ours_over_sequential:9.2f} {r.amdahl_over_sequential:6.2f} {ratio} "
              f"{r.scheduler_share:11.1%} {r.mean_batch_rows:10.1f}")
    print(f"amdahl: what c requests gain over sequential if their decode rows cost one's and prefill (here "
          f"{rows[0].sequential_prefill_share:.0%} of the sequential time) gains nothing from batching")
    for r in rows:
        if r.concurrency not in OVER_SEQUENTIAL:
            continue
        sequential = OVER_SEQUENTIAL[r.concurrency]
        hf = OVER_TRANSFORMERS.get(r.concurrency)
        print(f"at {r.concurrency} concurrent: ours / sequential {r.ours_over_sequential:.2f} ({sequential.text()}: "
              f"{judge(sequential, r.ours_over_sequential)}, Amdahl estimate {r.amdahl_over_sequential:.2f}), "
              f"ours / transformers {ratio_text(r.ours_over_transformers)}"
              + (f" ({hf.text()}: {judge(hf, r.ours_over_transformers)})" if hf else "")
              + f"; scheduler {r.scheduler_share:.1%} of an iteration ({SCHEDULER_SHARE.text()}: "
              f"{judge(SCHEDULER_SHARE, r.scheduler_share)})")
    print(f"every served output equal to the request alone: {result.outputs_equal_alone}")
    if result.limits is None:
        return
    limits = result.limits
    print(f"the machine's bound for this trace (rakv.bench.roofline.trace_bound: every prefill at the FMA peak "
          f"measured here, {limits.fma_peak_gflops:.0f} GFLOPS, then waves of c requests decoding, each step's "
          f"weights and K/V at the streaming bandwidth, {limits.stream_gb_s:.1f} GB/s):")
    for r in rows:
        goal = OF_BOUND.get(r.concurrency)
        judged = f" ({goal.text()}: {judge(goal, r.of_bound)})" if goal else ""
        print(f"  c = {r.concurrency:>2}: bound {r.bound_tok_s:7.1f} tok/s (prefill "
              f"{r.bound_prefill_s:.2f} s, decode {r.bound_decode_s:.2f} s); ours {r.ours_tok_s:.1f} = "
              f"{r.of_bound:.0%} of it{judged}")
    print_scaling(result)
    print("a decode step of b requests at this trace's prompt lengths, by kernel (rakv.bench.roofline.row_costs):")
    print("\n".join("  " + line for line in format_row_costs(result.row_costs)))


def print_scaling(result: ServingBenchReport) -> None:
    """c = 16 / c = 8 and its verdict: judged from the bound at c = 16 over ours at c = 8 (a faster c = 8 only lowers
    the ratio), the bound's own ratio beside as context (rakv.bench.goals.judge)."""
    by_c = result.by_concurrency()
    if 8 not in by_c or 16 not in by_c:
        return
    ours, bound = by_c[16].ours_tok_s / by_c[8].ours_tok_s, by_c[16].bound_tok_s / by_c[8].bound_tok_s
    # the bound is one for plain decoding only: drafts (several tokens a step) or reuse (prefill skipped) beat it
    bound_16 = by_c[16].bound_tok_s if result.strategy == AR else None
    verdict = judge(SCALING, by_c[16].ours_tok_s, by_c[8].ours_tok_s, bound_16)
    print(f"  c = 16 / c = 8: ours {ours:.2f} ({SCALING.text()}): {verdict} (the bound at c = 16 over ours at "
          f"c = 8 {by_c[16].bound_tok_s / by_c[8].ours_tok_s:.2f}; the bound's own ratio, context only, "
          f"{bound:.2f})")


def print_peer_and_overload(options: ServingBenchOptions, result: ServingBenchReport) -> None:
    for r in (r for r in result.rows if r.has_vllm):
        ngram = f", n-gram k = {options.vllm_ngram}" if options.vllm_ngram else ""
        goal = OVER_VLLM.get(r.concurrency)
        print(f"vLLM {result.vllm}{ngram} at c = {r.concurrency}: {r.vllm_tok_s:.1f} tok/s (engine start "
              f"{r.vllm_start_s:.0f} s); ours / vLLM {r.ours_over_vllm:.2f}"
              + (f" ({goal.text()}: {judge(goal, r.ours_over_vllm)})" if goal else "")
              + f"; greedy outputs equal to ours on {r.vllm_equal} of {options.requests}"
              + (f" (first divergences: {', '.join(r.vllm_divergences)})" if r.vllm_divergences else ""))
    if options.overload:
        o = result.overload
        print(f"overload: {o.requests} requests arriving over {o.arrival_span_s:.0f} s, served in "
              f"{o.duration_s:.0f} s: {o.completed} completed, {o.failed} refused; peak K/V "
              f"{o.peak_kv_mib:.1f} MiB of a {o.kv_budget_mib:g} MiB budget, {o.preemptions} preemptions, "
              f"max concurrency {o.max_concurrency}, p99 TTFT {o.p99_ttft_ms:.0f} ms; peak RSS "
              f"{o.peak_rss_mib:.0f} MiB")


def main() -> int:
    options, args = parse_args()
    try:
        result = measure(options)
    except RakvError as exc:
        print(f"bench_serving: error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        write_record(replace(result, args=ServingBenchArgs.of(options, args.json, args.out)), args.out)
    if args.json:
        print(json.dumps(to_json(result)))
        return 0
    print_rows(options, result)
    print_peer_and_overload(options, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
