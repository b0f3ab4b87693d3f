"""scripts/bench_serving.py's measurements: output tokens/s of the same requests through rakv.serving, one after
another through the batch-one engine, through transformers' batched `generate` and through the vLLM peer, and an
overload run (the script's docstring says what each is and the goals).
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from rakv.bench.options import ServingBenchOptions
from rakv.bench.peer_reports import ConcurrencyRow, OverloadRow, PeerThroughput, ServingBenchReport, ThroughputJob
from rakv.bench.peers import agreement, config, run_peer_job
from rakv.bench.roofline import Geometry, Limits, RowCost, measured_limits, row_costs, trace_bound
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.decoding import synchronize
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.models import load_pair
from rakv.runtime.proposers import PromptLookupProposer
from rakv.runtime.run_layout import ServedRunLayout
from rakv.runtime.strategies import action_of
from rakv.runtime.workloads import dataset_texts
from rakv.serving.metrics import ServedStatistics
from rakv.serving.records import read_records
from rakv.serving.server import ServeOptions, serve
from rakv.serving.trace import TraceRequest, generate_trace


def requests_of(texts, n: int, new_tokens: int, words: int, seed: int) -> list[TraceRequest]:
    trace = generate_trace(texts, requests=n, rate=1.0, max_new_tokens=new_tokens, prompt_words=words, seed=seed)
    return [TraceRequest(r.id, 0.0, r.prompt, r.max_new_tokens) for r in trace]  # all at the start



def ours(pair, proposer, trace, strategy, c, budget, kv_mib) -> tuple[float, ServedStatistics, dict[str, list[int]]]:
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30), proposer=proposer)
    with tempfile.TemporaryDirectory() as out:
        options = ServeOptions.default(strategy=strategy, token_budget=budget, max_batch=c, kv_budget_mib=kv_mib,
                                       ignore_eos=True)
        summary = serve(engine, trace, out, options, progress=False).statistics
        outputs = {r.id: r.token_ids for r in read_records(ServedRunLayout(Path(out)).requests)}
    return summary.output_throughput, summary, outputs



def sequential(pair, proposer, trace, strategy) -> tuple[float, dict[str, list[int]], float]:
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



@dataclass(frozen=True)
class VllmAtConcurrency:
    """vLLM at one concurrency: tok/s (median of the repeats) and each repeat's, its engine's start, its outputs by
    request id, its version."""

    tok_s: float
    start_s: float
    tok_s_runs: list[float]
    outputs: dict[str, list[int]]
    version: str


def vllm_peer(pair, trace, options: ServingBenchOptions) -> dict[int, VllmAtConcurrency]:
    """vLLM's tok/s and outputs per concurrency on the same requests' token ids (scripts/vllm_peer.py, run by the
    peer venv's interpreter: vLLM pins another transformers)."""
    python, weights = Path(options.vllm_venv) / "bin" / "python", Path(options.vllm_weights)
    if not python.exists() or not (weights / "config.json").exists():
        raise RakvError(f"--peer vllm needs {python} and the weights in {weights}: run scripts/setup_vllm_peer.sh")
    if options.pair != "smollm2":
        raise RakvError("--peer vllm serves the smollm2 target's weights; use --pair smollm2")
    tokenizer = pair.tokenizer
    prompts = [tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in trace]
    job = ThroughputJob(
        model=str(weights), prompts=prompts, max_tokens=options.new_tokens, concurrency=list(options.concurrency),
        repeats=options.repeats, eager=options.vllm_eager,
        speculative=config(options.vllm_ngram, PromptLookupProposer.max_ngram))
    result, stderr = run_peer_job(job, PeerThroughput, python, vllm_env(options))
    if result is None:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        raise RakvError(f"the vLLM peer failed: {tail}")
    tokens = len(trace) * options.new_tokens
    return {r.c: VllmAtConcurrency(tokens / statistics.median(r.seconds), r.start_s,
                                   [tokens / seconds for seconds in r.seconds],
                                   dict(zip([t.id for t in trace], r.outputs)), result.vllm)
            for r in result.results}


def vllm_env(options: ServingBenchOptions) -> dict[str, str]:
    env = dict(os.environ)
    if options.vllm_threads:
        env["OMP_NUM_THREADS"] = str(options.vllm_threads)
    return env


def overload(pair, texts, options: ServingBenchOptions) -> OverloadRow:
    trace = generate_trace(texts, requests=options.overload, rate=options.overload_rate,
                           max_new_tokens=options.overload_tokens, prompt_words=options.prompt_words,
                           seed=options.seed + 1)
    engine = Engine(pair, PrefixKVStore(budget_bytes=64 << 20), proposer=options.proposer)
    with tempfile.TemporaryDirectory() as out:
        serve_options = ServeOptions.default(strategy=options.strategy, token_budget=options.token_budget,
                                             max_batch=options.max_batch_overload,
                                             kv_budget_mib=options.overload_kv_mib, ignore_eos=True)
        summary = serve(engine, trace, out, serve_options, progress=sys.stderr.isatty()).statistics
    return OverloadRow(len(trace), summary.completed, summary.failed,
                       summary.duration_s, trace[-1].arrival_s,
                       summary.peak_kv_bytes / 2**20, options.overload_kv_mib,
                       summary.preemptions, summary.max_concurrency,
                       summary.p99_ttft_ms,
                       resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def concurrency_row(pair, stock, trace, c: int, peer: dict[int, VllmAtConcurrency],
                    options: ServingBenchOptions) -> tuple[ConcurrencyRow, bool]:
    """One concurrency's row (medians of the repeats, and each run's tok/s in `*_tok_s_runs`), and whether every
    served output equalled it alone."""
    samples = {"ours": [], "sequential": [], "transformers": []}
    shares, batch_rows, prefill_shares, equal = [], [], [], True
    for _ in range(options.repeats):
        rate, summary, served = ours(pair, options.proposer, trace, options.strategy, c, options.token_budget,
                                     options.kv_budget_mib)
        samples["ours"].append(rate)
        shares.append(summary.scheduler_share)
        batch_rows.append(summary.mean_batch_tokens)
        seq_rate, alone, prefill_share = sequential(pair, options.proposer, trace, options.strategy)
        samples["sequential"].append(seq_rate)
        prefill_shares.append(prefill_share)
        equal &= served == alone
        if stock is not None:
            samples["transformers"].append(transformers_batched(stock, trace, c, options.new_tokens))
    med = {k: statistics.median(v) if v else None for k, v in samples.items()}
    vllm = {}
    if c in peer:
        same, divergences = agreement(served, peer[c].outputs)
        vllm = dict(vllm_tok_s=peer[c].tok_s, ours_over_vllm=med["ours"] / peer[c].tok_s,
                    vllm_tok_s_runs=peer[c].tok_s_runs, vllm_equal=same, vllm_divergences=divergences,
                    vllm_start_s=peer[c].start_s)
    runs = {f"{name}_tok_s_runs": values for name, values in samples.items() if values}
    return ConcurrencyRow(
        **vllm, concurrency=c, ours_tok_s=med["ours"], sequential_tok_s=med["sequential"],
        transformers_tok_s=med["transformers"], **runs, ours_over_sequential=med["ours"] / med["sequential"],
        ours_over_transformers=med["ours"] / med["transformers"] if med["transformers"] else None,
        scheduler_share=statistics.median(shares), mean_batch_rows=statistics.median(batch_rows),
        sequential_prefill_share=statistics.median(prefill_shares),
        amdahl_over_sequential=amdahl_estimate(statistics.median(prefill_shares), c)), equal


@dataclass(frozen=True)
class TraceRoofline:
    """What the machine's bound and the per-row cost table need for a trace (rakv.bench.roofline): the two limits
    measured now, the target's geometry, each request's prompt length, a decode step of b requests by kernel."""

    limits: Limits
    geometry: Geometry
    prompt_tokens: list[int]
    row_costs: dict[int, RowCost]


def trace_roofline(pair, trace, sizes=(1, 2, 4, 8, 16, 32)) -> TraceRoofline:
    """The roofline of this trace: a decode step of b requests at these prompts' lengths (the trace's prompts
    repeated to fill the largest b) by kernel, beside the limits and the geometry."""
    limits = measured_limits(pair.device)
    model = pair.target.module
    prompts = [pair.tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in trace]
    contexts = [prompts[i % len(prompts)] for i in range(max(sizes))]
    return TraceRoofline(limits, Geometry.of(model), [len(p) for p in prompts],
                         row_costs(model, pair.device, contexts, sizes, 5, limits))


def with_bound(row: ConcurrencyRow, roofline: TraceRoofline, new_tokens: int) -> ConcurrencyRow:
    """The row with the machine's bound for the trace at its c (rakv.bench.roofline.trace_bound)."""
    bound = trace_bound(roofline.geometry, roofline.limits, roofline.prompt_tokens, new_tokens, row.concurrency)
    return replace(row, bound_tok_s=bound.tok_s, of_bound=row.ours_tok_s / bound.tok_s,
                   bound_prefill_s=bound.prefill_s, bound_decode_s=bound.decode_s)


def measure(options: ServingBenchOptions) -> ServingBenchReport:
    """Every measurement of scripts/bench_serving.py (its docstring says what each is), as one report."""
    pair = load_pair(options.pair, device=options.device, threads=options.threads, kernels="compact")
    stock = None if options.no_peer else load_pair(options.pair, device=options.device, threads=options.threads,
                                                   kernels="stock")
    texts = dataset_texts(options.dataset)
    trace = requests_of(texts, options.requests, options.new_tokens, options.prompt_words, options.seed)
    peer = vllm_peer(pair, trace, options) if options.peer == "vllm" else {}
    ours(pair, options.proposer, trace[:2], options.strategy, 2, options.token_budget,
         options.kv_budget_mib)  # warm-up
    rows, equal = [], True
    roofline = trace_roofline(pair, trace) if pair.device.type == "cpu" else None
    for c in options.concurrency:
        row, same = concurrency_row(pair, stock, trace, c, peer, options)
        rows.append(row if roofline is None else with_bound(row, roofline, options.new_tokens))
        equal &= same
    extra = {}
    if peer:
        extra |= {"vllm": next(iter(peer.values())).version, "vllm_ngram": options.vllm_ngram}
    if options.overload:
        extra["overload"] = overload(pair, texts, options)
    return ServingBenchReport(pair=options.pair, strategy=options.strategy, proposer=options.proposer,
                              requests=options.requests, new_tokens=options.new_tokens,
                              token_budget=options.token_budget, rows=rows, outputs_equal_alone=equal,
                              limits=None if roofline is None else roofline.limits,
                              row_costs=None if roofline is None else roofline.row_costs, **extra)
