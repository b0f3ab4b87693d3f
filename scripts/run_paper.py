"""Stage 'paper': build paper/build/<profile>/main.pdf from paper/main.tex with the numbers and figures of
one profile (paper/generated/<profile>/, figures/<profile>/) when LaTeX is installed.
    .venv/bin/python scripts/run_paper.py profile=smoke"""

import shutil
import subprocess
from pathlib import Path

import hydra

from rakv.stages import run_stage

PAPER = Path(__file__).resolve().parents[1] / "paper"


def paper(cfg):
    from rakv.errors import RakvError
    from rakv.notebooks import OutputPaths

    paths = OutputPaths.of(cfg.results_dir)
    name = paths.results.name
    if not (paths.generated / "macros.tex").exists():
        raise RakvError(f"{paths.generated} is empty: run the analysis stage of profile {cfg.profile.name} first")
    if not shutil.which("pdflatex"):
        print(f"run_paper: LaTeX is not installed, so no PDF was built; paper/main.tex and {paths.generated} are "
              "complete. To build: apt-get install texlive-latex-extra, then rerun ./reproduce.sh stages=paper",
              flush=True)
        return
    build = PAPER / "build" / name
    build.mkdir(parents=True, exist_ok=True)
    # main.tex reads generated/\RakvOutputs/ and ../figures/\RakvOutputs/; two passes settle the references
    command = ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", f"-output-directory={build}",
               f"\\def\\RakvOutputs{{{name}}}\\input{{main.tex}}"]
    for _ in range(2):
        done = subprocess.run(command, cwd=PAPER, capture_output=True, text=True)
        if done.returncode != 0:
            raise RakvError(f"LaTeX failed; see {build / 'main.log'}")
    print(f"run_paper: built {build / 'main.pdf'}", flush=True)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    run_stage("run_paper", paper, cfg)


if __name__ == "__main__":
    main()
