"""Stage 'feasibility' of ./reproduce.sh (rakv.experiments.stages.feasibility); directly:
    .venv/bin/python scripts/run_feasibility.py profile=smoke [Hydra overrides]"""

import hydra

from rakv.experiments.stages import run_stage


@hydra.main(version_base="1.3", config_path="../conf", config_name="feasibility")
def main(cfg):
    run_stage("feasibility", cfg)


if __name__ == "__main__":
    main()
