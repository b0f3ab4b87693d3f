"""Run-to-run reproducibility of the headline statistics: two results folders of the same profile, side by side.

    .venv/bin/python scripts/compare_runs.py results/offline /path/to/second/results/offline

For every statistic that carries a confidence interval in A's summary.json, says whether B's value lies inside
A's interval; statistics without an interval are printed with their relative difference. Then one line names
the statistics outside, and the hardware each study ran on (its study/metadata.json). `./reproduce.sh` ends with
this comparison against the shipped reference run (data/reference/<profile>/ as A).

Exit status 1 when any B value falls outside A's interval on the same (or unrecorded) hardware; on different
hardware the differences are expected (a speculative round's price is the machine's), so they are reported and the exit
status is 0. 2 on unreadable input.
"""

import argparse
import json
import sys
from dataclasses import is_dataclass
from pathlib import Path

from rakv.experiments.summary import Summary, read_summary, record_items
from rakv.runtime.errors import RakvError


def sections(summary: Summary) -> list[tuple[str, object]]:
    """Where the summary keeps its statistics: per configuration, and pooled over configurations."""
    return [("per_configuration", summary.per_configuration), ("pooled", summary.pooled)]


def walk(node, prefix=""):
    """(dotted name, value) for every leaf under `node` (a record or a map of records, named as in summary.json):
    a [value, low, high] triple counts as one leaf."""
    if is_dataclass(node):
        yield from walk(dict(record_items(node)), prefix)
    elif isinstance(node, dict):
        for key, child in node.items():
            yield from walk(child, f"{prefix}.{key}" if prefix else key)
    elif isinstance(node, list) and len(node) == 3 and all(isinstance(v, (int, float)) or v is None for v in node):
        yield prefix, node
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield prefix, node


def with_intervals(summary: Summary) -> dict[str, list[float]]:
    """name -> [value, low, high] for every statistic reported with a confidence interval."""
    return {name: value for section, node in sections(summary) for name, value in walk(node, section)
            if isinstance(value, list) and None not in value}


def scalars(summary: Summary) -> dict[str, float]:
    """name -> value for every statistic reported without an interval."""
    return {name: value for section, node in sections(summary) for name, value in walk(node, section)
            if not isinstance(value, list)}


def compare(a: Summary, b: Summary) -> tuple[list[str], list[str]]:
    """The side-by-side lines, and the names of B's statistics outside A's confidence interval."""
    width = max([34, *(len(n) for n in with_intervals(a)), *(len(n) for n in scalars(a))])
    lines, outside = [f"{'statistic':<{width}} {'A [95% CI]':>28} {'B':>9}  B inside A's CI"], []
    b_ci = with_intervals(b)
    for name, (value, low, high) in with_intervals(a).items():
        if name not in b_ci:
            lines.append(f"{name:<{width}} {'':>28} {'missing':>9}")
            continue
        other = b_ci[name][0]
        if other is None:
            continue
        inside = low <= other <= high
        if not inside:
            outside.append(name)
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


def hardware(folder: Path) -> dict | None:
    """The processor, device and threads a results folder's study ran on (None without its metadata.json)."""
    try:
        found = json.loads((folder / "study" / "metadata.json").read_text()).get("hardware") or {}
    except (OSError, ValueError):
        return None
    return {key: found.get(key) for key in ("processor", "isa", "device", "threads", "dtype")}


def described(machine: dict | None) -> str:
    if machine is None:
        return "hardware not recorded"
    isa = f", {machine['isa']}" if machine.get("isa") else ""
    return (f"{machine['processor']} ({machine['device']}{isa}, {machine['threads'] or 'GPU'} threads, "
            f"{machine['dtype']})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="the first results folder (its intervals are the reference)")
    parser.add_argument("b", type=Path, help="the second results folder")
    args = parser.parse_args(argv)
    try:
        a, b = (read_summary(folder) for folder in (args.a, args.b))
    except RakvError as exc:
        print(f"compare_runs: error: cannot read a summary.json ({exc})", file=sys.stderr)
        return 2
    lines, outside = compare(a, b)
    print("\n".join(lines))
    machines = hardware(args.a), hardware(args.b)
    print(f"compare_runs: A = {args.a}: {described(machines[0])}")
    print(f"compare_runs: B = {args.b}: {described(machines[1])}")
    total = len(with_intervals(a))
    print(f"compare_runs: {len(outside)} of {total} statistic(s) of B outside A's 95% confidence interval"
          + (f": {', '.join(outside)}" if outside else ""))
    if outside and None not in machines and machines[0] != machines[1]:
        print("compare_runs: the two studies ran on different hardware: statistics that depend on timing are "
              "expected to move, so this is reported, not failed")
        return 0
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
