"""The per-request choice of (reuse, proposer, k) against fixed choices, per workload, from a study of a
configuration of several proposers (rakv.experiments.proposer_choice; docs/heads.md):

    .venv/bin/python scripts/proposer_choice.py RESULTS_DIR [--configuration smollm2-all]

RESULTS_DIR is a results folder whose study ran such a configuration, e.g. after
`./reproduce.sh configurations=[smollm2-all] stages=heads,calibrate,study results_dir=/tmp/all`. Prints rakv-asd's
regret against the best fixed (proposer, k) per workload and pooled, against each proposer's best fixed (reuse, k),
each with its 95 % CI over prompts and its goal's verdict, which proposer rakv-asd ran, and each proposer's prices from
the run's calibrations (at --context tokens of context, 256 by default: where `rakv calibrate` quotes its step).
Exit status 2 on unreadable input or a study without such a configuration.
"""

import argparse
import sys
from pathlib import Path

import pandas as pd

from rakv.experiments.calibrations import calibration_tables
from rakv.experiments.proposer_choice import all_proposer_configurations, choice_rows, prices, render, render_prices
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import RunLayout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a results folder with study/runs.parquet")
    parser.add_argument("--configuration", help="the configuration of several proposers (default: every one)")
    parser.add_argument("--context", type=int, default=256, help="the context at which the prices are read")
    args = parser.parse_args(argv)
    path = RunLayout.of(args.results).study.runs
    try:
        runs = pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        print(f"proposer_choice: error: cannot read {path} ({exc})", file=sys.stderr)
        return 2
    names = [args.configuration] if args.configuration else all_proposer_configurations(runs)
    if not names:
        print(f"proposer_choice: error: {path} has no configuration of several proposers", file=sys.stderr)
        return 2
    for name in names:
        try:
            rows, shares = choice_rows(runs, name)
        except ValueError as exc:
            print(f"proposer_choice: error: {exc}", file=sys.stderr)
            return 2
        print(render(rows, shares))
    try:
        print(render_prices(prices(calibration_tables(args.results), args.context)))
    except RakvError as exc:
        print(f"proposer_choice: error: cannot read the run's calibrations ({exc})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
