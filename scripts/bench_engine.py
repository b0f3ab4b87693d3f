"""Engine benchmark on one pair, side by side with transformers in one process; prints ratios.

    .venv/bin/python scripts/bench_engine.py [--pair smollm2] [--new-tokens 64] [--repeats 3]

Goals (issue #3): AR ms/token / transformers generate <= 1.05; spec-k4 / transformers assisted
generation (same draft, 4 assistant tokens, constant schedule) <= 1.00 with identical output;
exact-repeat TTFT / cold TTFT <= 0.05 and 50 % partial-hit TTFT / cold <= 0.6 on a ~512-token
prompt. Timings are medians of interleaved repeats; memory is the peak increase while a call runs.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import time

import torch

from rakv.cache import PrefixKVStore
from rakv.costmodel import acceptance_estimate
from rakv.decoding import synchronize
from rakv.engine import Engine, parse_strategy
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


def make_sides(pair, engine, ids, n):
    """The four generation calls compared: ours and transformers', plain and speculative."""
    target, draft = pair.target.module, pair.draft.module
    hf_input = torch.tensor([ids], device=pair.device)
    # transformers stops at EOS even with min_new_tokens-free configs; we time exactly n tokens on both sides
    target.generation_config.eos_token_id = None
    config = copy.deepcopy(target.generation_config)
    config.update(max_new_tokens=n, do_sample=False, pad_token_id=pair.tokenizer.pad_token_id or 0,
                  num_assistant_tokens=4, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)

    def ours(strategy):
        engine.store.clear()
        return engine.run(ids, parse_strategy(strategy), n, ignore_eos=True)

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
                          "--device", args.device, "--probe", args.side_to_probe] +
                         (["--threads", str(args.threads)] if args.threads else []),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-prompt-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--probe", choices=("ours-ar", "hf-ar", "ours-spec-k4", "hf-spec-k4"),
                        help=argparse.SUPPRESS)  # internal: one memory measurement in a fresh process
    args = parser.parse_args()
    try:
        pair = load_pair(args.pair, device=args.device, threads=args.threads)
    except RakvError as exc:
        print(f"bench_engine: error: {exc}", file=sys.stderr)
        return 2
    device = pair.device
    engine = Engine(pair, PrefixKVStore())
    problems = load_humaneval()
    ids = engine.encode(problems[2]["prompt"])
    n = args.new_tokens
    sides = make_sides(pair, engine, ids, n)
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
            engine.run(warm, parse_strategy("ar"), 1)
        return engine.run(prompt, parse_strategy("kv-only"), 1).ttft_s

    cold = statistics.median(ttft(long_ids) for _ in range(args.repeats))
    exact = statistics.median(ttft(long_ids, warm=long_ids) for _ in range(args.repeats))
    partial = statistics.median(ttft(other, warm=long_ids) for _ in range(args.repeats))

    print(f"pair={pair.name} device={device} threads={torch.get_num_threads()} new_tokens={n} "
          f"prompt={len(ids)} tokens (HumanEval/2), repeats={args.repeats}")
    print(f"{'measure':<10} {'ours ms/tok':>12} {'hf ms/tok':>10} {'ratio':>7} {'goal':>6} "
          f"{'ours peak MiB':>14} {'hf peak MiB':>12} {'same output':>12}")
    for (label, ours_ms, hf_ms, m_ours, m_hf, same), goal in zip(rows, ("<=1.05", "<=1.00")):
        print(f"{label:<10} {ours_ms:>12.2f} {hf_ms:>10.2f} {ours_ms / hf_ms:>7.3f} {goal:>6} {m_ours:>14.1f} "
              f"{m_hf:>12.1f} {str(same):>12}")
    print(f"TTFT on a {len(long_ids)}-token prompt: cold {cold * 1e3:.1f} ms, exact repeat {exact * 1e3:.2f} ms "
          f"(ratio {exact / cold:.3f}, goal <=0.05), 50 % partial hit {partial * 1e3:.1f} ms "
          f"(ratio {partial / cold:.3f}, goal <=0.6)")
    print(f"spec-k4 on this prompt: accepted/proposed {accepted_share:.3f}, per-token acceptance alpha "
          f"{alpha:.3f} (accepted / (accepted + rejecting rounds)) over {spec.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
