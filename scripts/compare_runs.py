"""Run-to-run reproducibility of the headline statistics: two results folders of the same profile, side by side.

    .venv/bin/python scripts/compare_runs.py results/offline /path/to/second/results/offline

For every statistic that carries a confidence interval in both summary.json files: both CIs, B - A, and the
Holm-adjusted p-value of the difference tested with both runs' uncertainty (rakv.experiments.replication); whether
the two draw the same conclusion (the side of 0 each interval lies on); and, for reference, whether B's value lies
in A's CI, beside the share an exact replication puts there (about 86 % at 8 prompts, so "outside" alone is no
evidence). Statistics without an interval are printed with their relative difference. Then the hardware each
study ran on (its study/metadata.json). `./reproduce.sh` ends with this comparison against the shipped reference
run (data/reference/<profile>/ as A).

Exit status 1 when a difference is significant (Holm, 5 % family-wise) on the same (or unrecorded) machine class;
on different hardware differences are expected (a speculative round's price is the machine's), so they are reported
and the exit status is 0. 2 on unreadable input.
"""

import argparse
import sys
from pathlib import Path

from rakv.experiments.runcompare import compare, described, hardware, same_machine, with_intervals
from rakv.experiments.summary import read_summary
from rakv.runtime.errors import RakvError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="the first results folder (A)")
    parser.add_argument("b", type=Path, help="the second results folder (B)")
    args = parser.parse_args(argv)
    try:
        a, b = (read_summary(folder) for folder in (args.a, args.b))
    except RakvError as exc:
        print(f"compare_runs: error: cannot read a summary.json ({exc})", file=sys.stderr)
        return 2
    try:
        machines = hardware(args.a), hardware(args.b)
    except RakvError as exc:
        print(f"compare_runs: error: cannot read a study's metadata.json ({exc})", file=sys.stderr)
        return 2
    lines, got = compare(a, b)
    print("\n".join(lines))
    print(f"compare_runs: A = {args.a}: {described(machines[0])}")
    print(f"compare_runs: B = {args.b}: {described(machines[1])}")
    total = len(with_intervals(a))
    print(f"compare_runs: {len(got.significant)} of {got.total} statistic(s) differ significantly (both runs' "
          "uncertainty, Holm 5 %)" + (f": {', '.join(got.significant)}" if got.significant else ""))
    print(f"compare_runs: {got.same_conclusion} of {got.total} draw the same conclusion (the side of 0)"
          + (f"; not: {', '.join(got.flipped)}" if got.flipped else ""))
    print(f"compare_runs: {len(got.outside)} of {total} statistic(s) of B outside A's 95% confidence interval "
          f"({got.inside} of {got.total} inside; an exact replication puts {got.expected_inside:.0%} inside)"
          + (f": {', '.join(got.outside)}" if got.outside else ""))
    if got.significant and None not in machines and not same_machine(*machines):
        print("compare_runs: the two studies ran on different hardware: statistics that depend on timing are "
              "expected to move, so this is reported, not failed")
        return 0
    return 1 if got.significant else 0


if __name__ == "__main__":
    sys.exit(main())
