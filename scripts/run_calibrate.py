"""Stage 'calibrate' of ./reproduce.sh (rakv.experiments.stages.calibrate); directly:
    .venv/bin/python scripts/run_calibrate.py profile=smoke [Hydra overrides]"""

import hydra

from rakv.experiments.stages import run_stage


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    run_stage("calibrate", cfg)


if __name__ == "__main__":
    main()
