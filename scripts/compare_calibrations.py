"""Do two calibrations of one pair on one machine agree? Every measured point side by side.

    RAKV_CALIBRATION_DIR=/tmp/a .venv/bin/rakv calibrate --pair smollm2 --force
    RAKV_CALIBRATION_DIR=/tmp/b .venv/bin/rakv calibrate --pair smollm2 --force
    .venv/bin/python scripts/compare_calibrations.py /tmp/a/smollm2-draft-*.json /tmp/b/smollm2-draft-*.json

Prints, per cost, the relative difference |B - A| / A at each measured point; exit status 1 when any point
differs by more than --tolerance (default 10 %), 2 on unreadable input.
"""

import argparse
import sys
from pathlib import Path

from rakv.runtime.costmodel import CostTable, read_cost_table


def curves(table: CostTable) -> dict:
    out = {"target prefill": table.target_prefill, "target step": table.target_step,
           "proposer prefill": table.proposer_prefill, "KV copy": table.kv_copy}
    out.update({f"verify k={k}": c for k, c in table.verify.items()})
    out.update({f"propose k={k}": c for k, c in table.propose.items()})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args(argv)
    try:
        a, b = (read_cost_table(path) for path in (args.a, args.b))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"compare_calibrations: error: cannot read a calibration ({exc})", file=sys.stderr)
        return 2
    worst, outside = 0.0, 0
    b_curves = curves(b)
    for name, curve in curves(a).items():
        other = b_curves.get(name)
        if other is None:
            continue
        cells = []
        for x, y in zip(curve.xs, curve.ys):
            difference = abs(other(x) - y) / y if y > 0 else 0.0
            worst = max(worst, difference)
            outside += difference > args.tolerance
            cells.append(f"{int(x)}: {difference:.1%}{' !' if difference > args.tolerance else ''}")
        print(f"{name:<18} " + ", ".join(cells))
    print(f"compare_calibrations: largest difference {worst:.1%}; {outside} point(s) beyond {args.tolerance:.0%}")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
