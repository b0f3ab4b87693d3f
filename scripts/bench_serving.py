"""Serving benchmark: output tokens/s at several concurrencies, side by side in one run on the same requests.

    .venv/bin/python scripts/bench_serving.py [--pair smollm2] [--requests 16] [--new-tokens 32]
        [--concurrency 1 4 8 16] [--strategy ar] [--overload 1000] [--json]

Every request arrives at the start; concurrency c is `rakv serve`'s --max-batch c (continuous batching refills a
finished request's place at once). Printed per c, each a median of `--repeats` runs:
- ours: output tokens/s through rakv.serving (the scheduler's share of the iteration time, mean batch rows);
- sequential: the same requests one after another through the batch-one engine (`Engine.run`), same strategy;
- transformers: `generate` on batches of c left-padded prompts (greedy, exactly --new-tokens each), on a second
  copy of the pair loaded with stock kernels (transformers as shipped);
- the ratios ours / sequential (goals: >= 5 at 8, >= 8 at 16) beside Amdahl's estimate (decode rows free beside
  the first, prefill unbatched, from the sequential run's share of time before first tokens), ours / transformers
  (goal at 8: >= 1.5), and whether every served output equals the request's output alone.
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
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.decoding import synchronize
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.models import load_pair
from rakv.runtime.proposers import PromptLookupProposer
from rakv.runtime.paths import conf_file
from rakv.serving.server import ServeOptions, serve
from rakv.serving.trace import TraceRequest, generate_trace
from rakv.runtime.strategies import action_of
from rakv.runtime.workloads import dataset_texts


def requests_of(texts, n: int, new_tokens: int, words: int, seed: int) -> list[TraceRequest]:
    trace = generate_trace(texts, requests=n, rate=1.0, max_new_tokens=new_tokens, prompt_words=words, seed=seed)
    return [TraceRequest(r.id, 0.0, r.prompt, r.max_new_tokens) for r in trace]  # all at the start


def ours(pair, proposer, trace, strategy, c, budget, kv_mib) -> tuple[float, dict, dict]:
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30), proposer=proposer)
    with tempfile.TemporaryDirectory() as out:
        options = ServeOptions.default(strategy=strategy, token_budget=budget, max_batch=c, kv_budget_mib=kv_mib,
                                       ignore_eos=True)
        summary = serve(engine, trace, out, options, progress=False)
        with open(f"{out}/requests.jsonl") as fh:
            outputs = {r["id"]: r["token_ids"] for r in map(json.loads, fh)}
    return summary["output_throughput"], summary, outputs


def sequential(pair, proposer, trace, strategy) -> tuple[float, dict, float]:
    """Tokens/s of the requests one after another through the batch-one engine, their outputs, and the share of
    that time spent before each request's first token (prefill)."""
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30), proposer=proposer)
    outputs, tokens, to_first = {}, 0, 0.0
    synchronize(pair.device)
    start = time.perf_counter()
    for r in trace:
        result = engine.run(engine.encode(r.prompt), action_of(strategy), r.max_new_tokens, ignore_eos=True)
        outputs[r.id] = result.token_ids
        tokens += result.new_tokens
        to_first += result.ttft_s
    synchronize(pair.device)
    elapsed = time.perf_counter() - start
    return tokens / elapsed, outputs, to_first / elapsed


def amdahl_estimate(prefill_share: float, c: int) -> float:
    """What c concurrent requests gain over sequential if prefill rows cost what they cost alone (a prefill is
    compute-bound at batch one) and c requests' decode rows cost what one's does (Amdahl's law over the sequential
    run's time before and after first tokens). An estimate, not a bound: per-request fixed costs inside the time
    to first token amortise under batching too, and the two runs are measured at different moments."""
    return 1.0 / (prefill_share + (1.0 - prefill_share) / c)


def transformers_batched(stock, trace, c, new_tokens) -> float:
    """transformers `generate` over batches of c left-padded prompts, exactly `new_tokens` new tokens each."""
    tokenizer = stock.tokenizer
    model = stock.target.module
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    tokens = 0
    synchronize(stock.device)
    start = time.perf_counter()
    for i in range(0, len(trace), c):
        prompts = [tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in trace[i:i + c]]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=stock.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=stock.device)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, pad_token_id=pad)
        tokens += (out.shape[1] - width) * len(prompts)
    synchronize(stock.device)
    return tokens / (time.perf_counter() - start)


def vllm_peer(pair, trace, args) -> dict[int, dict]:
    """vLLM's tok/s and outputs per concurrency on the same requests' token ids (scripts/vllm_peer.py, run by the
    peer venv's interpreter: vLLM pins another transformers)."""
    python, weights = Path(args.vllm_venv) / "bin" / "python", Path(args.vllm_weights)
    if not python.exists() or not (weights / "config.json").exists():
        raise RakvError(f"--peer vllm needs {python} and the weights in {weights}: run scripts/setup_vllm_peer.sh")
    if args.pair != "smollm2":
        raise RakvError("--peer vllm serves the smollm2 target's weights; use --pair smollm2")
    tokenizer = pair.tokenizer
    job = {"model": str(weights), "prompts": [tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in trace],
           "max_tokens": args.new_tokens, "concurrency": args.concurrency, "repeats": args.repeats,
           "eager": args.vllm_eager,
           "speculative": {"method": "ngram", "num_speculative_tokens": args.vllm_ngram, "prompt_lookup_min": 1,
                           "prompt_lookup_max": PromptLookupProposer.max_ngram} if args.vllm_ngram else None}
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "job.json").write_text(json.dumps(job))
        done = subprocess.run([str(python), str(Path(__file__).with_name("vllm_peer.py")), f"{folder}/job.json",
                               f"{folder}/result.json"], capture_output=True, text=True, env=vllm_env(args))
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RakvError(f"the vLLM peer failed: {tail}")
        result = json.loads(Path(folder, "result.json").read_text())
    tokens = len(trace) * args.new_tokens
    return {r["c"]: {"tok_s": tokens / statistics.median(r["seconds"]), "start_s": r["start_s"],
                     "outputs": dict(zip([t.id for t in trace], r["outputs"])), "version": result["vllm"]}
            for r in result["results"]}


def vllm_env(args) -> dict:
    env = dict(os.environ)
    if args.vllm_threads:
        env["OMP_NUM_THREADS"] = str(args.vllm_threads)
    return env


def agreement(ours: dict, theirs: dict) -> tuple[int, list[str]]:
    """How many requests' outputs are equal token for token, and where each other one first diverges."""
    equal, divergences = 0, []
    for request_id, tokens in ours.items():
        other = theirs[request_id]
        if tokens == other:
            equal += 1
            continue
        at = next((i for i, (a, b) in enumerate(zip(tokens, other)) if a != b), min(len(tokens), len(other)))
        divergences.append(f"{request_id} at token {at}")
    return equal, divergences


def overload(pair, proposer, texts, args) -> dict:
    trace = generate_trace(texts, requests=args.overload, rate=args.overload_rate, max_new_tokens=args.overload_tokens,
                           prompt_words=args.prompt_words, seed=args.seed + 1)
    engine = Engine(pair, PrefixKVStore(budget_bytes=64 << 20), proposer=proposer)
    with tempfile.TemporaryDirectory() as out:
        options = ServeOptions.default(strategy=args.strategy, token_budget=args.token_budget,
                                       max_batch=args.max_batch_overload, kv_budget_mib=args.overload_kv_mib,
                                       ignore_eos=True)
        summary = serve(engine, trace, out, options, progress=sys.stderr.isatty())
    return {"requests": len(trace), "completed": summary["completed"], "failed": summary["failed"],
            "duration_s": summary["duration_s"], "arrival_span_s": trace[-1].arrival_s,
            "peak_kv_mib": summary["peak_kv_bytes"] / 2**20, "kv_budget_mib": args.overload_kv_mib,
            "preemptions": summary["preemptions"], "max_concurrency": summary["max_concurrency"],
            "p99_ttft_ms": summary["p99_ttft_ms"], "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
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
    args = parser.parse_args()
    try:
        pair = load_pair(args.pair, device=args.device, threads=args.threads, kernels="compact")
        stock = None if args.no_peer else load_pair(args.pair, device=args.device, threads=args.threads,
                                                    kernels="stock")
        texts = dataset_texts(args.dataset)
        trace = requests_of(texts, args.requests, args.new_tokens, args.prompt_words, args.seed)
        peer = vllm_peer(pair, trace, args) if args.peer == "vllm" else {}
        ours(pair, args.proposer, trace[:2], args.strategy, 2, args.token_budget, args.kv_budget_mib)  # warm-up
        rows, equal = [], True
        for c in args.concurrency:
            samples = {"ours": [], "sequential": [], "transformers": []}
            shares, batch_rows, prefill_shares = [], [], []
            for _ in range(args.repeats):
                rate, summary, served = ours(pair, args.proposer, trace, args.strategy, c, args.token_budget,
                                             args.kv_budget_mib)
                samples["ours"].append(rate)
                shares.append(summary["scheduler_share"])
                batch_rows.append(summary["mean_batch_tokens"])
                seq_rate, alone, prefill_share = sequential(pair, args.proposer, trace, args.strategy)
                samples["sequential"].append(seq_rate)
                prefill_shares.append(prefill_share)
                equal &= served == alone
                if stock is not None:
                    samples["transformers"].append(transformers_batched(stock, trace, c, args.new_tokens))
            med = {k: statistics.median(v) if v else None for k, v in samples.items()}
            if c in peer:
                same, divergences = agreement(served, peer[c]["outputs"])
                rows_peer = {"vllm_tok_s": peer[c]["tok_s"], "ours_over_vllm": med["ours"] / peer[c]["tok_s"],
                             "vllm_equal": same, "vllm_divergences": divergences, "vllm_start_s": peer[c]["start_s"]}
            else:
                rows_peer = {}
            rows.append(rows_peer | {"concurrency": c, "ours_tok_s": med["ours"], "sequential_tok_s": med["sequential"],
                         "transformers_tok_s": med["transformers"],
                         "ours_over_sequential": med["ours"] / med["sequential"],
                         "ours_over_transformers": med["ours"] / med["transformers"] if med["transformers"] else None,
                         "scheduler_share": statistics.median(shares), "mean_batch_rows": statistics.median(batch_rows),
                         "sequential_prefill_share": statistics.median(prefill_shares),
                         "amdahl_over_sequential": amdahl_estimate(statistics.median(prefill_shares), c)})
        result = {"pair": args.pair, "strategy": args.strategy, "proposer": args.proposer, "requests": args.requests,
                  "new_tokens": args.new_tokens, "token_budget": args.token_budget, "rows": rows,
                  "outputs_equal_alone": equal}
        if peer:
            result["vllm"] = next(iter(peer.values()))["version"]
            result["vllm_ngram"] = args.vllm_ngram
        if args.overload:
            result["overload"] = overload(pair, args.proposer, texts, args)
    except RakvError as exc:
        print(f"bench_serving: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
        return 0
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
    for r in rows:
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
