"""The pipeline's stages, in the order `reproduce.sh` runs them, behind one wrapper that validates the composed
config first and turns a RakvError into a one-line message and a non-zero exit (never a traceback).

`scripts/run_stage.py <stage> [Hydra overrides]` is the one Hydra entry point: it composes the stage's primary
config (`PRIMARY_CONFIGS`) and calls `run_stage`. `python -m rakv.experiments.stages --list` prints the stage names
in order for reproduce.sh; it must stay cheap, so this module imports rakv.experiments.config (torch) only inside
the stages.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from omegaconf import DictConfig

from rakv.runtime.errors import RakvError
from rakv.runtime.paths import PAPER_DIR as PAPER
from rakv.runtime.paths import REFERENCE_DIR, ROOT, shown

README_REFERENCE = REFERENCE_DIR / "offline"  # the shipped run whose claims table the README shows


def calibrate(cfg: DictConfig) -> None:
    """Every configuration's cost table (reused when still valid), copied into the results folder."""
    from rakv.experiments.config import configurations, cost_table_for, engine_for

    for configuration in configurations(cfg):
        engine = engine_for(cfg, configuration)
        table = cost_table_for(cfg, engine)
        print(f"calibration {configuration.name}: alpha = {table.acceptance:.3f}, target step "
              f"{table.target_step(256) * 1e3:.1f} ms at 256 tokens of context", flush=True)


def study(cfg: DictConfig) -> None:
    from rakv.experiments.study import run_main_study

    run_main_study(cfg)


def serving(cfg: DictConfig) -> None:
    from rakv.experiments.serving import run_serving

    run_serving(cfg)


def sensitivity(cfg: DictConfig) -> None:
    from rakv.experiments.sensitivity import run_sensitivity

    run_sensitivity(cfg)


def sampling(cfg: DictConfig) -> None:
    from rakv.experiments.sampling import run_sampling

    run_sampling(cfg)


def feasibility(cfg: DictConfig) -> None:
    from rakv.experiments.feasibility import run_feasibility

    run_feasibility(cfg)


def analysis(cfg: DictConfig) -> None:
    """Every notebook, headless, on results/<name>/: summary.json, figures/<name>/, paper/generated/<name>/."""
    from rakv.experiments.config import results_dir
    from rakv.experiments.notebooks import OutputPaths, run_all
    from rakv.experiments.readme_writer import refresh_readme
    from rakv.experiments.summary import read_summary

    results = results_dir(cfg)
    if not (results / "study" / "runs.parquet").exists():
        raise RakvError(f"{results}/study/runs.parquet is missing: run the study stage first")
    paths = run_all(cfg.profile.name, OutputPaths.of(results))
    print(f"analysis: summary {paths.results / 'summary.json'}, figures {paths.figures}, LaTeX {paths.generated}",
          flush=True)
    befores = [ROOT / b for b in cfg.profile.before_engines if (ROOT / b / "summary.json").exists()]
    if befores:  # the same profile run with earlier engines
        from rakv.experiments.enginecompare import write_engine_comparison

        written = write_engine_comparison(befores, paths.results, paths.generated)
        print(f"analysis: engine before/after ({', '.join(shown(b) for b in befores)} vs {shown(paths.results)}): "
              f"{written[0].name}", flush=True)
    if paths.results == README_REFERENCE.resolve():
        changed = refresh_readme(read_summary(paths.results), ROOT / "README.md", paths.results)
        print(f"analysis: README's claims table, sizes and times {'refreshed' if changed else 'unchanged'} from "
              f"{shown(paths.results)}", flush=True)


def paper(cfg: DictConfig) -> None:
    """paper/build/<name>/main.pdf from paper/main.tex and refs.bib with one results folder's numbers and figures
    (latexmk + bibtex: Debian's texlive-latex-extra, texlive-bibtex-extra and latexmk)."""
    from rakv.experiments.config import results_dir
    from rakv.experiments.notebooks import OutputPaths

    paths = OutputPaths.of(results_dir(cfg))
    name = paths.results.name
    if not (paths.generated / "macros.tex").exists():
        raise RakvError(f"{paths.generated} is empty: run the analysis stage of profile {cfg.profile.name} first")
    if not shutil.which("latexmk") or not shutil.which("pdflatex"):
        print(f"paper: LaTeX is not installed, so no PDF was built; paper/main.tex and {paths.generated} are "
              "complete. To build: apt-get install texlive-latex-extra texlive-bibtex-extra latexmk, then rerun "
              "./reproduce.sh stages=paper", flush=True)
        return
    build = PAPER / "build" / name
    build.mkdir(parents=True, exist_ok=True)
    # main.tex reads generated/\RakvOutputs/ and ../figures/\RakvOutputs/; latexmk runs pdflatex and bibtex until
    # the references settle. -g: rebuild even when latexmk thinks nothing changed (the figures may have)
    command = ["latexmk", "-pdf", "-g", "-interaction=nonstopmode", "-halt-on-error", f"-outdir={build}",
               f"-usepretex=\\def\\RakvOutputs{{{name}}}", "main.tex"]
    done = subprocess.run(command, cwd=PAPER, capture_output=True, text=True)
    if done.returncode != 0:
        raise RakvError(f"LaTeX failed; see {build / 'main.log'} (and {build / 'main.blg'} for the bibliography)")
    from rakv.experiments.pdf_layout import layout_report

    layout = layout_report((build / "main.log").read_text(errors="replace"), build / "main.pdf")
    (build / "layout.json").write_text(json.dumps(layout, indent=1) + "\n")
    print(f"paper: built {build / 'main.pdf'}; layout: {len(layout['overfull_hbox_pt'])} overfull line(s) "
          f"(largest {max(layout['overfull_hbox_pt'], default=0):.1f} pt), {len(layout['float_too_large_pt'])} "
          f"float(s) too large for the page, {len(layout['words_outside'])} run(s) of characters outside the text "
          "area", flush=True)
    if paths.results == README_REFERENCE.resolve():  # the README quotes the PDF's size: measured once it is built
        from rakv.experiments.readme_writer import refresh_readme
        from rakv.experiments.summary import read_summary

        refresh_readme(read_summary(paths.results), ROOT / "README.md", paths.results)


STAGES = {"calibrate": calibrate, "study": study, "serving": serving, "sensitivity": sensitivity,
          "sampling": sampling, "feasibility": feasibility, "analysis": analysis, "paper": paper}
# the stages whose primary config in conf/ is not config.yaml (the shared config plus the stage's overrides)
PRIMARY_CONFIGS = {"serving": "serving_study", "sensitivity": "sensitivity", "sampling": "sampling",
                   "feasibility": "feasibility"}


def peak_rss_bytes() -> int:
    """The largest resident set of this process or of any worker it waited for (Linux reports KiB)."""
    import resource

    return 1024 * max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)


def run_stage(name: str, cfg: DictConfig) -> None:
    from rakv.experiments.config import validate

    try:
        validate(cfg)
        STAGES[name](cfg)
        peak = peak_rss_bytes()
        print(f"{name}: peak resident memory {peak / 1e9:.2f} GB (the largest process: the stage or a worker)",
              flush=True)
        # beside reproduce.sh's stage_times.tsv (results/<profile>/, whatever results_dir is), so that
        # regenerating a shipped run's outputs never appends to its tables
        record = ROOT / "results" / cfg.profile.name
        record.mkdir(parents=True, exist_ok=True)
        with open(record / "stage_rss.tsv", "a") as fh:
            fh.write(f"{name}\t{peak}\n")
    except RakvError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{name}: interrupted; rerun the same command to resume", file=sys.stderr, flush=True)
        sys.exit(130)


if __name__ == "__main__":
    if sys.argv[1:] != ["--list"]:
        print("usage: python -m rakv.experiments.stages --list", file=sys.stderr)
        sys.exit(2)
    print(" ".join(STAGES))
