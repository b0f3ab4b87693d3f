"""Decision overhead of the RAKV-ASD controller (its goal: rakv.bench.goals.DECISION_US), store peek included.

    .venv/bin/python scripts/bench_controller.py [--pair tiny] [--decisions 2000]

Uses the pair's saved calibration (measured first if this machine has none) and a store holding
a few hundred prompts, so that peek has buckets to search.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

import numpy as np
import torch

from rakv.bench.goals import DECISION_US, judge
from rakv.runtime.calibration import calibration_for
from rakv.runtime.controller import Controller
from rakv.runtime.engine import open_engine
from rakv.runtime.errors import RakvError
from rakv.runtime.proposers import PROPOSERS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="tiny")
    parser.add_argument("--proposer", default="draft")
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--stored-prompts", type=int, default=300)
    args = parser.parse_args()
    try:
        engine = open_engine(args.pair, args.proposer, cache_budget_mib=1 << 20)
        pair = engine.pair
        controller = Controller(calibration_for(engine, "auto"))
    except RakvError as exc:
        print(f"bench_controller: error: {exc}", file=sys.stderr)
        return 2
    ns = engine.namespace(None)
    print(f"pair={pair.name} proposer={args.proposer} decisions per case={args.decisions} "
          f"stored prompts={args.stored_prompts}")
    for case, families in (("typical: 30 prompt families, ~10 entries per bucket", 30),
                           ("worst case: every entry in one bucket", 1)):
        engine.store.clear()
        rng = np.random.default_rng(0)
        heads = [rng.integers(100, 30000, size=16) for _ in range(families)]
        prompts = [np.concatenate([heads[i % families], rng.integers(100, 30000, size=int(rng.integers(16, 500)))])
                   for i in range(args.stored_prompts)]
        for p in prompts:  # tiny fake K/V: the search cost does not depend on tensor sizes
            engine.store.insert(ns, p, [(torch.zeros(1, 1, len(p), 1), torch.zeros(1, 1, len(p), 1))],
                                torch.zeros(1))
        peek, decide = [], []
        for i in range(args.decisions):
            query = prompts[i % len(prompts)][: int(rng.integers(20, 400))]
            start = time.perf_counter()
            hit = engine.store.peek(ns, query)
            middle = time.perf_counter()
            controller.decide(len(query), hit, 64)
            peek.append(middle - start)
            decide.append(time.perf_counter() - middle)
        total = [a + b for a, b in zip(peek, decide)]
        print(f"{case}:")
        for name, samples in (("peek", peek), ("decide", decide), ("total", total)):
            print(f"  {name:<7} median {statistics.median(samples) * 1e6:8.1f} us   p99 "
                  f"{np.percentile(samples, 99) * 1e6:8.1f} us")
        median_us = statistics.median(total) * 1e6
        print(f"  {DECISION_US.line()}: {median_us:.1f} {DECISION_US.unit}: {judge(DECISION_US, median_us)}")
    # the per-round depth (rakv.runtime.depth) chooses k once per speculative round, inside the request's decode time
    per_round = Controller(controller.table, replace(controller.config, depth_per_round=True))
    depth = per_round.round_depth(PROPOSERS["prompt-lookup"])
    rng = np.random.default_rng(1)
    rounds = []
    for i in range(args.decisions):
        context, available, match = int(rng.integers(20, 500)), int(rng.integers(0, 9)), ("unigram", "ngram")[i % 2]
        start = time.perf_counter()
        depth.choose(context, available, match)
        rounds.append(time.perf_counter() - start)
        depth.observe(match, max(available, 1), int(rng.integers(0, max(available, 1) + 1)))
    print(f"per-round depth choice: median {statistics.median(rounds) * 1e6:8.1f} us   p99 "
          f"{np.percentile(rounds, 99) * 1e6:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
