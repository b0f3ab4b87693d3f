"""Stage 'paper': build paper/main.pdf from paper/main.tex + paper/generated/ when LaTeX is installed.
    .venv/bin/python scripts/run_paper.py"""

import shutil
import subprocess
import sys
from pathlib import Path

PAPER = Path(__file__).resolve().parents[1] / "paper"


def main() -> int:
    if not (PAPER / "generated" / "macros.tex").exists():
        print("run_paper: error: paper/generated/ is empty: run the analysis stage first", file=sys.stderr)
        return 2
    if shutil.which("latexmk"):
        command = ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "main.tex"]
    elif shutil.which("pdflatex"):
        command = ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "main.tex"]
    else:
        print("run_paper: LaTeX is not installed, so paper/main.pdf was not built; paper/main.tex and "
              "paper/generated/ are complete. To build: sudo apt-get install texlive-latex-extra latexmk, "
              "then rerun ./reproduce.sh stages=paper", flush=True)
        return 0
    for _ in range(2 if command[0] == "pdflatex" else 1):  # pdflatex needs a second pass for references
        done = subprocess.run(command, cwd=PAPER, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"run_paper: error: LaTeX failed; see {PAPER / 'main.log'}", file=sys.stderr)
            return 1
    print(f"run_paper: built {PAPER / 'main.pdf'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
