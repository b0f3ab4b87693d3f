"""The engine benchmark's verdicts (rakv.bench.engine): the memory goal judged on the whole process's resident set as
first stated, and the batched steps judged from each step's floor over the measured one-row step."""

from rakv.bench.engine import BATCH_GOALS, MEMORY_GOAL, batch_row, memory_goal
from rakv.runtime.paths import ROOT

MB = 10**6


def test_the_memory_verdict_reads_the_whole_process_resident_set():
    rss = {"peak_rss_bytes": 1000 * MB, "weight_bytes": 600 * MB, "kv_bytes": 20 * MB}
    judged = memory_goal(rss, torch_baseline_bytes=300 * MB)
    assert judged["over_weights_and_kv"] == 1000 / 620 > MEMORY_GOAL
    assert judged["above_torch_over_weights_and_kv"] == 700 / 620 <= MEMORY_GOAL  # beside it, not judged
    assert judged["verdict"] == "missed"
    lean = memory_goal({**rss, "peak_rss_bytes": 780 * MB}, torch_baseline_bytes=300 * MB)
    assert lean["over_weights_and_kv"] <= MEMORY_GOAL and lean["verdict"] == "met"


def test_a_batched_step_is_judged_from_its_floor_over_the_measured_one_row_step():
    rows = {1: {"floor_ms": 10.0}, 8: {"floor_ms": 14.0}, 16: {"floor_ms": 19.0}}
    batch = {1: 20.0, 8: 30.0, 16: 40.0}  # the one-row step at twice its floor
    row = batch_row(batch, rows)
    assert row["floors_over_one"]["16"] == 1.9  # context: the floors' own ratio misses 1.6
    assert row["floor_over_measured_one"]["16"] == 19.0 / 20.0
    assert row["verdicts"] == {"8": "missed", "16": "missed"}
    at_floor = batch_row({1: 10.5, 8: 13.0, 16: 21.0}, rows)
    assert at_floor["verdicts"]["8"] == "met" and at_floor["verdicts"]["16"].startswith("out of reach")
    no_floors = batch_row(batch, None)
    assert no_floors["verdicts"] == {"8": "missed", "16": "missed"} and no_floors["floors_over_one"] is None


def test_docs_state_the_batched_step_goals_the_code_judges():
    text = " ".join((ROOT / "docs" / "engine.md").read_text().split())
    assert f"goals: 8 <= {BATCH_GOALS[8]:g}x, 16 <= {BATCH_GOALS[16]:g}x" in text
    assert "(goals: >= 5x sequential at 8 and >= 8x at 16" in text  # scripts/bench_serving.py's goals
