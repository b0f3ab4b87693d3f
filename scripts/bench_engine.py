"""Engine benchmark on one pair, side by side with transformers (and llama.cpp when installed) in one run; prints ratios.

    .venv/bin/python scripts/bench_engine.py [--pair smollm2] [--kernels compact] [--new-tokens 64] [--repeats 3] [--json]
    .venv/bin/python scripts/bench_engine.py --gemm   # only the GEMM table (rakv.runtime.kernels.cpp) by row count
    .venv/bin/python scripts/bench_engine.py --draft-reuse   # only the draft's prefill with and without its stored state
    pip install -e '.[peers]'   # optional: llama.cpp beside us (llama-cpp-python builds from source, 10-15 min)

Our engine runs the pair with `--kernels` (rakv.runtime.kernels; default compact); transformers' `generate` and
assisted generation run a second copy of the pair loaded with stock kernels, i.e. transformers as shipped. With
`llama-cpp-python` installed, llama.cpp decodes the same prompt greedily on the shipped Q4_1 GGUF and on that file
converted to F32 (the same dequantised fp32 weights as our target), and prefills the same ~512-token prompt.
Printed, each a median of interleaved repeats, with the goal beside it:
- AR and spec-k4 ms/token (prefill included), ours / transformers (identical outputs required); ours / llama.cpp F32:
  decode ms/token after the first token (goal <= 1.0) and prefill tokens/s of the same ~512 tokens (goal >= 1.5);
- the GEMM by row count (1-512 rows through the pair's own packed projections, fp32 target and int8 draft): ms,
  / one row, GFLOPS against the machine's FMA peak measured by the kernels themselves, GB/s of weights;
- the floor (target weight bytes / streaming bandwidth); the int8 draft's step against its floor and against the
  target step (goal <= 0.30);
- verify(k + 1) / one step for k in 1, 2, 4, 6, 8 (goal <= 1.10 for k <= 4);
- a batched step of 1, 2, 4, 8, 16 requests (each its own 256-token context) / one request (goals: 8 <= 1.3,
  16 <= 2.2); a 32-token prefill chunk beside 4 decoding requests / the 4 decodes alone (goal <= 2);
- prefill of 64, 128, 256 and 512 tokens, target and draft, against the previous engine's calibration
  (data/reference/offline-fast-kernels: goal faster at every point; measured on the reference machine);
- TTFT with the prefix store (exact repeat / cold <= 0.05, 50 % partial hit / cold <= 0.6, ~512 tokens);
- the draft's prefill before a joint-k4 request's first round, with the draft's state in the store and without
  (exact repeat: goal <= 0.05 of it without; 50 % partial hit);
- memory: the peak increase while each generation runs (fresh processes), and a fresh process's peak
  resident set against the bytes of the weights it holds plus its K/V (goal <= 1.3).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import subprocess
import sys
import time

import torch

from rakv.runtime.actions import SPEC_K, Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.costmodel import acceptance_estimate
from rakv.runtime.compact import Segment
from rakv.runtime.decoding import crop_cache, forward, forward_rows, synchronize
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import KERNEL_MODES, compact_of, new_kv_cache
from rakv.runtime.models import load_pair
from rakv.runtime.workloads import load_humaneval


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
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


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
    out = subprocess.run([sys.executable, __file__, "--pair", args.pair, "--new-tokens", str(args.new_tokens),
                          "--device", args.device, "--kernels", args.kernels, "--probe", args.side_to_probe] +
                         (["--threads", str(args.threads)] if args.threads else []),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    return float(out.stdout.strip().splitlines()[-1])


def distinct_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (a tied or shared tensor counted once)."""
    seen = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def model_tensors(module) -> list:
    compact = compact_of(module)
    if compact is not None and compact is module:  # a compact-only model (the int8 draft)
        return compact.tensors()
    return list(module.state_dict().values()) + (compact.tensors() if compact is not None else [])


def weight_bytes(module) -> int:
    """Bytes of the distinct parameter storages (a tied embedding counted once): what one token streams."""
    return distinct_bytes(model_tensors(module))


def streaming_bandwidth(device, repeats: int = 7) -> float:
    """Bytes per second of a reduction over 512 MiB (a sum reads each byte once)."""
    x = torch.ones(2**27, device=device)
    times = [seconds(x.sum, device) for _ in range(repeats + 1)][1:]
    return 2**29 / statistics.median(times)


def verify_ratios(engine, context: list[int], repeats: int) -> dict[int, float]:
    """Median target forward over k + 1 new tokens / median one-token step, on a cache holding `context`;
    key 0: the step in seconds."""
    ms = step_ms(engine.pair.target.module, engine.pair.device, context, (1, *(k + 1 for k in SPEC_K)), repeats)
    return {width - 1: t / ms[1] for width, t in ms.items() if width > 1} | {0: ms[1] / 1e3}


def step_ms(model, device, context: list[int], widths, repeats: int) -> dict[int, float]:
    """Median ms of one forward over `width` new tokens on a cache holding `context`, interleaved over widths."""
    ids = torch.tensor([context], device=device)
    cache = new_kv_cache(model)
    times = {w: [] for w in widths}
    with torch.inference_mode():
        forward(model, ids[:, :-max(widths)], cache, keep=1)
        base = cache.get_seq_length()
        for repeat in range(repeats + 1):
            for width in widths:
                t = seconds(lambda: forward(model, ids[:, base:base + width], cache, keep=1 if width == 1 else 0),
                            device)
                crop_cache(cache, base)
                if repeat:
                    times[width].append(t)
    return {w: statistics.median(t) * 1e3 for w, t in times.items()}


def batched_steps_ms(model, device, contexts: list[list[int]], sizes, repeats: int) -> dict[int, float]:
    """Median ms of one batched decode step of b requests (each one new token on its own context)."""
    caches = [new_kv_cache(model) for _ in contexts]
    with torch.inference_mode():
        for cache, context in zip(caches, contexts):
            forward(model, torch.tensor([context[:-1]], device=device), cache, keep=1)
        lengths = [c.get_seq_length() for c in caches]
        times = {b: [] for b in sizes}
        for repeat in range(repeats + 1):
            for b in sizes:
                segments = [Segment(torch.tensor(contexts[i][-1:], device=device), caches[i], 1) for i in range(b)]
                t = seconds(lambda: forward_rows(model, segments), device)
                for cache, length in zip(caches, lengths):
                    crop_cache(cache, length)
                if repeat:
                    times[b].append(t)
    return {b: statistics.median(t) * 1e3 for b, t in times.items()}


def llama_cpp_peer(prompt: str, long_prompt: str, n: int, repeats: int, threads: int) -> dict | None:
    """llama.cpp (llama-cpp-python) on the shipped Q4_1 GGUF and on its F32 conversion: decode ms/token (greedy,
    `n` tokens) and prefill tokens/s on `long_prompt`; None when llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    from rakv.runtime.models import derived_files_dir, file_hash, smollm2_gguf_path

    q4 = smollm2_gguf_path()
    f32 = derived_files_dir() / "gguf" / f"{file_hash(q4)}-f32.gguf"
    if not f32.exists():  # the same dequantised fp32 weights as our target
        f32.parent.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = 0, True, threads  # 0 = LLAMA_FTYPE_ALL_F32
        tmp = f32.with_suffix(".tmp")
        if llama_cpp.llama_model_quantize(str(q4).encode(), str(tmp).encode(), params) != 0:
            raise RuntimeError("llama.cpp could not convert the GGUF to F32")
        tmp.replace(f32)
    out = {"version": getattr(llama_cpp, "__version__", "?")}
    for label, path in (("f32", f32), ("q4_1", q4)):
        llm = llama_cpp.Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=2048,
                              verbose=False)
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
        out[label] = {"ms_per_token": statistics.median(decode), "prefill_tokens_per_s": statistics.median(prefill),
                      "prefill_tokens": len(long_tokens), "tokens": text}
        del llm
    return out


def rss_probe(args) -> dict:
    """In a fresh process: load only our pair, generate (AR, spec-k4, a batched step of 8), and compare the peak
    resident set with the bytes of the weights held plus the most K/V held; also the resident set before loading
    (the interpreter and its libraries) and its peak once the pair is loaded (dequantisation and packing)."""
    before_load = rss_kib("VmRSS") * 1024
    pair = load_pair(args.pair, device=args.device, threads=args.threads, kernels=args.kernels)
    loaded_peak = rss_kib("VmHWM") * 1024
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30))
    ids = engine.encode(load_humaneval()[2]["prompt"])
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


def print_draft_reuse(rows: dict, tokens: int) -> None:
    for case, row in rows.items():
        print(f"joint-k4 draft prefill before the first round, {case} ({tokens} tokens): with the draft's "
              f"state in the store {row['with_ms']:.2f} ms, without {row['without_ms']:.1f} ms (ratio "
              f"{row['ratio']:.3f}{', goal <=0.05' if case == 'exact repeat' else ''}); draft positions reused "
              f"{row['draft_hit_tokens']}")


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
    times = {(name, m): [] for name in sides for m in rows}
    order = list(times)
    shuffle = random.Random(0).shuffle  # a fresh order each repeat: no point always follows the same one
    with torch.inference_mode():
        for repeat in range(repeats + 1):
            shuffle(order)
            for name, m in order:
                t = seconds(lambda: [p(inputs[p.in_features][:m]) for p in sides[name]], pair.device)
                if repeat:
                    times[name, m].append(t)
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


def print_gemm_table(table: dict) -> None:
    print(f"GEMM by row count (kernels.cpp, {table['threads']} threads; fp32 FMA peak measured "
          f"{table['fma_peak_gflops']:.0f} GFLOPS): rows: ms (/ one row, GFLOPS or int8 GOPS, GB/s of weights)")
    for name, side in table["sides"].items():
        print(f"  {name} ({side['weight_bytes'] / 1e6:.0f} MB): " + "; ".join(
            f"{r['rows']}: {r['ms']:.1f} ({r['over_one']:.2f}x, {r['gflops']:.0f}"
            + (f" = {r['gflops'] / table['fma_peak_gflops']:.0%} of peak" if name == "fp32" else "")
            + f", {r['gb_s']:.0f})" for r in side["rows"]))


def chunk_beside_decodes_ms(model, device, contexts: list[list[int]], chunk: int, repeats: int) -> dict:
    """A batched step of 4 decoding requests (256-token contexts) alone and with a `chunk`-token prefill chunk of a
    fifth request (after 256 positions of its own) in the same pass; medians of interleaved repeats (ms)."""
    caches = [new_kv_cache(model) for _ in range(5)]
    with torch.inference_mode():
        for cache, context in zip(caches, contexts):
            forward(model, torch.tensor([context[:256]], device=device), cache, keep=1)
        decodes = [Segment(torch.tensor(c[256:257], device=device), cache, 1) for c, cache in zip(contexts, caches)]
        piece = Segment(torch.tensor(contexts[4][256:256 + chunk], device=device), caches[4], 1)
        times = {"decodes": [], "with_chunk": []}
        for repeat in range(repeats + 1):
            for label, segments in (("decodes", decodes[:4]), ("with_chunk", decodes[:4] + [piece])):
                t = seconds(lambda: forward_rows(model, segments), device)
                for cache in caches:
                    crop_cache(cache, 256)
                if repeat:
                    times[label].append(t)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


def prefill_seconds(models: dict, device, ids: list[int], lengths, repeats: int) -> dict:
    """Median seconds of a cold prefill of `n` tokens (logits of the last one), per model, interleaved."""
    times = {(name, n): [] for name in models for n in lengths}
    with torch.inference_mode():
        for repeat in range(repeats + 1):
            for name, model in models.items():
                for n in lengths:
                    t = seconds(lambda: forward(model, torch.tensor([ids[:n]], device=device), new_kv_cache(model),
                                                keep=1), device)
                    if repeat:
                        times[name, n].append(t)
    return {name: {n: statistics.median(times[name, n]) for n in lengths} for name in models}


def previous_prefill(pair_name: str) -> dict | None:
    """The previous engine's calibrated prefill curves (data/reference/offline-fast-kernels), target and draft."""
    from rakv.runtime.costmodel import Curve
    from rakv.runtime.paths import REFERENCE_DIR

    path = REFERENCE_DIR / "offline-fast-kernels" / "calibration" / f"{pair_name}-draft.json"
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    return {"target": Curve(**table["target_prefill"]), "draft": Curve(**table["proposer_prefill"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-prompt-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kernels", default="compact", choices=KERNEL_MODES, help="our side's kernels")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--no-peer", action="store_true", help="skip llama.cpp even when it is installed")
    parser.add_argument("--gemm", action="store_true", help="only the GEMM table by row count (kernels.cpp)")
    parser.add_argument("--draft-reuse", action="store_true",
                        help="only the draft's prefill before a joint-k4 request's first round, with and without "
                             "the draft's state in the store")
    parser.add_argument("--probe", choices=("ours-ar", "hf-ar", "ours-spec-k4", "hf-spec-k4", "rss"),
                        help=argparse.SUPPRESS)  # internal: one memory measurement in a fresh process
    args = parser.parse_args()
    if args.probe == "rss":
        print(json.dumps(rss_probe(args)))
        return 0
    if args.gemm:
        try:
            pair = load_pair(args.pair, device=args.device, threads=args.threads, kernels="compact")
        except RakvError as exc:
            print(f"bench_engine: error: {exc}", file=sys.stderr)
            return 2
        table = gemm_table(pair, args.repeats * 2)
        print(json.dumps(table) if args.json else "", end="\n" if args.json else "")
        if not args.json:
            print_gemm_table(table)
        return 0
    if args.draft_reuse:
        try:
            engine = Engine(load_pair(args.pair, device=args.device, threads=args.threads, kernels=args.kernels),
                            PrefixKVStore(budget_bytes=1 << 30))
        except RakvError as exc:
            print(f"bench_engine: error: {exc}", file=sys.stderr)
            return 2
        long_ids, other = reuse_prompts(engine, load_humaneval(), args.long_prompt_tokens)
        engine.run(long_ids, Action.of_strategy("joint-k4"), 2)  # warm-up of every path
        rows = draft_reuse_rows(engine, long_ids, other, args.repeats)
        print(json.dumps(rows)) if args.json else print_draft_reuse(rows, len(long_ids))
        return 0
    try:
        pair = load_pair(args.pair, device=args.device, threads=args.threads, kernels=args.kernels)
        stock = load_pair(args.pair, device=args.device, threads=args.threads, kernels="stock")
    except RakvError as exc:
        print(f"bench_engine: error: {exc}", file=sys.stderr)
        return 2
    device = pair.device
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30))
    problems = load_humaneval()
    ids = engine.encode(problems[2]["prompt"])
    n = args.new_tokens
    sides = make_sides(pair, stock, engine, ids, n)
    if args.probe:
        print(peak_increase_mib(sides[args.probe], device))
        return 0

    for fn in sides.values():  # warm-up of every path
        fn()
    times = {label: [] for label in sides}
    decode_ms = []  # our AR's ms per token after the first, as llama.cpp's decode rate is counted
    for _ in range(args.repeats):  # interleaved, so drift on a noisy machine hits both sides alike
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
    ms = {label: statistics.median(t) / n * 1e3 for label, t in times.items()}
    rows = [(kind, ms[f"ours-{kind}"], ms[f"hf-{kind}"], memory[f"ours-{kind}"], memory[f"hf-{kind}"],
             outputs[f"ours-{kind}"].token_ids == outputs[f"hf-{kind}"]) for kind in ("ar", "spec-k4")]
    spec = outputs["ours-spec-k4"]
    accepted_share = spec.accepted / max(spec.proposed, 1)
    alpha = acceptance_estimate(spec.round_log)

    # TTFT with the store: a ~512-token prompt cold, as an exact repeat, and after a 50 % shared prefix.
    long_ids, other = reuse_prompts(engine, problems, args.long_prompt_tokens)

    def ttft(prompt, warm=None):
        engine.store.clear()
        if warm is not None:
            engine.run(warm, Action.of_strategy("ar"), 1)
        return engine.run(prompt, Action.of_strategy("kv-only"), 1).ttft_s

    cold = statistics.median(ttft(long_ids) for _ in range(args.repeats))
    exact = statistics.median(ttft(long_ids, warm=long_ids) for _ in range(args.repeats))
    partial = statistics.median(ttft(other, warm=long_ids) for _ in range(args.repeats))

    draft_reuse = (draft_reuse_rows(engine, long_ids, other, args.repeats) if engine.proposer_type.has_draft_model
                   else None)

    ratios = verify_ratios(engine, long_ids[:265], args.repeats * 4)
    bandwidth = streaming_bandwidth(device)
    target_bytes = weight_bytes(stock.target.module)
    floor_ms = target_bytes / bandwidth * 1e3
    steps = [ratios[k] for k in SPEC_K]

    # the draft's one-token step against the target's, interleaved, and against its own floor
    context = long_ids[:257]
    draft_model, target_model = pair.draft.module, pair.target.module
    both = {"target": [], "draft": []}
    for _ in range(args.repeats * 4):
        both["target"].append(step_ms(target_model, device, context, (1,), 1)[1])
        both["draft"].append(step_ms(draft_model, device, context, (1,), 1)[1])
    target_step, draft_step = (statistics.median(both[k]) for k in ("target", "draft"))
    compact_draft = compact_of(draft_model)
    draft_bytes = (distinct_bytes(compact_draft.projection_tensors()) if compact_draft is not None
                   else weight_bytes(draft_model) - draft_model.get_input_embeddings().weight.nbytes)
    draft_floor = draft_bytes / bandwidth * 1e3

    # a batched decode step of b requests, each with its own 256-token context, against one request
    prompts = list(problems["prompt"])
    contexts = [engine.encode("\n".join(prompts[i::16]))[:257] for i in range(16)]
    batch = batched_steps_ms(target_model, device, contexts, (1, 2, 4, 8, 16), args.repeats * 2)
    chunked = chunk_beside_decodes_ms(target_model, device, contexts[:5], 32, args.repeats * 2)

    # prefill at 64-512 tokens, target and draft, against the previous engine's calibrated prefill
    lengths = (64, 128, 256, 512)
    prefill = prefill_seconds({"target": target_model, "draft": draft_model}, device, long_ids, lengths,
                              args.repeats)
    before = previous_prefill(args.pair)
    gemm = gemm_table(pair, args.repeats * 2) if compact_of(target_model) is not None and device.type == "cpu" else None

    # llama.cpp beside us (optional extra), and this process's own prefill speed on the same long prompt
    long_text = pair.tokenizer.decode(long_ids)
    peer = None if args.no_peer else llama_cpp_peer(problems[2]["prompt"], long_text, n, args.repeats,
                                                    torch.get_num_threads())
    prefill_tps = len(long_ids) / prefill["target"][512] if len(long_ids) >= 512 else len(long_ids) / cold
    ours_decode_ms = statistics.median(decode_ms)
    rss = json.loads(subprocess.run([sys.executable, __file__, "--pair", args.pair, "--new-tokens", str(n),
                                     "--device", args.device, "--kernels", args.kernels, "--probe", "rss"] +
                                    (["--threads", str(args.threads)] if args.threads else []),
                                    capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    report = {
        "pair": pair.name, "device": str(device), "threads": torch.get_num_threads(), "kernels": args.kernels,
        "new_tokens": n, "prompt_tokens": len(ids), "repeats": args.repeats,
        "ar": {"ours_ms_per_token": ms["ours-ar"], "hf_ms_per_token": ms["hf-ar"],
               "ratio": ms["ours-ar"] / ms["hf-ar"], "goal": 0.55, "same_output": rows[0][5],
               "ours_peak_mib": memory["ours-ar"], "hf_peak_mib": memory["hf-ar"]},
        "spec_k4": {"ours_ms_per_token": ms["ours-spec-k4"], "hf_ms_per_token": ms["hf-spec-k4"],
                    "ratio": ms["ours-spec-k4"] / ms["hf-spec-k4"], "goal": 0.70, "same_output": rows[1][5],
                    "ours_peak_mib": memory["ours-spec-k4"], "hf_peak_mib": memory["hf-spec-k4"]},
        "floor": {"weight_bytes": target_bytes, "bandwidth_gb_s": bandwidth / 1e9, "floor_ms": floor_ms,
                  "ar_over_floor": ms["ours-ar"] / floor_ms, "goal": 1.6},
        "verify": {"context_tokens": 256, "step_ms": ratios[0] * 1e3, "goal_k_le_4": 1.10,
                   "verify_over_step": {str(k): ratios[k] for k in SPEC_K},
                   "monotone": all(a <= b for a, b in zip(steps, steps[1:]))},
        "ttft": {"prompt_tokens": len(long_ids), "cold_ms": cold * 1e3, "exact_ms": exact * 1e3,
                 "partial_ms": partial * 1e3, "exact_over_cold": exact / cold, "partial_over_cold": partial / cold},
        "draft_reuse": draft_reuse,
        "spec_k4_acceptance": {"accepted_over_proposed": accepted_share, "alpha": alpha, "rounds": spec.rounds},
        "draft": {"context_tokens": 256, "target_step_ms": target_step, "draft_step_ms": draft_step,
                  "draft_over_target": draft_step / target_step, "goal_over_target": 0.30,
                  "weight_bytes": draft_bytes, "floor_ms": draft_floor, "over_floor": draft_step / draft_floor,
                  "goal_over_floor": 1.5},
        "batch": {"context_tokens": 256, "step_ms": {str(b): t for b, t in batch.items()},
                  "over_one": {str(b): t / batch[1] for b, t in batch.items()}, "goal_8": 1.3, "goal_16": 2.2},
        "chunk_beside_decodes": {"chunk_tokens": 32, "decodes": 4, **chunked,
                                 "ratio": chunked["with_chunk"] / chunked["decodes"], "goal": 2.0},
        "prefill": {"prompt_tokens": len(long_ids), "ours_tokens_per_s": prefill_tps,
                    "seconds": {name: {str(n): t for n, t in by_n.items()} for name, by_n in prefill.items()},
                    "previous_engine_seconds": None if before is None else {
                        name: {str(n): before[name](n) for n in lengths} for name in ("target", "draft")},
                    "faster_than_previous_everywhere": None if before is None else all(
                        prefill[name][n] < before[name](n) for name in ("target", "draft") for n in lengths)},
        "gemm": gemm,
        "memory": {**rss, "over_weights_and_kv": rss["peak_rss_bytes"] / (rss["weight_bytes"] + rss["kv_bytes"]),
                   "goal": 1.3},
        "llama_cpp": None if peer is None else {
            "version": peer["version"],
            **{label: {"ms_per_token": peer[label]["ms_per_token"],
                       "prefill_tokens_per_s": peer[label]["prefill_tokens_per_s"],
                       "prefill_tokens": peer[label]["prefill_tokens"],
                       "same_first_tokens_as_ours": peer[label]["tokens"][:16] == outputs["ours-ar"].token_ids[:16]}
               for label in ("f32", "q4_1")},
            "ours_decode_ms_per_token": ours_decode_ms,
            "ar_over_f32": ours_decode_ms / peer["f32"]["ms_per_token"], "goal": 1.0,
            "prefill_over_f32": prefill_tps / peer["f32"]["prefill_tokens_per_s"], "prefill_goal": 1.5},
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"pair={pair.name} device={device} threads={torch.get_num_threads()} kernels={args.kernels} (ours) vs stock "
          f"(transformers) new_tokens={n} prompt={len(ids)} tokens (HumanEval/2), repeats={args.repeats}")
    print(f"{'measure':<10} {'ours ms/tok':>12} {'hf ms/tok':>10} {'ratio':>7} {'goal':>6} "
          f"{'ours peak MiB':>14} {'hf peak MiB':>12} {'same output':>12}")
    for key, label in (("ar", "ar"), ("spec_k4", "spec-k4")):
        row = report[key]
        print(f"{label:<10} {row['ours_ms_per_token']:>12.2f} {row['hf_ms_per_token']:>10.2f} {row['ratio']:>7.3f} "
              f"{'<=' + str(row['goal']):>6} {row['ours_peak_mib']:>14.1f} {row['hf_peak_mib']:>12.1f} "
              f"{str(row['same_output']):>12}")
    print(f"floor: {target_bytes / 1e6:.0f} MB of target weights / {bandwidth / 1e9:.1f} GB/s streaming (sum over "
          f"512 MiB) = {floor_ms:.1f} ms/token; our AR / floor = {ms['ours-ar'] / floor_ms:.2f} (goal <=1.6)")
    print(f"verify(k+1) / one step at 256 tokens of context (step {ratios[0] * 1e3:.1f} ms): "
          + ", ".join(f"k={k} {ratios[k]:.2f}" for k in SPEC_K)
          + f" (goal <=1.10 for k <= 4); monotone in k: {report['verify']['monotone']}")
    print(f"TTFT on a {len(long_ids)}-token prompt: cold {cold * 1e3:.1f} ms, exact repeat {exact * 1e3:.2f} ms "
          f"(ratio {exact / cold:.3f}, goal <=0.05), 50 % partial hit {partial * 1e3:.1f} ms "
          f"(ratio {partial / cold:.3f}, goal <=0.6)")
    if draft_reuse is not None:
        print_draft_reuse(draft_reuse, len(long_ids))
    print(f"spec-k4 on this prompt: accepted/proposed {accepted_share:.3f}, per-token acceptance alpha "
          f"{alpha:.3f} (accepted / (accepted + rejecting rounds)) over {spec.rounds} rounds")
    d = report["draft"]
    print(f"draft step at 256 tokens of context {draft_step:.2f} ms vs target step {target_step:.2f} ms: ratio "
          f"{d['draft_over_target']:.3f} (goal <=0.30); its floor {draft_bytes / 1e6:.0f} MB / "
          f"{bandwidth / 1e9:.1f} GB/s = {draft_floor:.2f} ms, step / floor {d['over_floor']:.2f} (goal <=1.5)")
    print("batched step, b requests each with its own 256-token context (ms; / one request): "
          + ", ".join(f"b={b} {t:.1f} ({t / batch[1]:.2f})" for b, t in batch.items())
          + " (goals b=8 <=1.3, b=16 <=2.2)")
    c = report["chunk_beside_decodes"]
    print(f"a 32-token prefill chunk beside 4 decoding requests: {c['with_chunk']:.1f} ms vs the 4 decodes alone "
          f"{c['decodes']:.1f} ms: {c['ratio']:.2f}x (goal <=2)")
    pre = report["prefill"]
    print("prefill (s), target / draft: " + ", ".join(
        f"{n} tokens {prefill['target'][n]:.3f} / {prefill['draft'][n]:.3f}" for n in lengths))
    if before is not None:
        print("  previous engine (data/reference/offline-fast-kernels, its own machine), target / draft: " + ", ".join(
            f"{n} {before['target'](n):.3f} / {before['draft'](n):.3f}" for n in lengths)
              + f"; faster at every point: {pre['faster_than_previous_everywhere']}")
    if gemm is not None:
        print_gemm_table(gemm)
    m = report["memory"]
    print(f"memory (fresh process, our pair only): peak RSS {m['peak_rss_bytes'] / 1e6:.0f} MB vs weights "
          f"{m['weight_bytes'] / 1e6:.0f} MB + K/V {m['kv_bytes'] / 1e6:.1f} MB: ratio {m['over_weights_and_kv']:.2f} "
          f"(goal <=1.3); before loading {m['rss_before_load_bytes'] / 1e6:.0f} MB (interpreter and libraries), "
          f"peak once loaded {m['peak_rss_after_load_bytes'] / 1e6:.0f} MB (dequantisation and packing)")
    peer_row = report["llama_cpp"]
    if peer_row is None:
        print("llama.cpp: not installed (pip install -e '.[peers]', builds from source in 10-15 min) or --no-peer")
    else:
        for label in ("f32", "q4_1"):
            row = peer_row[label]
            print(f"llama.cpp {peer_row['version']} {label}: decode {row['ms_per_token']:.2f} ms/token, prefill "
                  f"{row['prefill_tokens_per_s']:.0f} tokens/s ({row['prefill_tokens']} tokens); first 16 tokens "
                  f"equal ours: {row['same_first_tokens_as_ours']}")
        print(f"ours / llama.cpp F32: AR decode after the first token {ours_decode_ms:.2f} ms/token = "
              f"{peer_row['ar_over_f32']:.3f}x (goal <=1.0), prefill of {len(long_ids)} tokens {prefill_tps:.0f} "
              f"tokens/s = {peer_row['prefill_over_f32']:.2f}x (goal >=1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
