#!/usr/bin/env bash
# LaTeX for the paper stage (latexmk + pdflatex + bibtex, Debian's texlive packages; about 150 MB, a few minutes).
# Optional: without it ./reproduce.sh writes the .tex and skips the PDF. Needs root (or sudo) and apt.
set -euo pipefail
if command -v latexmk >/dev/null && command -v pdflatex >/dev/null && command -v bibtex >/dev/null; then
    echo "install_latex: latexmk, pdflatex and bibtex are installed"
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends texlive-latex-extra texlive-latex-recommended \
    texlive-fonts-recommended texlive-bibtex-extra latexmk
