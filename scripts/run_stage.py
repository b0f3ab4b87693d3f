"""Any stage of ./reproduce.sh (rakv.experiments.stages), the pipeline's one Hydra entry point; directly:
    .venv/bin/python scripts/run_stage.py STAGE profile=smoke [Hydra overrides]
STAGE is one of `python -m rakv.experiments.stages --list`; the stage's primary config in conf/ is composed
(rakv.experiments.stages.PRIMARY_CONFIGS, else config.yaml) onto its schema (rakv.experiments.schema). Overrides
that do not compose (a misspelt key, a value of the wrong type) stop here with one line and exit status 2.
Site settings in conf/local/ (git-ignored; docs/cluster.md), when that folder exists, are on Hydra's search path:
conf/local/hydra/launcher/<site>.yaml is then `hydra/launcher=<site>`."""

import sys

import hydra

from rakv.experiments.schema import composition_error, register_schemas
from rakv.experiments.stages import PRIMARY_CONFIGS, STAGES, run_stage
from rakv.runtime.paths import CONF_DIR


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in STAGES:
        print(f"usage: {sys.argv[0]} STAGE [Hydra overrides] (stages: {' '.join(STAGES)})", file=sys.stderr)
        sys.exit(2)
    stage = sys.argv.pop(1)  # the rest are Hydra's
    site = CONF_DIR / "local"
    if site.is_dir() and not any(a.startswith("hydra.searchpath") for a in sys.argv[1:]):
        sys.argv.append(f"hydra.searchpath=[file://{site}]")
    config_name = PRIMARY_CONFIGS.get(stage, "config")
    register_schemas()
    error = composition_error(str(CONF_DIR), config_name, sys.argv[1:])
    if error:
        print(f"{stage}: error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)

    def task(cfg):
        run_stage(stage, cfg)

    hydra.main(version_base="1.3", config_path="../conf", config_name=config_name)(task)()


if __name__ == "__main__":
    main()
