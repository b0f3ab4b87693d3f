"""Stage 'analysis': run every notebook headless on results/<profile>/; they write summary.json,
figures/ and paper/generated/.   .venv/bin/python scripts/run_analysis.py profile=smoke"""

from pathlib import Path

import hydra

from rakv.errors import RakvError
from rakv.stages import run_stage

ROOT = Path(__file__).resolve().parents[1]


def analysis(cfg):
    from rakv.notebooks import run_all

    results = Path(cfg.results_dir)
    if not (results / "study" / "runs.parquet").exists():
        raise RakvError(f"{results}/study/runs.parquet is missing: run the study stage first")
    run_all(results, ROOT / "figures", ROOT / "paper" / "generated")
    print(f"analysis: summary {results / 'summary.json'}, figures {ROOT / 'figures'}, "
          f"LaTeX {ROOT / 'paper' / 'generated'}", flush=True)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    run_stage("run_analysis", analysis, cfg)


if __name__ == "__main__":
    main()
