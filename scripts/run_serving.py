"""Stage 'serving' of ./reproduce.sh (rakv.experiments.stages.serving); directly:
    .venv/bin/python scripts/run_serving.py profile=smoke [Hydra overrides]"""

import hydra

from rakv.experiments.stages import run_stage


@hydra.main(version_base="1.3", config_path="../conf", config_name="serving_study")
def main(cfg):
    run_stage("serving", cfg)


if __name__ == "__main__":
    main()
