"""The benchmarks' goals and verdicts (rakv.bench.goals, rakv.bench.engine): every goal declared once as data and
judged by one function; the memory goal judged on the whole process's resident set as first stated; the batched
steps judged from each step's floor over the measured one-row step; the TTFT goals, once only printed text, judged;
the engine report a typed record that reads back what it writes."""

import ast
import json
import re
from dataclasses import fields, is_dataclass

import pytest

from rakv.bench import goals
from rakv.bench.engine import batch_row
from rakv.bench.engine_load import memory_goal
from rakv.bench.engine_report import (
    Acceptance,
    ChunkRow,
    DraftReuse,
    DraftReuseRow,
    DraftRow,
    EngineReport,
    FloorRow,
    GenerationRow,
    LlamaCppModel,
    LlamaCppRow,
    MemoryRow,
    PrefillRow,
    PrefillSeconds,
    RssProbe,
    StartupRow,
    TtftRow,
    VerifyRow,
)
from rakv.bench.goals import AT_LEAST, AT_MOST, BATCH_GOALS, MEMORY, TTFT_EXACT, TTFT_PARTIAL, Goal, judge
from rakv.bench.roofline import RowCost
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import load_record, to_json
from rakv.runtime.paths import ROOT

MB = 10**6


def probe(peak_mb: int) -> RssProbe:
    return RssProbe(peak_rss_bytes=peak_mb * MB, weight_bytes=600 * MB, kv_bytes=20 * MB, store_bytes=0,
                    rss_before_load_bytes=0, peak_rss_after_load_bytes=0)


def test_the_memory_verdict_reads_the_whole_process_resident_set():
    judged = memory_goal(probe(1000), torch_baseline_bytes=300 * MB)
    assert judged.over_weights_and_kv == 1000 / 620 > MEMORY.threshold
    assert judged.above_torch_over_weights_and_kv == 700 / 620 <= MEMORY.threshold  # beside it, not judged
    assert judged.verdict == "missed" and judged.goal == MEMORY.threshold
    lean = memory_goal(probe(780), torch_baseline_bytes=300 * MB)
    assert lean.over_weights_and_kv <= MEMORY.threshold and lean.verdict == "met"


def cost(floor_ms: float) -> RowCost:
    return RowCost(step_ms=0.0, over_one=0.0, gemm_ms=0.0, attention_ms=0.0, other_ms=0.0, kv_mb=0.0,
                   floor_ms=floor_ms)


def test_a_batched_step_is_judged_from_its_floor_over_the_measured_one_row_step():
    rows = {1: cost(10.0), 8: cost(14.0), 16: cost(19.0)}
    batch = {1: 20.0, 8: 30.0, 16: 40.0}  # the one-row step at twice its floor
    row = batch_row(batch, rows)
    assert row.floors_over_one[16] == 1.9  # context: the floors' own ratio misses 1.6
    assert row.floor_over_measured_one[16] == 19.0 / 20.0
    assert row.verdicts == {8: "missed", 16: "missed"}
    assert (row.goal_8, row.goal_16) == (BATCH_GOALS[8].threshold, BATCH_GOALS[16].threshold)
    at_floor = batch_row({1: 10.5, 8: 13.0, 16: 21.0}, rows)
    assert at_floor.verdicts[8] == "met" and at_floor.verdicts[16].startswith("out of reach")
    no_floors = batch_row(batch, None)
    assert no_floors.verdicts == {8: "missed", 16: "missed"} and no_floors.floors_over_one is None
    assert to_json(row)["verdicts"] == {"8": "missed", "16": "missed"}  # as the report always wrote them


def test_the_ttft_goals_are_judged_where_they_were_only_printed():
    assert (TTFT_EXACT.threshold, TTFT_EXACT.direction) == (0.05, AT_MOST)
    assert (TTFT_PARTIAL.threshold, TTFT_PARTIAL.direction) == (0.6, AT_MOST)
    ttft = TtftRow(prompt_tokens=512, cold_ms=100.0, exact_ms=4.0, partial_ms=70.0, exact_over_cold=0.04,
                   partial_over_cold=0.7)
    assert judge(TTFT_EXACT, ttft.exact_over_cold) == "met"
    assert judge(TTFT_PARTIAL, ttft.partial_over_cold) == "missed"
    assert judge(TTFT_PARTIAL, None) == goals.NOT_MEASURED


def test_one_function_judges_every_direction_and_the_text_is_made_from_the_record():
    at_least = Goal("tok/s over vLLM", "ours_over_vllm", 1.5, AT_LEAST)
    assert judge(at_least, 1.5) == "met" and judge(at_least, 1.49) == "missed"
    assert judge(at_least, 150.0, 100.0) == "met"  # a ratio from its two terms
    assert at_least.text() == "goal >= 1.5"
    assert goals.OF_BOUND[8].text() == "goal >= 60 %" and goals.STARTUP_WARM.text() == "goal <= 10 s"
    with pytest.raises(ValueError, match="direction"):
        Goal("x", "x", 1.0, "about")


def every_goal() -> list[Goal]:
    found = []
    for value in vars(goals).values():
        if isinstance(value, Goal):
            found.append(value)
        elif isinstance(value, dict):
            found += [v for v in value.values() if isinstance(v, Goal)]
    return found + list(goals.fuzz_goals(1000).values())


def test_every_goal_is_declared_once():
    declared = every_goal()
    assert len(declared) >= 30
    named = {(g.name, g.measure) for g in declared}
    assert len(named) == len({id(g) for g in declared}), "two goals share a name and a measure"


def test_no_script_spells_a_goal_s_threshold_in_its_printed_text():
    """The scripts print each goal through its record (Goal.text, Goal.line), and their --help lists them from the
    records (goals_text): no threshold is spelled again, in the code or in the docstring."""
    spellings = re.compile(r"goals?:? *[<>]=?|[<>]= *\d|within \d+ %|< 1 ?ms|< 1e-3")
    for name in ("bench_engine", "bench_serving", "load_http", "fuzz_http", "bench_controller"):
        found = spellings.findall((ROOT / "scripts" / f"{name}.py").read_text())
        assert not found, f"scripts/{name}.py spells a goal's threshold itself: {found}"


def test_docs_state_the_batched_step_goals_the_code_judges():
    text = " ".join((ROOT / "docs" / "engine.md").read_text().split())
    assert f"goals: 8 <= {BATCH_GOALS[8].threshold:g}x, 16 <= {BATCH_GOALS[16].threshold:g}x" in text
    sequential = goals.OVER_SEQUENTIAL
    assert (f"(goals: >= {sequential[8].threshold:g}x sequential at 8 and >= {sequential[16].threshold:g}x at 16"
            in text)  # scripts/bench_serving.py's goals


def engine_report() -> EngineReport:
    generation = GenerationRow(10.0, 20.0, 0.5, 0.55, True, 1.0, 2.0)
    rows = {1: cost(10.0), 8: cost(14.0), 16: cost(19.0)}
    return EngineReport(
        pair="tiny", device="cpu", threads=2, kernels="compact", new_tokens=8, prompt_tokens=30, repeats=1,
        ar=generation, spec_k4=generation, floor=FloorRow(10, 1.0, 2.0, 3.0, 1.6),
        ttft=TtftRow(512, 100.0, 4.0, 70.0, 0.04, 0.7),
        draft_reuse=DraftReuse(DraftReuseRow(1.0, 20.0, 0.05, 256), DraftReuseRow(5.0, 20.0, 0.25, 128)),
        spec_k4_acceptance=Acceptance(0.5, 0.6, 7), verify=VerifyRow(256, 10.0, 1.1, {1: 1.01, 2: 1.02}, True),
        draft=DraftRow(256, 10.0, 3.0, 0.3, 0.3, 10, 1.0, 3.0, 1.5, 0.2, 0.1, "met"),
        batch=batch_row({1: 20.0, 8: 30.0, 16: 40.0}, rows), chunk_beside_decodes=ChunkRow(32, 10.0, 15.0, 1.5, 2.0),
        gemm=None, prefill=PrefillRow(512, 1000.0, PrefillSeconds({64: 0.1}, {64: 0.01}), None, None),
        memory=MemoryRow(**vars(probe(700)), over_weights_and_kv=1.1, torch_baseline_bytes=1, goal=1.3,
                         above_torch_over_weights_and_kv=1.0, verdict="met"),
        startup=StartupRow(5.0, 6.0, 1.0, 2.0, 2, 10.0, 3.0),
        llama_cpp=LlamaCppRow(LlamaCppModel(error="died"), LlamaCppModel("0.3", 5.0, 900.0, 512, True), 4.0, None,
                              1.0, None, 1.5))


def test_the_engine_report_reads_back_what_it_writes_with_the_keys_it_always_had():
    report = engine_report()
    written = json.loads(json.dumps(to_json(report)))
    assert load_record(EngineReport, written, "report") == report
    assert list(written) == [f.name for f in fields(EngineReport)]
    assert list(written["draft_reuse"]) == ["exact repeat", "50 % partial hit"]
    assert written["llama_cpp"]["f32"] == {"error": "died"}  # a dead process: its error alone
    assert list(written["memory"])[:6] == [f.name for f in fields(RssProbe)]
    assert list(written["batch"]["by_kernel"]) == ["1", "8", "16"]
    broken = dict(written, ttft={k: v for k, v in written["ttft"].items() if k != "cold_ms"})
    with pytest.raises(RakvError, match="report: missing field 'ttft.cold_ms'"):
        load_record(EngineReport, broken, "report")
    with pytest.raises(RakvError, match="unknown field 'verify.goal'"):
        load_record(EngineReport, dict(written, verify=dict(written["verify"], goal=1.0)), "report")


# ---------------------------------------------------------------------------------------------
# No string-key reads of the benchmarks' reports


def report_keys() -> set[str]:
    """Every key of every report record the benchmarks write (rakv.bench's records, their JSON names)."""
    from rakv.bench import engine_report, kernel_ab, peer_reports, roofline
    from rakv.runtime.json_records import name_of

    return {name_of(f) for module in (engine_report, kernel_ab, peer_reports, roofline)
            for record in vars(module).values()
            if isinstance(record, type) and is_dataclass(record) and record.__module__ == module.__name__
            for f in fields(record)}


BENCH_SCRIPTS = ("bench_engine", "bench_serving", "bench_controller", "ab_kernels", "bench_vllm_serve", "tune_vllm",
                 "vllm_peer", "load_http", "fuzz_http", "peer_weights", "peer_tables", "locustfile_http")
# reads of other programs' formats whose keys happen to be names of report fields: the OpenAI API's error body, and
# vLLM's benchmark client's result file (its own format, read into ClientOutput)
OTHER_FORMATS = {("load_client.py", "event['error']"), ("load_client.py", "json.loads(body)['error']"),
                 ("fuzz_http.py", "response.json()['error']"), ("peer_reports.py", "result.get('generated_texts')"),
                 ("peer_reports.py", "result.get('errors')")}


def string_key_reads(path, keys: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        if isinstance(key, str) and key in keys and (path.name, ast.unparse(node)) not in OTHER_FORMATS:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_report_is_read_by_a_string_key_in_the_bench_its_scripts_or_the_peer_tables():
    keys = report_keys() - {"json"}  # (the records' own field-metadata key)
    assert {"ours_tok_s", "exact_over_cold", "vllm_tok_s_runs", "bitwise_equal"} <= keys
    paths = [*sorted((ROOT / "src" / "rakv" / "bench").glob("*.py")), ROOT / "src/rakv/experiments/peer_tables.py",
             *(ROOT / "scripts" / f"{name}.py" for name in BENCH_SCRIPTS)]
    found = [read for path in paths for read in string_key_reads(path, keys)]
    assert not found, found


def test_the_records_have_no_mapping_methods():
    """A string-key read of a report fails at once wherever it hides from the static check above."""
    from rakv.bench import engine_report, peer_reports

    records = [v for m in (engine_report, peer_reports) for v in vars(m).values()
               if isinstance(v, type) and is_dataclass(v)]
    assert len(records) > 30
    for record in records:
        for method in ("__getitem__", "get", "keys", "items"):
            assert not hasattr(record, method), f"{record.__name__}.{method}"
