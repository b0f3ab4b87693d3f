"""Controller ablations replayed on a finished study (rakv.experiments.ablation): one row per configuration and variant.

    .venv/bin/python scripts/ablate_controller.py results/offline                      # the standard variants
    .venv/bin/python scripts/ablate_controller.py results/offline tie_margin=0.1 explore_every=4

Writes <results>/ablation.csv and prints the table as Markdown. Exit status 2 on bad input.
"""

import argparse
import sys
from pathlib import Path

from rakv.experiments import ablation
from rakv.experiments.records import write_atomic
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import RunLayout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a results folder with study/runs.parquet")
    parser.add_argument("options", nargs="*", help="one variant as controller options name=value (default: the "
                                                   "standard variants of rakv.experiments.ablation.VARIANTS)")
    args = parser.parse_args(argv)
    try:
        changes = {" ".join(args.options): ablation.parse_overrides(args.options)} if args.options else None
        table = ablation.study_ablations(args.results, changes)
    except (OSError, ValueError, KeyError, RakvError) as exc:
        print(f"ablate_controller: error: {exc}", file=sys.stderr)
        return 2
    write_atomic(RunLayout.of(args.results).ablation, table.to_csv(index=False))
    print(ablation.format_table(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
