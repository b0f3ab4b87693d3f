"""A small real results set, produced by the pipeline's own stages and notebooks on the tiny pair (the smoke
profile), checked for every output the docs promise. Its own file: the fixture takes a minute or two, and pytest-xdist
keeps a file's tests on one worker (scripts/test.sh), so the analysis tests beside it run on the other."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rakv.experiments.notebooks import run_all
from rakv.experiments.summary import read_summary
from rakv.runtime.json_records import record_items
from rakv.runtime.run_layout import RunLayout

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.heavy


@pytest.fixture(scope="session")
def smoke_outputs(tmp_path_factory):
    """A small real results set: the smoke profile's study, serving, sensitivity, sampling and feasibility stages on the
    tiny pair and HumanEval alone, then every notebook, with figures and LaTeX written beside it (not into the
    repository)."""
    root = tmp_path_factory.mktemp("smoke")
    results = root / "results"
    # the suite's own workers load the machine: its calibration's noise gate is opened for this fixture only, so no
    # test is refused by the load of the tests themselves (the gate itself: tests/test_costmodel.py)
    overrides = ["profile=smoke", f"results_dir={results}", "configurations=[tiny,tiny-lookup]", "datasets=[humaneval]",
                 "calibration.refuse_spread=10.0"]
    serving = ["profile.serving.repeats=2", "profile.serving.rates={chunking:[64],speculation:[16,64],acceptance:[16]}"]
    sampling = ["profile.sampling.seeds=1", "profile.sampling.distribution.seeds=12"]
    for stage in ("study", "serving", "sensitivity", "sampling", "feasibility"):
        extra = {"serving": serving, "sampling": sampling}.get(stage, [])
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_stage.py"), stage, *overrides, *extra],
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{stage}: {done.stderr[-2000:]}"
    layout = RunLayout.of(results, root / "figures", root / "generated")
    run_all("smoke", layout)
    return layout


def test_every_figure_and_summary_key_listed_in_the_docs_is_produced(smoke_outputs):
    readme = (ROOT / "docs" / "outputs.md").read_text()
    figures = readme.split("<!-- figures -->")[1].split("<!-- /figures -->")[0].split()
    keys = readme.split("<!-- summary-keys -->")[1].split("<!-- /summary-keys -->")[0].split()
    figures, keys = [f.strip("`,") for f in figures if f.startswith("`")], [k.strip("`,") for k in keys
                                                                          if k.startswith("`")]
    assert len(figures) >= 7 and len(keys) >= 15
    for name in figures:
        assert (smoke_outputs.figures / f"{name}.png").exists(), name
        assert (smoke_outputs.figures / f"{name}.pdf").exists(), name
    produced = dict(record_items(read_summary(smoke_outputs.root)))
    for key in keys:
        assert key in produced, key
    for name in ("macros.tex", "claims_table.tex", "strategy_table.tex", "abstract.tex", "limitations.tex",
                 "statistics_table.tex", "acceptance_table.tex", "memory_table.tex", "serving.tex",
                 "serving_goals_table.tex", "sampling.tex"):
        assert (smoke_outputs.generated / name).exists()
    assert not RunLayout.of(smoke_outputs.root).figures.exists()  # nothing written into the repository



def test_the_long_context_workload_counts_evictions_per_request(smoke_outputs):
    """Each request's evictions are counted from the store state it started from (the store's counters carry on
    across a restore): never negative; AR measured under the first budget only."""
    rows = pd.read_parquet(smoke_outputs.sampling_table("long_context"))
    assert (rows.evictions >= 0).all()
    ar = rows[rows.strategy == "ar"]
    assert set(ar.measured_under_mib) == {rows.budget_mib.iloc[0]}  # AR: measured under the first budget only
    assert len(ar) == len(rows[rows.strategy == "kv-only"])
