"""Stage 'sensitivity' of ./reproduce.sh (rakv.experiments.stages.sensitivity); directly:
    .venv/bin/python scripts/run_sensitivity.py profile=smoke [Hydra overrides]"""

import hydra

from rakv.experiments.stages import run_stage


@hydra.main(version_base="1.3", config_path="../conf", config_name="sensitivity")
def main(cfg):
    run_stage("sensitivity", cfg)


if __name__ == "__main__":
    main()
