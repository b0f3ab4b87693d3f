"""Stage 'sensitivity' of ./reproduce.sh; directly: .venv/bin/python scripts/run_sensitivity.py profile=smoke [overrides]"""

import hydra

from rakv.sensitivity import run_sensitivity
from rakv.stages import run_stage


@hydra.main(version_base="1.3", config_path="../conf", config_name="sensitivity")
def main(cfg):
    run_stage("run_sensitivity", run_sensitivity, cfg)


if __name__ == "__main__":
    main()
