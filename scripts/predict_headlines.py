"""The study's headline comparisons as a machine's calibration predicts them, before its study runs, and beside
what the study measured once it has (rakv.experiments.prediction).

    .venv/bin/python scripts/predict_headlines.py results/offline [--reference data/reference/offline]

Reads RESULTS/calibration/ (the calibrate stage's tables) and the study's request shapes (RESULTS/study/runs.parquet,
or before the study the shipped reference run's: the same prompts and scenarios on every machine). The interval
allows for a calibrated curve's run-to-run shift on one machine class, measured from the shipped same-machine pairs
of calibrations beside the reference. `./reproduce.sh` runs it after the calibrate stage and at the end.
Exit status 0 (a prediction is information, not a check), 2 on unreadable input.
"""

import argparse
import sys
from pathlib import Path

from rakv.experiments.prediction import (
    calibration_run_sd,
    prediction_lines,
    run_predictions,
    same_machine_calibrations,
    shapes_for,
)
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import RunLayout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path,
                        help="a results folder with calibration/ (and summary.json once analysed)")
    parser.add_argument("--reference", type=Path, default=RunLayout.reference("offline").root,
                        help="the shipped reference run: request shapes before a study, same-machine calibrations")
    args = parser.parse_args(argv)
    shapes = shapes_for(args.results, args.reference)
    run_sd = calibration_run_sd(same_machine_calibrations(args.reference))
    calibrations = RunLayout.of(args.results).calibration_dir
    if shapes is None or run_sd is None or not calibrations.is_dir():
        print(f"predict_headlines: error: need {calibrations}/ and the study's request shapes and "
              f"same-machine calibrations under {args.reference}", file=sys.stderr)
        return 2
    try:
        rows = run_predictions(args.results, shapes, run_sd)
    except (RakvError, OSError, ValueError, KeyError) as exc:
        print(f"predict_headlines: error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(f"predict_headlines: no configuration of {args.results} has a calibration and request shapes under "
              f"{args.reference} (another profile): nothing to predict")
        return 0
    print("\n".join(prediction_lines(rows)))
    measured = [r for r in rows if r.inside is not None]
    print(f"predict_headlines: a calibrated curve's run-to-run shift on one machine class: {run_sd:.1%} (log sd)")
    if measured:
        print(f"predict_headlines: {sum(r.inside for r in measured)} of {len(measured)} measured comparisons inside "
              "their predicted interval")
    return 0


if __name__ == "__main__":
    sys.exit(main())
