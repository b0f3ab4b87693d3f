"""Engine benchmark on one pair, side by side with transformers in one process; prints ratios.

    .venv/bin/python scripts/bench_engine.py [--pair smollm2] [--kernels fast] [--new-tokens 64] [--repeats 3] [--json]

Our engine runs the pair with `--kernels` (rakv.kernels; default fast); transformers' `generate` and
assisted generation run a second copy of the pair loaded with stock kernels, i.e. transformers as
shipped. Goals: our AR ms/token / `generate` <= 0.55; our spec-k4 / assisted generation (same draft,
4 assistant tokens, constant schedule) <= 0.70, both with identical output; our AR ms/token / floor
<= 1.6, where floor = the target's weight bytes / measured streaming bandwidth (one pass over the
weights per token); verify(k+1) / one step printed for k in 1, 2, 4, 6, 8, which should be monotone
in k; exact-repeat TTFT / cold TTFT <= 0.05 and 50 % partial-hit TTFT / cold <= 0.6 on a ~512-token
prompt. Timings are medians of interleaved repeats; memory is the peak increase while a call runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time

import torch

from rakv.actions import SPEC_K, Action
from rakv.cache import PrefixKVStore
from rakv.costmodel import acceptance_estimate
from rakv.decoding import synchronize
from rakv.engine import Engine
from rakv.errors import RakvError
from rakv.models import load_pair
from rakv.workloads import load_humaneval


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


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of the distinct parameter storages (a tied embedding counted once): what one token streams."""
    seen, total = set(), 0
    for tensor in module.state_dict().values():
        if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in seen:
            seen.add(tensor.untyped_storage().data_ptr())
            total += tensor.untyped_storage().nbytes()
    return total


def streaming_bandwidth(device, repeats: int = 7) -> float:
    """Bytes per second of a reduction over 512 MiB (a sum reads each byte once)."""
    x = torch.ones(2**27, device=device)
    times = [seconds(x.sum, device) for _ in range(repeats + 1)][1:]
    return 2**29 / statistics.median(times)


def verify_ratios(engine, context: list[int], repeats: int) -> dict[int, float]:
    """Median target forward over k + 1 new tokens / median one-token step, on a cache holding `context`."""
    from rakv.decoding import crop_cache, forward
    from rakv.kernels import new_kv_cache

    target, device = engine.pair.target.module, engine.pair.device
    ids = torch.tensor([context], device=device)
    cache = new_kv_cache(target)
    with torch.inference_mode():
        forward(target, ids[:, :-9], cache, keep=1)
        base = cache.get_seq_length()
        times = {}
        for width in (1, *(k + 1 for k in SPEC_K)):  # interleaved repeats, the first a warm-up
            times[width] = []
        for repeat in range(repeats + 1):
            for width in times:
                t = seconds(lambda: forward(target, ids[:, base:base + width], cache, keep=1 if width == 1 else 0),
                            device)
                crop_cache(cache, base)
                if repeat:
                    times[width].append(t)
    step = statistics.median(times[1])
    return {width - 1: statistics.median(t) / step for width, t in times.items() if width > 1} | {0: step}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-prompt-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kernels", default="fast", choices=("stock", "fast"), help="our side's kernels")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--probe", choices=("ours-ar", "hf-ar", "ours-spec-k4", "hf-spec-k4"),
                        help=argparse.SUPPRESS)  # internal: one memory measurement in a fresh process
    args = parser.parse_args()
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
    for _ in range(args.repeats):  # interleaved, so drift on a noisy machine hits both sides alike
        for label, fn in sides.items():
            times[label].append(seconds(fn, device))
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
    prompts = list(problems["prompt"])
    long_ids = engine.encode("\n".join(prompts))[: args.long_prompt_tokens]
    half = len(long_ids) // 2
    other = long_ids[:half] + engine.encode("\n".join(reversed(prompts)))[: len(long_ids) - half]

    def ttft(prompt, warm=None):
        engine.store.clear()
        if warm is not None:
            engine.run(warm, Action.of_strategy("ar"), 1)
        return engine.run(prompt, Action.of_strategy("kv-only"), 1).ttft_s

    cold = statistics.median(ttft(long_ids) for _ in range(args.repeats))
    exact = statistics.median(ttft(long_ids, warm=long_ids) for _ in range(args.repeats))
    partial = statistics.median(ttft(other, warm=long_ids) for _ in range(args.repeats))

    ratios = verify_ratios(engine, long_ids[:265], args.repeats * 4)
    bandwidth = streaming_bandwidth(device)
    target_bytes = weight_bytes(stock.target.module)
    floor_ms = target_bytes / bandwidth * 1e3
    steps = [ratios[k] for k in SPEC_K]
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
        "verify": {"context_tokens": 256, "step_ms": ratios[0] * 1e3,
                   "verify_over_step": {str(k): ratios[k] for k in SPEC_K},
                   "monotone": all(a <= b for a, b in zip(steps, steps[1:]))},
        "ttft": {"prompt_tokens": len(long_ids), "cold_ms": cold * 1e3, "exact_ms": exact * 1e3,
                 "partial_ms": partial * 1e3, "exact_over_cold": exact / cold, "partial_over_cold": partial / cold},
        "spec_k4_acceptance": {"accepted_over_proposed": accepted_share, "alpha": alpha, "rounds": spec.rounds},
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
          + f"; monotone in k: {report['verify']['monotone']}")
    print(f"TTFT on a {len(long_ids)}-token prompt: cold {cold * 1e3:.1f} ms, exact repeat {exact * 1e3:.2f} ms "
          f"(ratio {exact / cold:.3f}, goal <=0.05), 50 % partial hit {partial * 1e3:.1f} ms "
          f"(ratio {partial / cold:.3f}, goal <=0.6)")
    print(f"spec-k4 on this prompt: accepted/proposed {accepted_share:.3f}, per-token acceptance alpha "
          f"{alpha:.3f} (accepted / (accepted + rejecting rounds)) over {spec.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
