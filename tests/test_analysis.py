"""Statistics on small hand-built tables whose answers are known."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rakv import analysis
from rakv.notebooks import OutputPaths, run_all, setup

ROOT = Path(__file__).resolve().parents[1]


def run(prompt, kind, strategy, action, latency, predicted=None, equal=True, repeat=0):
    k = int(action[3:])
    return {"configuration": "c", "dataset": "d", "prompt_id": prompt, "scenario": "partial-50", "repeat": repeat,
            "kind": kind, "strategy": strategy, "action": action, "k": k, "reuse": action[1] == "1",
            "latency_s": latency, "ttft_s": latency / 10, "tokens_per_s": 10 / latency,
            "predicted_latency_s": predicted if predicted is not None else latency, "equal_to_ar": equal}


@pytest.fixture
def runs():
    rows = []
    # prompt p1: oracle r1k0 (1.0); the controller picks r1k0. prompt p2: oracle r1k4 (1.5); controller picks r1k0 (2.0)
    sweep = {"p1": {"r0k0": (2.0, 2.2), "r0k4": (3.0, 2.9), "r1k0": (1.0, 1.1), "r1k4": (1.2, 1.5)},
             "p2": {"r0k0": (3.0, 3.0), "r0k4": (2.5, 2.6), "r1k0": (2.0, 1.8), "r1k4": (1.5, 1.9)}}
    for prompt, actions in sweep.items():
        for action, (measured, predicted) in actions.items():
            rows.append(run(prompt, "sweep", action, action, measured, predicted))
    strategies = {"p1": {"ar": ("r0k0", 2.0), "kv-only": ("r1k0", 1.0), "spec-k4": ("r0k4", 3.0),
                         "joint-k4": ("r1k4", 1.2), "rakv-asd": ("r1k0", 1.0)},
                  "p2": {"ar": ("r0k0", 3.0), "kv-only": ("r1k0", 2.0), "spec-k4": ("r0k4", 2.5),
                         "joint-k4": ("r1k4", 1.5), "rakv-asd": ("r1k0", 2.0)}}
    for prompt, items in strategies.items():
        for strategy, (action, latency) in items.items():
            rows.append(run(prompt, "strategy", strategy, action, latency, equal=not (prompt == "p2" and
                                                                                     strategy == "spec-k4")))
    return pd.DataFrame(rows)


def test_latency_reduction_and_throughput_gain(runs):
    value, low, high = analysis.latency_reduction(runs, "rakv-asd", "joint-k4", resamples=200)
    assert value == pytest.approx(1 - (1.0 + 2.0) / (1.2 + 1.5))
    assert low <= value <= high
    gain = analysis.throughput_gain(runs, "rakv-asd", "ar", resamples=200)[0]
    assert gain == pytest.approx(np.mean([10 / 1.0, 10 / 2.0]) / np.mean([10 / 2.0, 10 / 3.0]) - 1)


def test_exactness_counts_strategy_runs(runs):
    assert analysis.exactness(runs) == (9, 10)


def test_oracle_accuracy_and_regret(runs):
    oracle = analysis.oracle_table(runs).set_index("prompt_id")
    assert oracle.oracle_action.to_dict() == {"p1": "r1k0", "p2": "r1k4"}
    assert analysis.controller_accuracy(runs) == (0.5, 0.5)
    mean, worst = analysis.regret(runs)
    assert worst == pytest.approx(2.0 / 1.5 - 1) and mean == pytest.approx((0 + 2.0 / 1.5 - 1) / 2)


def test_mape_and_spearman(runs):
    errors = [0.2 / 2.0, 0.1 / 3.0, 0.1 / 1.0, 0.3 / 1.2, 0.0, 0.1 / 2.5, 0.2 / 2.0, 0.4 / 1.5]
    assert analysis.mape(runs) == pytest.approx(np.mean(errors))
    pooled, per = analysis.spearman(runs)
    assert per == pytest.approx((1.0 + 0.8) / 2)  # p1 ranks perfectly; p2 swaps the two best actions
    assert 0.8 < pooled < 1.0


def test_spec_slowdown(runs):
    low, high, share = analysis.spec_slowdown(runs)
    assert (low, high, share) == (pytest.approx(1.5 / 2.0 - 1), pytest.approx(1.2 / 1.0 - 1), 0.5)


def test_crossovers():
    controlled = pd.DataFrame({"configuration": "c", "k": 4, "alpha": [0.5, 0.7, 0.9],
                               "measured_speedup": [0.5, 0.9, 1.1]})
    assert analysis.measured_crossover(controlled) == {"c/k4": pytest.approx(0.8)}
    crossover = pd.DataFrame({"configuration": "c", "scenario": ["cold"] * 4, "prompt_tokens": [64, 64, 128, 128],
                              "k": [2, 4, 2, 4], "break_even_alpha": [0.9, 0.85, np.nan, np.nan]})
    assert analysis.model_crossover(crossover) == {"min": 0.85, "max": 0.85, "median": 0.85, "settings": 2,
                                                   "never": 1}


def test_claims_compare_with_reference(runs, tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    runs.to_parquet(study / "runs.parquet")
    summary = analysis.summarize(tmp_path, resamples=100)
    rows = {r["claim"]: r for r in summary["claims"]}
    exact = rows["outputs identical to AR"]
    assert exact["reproduced"] == 90.0 and exact["reference"] == 100.0 and not exact["holds"]
    assert rows["RAKV-ASD vs Joint-k4: latency reduction"]["holds"] is False  # 1 - 3/2.7 < 0
    assert summary["feasibility"] == {"status": "missing"}


@pytest.fixture(scope="session")
def smoke_outputs(tmp_path_factory):
    """A small real results set: the smoke profile's study, sensitivity and feasibility stages on the tiny pair
    and HumanEval alone, then every notebook, with figures and LaTeX written beside it (not into the repository)."""
    root = tmp_path_factory.mktemp("smoke")
    results = root / "results"
    overrides = ["profile=smoke", f"results_dir={results}", "configurations=[tiny,tiny-lookup]", "datasets=[humaneval]"]
    for stage in ("study", "sensitivity", "feasibility"):
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / f"run_{stage}.py"), *overrides],
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{stage}: {done.stderr[-2000:]}"
    paths = OutputPaths.of(results, root / "figures", root / "generated")
    run_all("smoke", paths)
    return paths


def test_every_figure_and_summary_key_listed_in_readme_is_produced(smoke_outputs):
    readme = (ROOT / "README.md").read_text()
    figures = readme.split("<!-- figures -->")[1].split("<!-- /figures -->")[0].split()
    keys = readme.split("<!-- summary-keys -->")[1].split("<!-- /summary-keys -->")[0].split()
    figures, keys = [f.strip("`,") for f in figures if f.startswith("`")], [k.strip("`,") for k in keys
                                                                          if k.startswith("`")]
    assert len(figures) >= 7 and len(keys) >= 15
    for name in figures:
        assert (smoke_outputs.figures / f"{name}.png").exists(), name
        assert (smoke_outputs.figures / f"{name}.pdf").exists(), name
    summary = json.loads((smoke_outputs.results / "summary.json").read_text())
    for key in keys:
        assert key in summary, key
    for name in ("macros.tex", "claims_table.tex", "strategy_table.tex"):
        assert (smoke_outputs.generated / name).exists()
    assert not (ROOT / "figures" / smoke_outputs.results.name).exists()  # nothing written into the repository


def test_notebook_setup_names_the_command_when_results_are_missing(tmp_path):
    with pytest.raises(SystemExit, match=r"\./reproduce\.sh profile=nothing-here"):
        setup("nothing-here", str(tmp_path / "nothing-here"))


def test_cost_side_feasibility_is_labelled_and_never_claims_a_verdict(runs, tmp_path):
    rows = [{"pair": "big-twin", "k": 2, "break_even_alpha": 0.93}, {"pair": "big-twin", "k": 4, "break_even_alpha": 0.88},
            {"pair": "big-twin", "k": 8, "break_even_alpha": None}, {"pair": "other-twin", "k": 2, "break_even_alpha": 0.5}]
    feas = {"status": "cost side only: weights unavailable", "configuration": "big", "twin": "big-twin",
            "twins": ["big-twin", "other-twin"], "break_even": rows}
    sentence = analysis.cost_side_sentence(feas)
    assert sentence == ("cost side only (architecture twins): pays only above alpha = 0.88 (k = 4), never for k = 8; "
                        "acceptance needs the real weights")
    never = analysis.cost_side_sentence({**feas, "break_even": [{**r, "break_even_alpha": None} for r in rows]})
    assert "never pays, for any k, even at alpha = 1" in never
    study = tmp_path / "study"
    study.mkdir()
    runs.to_parquet(study / "runs.parquet")
    (tmp_path / "feasibility").mkdir()
    (tmp_path / "feasibility" / "summary.json").write_text(json.dumps(feas))
    claim = analysis.summarize(tmp_path, resamples=50)["claims"][-1]
    assert claim["holds"] is None and claim["reproduced"] == sentence
