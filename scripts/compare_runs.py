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

SCALARS = ("mape", "accuracy_action", "accuracy_k", "mean_regret", "worst_regret", "spearman_pooled",
           "spearman_per_scenario")


def with_intervals(summary: dict) -> dict[str, list[float]]:
    """name -> [value, low, high] for every statistic reported with a confidence interval."""
    out = {}
    for family in ("latency_reduction", "throughput_gain"):
        for baseline, triple in summary.get(family, {}).items():
            out[f"{family} vs {baseline}"] = triple
    return out


def compare(a: dict, b: dict) -> tuple[list[str], int]:
    lines, outside = [f"{'statistic':<34} {'A [95% CI]':>28} {'B':>9}  B inside A's CI"], 0
    b_ci = with_intervals(b)
    for name, (value, low, high) in with_intervals(a).items():
        if name not in b_ci:
            lines.append(f"{name:<34} {'':>28} {'missing':>9}")
            continue
        other = b_ci[name][0]
        inside = low <= other <= high
        outside += not inside
        lines.append(f"{name:<34} {value:>9.4f} [{low:>7.4f}, {high:>7.4f}] {other:>9.4f}  {'yes' if inside else 'NO'}")
    lines.append(f"{'statistic (no interval)':<34} {'A':>28} {'B':>9}  relative difference")
    for name in SCALARS:
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            continue
        relative = (y - x) / abs(x) if x else float("nan")
        lines.append(f"{name:<34} {x:>28.4f} {y:>9.4f}  {relative:+.1%}")
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
