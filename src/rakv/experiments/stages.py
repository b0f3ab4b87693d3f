"""The pipeline's stages, in the order `reproduce.sh` runs them, behind one wrapper that validates the composed
config first and turns a RakvError into a one-line message and a non-zero exit (never a traceback).

`scripts/run_stage.py <stage> [Hydra overrides]` is the one Hydra entry point: it composes the stage's primary
config (`PRIMARY_CONFIGS`) and calls `run_stage`. `python -m rakv.experiments.stages --list` prints the stage names
in order for reproduce.sh; it must stay cheap, so this module imports rakv.experiments.config (torch) only inside
the stages.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from omegaconf import DictConfig

from rakv.runtime.errors import RakvError
from rakv.runtime.paths import PAPER_DIR as PAPER
from rakv.runtime.paths import ROOT, shown
from rakv.runtime.run_layout import RunLayout

README_REFERENCE = RunLayout.reference("offline")  # the shipped run whose claims table the README shows


def calibrate(cfg: DictConfig) -> None:
    """Every configuration's cost table (reused when still valid), copied into the results folder."""
    from rakv.experiments.config import configurations, cost_tables_for, engine_for

    for configuration in configurations(cfg):
        engine = engine_for(cfg, configuration)
        for proposer, table in cost_tables_for(cfg, configuration, engine).items():  # several: one table each
            name = configuration.name if not configuration.chooses_proposer else f"{configuration.name} ({proposer})"
            print(f"calibration {name}: alpha = {table.acceptance:.3f}, target step "
                  f"{table.target_step(256) * 1e3:.1f} ms at 256 tokens of context", flush=True)
    from rakv.experiments.serving import calibrate_serving

    calibrate_serving(cfg)  # the serving study's tables too: its jobs read them, never write them (docs/cluster.md)
    if cfg.study.num_shards > 1:  # the calibration job of stages run as jobs: the feasibility pair's table too
        from rakv.experiments.feasibility import calibrate_feasibility

        calibrate_feasibility(cfg)


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
    from rakv.experiments.config import run_layout
    from rakv.experiments.notebooks import run_all
    from rakv.experiments.readme_writer import refresh_readme
    from rakv.experiments.summary import read_summary

    layout = run_layout(cfg)
    if not layout.study.runs.exists():
        raise RakvError(f"{layout.study.runs} is missing: run the study stage first")
    run_all(cfg.profile.name, layout)
    print(f"analysis: summary {layout.summary}, figures {layout.figures}, LaTeX {layout.generated}", flush=True)
    befores = [RunLayout.of(ROOT / b) for b in cfg.profile.before_engines if RunLayout.of(ROOT / b).summary.exists()]
    if befores:  # the same profile run with earlier engines
        from rakv.experiments.enginecompare import write_engine_comparison

        written = write_engine_comparison([b.root for b in befores], layout.root, layout.generated)
        print(f"analysis: engine before/after ({', '.join(shown(b.root) for b in befores)} vs {shown(layout.root)}): "
              f"{written[0].name}", flush=True)
    if layout.root == README_REFERENCE.root:
        changed = refresh_readme(read_summary(layout.root), ROOT / "README.md", layout.root)
        print(f"analysis: README's claims table, sizes and times {'refreshed' if changed else 'unchanged'} from "
              f"{shown(layout.root)}", flush=True)


def paper(cfg: DictConfig) -> None:
    """paper/build/<name>/main.pdf from paper/main.tex and refs.bib with one results folder's numbers and figures
    (latexmk + bibtex: Debian's texlive-latex-extra, texlive-bibtex-extra and latexmk)."""
    from rakv.experiments.config import run_layout

    layout = run_layout(cfg)
    name = layout.outputs_name  # generated/<name>/ and ../figures/<name>/ as main.tex reads them
    if not (layout.generated / "macros.tex").exists():
        raise RakvError(f"{layout.generated} is empty: run the analysis stage of profile {cfg.profile.name} first")
    if not shutil.which("latexmk") or not shutil.which("pdflatex"):
        print(f"paper: LaTeX is not installed, so no PDF was built; paper/main.tex and {layout.generated} are "
              "complete. To build: apt-get install texlive-latex-extra texlive-bibtex-extra latexmk, then rerun "
              "./reproduce.sh stages=paper", flush=True)
        return
    build = layout.build
    build.mkdir(parents=True, exist_ok=True)
    # main.tex reads generated/\RakvOutputs/ and ../figures/\RakvOutputs/; latexmk runs pdflatex and bibtex until
    # the references settle. -g: rebuild even when latexmk thinks nothing changed (the figures may have)
    command = ["latexmk", "-pdf", "-g", "-interaction=nonstopmode", "-halt-on-error", f"-outdir={build}",
               f"-usepretex=\\def\\RakvOutputs{{{name}}}", "main.tex"]
    done = subprocess.run(command, cwd=PAPER, capture_output=True, text=True)
    if done.returncode != 0:
        raise RakvError(f"LaTeX failed; see {layout.latex_log} (and {layout.bibtex_log} for the bibliography)")
    from rakv.experiments.pdf_layout import layout_report, write_pdf_layout

    report = write_pdf_layout(layout_report(layout.latex_log.read_text(errors="replace"), layout.pdf),
                              layout.pdf_layout)
    print(f"paper: built {layout.pdf}; layout: {len(report.overfull_hbox_pt)} overfull line(s) "
          f"(largest {max(report.overfull_hbox_pt, default=0):.1f} pt), {len(report.float_too_large_pt)} "
          f"float(s) too large for the page, {len(report.words_outside)} run(s) of characters outside the text "
          "area", flush=True)
    if layout.root == README_REFERENCE.root:  # the README quotes the PDF's size: measured once it is built
        from rakv.experiments.readme_writer import refresh_readme
        from rakv.experiments.summary import read_summary

        refresh_readme(read_summary(layout.root), ROOT / "README.md", layout.root)


def heads(cfg: DictConfig) -> None:
    """Learned heads for the pair of conf/heads/<pair>.yaml: shipped, cached or trained (rakv.experiments.heads)."""
    from rakv.experiments.heads import run_heads

    run_heads(cfg)


STAGES = {"heads": heads, "calibrate": calibrate, "study": study, "serving": serving, "sensitivity": sensitivity,
          "sampling": sampling, "feasibility": feasibility, "analysis": analysis, "paper": paper}
# the stages whose primary config in conf/ is not config.yaml (the shared config plus the stage's overrides)
PRIMARY_CONFIGS = {"heads": "heads", "serving": "serving_study", "sensitivity": "sensitivity", "sampling": "sampling",
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
        record = RunLayout.own(cfg.profile.name)
        record.root.mkdir(parents=True, exist_ok=True)
        with open(record.stage_rss, "a") as fh:
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
