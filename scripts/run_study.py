"""Main study: ./reproduce.sh stages=study [overrides], or directly:
    .venv/bin/python scripts/run_study.py profile=smoke
Resumable: rerun the same command after an interruption."""

import hydra

from rakv.stages import run_stage
from rakv.study import run_main_study


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    run_stage("run_study", run_main_study, cfg)


if __name__ == "__main__":
    main()
