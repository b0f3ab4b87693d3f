"""Where admission's service prediction (rakv.serving.admission.service_prediction) misses, per proposer served
alone: the iterations' measured time over the batch cost model's (decode-only, mixed and prefill-only iterations;
the table's price and the price scaled by the iterations before it), the mean k the load-aware policy ran per
decoding request, and the speculative rounds the requests ran against the rounds admission priced at their k.
On scripts/served_choice.py's traces (its options; docs/heads.md, "Serving"):
    .venv/bin/python scripts/served_price_check.py [--rate 2] [--repeats 2] [--proposers draft,prompt-lookup]"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from rakv.experiments.served_choice import ServedProposersOptions, trace_of
from rakv.runtime.actions import ADAPTIVE
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.calibration import calibration_for
from rakv.runtime.controller import ControllerConfig
from rakv.runtime.costmodel import tokens_per_round
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.models import load_pair
from rakv.runtime.run_layout import ServedRunLayout
from rakv.serving.records import read_iterations, read_records
from rakv.serving.server import ServeOptions, serve, serve_parts


def served(pair, proposer: str, trace, max_batch: int):
    """One server with `proposer` alone, as scripts/served_choice.py serves it: its request and iteration records."""
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30), proposer=proposer)
    options = ServeOptions.default(strategy=ADAPTIVE, speculation="load-aware", acceptance="ewma",
                                   max_batch=max_batch, ignore_eos=True)
    parts = serve_parts(engine, options, calibration_for, ControllerConfig.default(), progress=False)
    with tempfile.TemporaryDirectory() as out:
        serve(engine, trace, out, options, parts, progress=False)
        layout = ServedRunLayout(Path(out))
        return read_records(layout.requests), read_iterations(layout.iterations)


def iteration_lines(name: str, iterations) -> list[str]:
    lines = []
    for label, group in (("decode", [i for i in iterations if i.decodes and not i.mixed]),
                         ("mixed", [i for i in iterations if i.mixed]),
                         ("prefill", [i for i in iterations if not i.decodes])):
        priced = [i for i in group if i.model_s and i.predicted_s]
        if not priced:
            continue
        measured = sum(i.iteration_s for i in priced)
        table, scaled = sum(i.model_s for i in priced), sum(i.predicted_s for i in priced)
        rows = statistics.fmean(i.rows for i in priced)
        mean_k = statistics.fmean(statistics.fmean(i.k) if i.k else 0.0 for i in priced)
        lines.append(f"{name:<22} {label:<8} {len(priced):>4} iterations: measured / table "
                     f"{measured / table:.2f}, / scaled {measured / scaled:.2f}; "
                     f"mean {measured / len(priced) * 1e3:.1f} ms, {rows:.1f} rows, "
                     f"k per decode {mean_k:.1f}")
    return lines


def request_line(name: str, records) -> str:
    ran = sum(r.rounds for r in records)
    priced = sum((r.new_tokens - 1) / tokens_per_round(r.alpha, r.k, 1.0) for r in records if r.alpha and r.k)
    measured, predicted = sum(r.service_s for r in records), sum(r.served_predicted_s for r in records)
    return (f"{name:<22} requests: k at admission {statistics.fmean(r.k for r in records):.1f}; rounds with candidates "
            f"{ran}, rounds priced at admission's k {priced:.0f}; service measured {measured:.2f} s, "
            f"predicted {predicted:.2f} s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--proposers", default="draft,prompt-lookup")
    args = parser.parse_args(argv)
    try:
        options = ServedProposersOptions(rate=args.rate, repeats=args.repeats,
                                         proposers=tuple(args.proposers.split(",")))
        pair = load_pair(options.pair)
        for proposer in options.proposers:  # warm-up, and every table measured before any timing
            served(pair, proposer, trace_of(options, 999)[:4], options.max_batch)
        for repeat in range(options.repeats):
            for proposer in options.proposers:
                records, iterations = served(pair, proposer, trace_of(options, repeat), options.max_batch)
                name = f"{proposer} repeat {repeat}"
                print("\n".join(iteration_lines(name, iterations) + [request_line(name, records)]), flush=True)
    except RakvError as exc:
        print(f"served_price_check: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
