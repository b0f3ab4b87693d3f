"""scripts/compare_runs.py: B's headline statistics against A's confidence intervals."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_runs.py"
spec = importlib.util.spec_from_file_location("compare_runs", SCRIPT)
compare_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_runs)


def summary(latency, mape=0.2):
    return {"per_configuration": {"c": {"latency_reduction": {"joint-k4": latency, "kv-only": [0.02, -0.01, 0.05]},
                                        "throughput_gain": {"joint-k4": [0.1, 0.05, 0.15]}, "worst_regret": mape,
                                        "best_fixed_action": "r1k0"}},
            "pooled": {"latency_reduction": {"kv-only": [0.02, -0.01, 0.05]}}, "runs": 10}


def write(folder: Path, content: dict) -> Path:
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(content))
    return folder


def test_inside_and_outside_the_interval(tmp_path, capsys):
    a = write(tmp_path / "a", summary([0.10, 0.04, 0.17]))
    inside = write(tmp_path / "inside", summary([0.12, 0.05, 0.2], mape=0.25))
    outside = write(tmp_path / "outside", summary([0.01, -0.06, 0.08]))
    assert compare_runs.main([str(a), str(inside)]) == 0
    assert "+25.0%" in capsys.readouterr().out
    assert compare_runs.main([str(a), str(outside)]) == 1
    assert "per_configuration.c.latency_reduction.joint-k4" in capsys.readouterr().out


def with_hardware(folder: Path, processor: str) -> Path:
    (folder / "study").mkdir()
    (folder / "study" / "metadata.json").write_text(json.dumps(
        {"hardware": {"processor": processor, "device": "cpu", "threads": 2, "dtype": "float32"}}))
    return folder


def test_outside_on_the_same_hardware_fails_and_on_other_hardware_is_reported(tmp_path, capsys):
    a = with_hardware(write(tmp_path / "a", summary([0.10, 0.04, 0.17])), "CPU X")
    same = with_hardware(write(tmp_path / "same", summary([0.01, -0.06, 0.08])), "CPU X")
    other = with_hardware(write(tmp_path / "other", summary([0.01, -0.06, 0.08])), "CPU Y")
    assert compare_runs.main([str(a), str(same)]) == 1
    out = capsys.readouterr().out
    assert ("1 of 4 statistic(s) of B outside A's 95% confidence interval: "
            "per_configuration.c.latency_reduction.joint-k4") in out
    assert "CPU X (cpu, 2 threads, float32)" in out and "different hardware" not in out
    assert compare_runs.main([str(a), str(other)]) == 0
    out = capsys.readouterr().out
    assert "CPU Y" in out and "different hardware" in out


def test_unreadable_input_is_a_one_line_error(tmp_path, capsys):
    assert compare_runs.main([str(tmp_path / "nowhere"), str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
