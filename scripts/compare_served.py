"""Compare two folders of `rakv serve` outputs (scripts/serve_fixed_trace.sh) on everything but the clock: each
configuration's requests.jsonl and iterations.jsonl line for line, without their times (and the predictions made
from them). A behaviour-preserving change to serving prints `identical` for every file; exit 1 otherwise.

    .venv/bin/python scripts/compare_served.py /tmp/before-served /tmp/after-served
"""

import argparse
import json
import sys
from pathlib import Path

from rakv.runtime.run_layout import ServedRunLayout

CLOCK = {"arrival_s", "ttft_s", "tpot_s", "itl_s", "e2el_s", "service_s", "at_s", "schedule_s", "iteration_s",
         "predicted_s", "admitted_s",
         "served_predicted_s"}  # admission's prediction under load: the batch cost model's scale follows measured times


def lines(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in CLOCK} for line in path.read_text().splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--ignore", nargs="*", default=[], metavar="KEY",
                        help="keys left out too (a field one version adds, such as draft_hit_tokens)")
    args = parser.parse_args()
    CLOCK.update(args.ignore)
    runs = sorted(served.root.relative_to(args.a) for served in ServedRunLayout.found_under(args.a))
    if not runs:
        print(f"compare_served: error: no requests.jsonl under {args.a}", file=sys.stderr)
        return 2
    differing = 0
    for run in runs:
        mine, theirs = ServedRunLayout(args.a / run), ServedRunLayout(args.b / run)
        for a, b in ((mine.requests, theirs.requests), (mine.iterations, theirs.iterations)):
            name = a.name
            if not b.exists():
                print(f"{str(run / name):<42} only in {args.a}")
                differing += 1
                continue
            left, right = lines(a), lines(b)
            verdict = left == right
            differing += not verdict
            print(f"{str(run / name):<42} {len(left):>4} lines {'identical' if verdict else 'DIFFERS'}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
