"""The learned heads' goals (docs/heads.md), measured side by side in one run on held-out text and printed with 95 %
intervals (bootstrap over prompts):

- each head's top-1 agreement with the target's greedy continuation (head 1 = the token after the target's own), on
  held-out prompts of a workload (--workload): WikiText-2 test paragraphs cut to --prompt-tokens (the heads train on
  the validation split), or HumanEval's or the structured-output (JSON) workload's prompts whole, none of which the
  heads saw; teacher-forced over the AR output;
- the acceptance by head position in real greedy rounds (k = heads): the share of rounds reaching position i that
  accept it;
- the proposal's cost (k candidates) over one target step at the prompt's context, both timed here, medians;
- the batch-one speedup over AR of spec-k with the heads and with the int8 self-draft (--draft), per prompt.

    .venv/bin/python scripts/bench_heads.py [--pair smollm2] [--prompts 12] [--new-tokens 64] [--draft]
                                            [--heads FOLDER]   # another trained set (default: the shipped one)
                                            [--workload wikitext2|humaneval|structured]
                                            [--show-outputs]     # each prompt's greedy output, printed

Timings depend on the machine and its load: read them as ratios measured in the same run, not as results.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rakv.runtime.actions import Action, spec
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.decoding import crop_cache, forward
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.heads import HeadsProposer, load_heads, shipped_heads
from rakv.runtime.kernels import new_kv_cache
from rakv.runtime.models import load_pair
from rakv.runtime.run_layout import HeadsLayout
from rakv.runtime.workloads import dataset_texts


def bootstrap(values, statistic=np.mean, seed: int = 0, draws: int = 2000) -> tuple[float, float, float]:
    values = np.asarray(values, float)
    if len(values) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    stats = [statistic(values[rng.integers(0, len(values), len(values))]) for _ in range(draws)]
    return float(statistic(values)), float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))


def shown(ci, digits: int = 3) -> str:
    value, low, high = ci
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


WORKLOADS = {"wikitext2": "WikiText-2 test", "humaneval": "HumanEval", "structured": "structured-output (JSON)"}


def held_out_prompts(encode, count: int, tokens: int, seed: int, workload: str = "wikitext2") -> list[list[int]]:
    """`count` seeded prompts of the workload: WikiText-2 test paragraphs of at least `tokens` tokens cut to
    `tokens`; HumanEval's and the structured workload's prompts whole (a cut would end a code prompt mid-docstring)."""
    if workload != "wikitext2":
        encoded = [encode(t) for _, t in dataset_texts(workload)]
        rng = np.random.default_rng(seed)
        return [encoded[i] for i in sorted(rng.choice(len(encoded), size=min(count, len(encoded)), replace=False))]
    texts = dataset_texts("wikitext2", "bundled", "test")
    encoded = [ids[:tokens] for ids in (encode(t) for _, t in texts) if len(ids) >= tokens]
    rng = np.random.default_rng(seed)
    return [encoded[i] for i in sorted(rng.choice(len(encoded), size=min(count, len(encoded)), replace=False))]


@torch.inference_mode()
def agreement(pair, heads, prompt: list[int], output: list[int]) -> list[tuple[int, int]]:
    """Per head: (agreements, positions) of its argmax with the greedy output, teacher-forced."""
    ids = torch.tensor([prompt + output], dtype=torch.long, device=pair.device)
    _, hidden = forward(pair.target.module, ids, new_kv_cache(pair.target.module), return_hidden=True)
    first = len(prompt) - 1  # hidden[first + j] produced output[j]
    hits, totals = [0] * heads.count, [0] * heads.count
    for j in range(len(output) - 1):
        predicted = heads.vocab[heads.logits(hidden[first + j], heads.count, output[j]).argmax(-1)].tolist()
        for i in range(1, heads.count + 1):
            if j + i < len(output):
                hits[i - 1] += predicted[i - 1] == output[j + i]
                totals[i - 1] += 1
    return list(zip(hits, totals))


@torch.inference_mode()
def cost_ratio(pair, heads, prompt: list[int], repeats: int = 30) -> float:
    """Median time of a k = heads proposal over the median time of one target step at this context."""
    target = pair.target.module
    cache = new_kv_cache(target)
    ids = torch.tensor([prompt], dtype=torch.long, device=pair.device)
    _, hidden = forward(target, ids, cache, return_hidden=True)
    step, propose = [], []
    token = torch.tensor([[prompt[-1]]], dtype=torch.long, device=pair.device)
    produced = int(prompt[-1])  # the token the last hidden state is taken to have produced (the cost is the same)
    for _ in range(repeats):
        start = time.perf_counter()
        forward(target, token, cache, keep=1)
        step.append(time.perf_counter() - start)
        crop_cache(cache, len(prompt))
        start = time.perf_counter()
        heads.vocab[heads.logits(hidden[-1], heads.count, produced).argmax(-1)].tolist()
        propose.append(time.perf_counter() - start)
    return statistics.median(propose) / statistics.median(step)


def prompt_lengths(prompts: list[list[int]]) -> str:
    lengths = sorted(len(p) for p in prompts)
    if lengths[0] == lengths[-1]:
        return str(lengths[0])
    return f"{lengths[0]} to {lengths[-1]} (median {lengths[len(lengths) // 2]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="wikitext2",
                        help="the held-out prompts (default: WikiText-2 test paragraphs)")
    parser.add_argument("--draft", action="store_true", help="also time spec-k with the int8 self-draft")
    parser.add_argument("--heads", type=Path, default=None,
                        help="a trained set's folder (heads.pt, heads.json); default: data/heads/<pair>/")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show-outputs", action="store_true", help="print each prompt's greedy output (what the "
                        "heads are measured against)")
    args = parser.parse_args()
    if args.prompts < 2 or args.new_tokens < 8:
        raise RakvError("--prompts must be >= 2 and --new-tokens >= 8")
    pair = load_pair(args.pair, threads=args.threads)
    heads = shipped_heads(pair) if args.heads is None else load_heads(pair, HeadsLayout(args.heads))
    k = heads.count
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30), proposer="draft")
    prompts = held_out_prompts(engine.encode, args.prompts, args.prompt_tokens, args.seed, args.workload)
    per_head = [[] for _ in range(k)]
    reached, passed = np.zeros(k), np.zeros(k)
    speedup, draft_speedup, ratios = [], [], []
    for ids in prompts:
        ar = engine.run(ids, Action(False, 0), args.new_tokens, ignore_eos=True)
        if args.show_outputs:
            print(f"  greedy output: {pair.tokenizer.decode(ar.token_ids)!r}")
        guessed = engine.run(ids, Action(False, k), args.new_tokens, ignore_eos=True, proposer=HeadsProposer(heads))
        if guessed.token_ids != ar.token_ids:
            raise RakvError("the heads changed a greedy output: a bug")
        for i, (hits, total) in enumerate(agreement(pair, heads, ids, ar.token_ids)):
            per_head[i].append(hits / max(total, 1))
        for proposed, accepted in guessed.round_log:
            for i in range(min(proposed, accepted + 1)):
                reached[i] += 1
                passed[i] += i < accepted
        speedup.append(ar.latency_s / guessed.latency_s)
        if args.draft:
            draft = engine.run(ids, Action(False, k), args.new_tokens, ignore_eos=True)
            draft_speedup.append(ar.latency_s / draft.latency_s)
        ratios.append(cost_ratio(pair, heads, ids))
    record = heads.record
    print(f"bench_heads: pair {args.pair}, heads {record.key if record else '?'} ({k} heads, vocabulary "
          f"{len(heads.vocab)}), {len(prompts)} {WORKLOADS[args.workload]} prompts of "
          f"{prompt_lengths(prompts)} tokens, {args.new_tokens} new tokens, greedy; 95 % bootstrap "
          "intervals over prompts")
    for i in range(k):
        print(f"  head {i + 1} top-1 agreement with the target (teacher-forced): {shown(bootstrap(per_head[i]))}")
    print("  acceptance by position in spec-k rounds (accepted / reached): "
          + ", ".join(f"{i + 1}: {passed[i] / max(reached[i], 1):.3f} ({int(reached[i])})" for i in range(k)))
    print(f"  proposal ({k} candidates) / target step, median per prompt: {shown(bootstrap(ratios, np.median), 4)}")
    print(f"  speedup over AR, heads {spec(k)}: {shown(bootstrap(speedup))}")
    if draft_speedup:
        print(f"  speedup over AR, int8 self-draft {spec(k)}: {shown(bootstrap(draft_speedup))}")
        print(f"  heads / self-draft speed: {shown(bootstrap(np.asarray(speedup) / np.asarray(draft_speedup)))}")


if __name__ == "__main__":
    try:
        main()
    except RakvError as exc:
        print(f"bench_heads: error: {exc}", file=sys.stderr)
        sys.exit(2)
