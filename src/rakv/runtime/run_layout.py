"""Every path of a results folder, of a served run's folder and of the shipped reference runs, spelled here once.

A results folder (`results/<name>/`, or a shipped `data/reference/<name>/`) holds one pipeline run: each stage
writes its own subfolder, the analysis writes the summary beside them, and the figures and LaTeX go to folders named
like the run (`figures/<name>/`, `paper/generated/<name>/`, `paper/build/<name>/`). `rakv serve --out DIR` writes a
served run's folder (`ServedRunLayout`), which the serving study nests under its cells. The stages, statistics,
figures, notebooks, scripts and tests build their paths from these records, so renaming a file is a change here
(tests/test_run_layout.py fails on a results-folder file name spelled anywhere else). docs/outputs.md describes
each file's content.

Three files share the name summary.json and are three different records: a results folder's summary
(`RunLayout.summary`, rakv.experiments.summary.Summary), the feasibility stage's outcome
(`RunLayout.feasibility_summary`, its Feasibility) and a served run's statistics (`ServedRunLayout.served_summary`,
rakv.serving.metrics.RunSummary); the attribute names tell them apart, the files keep their names (the shipped
runs under data/reference/ are read as they are).

This module sits in the runtime, the lowest layer, because the runtime (calibration), serving (a served run's
files) and the benchmarks (the shipped reference's calibrations) write or read these folders too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rakv.runtime.paths import DATA_DIR, PAPER_DIR, REFERENCE_DIR, ROOT

RESULTS_DIR = ROOT / "results"  # ./reproduce.sh's results folders, results/<profile>/ by default
FIGURES_DIR = ROOT / "figures"
GENERATED_DIR = PAPER_DIR / "generated"
BUILD_DIR = PAPER_DIR / "build"
# shipped runs of other machines (data/reference/other-machines/<label>-<commit>/, each with about.json)
OTHER_MACHINES_DIR = REFERENCE_DIR / "other-machines"
# the simulated coverage of every interval method (scripts/interval_coverage.py): the code's and the shipped
# profiles', not one run's, so it lives beside the paper
INTERVAL_COVERAGE = PAPER_DIR / "interval_coverage.csv"


def calibration_stem(pair: str, proposer: str, precision: str = "fp32") -> str:
    """A kept calibration's name (RunLayout.calibration): `<pair>-<proposer>`, with `@<precision>` unless fp32."""
    return f"{pair}-{proposer}" if precision == "fp32" else f"{pair}-{proposer}@{precision}"


def split_calibration_stem(stem: str) -> tuple[str, str]:
    """A kept calibration's name back into (`<pair>-<proposer>`, precision): fp32 where no `@` names one."""
    name, _, precision = stem.partition("@")
    return name, precision or "fp32"


def trace_settings(trace: Path) -> Path:
    """The settings a trace was generated with, beside it (`<trace>.meta.json`, rakv.serving.trace.write_trace)."""
    return Path(f"{trace}.meta.json")


@dataclass(frozen=True)
class ServedRunLayout:
    """A served run's folder (`rakv serve --out DIR`, or one cell and repeat of the serving study)."""

    root: Path

    @property
    def trace(self) -> Path:
        """The trace it served, where the caller wrote it beside the run (the HTTP benchmarks)."""
        return self.root / "trace.jsonl"

    @property
    def requests(self) -> Path:
        """One line per finished request (rakv.serving.records.RequestRecord), fsynced as each finishes."""
        return self.root / "requests.jsonl"

    @property
    def iterations(self) -> Path:
        """One line per engine iteration (rakv.serving.records.IterationRecord)."""
        return self.root / "iterations.jsonl"

    @property
    def served_summary(self) -> Path:
        """The served run's statistics (rakv.serving.metrics.RunSummary; in the serving study with its cell,
        rakv.experiments.serving_runs.StudyRunSummary); not a results folder's summary.json."""
        return self.root / "summary.json"

    @property
    def complete(self) -> Path:
        """Written last by the serving study: a cell's repeat with it is not served again on resume."""
        return self.root / "complete.json"

    @classmethod
    def found_under(cls, folder: Path) -> list[ServedRunLayout]:
        """Every served run under `folder` (any depth: a folder with a requests.jsonl), sorted by path."""
        probe = cls(Path(folder)).requests.name
        return [cls(p.parent) for p in sorted(Path(folder).rglob(probe))]


@dataclass(frozen=True)
class StudyLayout:
    """A study's folder: results/<name>/study/, or the feasibility stage's sweep under feasibility/study/."""

    root: Path

    @property
    def runs(self) -> Path:
        """Every timed run, one row each (docs/outputs.md's schema)."""
        return self.root / "runs.parquet"

    @property
    def journal(self) -> Path:
        """The fsynced journal of timed runs the study resumes from; runs.parquet is built from it."""
        return self.root / "runs.jsonl"

    def shard_journal(self, shard: int, count: int) -> Path:
        """One shard's journal (study.num_shards > 1); the unsharded study's is `journal`."""
        return self.journal if count <= 1 else self.root / f"runs.shard{shard}of{count}.jsonl"

    def journals(self) -> list[Path]:
        """Every journal present, the unsharded one and each shard's, sorted by name."""
        return sorted(self.root.glob("runs*.jsonl"))

    @property
    def metadata(self) -> Path:
        """The study's provenance (rakv.experiments.metadata.RunMetadata): composed config, commit, packages,
        hardware, calibration keys, the machine's load."""
        return self.root / "metadata.json"

    @property
    def plan(self) -> Path:
        return self.root / "plan.txt"

    @property
    def plan_record(self) -> Path:
        """The whole plan as a record (rakv.experiments.study.StudyPlan), written by every shard: what the merge
        reads instead of models and calibrations."""
        return self.root / "plan.json"

    def lock(self, shard: int) -> Path:
        """One writer per shard of a study folder (rakv.experiments.records.exclusive)."""
        return self.root / f".lock.shard{shard}"


@dataclass(frozen=True)
class ServingStudyLayout:
    """The serving study's folder: results/<name>/serving/, or a shipped pilot (data/reference/serving-pilot*/)."""

    root: Path

    @classmethod
    def of(cls, folder: Path | str | ServingStudyLayout) -> ServingStudyLayout:
        """The layout of a serving study's folder (a layout given is returned as it is)."""
        return folder if isinstance(folder, ServingStudyLayout) else cls(Path(folder))

    @property
    def cells(self) -> Path:
        """One row per served run (cell x repeat)."""
        return self.root / "cells.parquet"

    @property
    def requests(self) -> Path:
        """One row per served request."""
        return self.root / "requests.parquet"

    @property
    def iterations(self) -> Path:
        """One row per engine iteration of every served run."""
        return self.root / "iterations.parquet"

    @property
    def metadata(self) -> Path:
        """The serving study's provenance (rakv.experiments.metadata.ServingMetadata)."""
        return self.root / "metadata.json"

    @property
    def plan(self) -> Path:
        return self.root / "plan.txt"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    def shard_lock(self, shard: int) -> Path:
        """One writer per shard of a sharded serving study (docs/cluster.md)."""
        return self.root / f".lock.shard{shard}"

    def batch_cost(self, configuration: str) -> Path:
        """The batch cost table the serving study used for a configuration (rakv.serving.batchcost.BatchCost)."""
        return self.root / f"batch_cost-{configuration}.json"

    @property
    def traces(self) -> Path:
        return self.root / "traces"

    def trace(self, family: str, rate: float, repeat: int) -> Path:
        """A family's seeded trace at one rate for one repeat (its settings beside it, `<trace>.meta.json`)."""
        return self.traces / f"{family}-{rate:g}-r{repeat}.jsonl"

    @property
    def cells_dir(self) -> Path:
        return self.root / "cells"

    def served_run(self, family: str, rate: float, policy: str, repeat: int) -> ServedRunLayout:
        """One cell's repeat, served into its own folder."""
        return ServedRunLayout(self.cells_dir / family / f"{rate:g}" / policy / f"r{repeat}")

    def completed_runs(self) -> list[ServedRunLayout]:
        """Every cell's repeat served to the end so far (its complete.json written)."""
        marker = ServedRunLayout(self.root).complete.name
        return [ServedRunLayout(p.parent) for p in sorted(self.cells_dir.glob(f"*/*/*/*/{marker}"))]


@dataclass(frozen=True)
class RunLayout:
    """A results folder: `results/<name>/`, or a shipped run under `data/reference/<name>/`.

    `figures_dir` and `generated_dir` move the run's figures and LaTeX elsewhere (a test writing into a temporary
    folder; a notebook run with FIGURES / GENERATED); by default they are folders named like the run."""

    root: Path
    figures_dir: Path | None = None
    generated_dir: Path | None = None

    @classmethod
    def of(cls, results: Path | str | RunLayout, figures: Path | str | None = None,
           generated: Path | str | None = None) -> RunLayout:
        """The layout of the results folder `results` (a layout given is returned as it is)."""
        if isinstance(results, RunLayout):
            return results
        return cls(Path(results).resolve(), Path(figures) if figures else None,
                   Path(generated) if generated else None)

    @classmethod
    def reference(cls, name: str) -> RunLayout:
        """A shipped run (data/reference/<name>/)."""
        return cls.of(REFERENCE_DIR / name)

    @classmethod
    def own(cls, name: str) -> RunLayout:
        """This checkout's run of a profile (results/<name>/, ./reproduce.sh's default results_dir)."""
        return cls.of(RESULTS_DIR / name)

    @classmethod
    def own_runs(cls) -> list[RunLayout]:
        """Every results/<name>/ of this checkout with a study's runs table, sorted by name."""
        probe = cls(Path("")).study.runs
        return [cls.of(p.parents[len(probe.parts) - 1]) for p in sorted(RESULTS_DIR.glob(f"*/{probe}"))]

    @classmethod
    def other_machines(cls, folder: Path = OTHER_MACHINES_DIR) -> list[RunLayout]:
        """The shipped runs of other machines under `folder`: each subfolder with an about.json, sorted by name."""
        runs = [cls.of(p) for p in sorted(Path(folder).glob("*"))]
        return [run for run in runs if run.about.exists()]

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def shipped(self) -> bool:
        """A run shipped under data/reference/ (not one of this checkout's own)."""
        return self.root.is_relative_to(REFERENCE_DIR.resolve())

    # -- beside the stages' folders ---------------------------------------------------------------------------------
    @property
    def summary(self) -> Path:
        """Every statistic of the run (rakv.experiments.summary.Summary), written by the analysis stage."""
        return self.root / "summary.json"

    @property
    def about(self) -> Path:
        """A shipped run's description (another machine's run: where, when, why; rakv.experiments.metadata.About)."""
        return self.root / "about.json"

    @property
    def stage_times(self) -> Path:
        """Each stage's wall time, appended by reproduce.sh."""
        return self.root / "stage_times.tsv"

    @property
    def stage_rss(self) -> Path:
        """Each stage's peak resident memory, appended by the stage wrapper."""
        return self.root / "stage_rss.tsv"

    @property
    def ablation(self) -> Path:
        """The controller's ablations replayed on the finished study (notebook 02, scripts/ablate_controller.py)."""
        return self.root / "ablation.csv"

    @property
    def compare_reference(self) -> Path:
        """This run against the shipped reference run of its profile (scripts/compare_runs.py, from reproduce.sh)."""
        return self.root / "compare_reference.txt"

    @property
    def notebooks(self) -> Path:
        """The executed notebooks of the analysis stage."""
        return self.root / "notebooks"

    def executed_notebook(self, name: str) -> Path:
        return self.notebooks / name

    # -- calibration ------------------------------------------------------------------------------------------------
    @property
    def calibration_dir(self) -> Path:
        return self.root / "calibration"

    def calibration(self, pair: str, proposer: str, precision: str = "fp32") -> Path:
        """The cost table a configuration's runs were decided under (rakv.runtime.costmodel.CostTable's JSON):
        `<pair>-<proposer>.json` with the target at fp32, `<pair>-<proposer>@<precision>.json` at another precision
        (rakv.runtime.models.PRECISIONS), so the two prices of one pair and proposer never share a file."""
        return self.calibration_dir / f"{calibration_stem(pair, proposer, precision)}.json"

    def calibrations(self) -> list[Path]:
        """Every kept cost table, sorted by name (`<pair>-<proposer>[@<precision>].json`: the stem names it,
        `split_calibration_stem` reads it back)."""
        return sorted(self.calibration_dir.glob("*.json"))

    # -- study ------------------------------------------------------------------------------------------------------
    @property
    def study(self) -> StudyLayout:
        return StudyLayout(self.root / "study")

    # -- serving study ----------------------------------------------------------------------------------------------
    @property
    def serving(self) -> ServingStudyLayout:
        return ServingStudyLayout(self.root / "serving")

    # -- sensitivity, sampling, feasibility -------------------------------------------------------------------------
    @property
    def sensitivity_dir(self) -> Path:
        return self.root / "sensitivity"

    def sensitivity_table(self, part: str) -> Path:
        """One sensitivity sweep's table (e.g. "crossover", "controlled", "reuse_output_length")."""
        return self.sensitivity_dir / f"{part}.parquet"

    def sensitivity_tables(self) -> list[Path]:
        """Every sensitivity table present, sorted by name (the stem names the sweep)."""
        return sorted(self.sensitivity_dir.glob("*.parquet"))

    @property
    def sensitivity_complete(self) -> Path:
        """Written last by the sensitivity stage: with it the stage does not measure again."""
        return self.sensitivity_dir / "complete.json"

    def stage_units(self, stage: str) -> Path:
        """A stage run as jobs (docs/cluster.md): each unit's tables and record (rakv.experiments.records.ShardUnit),
        what the merge reads."""
        return self.root / stage / "units"

    @property
    def sampling_dir(self) -> Path:
        return self.root / "sampling"

    def sampling_table(self, part: str) -> Path:
        """One sampling table ("runs", "distribution", "structured", "long_context")."""
        return self.sampling_dir / f"{part}.parquet"

    @property
    def sampling_design(self) -> Path:
        """The sampling stage's design, the commit each part was measured with, the hardware."""
        return self.sampling_dir / "design.json"

    @property
    def sampling_acceptance(self) -> Path:
        """Where each temperature's controller started."""
        return self.sampling_dir / "acceptance.json"

    @property
    def feasibility_dir(self) -> Path:
        return self.root / "feasibility"

    @property
    def feasibility_summary(self) -> Path:
        """The feasibility stage's outcome (rakv.experiments.summary.Feasibility); not the results folder's
        summary.json."""
        return self.feasibility_dir / "summary.json"

    def feasibility_table(self, part: str) -> Path:
        """"gap" (with the pair's weights), or "break_even" and "controlled" (its architecture twins)."""
        return self.feasibility_dir / f"{part}.parquet"

    @property
    def feasibility_study(self) -> StudyLayout:
        """The feasibility pair's action sweep (with its weights), the main study's machinery in its own folder."""
        return StudyLayout(self.feasibility_dir / "study")

    # -- outside the folder: figures, LaTeX, the PDF ----------------------------------------------------------------
    @property
    def outputs_name(self) -> str:
        """The name of this run's figures, generated LaTeX and paper build: the run's own, but <name>-own for a run
        that shares its name with a shipped run without being it (results/offline/ beside data/reference/offline/),
        so that a user's run never overwrites the shipped outputs the tests hold to the shipped tables."""
        shipped = REFERENCE_DIR / self.name
        return f"{self.name}-own" if shipped.exists() and shipped.resolve() != self.root else self.name

    @property
    def figures(self) -> Path:
        return self.figures_dir or FIGURES_DIR / self.outputs_name

    @property
    def generated(self) -> Path:
        """The paper's macros, tables and generated text for this run."""
        return self.generated_dir or GENERATED_DIR / self.outputs_name

    @property
    def build(self) -> Path:
        """latexmk's output folder for this run's paper."""
        return BUILD_DIR / self.outputs_name

    @property
    def pdf(self) -> Path:
        return self.build / "main.pdf"

    @property
    def latex_log(self) -> Path:
        return self.build / "main.log"

    @property
    def bibtex_log(self) -> Path:
        return self.build / "main.blg"

    @property
    def pdf_layout(self) -> Path:
        """LaTeX's account of the built PDF's layout (rakv.experiments.pdf_layout), kept beside it."""
        return self.build / "layout.json"

    # -- runs beside it ---------------------------------------------------------------------------------------------
    def reruns(self) -> list[RunLayout]:
        """`<name>-rerun*` folders beside this one (the same profile run again), sorted by name."""
        return [RunLayout(p.resolve()) for p in sorted(self.root.parent.glob(f"{self.name}-rerun*")) if p.is_dir()]


@dataclass(frozen=True)
class PeerLayout:
    """The vLLM peer's results: this machine's (results/peer/) or the shipped ones (data/reference/peer/), copied by
    scripts/ship_peer.sh; docs/peers.md's tables and the paper's "Against vLLM" rows read them."""

    root: Path

    @classmethod
    def own(cls) -> PeerLayout:
        return cls(RESULTS_DIR / "peer")

    @classmethod
    def shipped(cls) -> PeerLayout:
        return cls(REFERENCE_DIR / "peer")

    @property
    def vllm_serve_dir(self) -> Path:
        """scripts/bench_vllm_serve.py's --out folder."""
        return self.root / "bench_vllm_serve"

    @property
    def vllm_serve_summary(self) -> Path:
        return self.vllm_serve_summary_in(self.vllm_serve_dir)

    @staticmethod
    def vllm_serve_summary_in(out: Path) -> Path:
        """scripts/bench_vllm_serve.py's record (rakv.bench.vllm_serve's VllmServeSummary) in its --out folder."""
        return Path(out) / "summary.json"

    @property
    def tune_dir(self) -> Path:
        """scripts/tune_vllm.py's --out folder."""
        return self.root / "tune_vllm"

    @property
    def tune(self) -> Path:
        return self.tune_in(self.tune_dir)

    @staticmethod
    def tune_in(out: Path) -> Path:
        """scripts/tune_vllm.py's record (TuneReport) in its --out folder."""
        return Path(out) / "tune.json"

    @property
    def bench_serving_dir(self) -> Path:
        """scripts/bench_serving.py's --out files, one per engine setting."""
        return self.root / "bench_serving"

    @property
    def bench_engine_dir(self) -> Path:
        """scripts/bench_engine.py --precision-peer's records, one per machine."""
        return self.root / "bench_engine"

    def precision(self, label: str) -> Path:
        """One machine's precision benchmark (rakv.bench.engine_report.PrecisionPeerFile), by its CPU's label."""
        return self.bench_engine_dir / f"precision-{label}.json"

    def precisions(self) -> list[Path]:
        """Every machine's precision benchmark, sorted by name (docs/engine.md renders them in this order)."""
        return sorted(self.bench_engine_dir.glob("precision-*.json"))


@dataclass(frozen=True)
class HeadsLayout:
    """A trained set of heads (rakv.runtime.heads): its record and its tensors in one folder; the shipped set of a
    pair is data/heads/<pair>/, the heads stage's cache <derived files>/heads/<key>/ (rakv.experiments.heads)."""

    root: Path

    @classmethod
    def shipped(cls, pair: str) -> HeadsLayout:
        return cls(DATA_DIR / "heads" / pair)

    @classmethod
    def cached(cls, folder: Path, key: str) -> HeadsLayout:
        return cls(Path(folder) / "heads" / key)

    @property
    def record(self) -> Path:
        return self.root / "heads.json"

    @property
    def tensors(self) -> Path:
        return self.root / "heads.pt"
