"""A kernel change measured as docs/engine.md quotes it: kernels.cpp at a git revision and the working tree's (or
another file), built side by side in one process, timed in turn on the pair's own weights, outputs compared bit for
bit (rakv.bench.kernel_ab says how).

    .venv/bin/python scripts/ab_kernels.py --base HEAD~1 [--new FILE.cpp] [--pair smollm2] [--rows 1 8 16]
        [--attention 1:256 16:256 1:256:5] [--repeats 15] [--threads 2] [--json]
    RAKV_KERNELS_MARCH=x86-64-v3 .venv/bin/python scripts/ab_kernels.py --base HEAD~1   # the AVX2 code paths

Prints, per case, each build's median ms over the interleaved repeats, new / base, whether every output of the
two builds is bitwise equal and, where not, the largest difference relative to the output's largest magnitude (a
kernel that rounds otherwise, e.g. attention in another order, differs by ~1e-7 there). Exit status 1 if any case's
outputs differ, 2 on bad input or a failed build.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

from rakv.bench.kernel_ab import (
    AttentionCase,
    KernelAbReport,
    attention_case,
    build,
    compare,
    describe_builds,
    gemm_case,
    read_new_source,
    source_at,
)
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import to_json
from rakv.runtime.kernels import compact_of
from rakv.runtime.models import load_pair

BASE, NEW = "base", "new"  # the two builds, as the report's maps name them


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the git revision whose kernels.cpp is the baseline")
    parser.add_argument("--new", help="the new kernels.cpp (default: the working tree's)")
    parser.add_argument("--pair", default="smollm2", help="whose weights and shapes (default smollm2)")
    parser.add_argument("--rows", type=int, nargs="*", default=[1, 8, 16],
                        help="GEMM cases: rows through every projection, fp32 target and int8 draft")
    parser.add_argument("--attention", nargs="*", default=["1:256", "16:256", "1:256:5"],
                        help="attention cases, segments:positions[:rows]")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.repeats < 1 or args.threads < 1 or any(r < 1 for r in args.rows):
            raise ValueError("--repeats, --threads and --rows must be positive")
        attention = [AttentionCase.parse(text) for text in args.attention]
        base_source = source_at(args.base)
        new_source, new_label = read_new_source(args.new)
        pair = load_pair(args.pair, threads=args.threads, kernels="compact")
    except (ValueError, RakvError) as exc:
        print(f"ab_kernels: error: {exc}", file=sys.stderr)
        return 2
    target, draft = compact_of(pair.target.module), compact_of(pair.draft.module)
    try:
        builds = {BASE: build(base_source, "rakv_ab_base"), NEW: build(new_source, "rakv_ab_new")}
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        print(f"ab_kernels: error: a build failed to compile: {lines[-1].strip()}", file=sys.stderr)
        return 2
    cases = {}
    for rows in args.rows:
        cases[f"GEMM fp32, {rows} row(s)"] = gemm_case(target.projections(), rows)
        if draft is not None and draft.projections()[0].scale is not None:
            cases[f"GEMM int8, {rows} row(s)"] = gemm_case(draft.projections(), rows)
    for case in attention:
        cases[case.label()] = attention_case(case, len(target.blocks), target.heads, target.kv_heads,
                                             target.head_dim)
    with torch.inference_mode():
        rows = compare(builds, cases, args.repeats)
    if args.json:
        print(json.dumps(to_json(KernelAbReport(args.base, new_label, rows))))
    else:
        print(describe_builds(args.base, new_label) + f"; {args.repeats} interleaved repeats, medians")
        print(f"{'case':<46} {'base ms':>9} {'new ms':>9} {'new/base':>9} {'bitwise equal':>14} {'max rel diff':>13}")
        for row in rows:
            print(f"{row.case:<46} {row.ms[BASE]:9.2f} {row.ms[NEW]:9.2f} "
                  f"{row.over_first[NEW]:9.3f} {str(row.bitwise_equal):>14} {row.max_relative_difference:13.1e}")
    return 0 if all(row.bitwise_equal for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
