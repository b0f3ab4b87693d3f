"""Every file the pipeline writes is a typed record, read and written through the one codec
(rakv.runtime.json_records, docs/layout.md): its forms on disk (a CI as a list or as three keys, an inline record,
NaN as null or kept), no string-key read of any record in src/, scripts/ or the notebooks, JSON parsed only where
records or wire bodies are, and no bare dict across a module boundary of the experiments and the bench."""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from record_reads import ROOT, notebook_code, record_sources, record_types, string_reads

from rakv.experiments.serving_goal_ids import KEY_TAILS, GoalId, GoalKind
from rakv.experiments.summary import read_summary
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import ABSENT, CI, ci_keys, inline, load_record, optional, to_json
from rakv.runtime.paths import REFERENCE_DIR

# ---------------------------------------------------------------------------------------------
# The codec's forms


@dataclass(frozen=True)
class Row:
    name: str
    ci: CI = ci_keys("value", "ci_low", "ci_high")
    spread: CI = optional()


@dataclass(frozen=True)
class Inner:
    a: int
    b: float | None


@dataclass(frozen=True, kw_only=True)
class Flat:
    inner: Inner = inline()
    checked: int = optional()
    last: str
    by_k: dict[int, float] = optional()


def test_a_ci_is_one_type_in_each_of_its_forms_on_disk():
    row = Row("x", CI(0.1, 0.0, 0.2), CI(1.0, None, None))
    data = to_json(row)
    assert data == {"name": "x", "value": 0.1, "ci_low": 0.0, "ci_high": 0.2, "spread": [1.0, None, None]}
    assert list(data) == ["name", "value", "ci_low", "ci_high", "spread"]
    back = load_record(Row, json.loads(json.dumps(data)), "row.json")
    assert back == row and isinstance(back.ci, CI) and isinstance(back.spread, CI)
    assert back.ci.low == 0.0 and back.spread.high is None
    with pytest.raises(RakvError, match="^row.json: missing field 'ci_high'$"):
        load_record(Row, {"name": "x", "value": 0.1, "ci_low": 0.0}, "row.json")
    with pytest.raises(RakvError, match="^row.json: field 'spread' is not an interval"):
        load_record(Row, {**data, "spread": [1.0]}, "row.json")


def test_an_inline_record_is_written_into_its_parent_and_read_back_from_it():
    record = Flat(inner=Inner(1, None), last="z", by_k={2: 0.5})
    data = to_json(record)
    assert list(data) == ["a", "b", "last", "by_k"] and data["by_k"] == {"2": 0.5}  # unchecked: left out
    assert load_record(Flat, json.loads(json.dumps(data)), "f") == record
    assert load_record(Flat, {**data, "checked": 3}, "f").checked == 3
    with pytest.raises(RakvError, match="^f: missing field 'a'$"):
        load_record(Flat, {k: v for k, v in data.items() if k != "a"}, "f")
    with pytest.raises(RakvError, match="^f: unknown field 'c'$"):
        load_record(Flat, {**data, "c": 1}, "f")


def test_nan_is_null_in_the_summary_and_kept_elsewhere():
    row = Row("x", CI(math.nan, math.nan, math.nan))
    assert to_json(row, nan_as_null=True)["value"] is None
    assert math.isnan(to_json(row)["value"])
    assert to_json(Row("x", CI(1.0, 0.5, 2.0), ABSENT)) == {"name": "x", "value": 1.0, "ci_low": 0.5, "ci_high": 2.0}


def test_the_shipped_summary_holds_cis_in_every_form():
    summary = read_summary(REFERENCE_DIR / "offline")
    assert isinstance(summary.pooled.latency_reduction.joint_k4, CI)  # a list on disk
    assert all(isinstance(c.reproduced, CI) for c in summary.claims)  # reproduced / ci_low / ci_high on disk
    assert all(isinstance(g.ci, CI) for g in summary.serving.goals + summary.serving.pairs)  # value / ci_low / ...


# ---------------------------------------------------------------------------------------------
# A goal's key is read back in one place


def test_a_goal_key_reads_back_as_its_goal_id():
    for kind, tail in KEY_TAILS.items():
        rival = "disable-by-batch-size" if "{rival}" in tail else None
        goal = GoalId("speculation-draft", kind, rival)
        assert GoalId.from_key(goal.key) == goal
    summary = read_summary(REFERENCE_DIR / "offline")
    ids = [g.goal_id for g in summary.serving.goals]
    assert [i.key for i in ids] == [g.key for g in summary.serving.goals]
    assert sum(i.kind is GoalKind.NO_WORSE for i in ids) == 8
    with pytest.raises(ValueError, match="not a serving goal's key"):
        GoalId.from_key("speculation/sideways/k0")


# ---------------------------------------------------------------------------------------------
# No string-key read of any record the pipeline writes


@pytest.fixture(scope="module")
def records() -> set[str]:
    return record_types()


@pytest.fixture(scope="module")
def sources(records) -> set[str]:
    return record_sources(records)


def test_every_record_the_pipeline_writes_is_checked(records, sources):
    assert {"Summary", "Feasibility", "RunSummary", "RequestRecord", "IterationRecord", "StudyRunSummary",
            "VllmServeSummary", "ServingBenchReport", "TuneReport", "EngineReport", "RunMetadata"} <= records
    assert {"read_summary", "read_feasibility", "read_run_summary", "read_records", "read_iterations",
            "read_serve_summary", "read_tune", "read_run_metadata", "summarize", "serve"} <= sources


def test_no_record_has_mapping_methods():
    """A string-key read of a record fails at once (TypeError), wherever it hides from the static check below."""
    import importlib
    from dataclasses import is_dataclass

    from record_reads import record_modules

    types = [v for name in record_modules() for v in vars(importlib.import_module(name)).values()
             if isinstance(v, type) and is_dataclass(v) and v.__module__ == name]
    assert len(types) > 100
    offending = [f"{t.__name__}.{m}" for t in types for m in ("__getitem__", "get", "keys", "items") if hasattr(t, m)]
    assert not offending


PLANTED = '''
from rakv.experiments.summary import read_summary; from rakv.experiments.analysis import summarize
from rakv.serving.metrics import read_run_summary
from rakv.serving.records import read_records
from rakv.bench.peer_reports import read_tune, VllmServeSummary
from rakv.experiments.metadata import read_run_metadata
from rakv.runtime.json_records import to_json
summary = read_summary(results)
print(summary["runs"])  # flagged
for name, s in summarize(results).per_configuration.items():
    s.latency_reduction["joint-k4"]  # flagged
def serving_text(summary):
    return summary.get("serving")  # flagged
def table(rows: list[ClaimRow]):
    return [r["claim"] for r in rows]  # flagged
claims = [r for r in summary.claims]
claims[0]["verdict"]  # flagged
best = min(summary.acceptance, key=lambda r: r.break_even_alpha)
best["k"]  # flagged
run = read_run_summary(path)
run["completed"]  # flagged
for record in read_records(path):
    record["ttft_s"]  # flagged
read_tune(path).to_json()["alpha"]  # flagged
def peer(serve: VllmServeSummary):
    return serve.machine["cpu"]  # flagged
read_run_metadata(layout).get("git_commit")  # flagged
to_json(summary)["claims"]  # flagged
'''

NOT_RECORDS = '''
from rakv.experiments.summary import read_summary
summary = read_summary(results)
rows = pd.DataFrame(summary.claims)
rows["configuration"]
runs = pd.read_parquet(path)
runs["latency_s"]
line = summary.to_json()
line["runs"] = 1
data = json.loads(text)
data["x"]
def f(result):
    return result["completed"]
'''


def test_the_checker_finds_string_reads_of_records_and_not_of_tables(records, sources):
    flagged = [f"line {n}" for n, line in enumerate(PLANTED.splitlines(), 1) if line.endswith("# flagged")]
    assert [f.split(":")[0] for f in string_reads(PLANTED, records, sources)] == flagged
    assert len(flagged) == 12
    assert string_reads(NOT_RECORDS, records, sources) == []


def python_files() -> list[Path]:
    return sorted((ROOT / "src" / "rakv").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))


def test_nothing_reads_a_record_by_a_string_key(records, sources):
    files = python_files()
    found = [f"{p.relative_to(ROOT)} {read}" for p in files for read in string_reads(p.read_text(), records, sources)]
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    found += [f"{p.relative_to(ROOT)} {read}" for p in notebooks
              for read in string_reads(notebook_code(p), records, sources)]
    assert len(files) > 100 and len(notebooks) >= 6
    assert not found, f"read the records' attributes (rakv.runtime.json_records): {found}"


# ---------------------------------------------------------------------------------------------
# JSON is parsed only where records or wire bodies are: no pipeline file is read raw elsewhere

JSON_PARSING = {
    # the records' codec and the modules whose records it reads
    "src/rakv/runtime/json_records.py": "the codec: every record file is parsed here",
    "src/rakv/serving/records.py": "requests.jsonl and iterations.jsonl, a record per line through the codec",
    "src/rakv/serving/metrics.py": "a served run's summary.json through RunSummary",
    "src/rakv/experiments/serving_runs.py": "a serving study run's summary.json through StudyRunSummary",
    "src/rakv/experiments/records.py": "the study's journal (runs.jsonl), its rows kept as they were written",
    "src/rakv/runtime/costmodel.py": "a calibration's cost table through CostTable.from_json (read_cost_table)",
    "src/rakv/serving/batchcost.py": "a batch cost table through BatchCost.from_json",
    "src/rakv/serving/trace.py": "trace.jsonl, each line checked as a TraceRequest",
    "src/rakv/bench/load_client.py": "OpenAI answers and SSE events (wire bodies); outcome lines via Outcome.from_json",
    # JSON held in a table's column (parquet has no list of lists)
    "src/rakv/experiments/calibrations.py": "runs.parquet's `predictions` column",
    "src/rakv/experiments/oracle.py": "runs.parquet's `tie_set` column",
    "src/rakv/experiments/runcompare.py": "runs.parquet's `tie_set` column",
    "src/rakv/experiments/study.py": "the journal's `ewma_by_match` column, to resume the controller",
    "src/rakv/experiments/figures.py": "requests.parquet's `itl_s` column",
    "src/rakv/experiments/sampling_stats.py": "the sampling table's `tokens` column",
    # iterations.parquet's `k` column; and the batch cost table read raw: converted by the RunMetadata change
    "src/rakv/experiments/serving_stats.py": "iterations.parquet's `k` column; the batch cost table",
    # other programs' output, input files and wire bodies
    "src/rakv/cli.py": "a user's prompts file (JSON lines), checked line by line",
    "src/rakv/runtime/models.py": "the file hashes' memo (derived files of this machine)",
    "src/rakv/bench/engine_load.py": "a probe subprocess's stdout (then its record) and an HTTP answer",
    "src/rakv/bench/fuzz_http.py": "SSE events of a streamed answer (wire bodies)",
    "src/rakv/bench/peers.py": "scripts/vllm_peer.py's result.json (another venv's program), then its records",
    "src/rakv/bench/vllm_serve.py": "vLLM's benchmark client's result file (ClientOutput.of_client keeps its fields)",
    "scripts/vllm_peer.py": "runs in the vLLM peer's venv, which has no rakv: its job file",
    "scripts/compare_served.py": "compares two versions' requests.jsonl / iterations.jsonl key by key, as written",
    "scripts/tune_vllm.py": "--hand: a schedule given on the command line as JSON",
    "scripts/locustfile_http.py": "the prompts file (a JSON list, input data)",
    "src/rakv/bench/llama_cpp.py": "the llama.cpp peer's child process, in another venv without rakv: JSON in and out",
    "scripts/compare_lm_eval.py": "lm-evaluation-harness's own output files (another program's)",
    "scripts/write_lock.py": "pip's installation report (another program's output)",
    # shipped runs of earlier engines, whose summary.json predates today's Summary record: read field by field
    "src/rakv/experiments/figures_runs.py": "earlier engines' summary.json (before today's Summary record)",
    "src/rakv/experiments/prose_abstract.py": "earlier engines' summary.json (before today's Summary record)",
}


def json_parses(source: str) -> list[int]:
    """The lines of `source` that parse JSON: json.load / json.loads, or load / loads imported from json."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "json" for alias in node.names if alias.name in ("load", "loads")}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr in ("load", "loads") and isinstance(func.value, ast.Name)
                    and func.value.id == "json") or (isinstance(func, ast.Name) and func.id in imported):
                lines.append(node.lineno)
    return sorted(lines)


def test_the_json_rule_finds_every_way_to_parse():
    planted = "import json\nfrom json import loads as parse\na = json.loads(t)\nb = json.load(f)\nc = parse(t)\n"
    assert json_parses(planted) == [3, 4, 5]
    assert json_parses("import json\ntext = json.dumps(x)\n") == []


def test_json_is_parsed_only_where_records_or_wire_bodies_are():
    parsing = {str(p.relative_to(ROOT)): json_parses(p.read_text()) for p in python_files()}
    parsing = {path: lines for path, lines in parsing.items() if lines}
    outside = {path: lines for path, lines in parsing.items() if path not in JSON_PARSING}
    assert not outside, (f"JSON parsed outside the modules that declare records or parse wire bodies: {outside}; "
                         "read the file through its record (rakv.runtime.json_records)")
    stale = sorted(set(JSON_PARSING) - set(parsing))
    assert not stale, f"JSON_PARSING names modules that no longer parse JSON (delete them): {stale}"
    notebooks = {p.name: json_parses(notebook_code(p)) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))}
    assert not any(notebooks.values()), f"a notebook parses JSON: read it through its record: {notebooks}"


# ---------------------------------------------------------------------------------------------
# No bare dict across a module boundary of the experiments and the bench

MAPS = {"dict", "Dict", "Mapping", "MutableMapping"}

# "<module>:<function>" -> why it returns a dict
DICT_RETURNS = {
    "experiments/analysis.py:sensitivity_statistics": "Summary's keyword arguments from the sensitivity stage",
    "experiments/enginecompare.py:engine_rows": "a pandas-ready row per configuration (the engine table)",
    "experiments/metadata.py:RunMetadata.controller": "a section of the composed Hydra config, kept a mapping",
    "experiments/metadata.py:ServingMetadata.experiment": "a section of the composed Hydra config, kept a mapping",
    "experiments/metadata.py:ServingMetadata.serving_grid": "a section of the composed Hydra config, kept a mapping",
    "experiments/metadata.py:ServingMetadata.slo_steps": "a section of the composed Hydra config, kept a mapping",
    "experiments/metadata.py:composed_config": "the composed Hydra config as metadata.json keeps it",
    "experiments/sampling.py:run_rows": "pandas-ready rows (the sampling stage's tables) and alphas by temperature",
    "experiments/sampling.py:distribution_rows": "pandas-ready rows (the sampling stage's tables)",
    "experiments/sampling.py:structured_rows": "pandas-ready rows (the sampling stage's tables)",
    "experiments/sampling.py:long_context_rows": "pandas-ready rows (the sampling stage's tables)",
    "experiments/sensitivity.py:alpha_model_tables": "pandas-ready rows (the sensitivity stage's tables)",
    "experiments/sensitivity.py:measure_panel": "pandas-ready rows by part (the sensitivity stage's tables)",
    "experiments/records.py:read_units": "each unit's ShardUnit and its pandas-ready rows by part",
    "experiments/sensitivity.py:controlled_rows": "pandas-ready rows (the sensitivity stage's tables)",
    "experiments/sensitivity.py:budget_rows": "pandas-ready rows (the sensitivity stage's tables)",
    "experiments/sensitivity.py:factor_rows": "pandas-ready rows (the sensitivity stage's tables), by factor",
    "experiments/sensitivity.py:reuse_length_rows": "pandas-ready rows (the sensitivity stage's tables)",
    "experiments/sensitivity.py:replay_rows": "pandas-ready rows (the sensitivity stage's tables)",
    "experiments/serving.py:cells": "the serving design's cells as the Hydra config names them",
    "experiments/serving.py:run_order": "the serving design's cells as the Hydra config names them, by repeat",
    "experiments/serving.py:shard_of_runs": "the serving design's cells as the Hydra config names them, by repeat",
    "experiments/serving_runs.py:StudyRunSummary.to_json": "JSON of a record (a study run's summary.json)",
    "experiments/serving_runs.py:StudyRunSummary.row": "a pandas-ready row (cells.parquet)",
    "experiments/serving_stats.py:judged_by": "the serving design's Hydra sections a run is judged by",
    "experiments/study.py:result_row": "a pandas-ready row (runs.parquet)",
    "experiments/summary.py:Summary.to_json": "JSON of a record (summary.json)",
}


def untyped(node) -> bool:
    """A type that says nothing of its values: dict or Mapping bare or with values dict, Any or list[dict]; a
    list, tuple or union holding one. A map keyed by name whose values are typed (dict[str, Crossover]) is not:
    it is how a record holds an open-ended set of parts (rakv.experiments.summary)."""
    if isinstance(node, ast.BinOp):
        return untyped(node.left) or untyped(node.right)
    name = ast.unparse(node.value if isinstance(node, ast.Subscript) else node)
    args = [] if not isinstance(node, ast.Subscript) else (
        node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice])
    if name in MAPS:
        return len(args) < 2 or ast.unparse(args[-1]) in ("Any", "object") or untyped(args[-1])
    return name in ("list", "tuple", "Sequence", "Iterable", "Iterator") and any(untyped(a) for a in args)


def dict_returns(source: str) -> list[str]:
    """The public functions and methods of `source` that return an untyped dict (by annotation, or unannotated
    returning a dict literal), as 'function' or 'Class.method'."""
    found = []
    for node in ast.parse(source).body:
        functions = [(node, "")] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else [
            (f, f"{node.name}.") for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        ] if isinstance(node, ast.ClassDef) else []
        for function, owner in functions:
            if function.name.startswith("_"):
                continue
            literal = function.returns is None and any(
                isinstance(n, ast.Return) and isinstance(n.value, (ast.Dict, ast.DictComp)) for n in ast.walk(function))
            if literal or (function.returns is not None and untyped(function.returns)):
                found.append(owner + function.name)
    return found


def test_the_dict_rule_finds_bare_dicts_and_passes_typed_maps():
    planted = '''
def a() -> dict: ...
def b() -> list[dict]: ...
def c() -> dict[str, Any]: ...
def d() -> tuple[float, dict]: ...
def e(): return {"k": 1}
class R:
    def f(self) -> Mapping: ...
def g() -> dict[str, Crossover]: ...
def h() -> dict[int, float] | None: ...
def _private() -> dict: ...
def i() -> list[Goal]: ...
'''
    assert dict_returns(planted) == ["a", "b", "c", "d", "e", "R.f"]


def test_no_public_function_of_the_experiments_or_the_bench_returns_a_bare_dict():
    src = ROOT / "src" / "rakv"
    found = {f"{p.relative_to(src)}:{name}" for layer in ("experiments", "bench")
             for p in sorted((src / layer).glob("*.py")) for name in dict_returns(p.read_text())}
    new = sorted(found - set(DICT_RETURNS))
    assert not new, f"return a record (a dataclass) or a typed map, or name the reason in DICT_RETURNS: {new}"
    stale = sorted(set(DICT_RETURNS) - found)
    assert not stale, f"DICT_RETURNS names functions that no longer return a bare dict (delete them): {stale}"
