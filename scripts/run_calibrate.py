"""Calibrate every configuration of the profile on this machine (reused when still valid):
    .venv/bin/python scripts/run_calibrate.py profile=offline [calibration.recalibrate=always]"""

import hydra

from rakv.stages import run_stage
from rakv.study import calibrate_configurations


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    run_stage("run_calibrate", calibrate_configurations, cfg)


if __name__ == "__main__":
    main()
