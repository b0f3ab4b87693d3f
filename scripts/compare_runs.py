"""Run-to-run reproducibility of the headline statistics: two results folders of the same profile, side by side.

    .venv/bin/python scripts/compare_runs.py results/offline /path/to/second/results/offline

For every statistic that carries a confidence interval in A's summary.json, says whether B's value lies inside
A's interval; statistics without an interval are printed with their relative difference. Exit status 1 when
any B value falls outside A's interval, 2 on unreadable input.
"""

import argparse
import json
import sys
from pathlib import Path

SECTIONS = ("per_configuration", "pooled")  # where summary.json keeps its statistics


def walk(node, prefix=""):
    """(dotted name, value) for every leaf under `node`: a [value, low, high] triple counts as one leaf."""
    if isinstance(node, dict):
        for key, child in node.items():
            yield from walk(child, f"{prefix}.{key}" if prefix else key)
    elif isinstance(node, list) and len(node) == 3 and all(isinstance(v, (int, float)) or v is None for v in node):
        yield prefix, node
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield prefix, node


def with_intervals(summary: dict) -> dict[str, list[float]]:
    """name -> [value, low, high] for every statistic reported with a confidence interval."""
    return {name: value for section in SECTIONS for name, value in walk(summary.get(section, {}), section)
            if isinstance(value, list) and None not in value}


def scalars(summary: dict) -> dict[str, float]:
    """name -> value for every statistic reported without an interval."""
    return {name: value for section in SECTIONS for name, value in walk(summary.get(section, {}), section)
            if not isinstance(value, list)}


def compare(a: dict, b: dict) -> tuple[list[str], int]:
    width = max([34, *(len(n) for n in with_intervals(a)), *(len(n) for n in scalars(a))])
    lines, outside = [f"{'statistic':<{width}} {'A [95% CI]':>28} {'B':>9}  B inside A's CI"], 0
    b_ci = with_intervals(b)
    for name, (value, low, high) in with_intervals(a).items():
        if name not in b_ci:
            lines.append(f"{name:<{width}} {'':>28} {'missing':>9}")
            continue
        other = b_ci[name][0]
        if other is None:
            continue
        inside = low <= other <= high
        outside += not inside
        lines.append(f"{name:<{width}} {value:>9.4f} [{low:>7.4f}, {high:>7.4f}] {other:>9.4f}  "
                     f"{'yes' if inside else 'NO'}")
    lines.append(f"{'statistic (no interval)':<{width}} {'A':>28} {'B':>9}  relative difference")
    b_scalars = scalars(b)
    for name, x in scalars(a).items():
        y = b_scalars.get(name)
        if y is None:
            continue
        relative = (y - x) / abs(x) if x else float("nan")
        lines.append(f"{name:<{width}} {x:>28.4f} {y:>9.4f}  {relative:+.1%}")
    return lines, outside


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="the first results folder (its intervals are the reference)")
    parser.add_argument("b", type=Path, help="the second results folder")
    args = parser.parse_args(argv)
    try:
        a, b = (json.loads((folder / "summary.json").read_text()) for folder in (args.a, args.b))
    except (OSError, ValueError) as exc:
        print(f"compare_runs: error: cannot read a summary.json ({exc})", file=sys.stderr)
        return 2
    lines, outside = compare(a, b)
    print("\n".join(lines))
    print(f"compare_runs: {outside} statistic(s) of B outside A's confidence interval")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
