"""Stage 'analysis': run every notebook headless on results/<profile>/; they write summary.json there,
figures to figures/<profile>/ and LaTeX fragments to paper/generated/<profile>/.
    .venv/bin/python scripts/run_analysis.py profile=smoke"""

from pathlib import Path

import hydra

from rakv.stages import run_stage


def analysis(cfg):
    from rakv.errors import RakvError
    from rakv.notebooks import OutputPaths, run_all

    results = Path(cfg.results_dir)
    if not (results / "study" / "runs.parquet").exists():
        raise RakvError(f"{results}/study/runs.parquet is missing: run the study stage first")
    paths = run_all(cfg.profile.name, OutputPaths.of(results))
    print(f"analysis: summary {paths.results / 'summary.json'}, figures {paths.figures}, LaTeX {paths.generated}",
          flush=True)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    run_stage("run_analysis", analysis, cfg)


if __name__ == "__main__":
    main()
