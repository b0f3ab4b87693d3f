"""Stage 'feasibility' of ./reproduce.sh; directly: .venv/bin/python scripts/run_feasibility.py profile=smoke [overrides]"""

import hydra

from rakv.sensitivity import run_feasibility
from rakv.stages import run_stage


@hydra.main(version_base="1.3", config_path="../conf", config_name="feasibility")
def main(cfg):
    run_stage("run_feasibility", run_feasibility, cfg)


if __name__ == "__main__":
    main()
