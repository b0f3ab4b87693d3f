"""The proposer chosen per request under load against one proposer per server, on the same traces
(rakv.experiments.served_choice; docs/heads.md, "Serving"):

    .venv/bin/python scripts/served_choice.py [--pair smollm2] [--proposers draft,prompt-lookup,heads]
        [--datasets humaneval,wikitext2] [--requests 24] [--rate 2] [--new-tokens 32] [--max-batch 8]
        [--repeats 5] [--seed 0] [--at-load] [--out FILE.json]

Prints each setup's median output tokens/s, mean end-to-end latency, greedy outputs equal to the first setup's and
which proposer its requests ran; the choice against each fixed proposer with a 95 % CI, and the goal's verdict
(regret against the best fixed proposer <= 5 %). Calibrates what is missing first (the heads' batch table included:
minutes, on a quiet machine). Timings depend on the machine and its load: read them as ratios measured in one run.
"""

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from rakv.experiments.served_choice import ServedProposersOptions, measure, report_text
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import write_record
from rakv.runtime.proposers import parse_proposers


def parse_args(argv=None) -> tuple[ServedProposersOptions, Path | None]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lists = {"proposers": parse_proposers, "datasets": lambda text: tuple(t for t in text.split(",") if t)}
    for spec in fields(ServedProposersOptions):
        default, flag = spec.default, "--" + spec.name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help="also serve the choice by the predicted service time "
                                "under load (rakv serve --proposer-choice service) as a setup of its own")
            continue
        shown = ",".join(default) if isinstance(default, tuple) else default
        parser.add_argument(flag, type=lists.get(spec.name, type(default)), default=default, help=f"(default {shown})")
    parser.add_argument("--out", type=Path, help="also write the report as JSON")
    args = parser.parse_args(argv)
    return ServedProposersOptions(**{f.name: getattr(args, f.name) for f in fields(ServedProposersOptions)}), args.out


def main(argv=None) -> int:
    try:
        options, out = parse_args(argv)
        report = measure(options)
    except RakvError as exc:
        print(f"served_choice: {exc}", file=sys.stderr)
        return 2
    print(report_text(report))
    if out is not None:
        write_record(report, out)  # rakv.experiments.served_choice.read_report reads it back
    return 0


if __name__ == "__main__":
    sys.exit(main())
