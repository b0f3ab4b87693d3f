"""The engine benchmark's measurements (scripts/bench_engine.py prints them; docs/engine.md): our engine beside
transformers and llama.cpp, the GEMM by row count, the store's TTFT, the draft's reuse, batched steps and prefill,
memory. Timings go through rakv.runtime.calibration's measurement functions (`Point`, `measure_interleaved`,
`forward_points`): one warm-up, interleaved shuffled passes, medians, noisy points measured again.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from rakv.bench.roofline import distinct_bytes, goal_verdict, measured_limits, row_costs, streaming_bandwidth
from rakv.runtime.actions import SPEC_K, Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.calibration import CalibrationPlan, Point, forward_points, measure_interleaved, time_once
from rakv.runtime.compact import Segment
from rakv.runtime.costmodel import acceptance_estimate
from rakv.runtime.decoding import crop_cache, forward, forward_rows, synchronize
from rakv.runtime.engine import Engine
from rakv.runtime.kernels import compact_of, new_kv_cache
from rakv.runtime.models import load_pair
from rakv.runtime.paths import ROOT
from rakv.runtime.workloads import humaneval_prompts, load_humaneval

SCRIPT = ROOT / "scripts" / "bench_engine.py"  # run again in fresh processes for the memory probes


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def peak_increase_mib(fn, device) -> float:
    """Peak memory increase while `fn` runs: CUDA allocator peak, or the process's peak RSS (Linux)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset the peak-RSS high-water mark to the current RSS
    base = rss_kib("VmRSS")
    fn()
    return (rss_kib("VmHWM") - base) / 1024


def seconds(fn, device) -> float:
    return time_once(Point(fn), device)


def medians_ms(points: dict, device, repeats: int) -> dict:
    """Each point's median in ms, measured as calibration measures (rakv.runtime.calibration.measure_interleaved)."""
    measure_interleaved(points, device, CalibrationPlan(repeats=repeats))
    return {key: point.median * 1e3 for key, point in points.items()}


def make_sides(pair, stock, engine, ids, n):
    """The four generation calls compared: ours (on `pair`) and transformers' (on `stock`), plain and speculative."""
    target, draft = stock.target.module, stock.draft.module
    hf_input = torch.tensor([ids], device=pair.device)
    # transformers stops at EOS even with min_new_tokens-free configs; we time exactly n tokens on both sides
    target.generation_config.eos_token_id = None
    config = copy.deepcopy(target.generation_config)
    config.update(max_new_tokens=n, do_sample=False, pad_token_id=pair.tokenizer.pad_token_id or 0,
                  num_assistant_tokens=4, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)

    def ours(strategy):
        engine.store.clear()
        return engine.run(ids, Action.of_strategy(strategy), n, ignore_eos=True)

    def theirs(assistant):
        with torch.inference_mode():
            out = target.generate(hf_input, attention_mask=torch.ones_like(hf_input), generation_config=config,
                                  assistant_model=assistant)
        return out[0, len(ids):].tolist()

    return {"ours-ar": lambda: ours("ar"), "hf-ar": lambda: theirs(None),
            "ours-spec-k4": lambda: ours("spec-k4"), "hf-spec-k4": lambda: theirs(draft)}


def probe_memory(args) -> float:
    """Run in a fresh process so that no earlier call has already grown the allocator's arenas."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--pair", args.pair, "--new-tokens", str(args.new_tokens),
                          "--device", args.device, "--kernels", args.kernels, "--probe", args.side_to_probe] +
                         (["--threads", str(args.threads)] if args.threads else []),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    return float(out.stdout.strip().splitlines()[-1])


def model_tensors(module) -> list:
    compact = compact_of(module)
    if compact is not None and compact is module:  # a compact-only model (the int8 draft)
        return compact.tensors()
    return list(module.state_dict().values()) + (compact.tensors() if compact is not None else [])


def weight_bytes(module) -> int:
    """Bytes of the distinct parameter storages (a tied embedding counted once): what one token streams."""
    return distinct_bytes(model_tensors(module))


def verify_ratios(engine, context: list[int], repeats: int) -> dict[int, float]:
    """Median target forward over k + 1 new tokens / median one-token step, on a cache holding `context`;
    key 0: the step in seconds."""
    ms = step_ms(engine.pair.target.module, engine.pair.device, context, (1, *(k + 1 for k in SPEC_K)), repeats)
    return {width - 1: t / ms[1] for width, t in ms.items() if width > 1} | {0: ms[1] / 1e3}


def step_ms(model, device, context: list[int], widths, repeats: int) -> dict[int, float]:
    """Median ms of one forward over `width` new tokens on a cache holding `context`, interleaved over widths."""
    ids = torch.tensor([context], device=device)
    cache = new_kv_cache(model)
    with torch.inference_mode():
        forward(model, ids[:, :-max(widths)], cache, keep=1)
        return medians_ms(forward_points(model, ids, cache, cache.get_seq_length(), widths), device, repeats)


def batched_steps_ms(model, device, contexts: list[list[int]], sizes, repeats: int) -> dict[int, float]:
    """Median ms of one batched decode step of b requests (each one new token on its own context)."""
    caches = [new_kv_cache(model) for _ in contexts]
    with torch.inference_mode():
        for cache, context in zip(caches, contexts):
            forward(model, torch.tensor([context[:-1]], device=device), cache, keep=1)
        lengths = [c.get_seq_length() for c in caches]

        def crop_back():
            for cache, length in zip(caches, lengths):
                crop_cache(cache, length)

        segments = [Segment(torch.tensor(context[-1:], device=device), cache, 1)
                    for context, cache in zip(contexts, caches)]
        points = {b: Point(lambda b=b: forward_rows(model, segments[:b]), crop_back) for b in sizes}
        return medians_ms(points, device, repeats)


def llama_cpp_peer(prompt: str, long_prompt: str, n: int, repeats: int, threads: int) -> dict | None:
    """llama.cpp (llama-cpp-python) on the shipped Q4_1 GGUF and on its F32 conversion: decode ms/token (greedy,
    `n` tokens) and prefill tokens/s on `long_prompt`; None when llama-cpp-python is not installed. Each model runs
    in a child process of its own, so that a crash inside llama.cpp (its Q4_1 kernels built with GGML_NATIVE on a
    Sapphire Rapids guest die with SIGSEGV in 0.3.36) is one line of the report, {"error": ...}, not the end of the
    benchmark."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from rakv.runtime.models import derived_files_dir, file_hash, smollm2_gguf_path

    q4 = smollm2_gguf_path()
    f32 = derived_files_dir() / "gguf" / f"{file_hash(q4)}-f32.gguf"
    out = {}
    for label, path in (("f32", f32), ("q4_1", q4)):
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as child:
            try:
                out[label] = child.submit(_llama_cpp_model, label, str(q4), str(path), prompt, long_prompt, n,
                                          repeats, threads).result()
            except BrokenProcessPool:
                out[label] = {"error": "llama.cpp's process died (a crash inside llama.cpp)"}
            except RuntimeError as exc:
                out[label] = {"error": str(exc)}
    return out


def _llama_cpp_model(label: str, q4: str, path: str, prompt: str, long_prompt: str, n: int, repeats: int,
                     threads: int) -> dict:
    """One model of llama_cpp_peer, in its child process (the F32 file converted from the Q4_1 one first, once)."""
    import llama_cpp

    if label == "f32" and not Path(path).exists():  # the same dequantised fp32 weights as our target
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = 0, True, threads  # 0 = LLAMA_FTYPE_ALL_F32
        tmp = Path(path).with_suffix(".tmp")
        if llama_cpp.llama_model_quantize(q4.encode(), str(tmp).encode(), params) != 0:
            raise RuntimeError("llama.cpp could not convert the GGUF to F32")
        tmp.replace(path)
    llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=2048, verbose=False)
    tokens = llm.tokenize(prompt.encode(), add_bos=False)
    long_tokens = llm.tokenize(long_prompt.encode(), add_bos=False)
    decode, prefill, text = [], [], []
    for repeat in range(repeats + 1):
        llm.reset()
        first, produced = None, []
        for token in llm.generate(tokens, temp=0.0, top_k=1, reset=True):
            first = first or time.perf_counter()
            produced.append(token)
            if len(produced) >= n:
                break
        end = time.perf_counter()
        llm.reset()
        start = time.perf_counter()
        llm.eval(long_tokens)
        long_s = time.perf_counter() - start
        if repeat:  # the first is a warm-up
            decode.append((end - first) / (n - 1) * 1e3)
            prefill.append(len(long_tokens) / long_s)
        text = produced
    return {"version": getattr(llama_cpp, "__version__", "?"), "ms_per_token": statistics.median(decode),
            "prefill_tokens_per_s": statistics.median(prefill), "prefill_tokens": len(long_tokens), "tokens": text}


def rss_probe(args) -> dict:
    """In a fresh process: load only our pair, generate (AR, spec-k4), and compare the peak resident set with the
    bytes of the weights held plus the most K/V held; also the resident set before loading (the interpreter and its
    libraries) and its peak once the pair is loaded (dequantisation and packing). The prompt is read without
    `datasets`, which a server does not hold (rakv.runtime.workloads.humaneval_prompts)."""
    before_load = rss_kib("VmRSS") * 1024
    pair = load_pair(args.pair, device=args.device, threads=args.threads, kernels=args.kernels)
    loaded_peak = rss_kib("VmHWM") * 1024
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30))
    ids = engine.encode(humaneval_prompts()["HumanEval/2"])
    runs = [engine.run(ids, Action.of_strategy(s), args.new_tokens, ignore_eos=True) for s in ("ar", "spec-k4")]
    held = distinct_bytes(model_tensors(pair.target.module) + model_tensors(pair.draft.module))
    kv = max(r.peak_kv_bytes for r in runs)
    return {"peak_rss_bytes": rss_kib("VmHWM") * 1024, "weight_bytes": held, "kv_bytes": kv,
            "store_bytes": engine.store.stats.bytes, "rss_before_load_bytes": before_load,
            "peak_rss_after_load_bytes": loaded_peak}


def reuse_prompts(engine, problems, tokens: int) -> tuple[list[int], list[int]]:
    """A ~`tokens`-token prompt of HumanEval text, and one sharing its first half."""
    prompts = list(problems["prompt"])
    long_ids = engine.encode("\n".join(prompts))[:tokens]
    half = len(long_ids) // 2
    return long_ids, long_ids[:half] + engine.encode("\n".join(reversed(prompts)))[: len(long_ids) - half]


def draft_reuse_rows(engine, prompt: list[int], partial: list[int], repeats: int) -> dict:
    """A joint-k4 request's draft prefill (the time before its first round that is the draft's) on an exact repeat
    and on a 50 % partial hit of a speculating earlier request, with the draft's K/V in the store entry and without
    (conf/cache: reuse_draft), interleaved; medians."""
    rows = {}
    for case, ids in (("exact repeat", prompt), ("50 % partial hit", partial)):
        seconds, hits = {True: [], False: []}, {}
        for _ in range(repeats):
            for reuse_draft in (True, False):
                engine.reuse_draft = reuse_draft
                engine.store.clear()
                engine.run(prompt, Action(False, 1), 1)  # the earlier request: the draft prefills, nothing verified
                result = engine.run(ids, Action.of_strategy("joint-k4"), 2, ignore_eos=True)
                seconds[reuse_draft].append(result.draft_prefill_s)
                hits[reuse_draft] = result.draft_hit_tokens
        engine.reuse_draft = True
        with_s, without_s = statistics.median(seconds[True]), statistics.median(seconds[False])
        rows[case] = {"with_ms": with_s * 1e3, "without_ms": without_s * 1e3, "ratio": with_s / without_s,
                      "draft_hit_tokens": hits[True]}
    return rows


def gemm_table(pair, repeats: int, rows=(1, 2, 4, 5, 8, 12, 16, 32, 64, 128, 256, 512)) -> dict:
    """kernels.cpp's GEMM by row count: one pass through every projection of the pair's compact target (fp32) and
    of its int8 draft (when it has one), on random inputs; and the FMA peak the kernels measure on this machine."""
    from rakv.runtime.kernels import native

    target, draft = compact_of(pair.target.module), compact_of(pair.draft.module)
    sides = {"fp32": target.projections()}
    if draft is not None and draft.projections()[0].scale is not None:
        sides["int8"] = draft.projections()
    inputs = {k: torch.randn(max(rows), k) for k in {p.in_features for ps in sides.values() for p in ps}}
    macs = {name: sum(p.out_features * p.in_features for p in ps) for name, ps in sides.items()}
    nbytes = {name: distinct_bytes([t for p in ps for t in p.tensors()]) for name, ps in sides.items()}
    points = {(name, m): Point(lambda name=name, m=m: [p(inputs[p.in_features][:m]) for p in sides[name]])
              for name in sides for m in rows}
    with torch.inference_mode():
        measure_interleaved(points, pair.device, CalibrationPlan(repeats=repeats))
    times = {key: point.samples for key, point in points.items()}
    peak = statistics.median(native().fma_peak_gflops(50_000_000) for _ in range(3))
    table = {"fma_peak_gflops": peak, "threads": torch.get_num_threads(), "sides": {}}
    for name in sides:
        one = statistics.median(times[name, 1])
        table["sides"][name] = {"weight_bytes": nbytes[name], "rows": [
            {"rows": m, "ms": statistics.median(times[name, m]) * 1e3,
             "over_one": statistics.median(times[name, m]) / one,
             "gflops": 2 * m * macs[name] / statistics.median(times[name, m]) / 1e9,
             "gb_s": nbytes[name] / statistics.median(times[name, m]) / 1e9} for m in rows]}
    return table


def chunk_beside_decodes_ms(model, device, contexts: list[list[int]], chunk: int, repeats: int) -> dict:
    """A batched step of 4 decoding requests (256-token contexts) alone and with a `chunk`-token prefill chunk of a
    fifth request (after 256 positions of its own) in the same pass; medians of interleaved repeats (ms)."""
    caches = [new_kv_cache(model) for _ in range(5)]
    with torch.inference_mode():
        for cache, context in zip(caches, contexts):
            forward(model, torch.tensor([context[:256]], device=device), cache, keep=1)
        decodes = [Segment(torch.tensor(c[256:257], device=device), cache, 1) for c, cache in zip(contexts, caches)]
        piece = Segment(torch.tensor(contexts[4][256:256 + chunk], device=device), caches[4], 1)

        def crop_back():
            for cache in caches:
                crop_cache(cache, 256)

        points = {label: Point(lambda segments=segments: forward_rows(model, segments), crop_back)
                  for label, segments in (("decodes", decodes[:4]), ("with_chunk", decodes[:4] + [piece]))}
        return medians_ms(points, device, repeats)


def prefill_seconds(models: dict, device, ids: list[int], lengths, repeats: int) -> dict:
    """Median seconds of a cold prefill of `n` tokens (logits of the last one), per model, interleaved."""
    points = {(name, n): Point(lambda model=model, n=n: forward(model, torch.tensor([ids[:n]], device=device),
                                                                 new_kv_cache(model), keep=1))
              for name, model in models.items() for n in lengths}
    with torch.inference_mode():
        ms = medians_ms(points, device, repeats)
    return {name: {n: ms[name, n] / 1e3 for n in lengths} for name in models}


def previous_prefill(pair_name: str) -> dict | None:
    """The previous engine's calibrated prefill curves (data/reference/offline-fast-kernels), target and draft."""
    from rakv.runtime.costmodel import Curve
    from rakv.runtime.paths import REFERENCE_DIR

    path = REFERENCE_DIR / "offline-fast-kernels" / "calibration" / f"{pair_name}-draft.json"
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    return {"target": Curve(**table["target_prefill"]), "draft": Curve(**table["proposer_prefill"])}


def load_sides(args):
    """Our pair (with `args.kernels`), a stock copy for transformers, our engine and the prompt (HumanEval/2)."""
    pair = load_pair(args.pair, device=args.device, threads=args.threads, kernels=args.kernels)
    stock = load_pair(args.pair, device=args.device, threads=args.threads, kernels="stock")
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30))
    return pair, stock, engine, engine.encode(load_humaneval()[2]["prompt"])


def generations(args, sides: dict, device) -> dict:
    """The four generation calls, interleaved (drift on a noisy machine hits both sides alike): ms per token,
    our AR's ms per token after the first (as llama.cpp's decode rate is counted), outputs, peak memory."""
    n = args.new_tokens
    for fn in sides.values():  # warm-up of every path
        fn()
    times = {label: [] for label in sides}
    decode_ms = []
    for _ in range(args.repeats):
        for label, fn in sides.items():
            start = time.perf_counter()
            result = fn()
            synchronize(device)
            times[label].append(time.perf_counter() - start)
            if label == "ours-ar":
                decode_ms.append((result.latency_s - result.ttft_s) / (n - 1) * 1e3)
    outputs = {label: fn() for label, fn in sides.items()}
    memory = {}
    for label in sides:
        args.side_to_probe = label
        memory[label] = probe_memory(args)
    return {"ms": {label: statistics.median(t) / n * 1e3 for label, t in times.items()}, "outputs": outputs,
            "memory": memory, "decode_ms": statistics.median(decode_ms)}


def generation_rows(measured: dict) -> dict:
    ms, memory, outputs = measured["ms"], measured["memory"], measured["outputs"]
    return {key: {"ours_ms_per_token": ms[f"ours-{kind}"], "hf_ms_per_token": ms[f"hf-{kind}"],
                  "ratio": ms[f"ours-{kind}"] / ms[f"hf-{kind}"], "goal": goal,
                  "same_output": outputs[f"ours-{kind}"].token_ids == outputs[f"hf-{kind}"],
                  "ours_peak_mib": memory[f"ours-{kind}"], "hf_peak_mib": memory[f"hf-{kind}"]}
            for key, kind, goal in (("ar", "ar", 0.55), ("spec_k4", "spec-k4", 0.70))}


def store_ttft(engine, long_ids: list[int], other: list[int], repeats: int) -> dict:
    """TTFT with the store: a ~512-token prompt cold, as an exact repeat, and after a 50 % shared prefix."""

    def ttft(prompt, warm=None):
        engine.store.clear()
        if warm is not None:
            engine.run(warm, Action.of_strategy("ar"), 1)
        return engine.run(prompt, Action.of_strategy("kv-only"), 1).ttft_s

    cold = statistics.median(ttft(long_ids) for _ in range(repeats))
    exact = statistics.median(ttft(long_ids, warm=long_ids) for _ in range(repeats))
    partial = statistics.median(ttft(other, warm=long_ids) for _ in range(repeats))
    return {"prompt_tokens": len(long_ids), "cold_ms": cold * 1e3, "exact_ms": exact * 1e3,
            "partial_ms": partial * 1e3, "exact_over_cold": exact / cold, "partial_over_cold": partial / cold}


DRAFT_GOAL = 0.30  # the draft's one-token step / the target's, at most


def draft_against_target(pair, context: list[int], repeats: int, bandwidth: float) -> dict:
    """The draft's one-token step against the target's (interleaved) and against its own floor."""
    device, draft_model, target_model = pair.device, pair.draft.module, pair.target.module
    both = {"target": [], "draft": []}
    for _ in range(repeats):
        both["target"].append(step_ms(target_model, device, context, (1,), 1)[1])
        both["draft"].append(step_ms(draft_model, device, context, (1,), 1)[1])
    target_step, draft_step = (statistics.median(both[k]) for k in ("target", "draft"))
    compact_draft = compact_of(draft_model)
    draft_bytes = (distinct_bytes(compact_draft.projection_tensors()) if compact_draft is not None
                   else weight_bytes(draft_model) - draft_model.get_input_embeddings().weight.nbytes)
    draft_floor = draft_bytes / bandwidth * 1e3
    compact_target = compact_of(target_model)
    target_bytes = (distinct_bytes(compact_target.projection_tensors()) if compact_target is not None
                    else weight_bytes(target_model) - target_model.get_input_embeddings().weight.nbytes)
    return {"context_tokens": 256, "target_step_ms": target_step, "draft_step_ms": draft_step,
            "draft_over_target": draft_step / target_step, "goal_over_target": DRAFT_GOAL, "weight_bytes": draft_bytes,
            "floor_ms": draft_floor, "over_floor": draft_step / draft_floor, "goal_over_floor": 1.5,
            "floors_over_target": draft_bytes / target_bytes, "floor_over_measured_target": draft_floor / target_step,
            "verdict_over_target": goal_verdict(draft_step, target_step, DRAFT_GOAL, draft_floor)}


def prefill_row(prefill: dict, before: dict | None, long_ids: list[int], tokens_per_s: float, lengths) -> dict:
    """Prefill at 64-512 tokens, target and draft, against the previous engine's calibrated prefill."""
    return {"prompt_tokens": len(long_ids), "ours_tokens_per_s": tokens_per_s,
            "seconds": {name: {str(n): t for n, t in by_n.items()} for name, by_n in prefill.items()},
            "previous_engine_seconds": None if before is None else {
                name: {str(n): before[name](n) for n in lengths} for name in ("target", "draft")},
            "faster_than_previous_everywhere": None if before is None else all(
                prefill[name][n] < before[name](n) for name in ("target", "draft") for n in lengths)}


def llama_cpp_row(peer: dict | None, ours_tokens: list[int], ours_decode_ms: float, prefill_tps: float) -> dict | None:
    """Each llama.cpp model's row ({"error": ...} where its process died), and ours against F32 where F32 ran."""
    if peer is None:
        return None
    row = {label: measured if "error" in measured else {
        "version": measured["version"], "ms_per_token": measured["ms_per_token"],
        "prefill_tokens_per_s": measured["prefill_tokens_per_s"], "prefill_tokens": measured["prefill_tokens"],
        "same_first_tokens_as_ours": measured["tokens"][:16] == ours_tokens[:16]} for label, measured in peer.items()}
    f32 = peer["f32"]
    ran = "error" not in f32
    return {**row, "ours_decode_ms_per_token": ours_decode_ms,
            "ar_over_f32": ours_decode_ms / f32["ms_per_token"] if ran else None, "goal": 1.0,
            "prefill_over_f32": prefill_tps / f32["prefill_tokens_per_s"] if ran else None, "prefill_goal": 1.5}


BATCH_GOALS = {8: 1.3, 16: 1.6}  # a batched step of b requests / one request, at most


def batch_row(batch: dict[int, float], rows: dict[int, dict] | None) -> dict:
    """Batched steps against one request, each goal's verdict (rakv.bench.roofline.goal_verdict: the step's floor
    over the measured one-row step, where the per-row table measured floors), and the floors' own ratio beside it as
    context only (it bounds no ratio of measured steps)."""
    floors = None if rows is None else {b: row["floor_ms"] for b, row in rows.items()}
    return {"context_tokens": 256, "step_ms": {str(b): t for b, t in batch.items()},
            "over_one": {str(b): t / batch[1] for b, t in batch.items()},
            **{f"goal_{b}": goal for b, goal in BATCH_GOALS.items()},
            "verdicts": {str(b): goal_verdict(batch[b], batch[1], goal, floors and floors[b])
                         for b, goal in BATCH_GOALS.items() if b in batch},
            "floor_over_measured_one": None if floors is None else {str(b): f / batch[1] for b, f in floors.items()},
            "floors_over_one": None if floors is None else {str(b): f / floors[1] for b, f in floors.items()},
            "by_kernel": None if rows is None else {str(b): row for b, row in rows.items()}}


def kernel_rows(pair, engine, long_ids: list[int], repeats: int) -> dict:
    """Verify against one step, the draft's step, batched steps, a chunk beside decodes, prefill, the GEMM."""
    device, target_model = pair.device, pair.target.module
    ratios = verify_ratios(engine, long_ids[:265], repeats * 4)
    steps = [ratios[k] for k in SPEC_K]
    bandwidth = streaming_bandwidth(device)
    prompts = list(load_humaneval()["prompt"])
    contexts = [engine.encode("\n".join(prompts[i::32]))[:257] for i in range(32)]
    sizes = (1, 2, 4, 8, 16, 32)
    if compact_of(target_model) is not None and device.type == "cpu":  # the per-row cost table, by kernel
        rows = row_costs(target_model, device, contexts, sizes, repeats * 2, measured_limits(device))
        batch = {b: row["step_ms"] for b, row in rows.items()}
    else:
        rows, batch = None, batched_steps_ms(target_model, device, contexts, sizes, repeats * 2)
    chunked = chunk_beside_decodes_ms(target_model, device, contexts[:5], 32, repeats * 2)
    lengths = (64, 128, 256, 512)
    prefill = prefill_seconds({"target": target_model, "draft": pair.draft.module}, device, long_ids, lengths, repeats)
    return {"bandwidth": bandwidth, "prefill": prefill, "lengths": lengths,
            "verify": {"context_tokens": 256, "step_ms": ratios[0] * 1e3, "goal_k_le_4": 1.10,
                       "verify_over_step": {str(k): ratios[k] for k in SPEC_K},
                       "monotone": all(a <= b for a, b in zip(steps, steps[1:]))},
            "draft": draft_against_target(pair, long_ids[:257], repeats * 4, bandwidth),
            "batch": batch_row(batch, rows),
            "chunk_beside_decodes": {"chunk_tokens": 32, "decodes": 4, **chunked,
                                     "ratio": chunked["with_chunk"] / chunked["decodes"], "goal": 2.0},
            "gemm": gemm_table(pair, repeats * 2) if compact_of(target_model) is not None and device.type == "cpu"
            else None}


def torch_baseline_rss() -> int:
    """The resident set of a fresh interpreter that has imported torch (bytes): what no loading can save."""
    code = "import torch; print(int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1]) * 1024


MEMORY_GOAL = 1.3  # a fresh process's whole peak resident set / (weights held + K/V), at most


def memory_goal(rss: dict, torch_baseline_bytes: int) -> dict:
    """An rss_probe's peak against the bytes it holds (weights + the most K/V), judged as the goal was first stated
    (scripts/bench_engine.py, docs/engine.md): the whole process's peak resident set over them, <= 1.3. Beside it, not
    judged, the same peak less an interpreter that has only imported torch (`torch_baseline_bytes`): what loading and
    generating add. That second figure was once made the goal's measure after the whole one had missed; a measure
    changed after seeing the data is no test of the goal, so it is printed as information only."""
    held = rss["weight_bytes"] + rss["kv_bytes"]
    return {**rss, "over_weights_and_kv": rss["peak_rss_bytes"] / held, "torch_baseline_bytes": torch_baseline_bytes,
            "above_torch_over_weights_and_kv": (rss["peak_rss_bytes"] - torch_baseline_bytes) / held,
            "goal": MEMORY_GOAL, "verdict": goal_verdict(rss["peak_rss_bytes"], held, MEMORY_GOAL, None)}


def fresh_rss(args) -> dict:
    """rss_probe in a fresh process (this one has grown its arenas), judged by `memory_goal` (docs/engine.md)."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--pair", args.pair, "--new-tokens", str(args.new_tokens),
                           "--device", args.device, "--kernels", args.kernels, "--probe", "rss"]
                          + (["--threads", str(args.threads)] if args.threads else []),
                          capture_output=True, text=True, check=True)
    return memory_goal(json.loads(done.stdout.strip().splitlines()[-1]), torch_baseline_rss())


STARTUP_PROMPT = "def fibonacci(n):"


def first_token_seconds(args, env: dict) -> tuple[float, float]:
    """A fresh `rakv generate` process (AR, one new token) from its start: (seconds to its first token on stdout,
    seconds to its exit). The first token is the first byte after the request's "[0] " header."""
    command = [sys.executable, "-m", "rakv.cli", "generate", "--pair", args.pair, "--prompt", STARTUP_PROMPT,
               "--strategy", "ar", "--max-new-tokens", "1", "--ignore-eos", "--device", args.device,
               "--kernels", args.kernels] + (["--threads", str(args.threads)] if args.threads else [])
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    seen, first = b"", None
    while first is None and (byte := process.stdout.read(1)):
        if b"[0] " in seen:
            first = time.perf_counter() - started
        seen += byte
    process.stdout.read()
    if process.wait() != 0 or first is None:
        raise RuntimeError(f"rakv generate failed (exit {process.returncode}): {seen.decode(errors='replace')}")
    return first, time.perf_counter() - started


def serve_first_token_seconds(args, env: dict) -> float:
    """A fresh `rakv serve --http` process (AR, a free port) from its start to the first token of one completion
    (one new token) asked as soon as it says it is ready; the server is then drained with SIGTERM."""
    import re
    import signal
    import urllib.request

    command = [sys.executable, "-m", "rakv.cli", "serve", "--http", "127.0.0.1:0", "--pair", args.pair, "--strategy",
               "ar", "--no-calibrate", "--device", args.device, "--kernels", args.kernels, "--quiet"] + (
        ["--threads", str(args.threads)] if args.threads else [])
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        line = process.stdout.readline()
        where = re.search(r"rakv serve: (.+) on http://([^/]+)/v1", line)
        if where is None:
            raise RuntimeError(f"rakv serve --http did not say where it listens: {line.strip() or 'no output'}")
        body = json.dumps({"model": where[1], "prompt": STARTUP_PROMPT, "max_tokens": 1}).encode()
        request = urllib.request.Request(f"http://{where[2]}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            json.loads(response.read())
        return time.perf_counter() - started
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


def startup(args, warm_runs: int = 2) -> dict:
    """Start-up to the first token of fresh `rakv generate` processes: once with the packed weights' cache cold (a
    derived-files folder without them: the GGUF is read and packed, then written), then warm (mapped). The folder
    is a temporary copy of this machine's tokenizer exports and file hashes, removed afterwards."""
    import os
    import shutil
    import tempfile

    from rakv.runtime.models import derived_files_dir

    source = derived_files_dir()
    with tempfile.TemporaryDirectory(prefix="rakv-startup-") as folder:
        for name in ("tokenizers", "file_hashes.json"):
            if (source / name).is_dir():
                shutil.copytree(source / name, Path(folder) / name)
            elif (source / name).exists():
                shutil.copyfile(source / name, Path(folder) / name)
        env = {**os.environ, "RAKV_CACHE_DIR": folder}
        cold = first_token_seconds(args, env)
        warm = [first_token_seconds(args, env) for _ in range(warm_runs)]
        serve_warm = [serve_first_token_seconds(args, env) for _ in range(warm_runs)]
    return {"cold_first_token_s": cold[0], "cold_exit_s": cold[1],
            "warm_first_token_s": statistics.median(w[0] for w in warm),
            "warm_exit_s": statistics.median(w[1] for w in warm), "warm_runs": warm_runs, "goal_warm_s": 10.0,
            "serve_warm_first_token_s": statistics.median(serve_warm)}


def bench(args, pair, stock, engine, ids) -> dict:
    """Every measurement of the full benchmark (docs/engine.md), as one JSON-ready report."""
    device, n = pair.device, args.new_tokens
    measured = generations(args, make_sides(pair, stock, engine, ids, n), device)
    spec = measured["outputs"]["ours-spec-k4"]
    long_ids, other = reuse_prompts(engine, load_humaneval(), args.long_prompt_tokens)
    ttft = store_ttft(engine, long_ids, other, args.repeats)
    draft_reuse = (draft_reuse_rows(engine, long_ids, other, args.repeats) if engine.proposer_type.has_draft_model
                   else None)
    kernels = kernel_rows(pair, engine, long_ids, args.repeats)
    target_bytes = weight_bytes(stock.target.module)
    floor_ms = target_bytes / kernels["bandwidth"] * 1e3
    prefill = kernels.pop("prefill")
    lengths = kernels.pop("lengths")
    # llama.cpp beside us (optional extra), and this process's own prefill speed on the same long prompt
    peer = None if args.no_peer else llama_cpp_peer(load_humaneval()[2]["prompt"], pair.tokenizer.decode(long_ids), n,
                                                    args.repeats, torch.get_num_threads())
    prefill_tps = (len(long_ids) / prefill["target"][512] if len(long_ids) >= 512
                   else len(long_ids) / (ttft["cold_ms"] / 1e3))
    return {"pair": pair.name, "device": str(device), "threads": torch.get_num_threads(), "kernels": args.kernels,
            "new_tokens": n, "prompt_tokens": len(ids), "repeats": args.repeats, **generation_rows(measured),
            "floor": {"weight_bytes": target_bytes, "bandwidth_gb_s": kernels.pop("bandwidth") / 1e9,
                      "floor_ms": floor_ms, "ar_over_floor": measured["ms"]["ours-ar"] / floor_ms, "goal": 1.6},
            "ttft": ttft, "draft_reuse": draft_reuse,
            "spec_k4_acceptance": {"accepted_over_proposed": spec.accepted / max(spec.proposed, 1),
                                   "alpha": acceptance_estimate(spec.round_log), "rounds": spec.rounds},
            **kernels, "prefill": prefill_row(prefill, previous_prefill(args.pair), long_ids, prefill_tps, lengths),
            "memory": fresh_rss(args), "startup": startup(args),
            "llama_cpp": llama_cpp_row(peer, measured["outputs"]["ours-ar"].token_ids, measured["decode_ms"],
                                       prefill_tps)}
