"""Compare two study results folders on everything that does not depend on the clock: the plan (run ids), each
run's action, output tokens, store hit, rounds and acceptance, and the cost model's predictions and the
controller's state (which depend only on the calibration and the outputs). When both folders have a serving stage,
also what of it does not depend on the clock: every served request's status, prompt and output length, and every
run's count of outputs equal to batch-one AR (which requests share an iteration, and so preemptions, a rakv-asd
request's store hit and the load-aware policy's k, follow the clock). A behaviour-preserving change prints
`identical` for every column.

    .venv/bin/python scripts/compare_study_outputs.py results/smoke /tmp/before/results/smoke
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from rakv.runtime.run_layout import RunLayout

DETERMINISTIC = ("configuration", "dataset", "prompt_id", "scenario", "kind", "strategy", "repeat", "action",
                 "reuse", "k", "prompt_tokens", "hit_tokens", "available_hit_tokens", "exact_hit", "new_tokens",
                 "rounds", "proposed", "accepted", "rejections", "output_hash", "equal_to_ar", "order",
                 "predicted_latency_s", "predictions", "alpha_before", "alpha_after", "reuse_rate",
                 "reuse_rate_target", "draft_hit_tokens", "available_draft_tokens", "reuse_draft")


def same(a: pd.Series, b: pd.Series) -> bool:
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        return bool(np.allclose(a.astype(float), b.astype(float), rtol=1e-12, atol=0, equal_nan=True))
    return bool((a.fillna("<na>").astype(str) == b.fillna("<na>").astype(str)).all())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args()
    try:
        a, b = (pd.read_parquet(RunLayout.of(p).study.runs).set_index("run_id").sort_index()
                for p in (args.a, args.b))
    except OSError as exc:
        print(f"compare_study_outputs: error: {exc}", file=sys.stderr)
        return 2
    if set(a.index) != set(b.index):
        print(f"plans differ: {len(set(a.index) ^ set(b.index))} run ids in one folder only")
        return 1
    differing = 0
    for column in DETERMINISTIC:
        if column not in a or column not in b:
            print(f"{column:<22} only in {'a' if column in a else 'b'}")
            continue
        verdict = same(a[column], b[column])
        differing += not verdict
        print(f"{column:<22} {'identical' if verdict else 'DIFFERS'}")
    print(f"{len(a)} runs; columns only in a: {sorted(set(a) - set(b))}; only in b: {sorted(set(b) - set(a))}")
    differing += compare_serving(args.a, args.b)
    return 1 if differing else 0


SERVED = ("status", "prompt_tokens", "new_tokens")
SERVING_KEY = ["family", "rate", "policy", "repeat", "id"]


def compare_serving(a_dir: Path, b_dir: Path) -> int:
    """The serving stage's clock-free columns; the number of differing ones (0 when either folder has none)."""
    paths = [RunLayout.of(d).serving.requests for d in (a_dir, b_dir)]
    if not all(p.exists() for p in paths):
        return 0
    a, b = (pd.read_parquet(p).set_index(SERVING_KEY).sort_index() for p in paths)
    if set(a.index) != set(b.index):
        print(f"serving: requests differ: {len(set(a.index) ^ set(b.index))} in one folder only")
        return 1
    cells = [pd.read_parquet(RunLayout.of(d).serving.cells).set_index(SERVING_KEY[:-1]).sort_index()
             for d in (a_dir, b_dir)]
    differing = 0
    for name, left, right in [*((c, a[c], b.loc[a.index, c]) for c in SERVED),
                              ("outputs_equal_ar", cells[0].outputs_equal_ar, cells[1].outputs_equal_ar)]:
        verdict = same(left, right.reindex(left.index))
        differing += not verdict
        print(f"serving {name:<14} {'identical' if verdict else 'DIFFERS'}")
    print(f"serving: {len(a)} requests in {len(cells[0])} runs")
    return differing


if __name__ == "__main__":
    sys.exit(main())
