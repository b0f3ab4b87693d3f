"""The summary's schema (rakv.experiments.summary): summary.json is read and written through it, an old or edited
file stops with one line naming the field, and nothing outside the schema reads the summary by a string key."""

import ast
import json
import re
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from rakv.experiments import summary as schema
from rakv.experiments.summary import ABSENT, Feasibility, Summary, load_record, read_summary, write_summary
from rakv.experiments.verdicts import Verdict
from rakv.runtime.errors import RakvError
from rakv.runtime.paths import REFERENCE_DIR, ROOT

REFERENCE = REFERENCE_DIR / "offline"


@pytest.fixture(scope="module")
def shipped() -> dict:
    return json.loads((REFERENCE / "summary.json").read_text())


def test_the_shipped_summary_reads_into_records_and_writes_back_byte_for_byte(shipped, tmp_path):
    summary = read_summary(REFERENCE)
    assert summary.per_configuration["smollm2"].latency_reduction.joint_k4 == \
        shipped["per_configuration"]["smollm2"]["latency_reduction"]["joint-k4"]
    assert summary.serving.goals[0].verdict == shipped["serving"]["goals"][0]["verdict"]
    write_summary(summary, tmp_path)
    assert (tmp_path / "summary.json").read_text() == (REFERENCE / "summary.json").read_text()


def failure(data) -> str:
    with pytest.raises(RakvError) as caught:
        Summary.from_json(data)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_old_or_edited_summary_fails_with_one_line_naming_the_field(shipped):
    old = json.loads(json.dumps(shipped))
    del old["claims"][3]["direction"]
    assert failure(old) == "summary.json: missing field 'claims[3].direction'"
    mistyped = json.loads(json.dumps(shipped))
    mistyped["per_configuration"]["smollm2"]["scenarios"] = "forty"
    assert failure(mistyped).startswith("summary.json: field 'per_configuration.smollm2.scenarios' is not a int")
    bad_interval = json.loads(json.dumps(shipped))
    bad_interval["pooled"]["latency_reduction"]["kv-only"] = [0.1, 0.2]
    assert failure(bad_interval) == \
        "summary.json: field 'pooled.latency_reduction.kv-only' is not an interval [value, low, high]"
    unknown = json.loads(json.dumps(shipped))
    unknown["grid"]["promtps"] = {}
    assert failure(unknown) == "summary.json: unknown field 'grid.promtps'"
    missing_part = {k: v for k, v in shipped.items() if k != "claims"}
    assert failure(missing_part) == "summary.json: missing field 'claims'"
    unknown_word = json.loads(json.dumps(shipped))
    unknown_word["serving"]["goals"][0]["verdict"] = "passed"
    assert failure(unknown_word).startswith("summary.json: field 'serving.goals[0].verdict' is not one of met, missed")


def test_a_goals_verdict_reads_back_as_the_one_vocabulary(shipped):
    """Goal and pair verdicts read back as rakv.experiments.verdicts.Verdict members, equal to the words written."""
    serving = read_summary(REFERENCE).serving
    assert all(isinstance(g.verdict, Verdict) for g in serving.goals + serving.pairs)
    assert [g.verdict for g in serving.goals] == [g["verdict"] for g in shipped["serving"]["goals"]]


def test_a_part_that_was_not_computed_is_left_out_not_written_as_null(shipped):
    without = {k: v for k, v in shipped.items() if k not in ("serving", "crossover_model_per_configuration")}
    summary = Summary.from_json(without)
    assert summary.serving is ABSENT and not summary.serving
    assert summary.to_json() == without
    assert schema.to_json(load_record(Feasibility, {"status": "missing"}, "feasibility")) == {"status": "missing"}


def test_a_missing_summary_names_the_stage_to_run(tmp_path):
    with pytest.raises(RakvError, match="summary.json is missing: run the analysis stage first"):
        read_summary(tmp_path)


def test_the_records_have_no_mapping_methods():
    """A string-key read of a record fails at once (TypeError), wherever it hides from the static check below."""
    records = [v for v in vars(schema).values() if isinstance(v, type) and is_dataclass(v)]
    assert len(records) > 25
    for record in records:
        for method in ("__getitem__", "get", "keys", "items"):
            assert not hasattr(record, method), f"{record.__name__}.{method}"


# ---------------------------------------------------------------------------------------------
# No string-key reads of the summary outside its schema


RECORDS = {name for name, v in vars(schema).items() if isinstance(v, type) and is_dataclass(v)}
SOURCES = {"summarize", "read_summary", "read_feasibility", "serving_summary", "from_json", "load_record"}
PASSING = {"items", "values", "get", "against", "to_json"}  # methods of a part that return parts of it
ELEMENTS = {"sorted", "list", "tuple", "min", "max", "next", "reversed", "iter", "enumerate", "zip", "filter"}


class SummaryReads(ast.NodeVisitor):
    """String-key reads (x["key"], x.get("key")) of the summary or of a part of it, found by following names.

    What is the summary: the value of a call to one of SOURCES (summarize, read_summary, ...) imported from
    rakv.experiments (rakv.serving.metrics.summarize is a served run's); a parameter annotated with one of the
    schema's record types, or named `summary` in code that imports from rakv.experiments; and, within a scope,
    every name bound to an attribute, item, iteration element or `.items()`/`.values()`/`.get()`/`.against()`/
    `.to_json()` of the summary (assignments, for loops, comprehensions; a rebinding to something else clears the
    name). What is not: the value of any other call (but a builtin's such as sorted, min or next over parts of the
    summary, and a comprehension over them, is the summary's), so a pandas table built from records
    (`pd.DataFrame(summary.claims)["configuration"]`), a parquet table's columns or another JSON file's keys are not
    flagged. Lambda parameters, values passed through containers and summary.json parsed with json.loads are not
    followed; the records' lack of mapping methods (test above) catches the first two at run time, and
    summary.json is read through rakv.experiments.summary.read_summary."""

    def __init__(self, imported: set[str]):
        self.imported = imported  # names imported from rakv.experiments (its modules, functions, records)
        self.found: list[str] = []
        self.scopes: list[set[str]] = [set()]

    def is_summary(self, node) -> bool:
        names = self.scopes[-1]
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            return self.is_summary(node.value)
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else called
            if called in SOURCES and owner in self.imported:
                return True
            if isinstance(func, ast.Name) and called in ELEMENTS:
                return any(self.is_summary(a) for a in node.args)
            return isinstance(func, ast.Attribute) and func.attr in PASSING and self.is_summary(func.value)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return any(self.is_summary(g.iter) for g in node.generators)
        if isinstance(node, ast.BoolOp):
            return any(self.is_summary(v) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self.is_summary(node.body) or self.is_summary(node.orelse)
        return False

    def bind(self, target, value_is_summary: bool) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                (self.scopes[-1].add if value_is_summary else self.scopes[-1].discard)(node.id)

    def visit_Assign(self, node):
        self.generic_visit(node)
        for target in node.targets:
            self.bind(target, self.is_summary(node.value))

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        if node.value is not None:
            self.bind(node.target, self.is_summary(node.value))

    def visit_NamedExpr(self, node):
        self.generic_visit(node)
        self.bind(node.target, self.is_summary(node.value))

    def visit_For(self, node):
        self.visit(node.iter)
        self.bind(node.target, self.is_summary(node.iter))
        for statement in node.body + node.orelse:
            self.visit(statement)

    def visit_comprehension(self, node):
        self.visit(node.iter)
        self.bind(node.target, self.is_summary(node.iter))
        for condition in node.ifs:
            self.visit(condition)

    def _comprehension(self, node):
        self.scopes.append(set(self.scopes[-1]))
        for generator in node.generators:
            self.visit_comprehension(generator)
        for part in ("elt", "key", "value"):
            if getattr(node, part, None) is not None:
                self.visit(getattr(node, part))
        self.scopes.pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def _function(self, node):
        scope = set(self.scopes[-1])
        for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            if (arg.arg == "summary" and self.imported) or RECORDS & set(re.findall(r"\w+", annotation)):
                scope.add(arg.arg)
            else:
                scope.discard(arg.arg)
        self.scopes.append(scope)
        for statement in node.body if isinstance(node.body, list) else [node.body]:
            self.visit(statement)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Subscript(self, node):
        self.generic_visit(node)
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and self.is_summary(node.value):
            self.found.append(f"line {node.lineno}: {ast.unparse(node)}")

    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "get" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and self.is_summary(func.value)):
            self.found.append(f"line {node.lineno}: {ast.unparse(node)}")


def string_reads(source: str) -> list[str]:
    """Every string-key read of the summary in `source` (Python), as 'line N: the expression'."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("rakv.experiments") for alias in node.names}
    checker = SummaryReads(imported)
    checker.visit(tree)
    return checker.found


def notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_the_checker_finds_string_reads_of_the_summary_and_not_of_tables():
    planted = '''
from rakv.experiments.summary import read_summary; from rakv.experiments.analysis import summarize
summary = read_summary(results)
print(summary["runs"])
for name, s in summarize(results).per_configuration.items():
    s.latency_reduction["joint-k4"]

def serving_text(summary):
    return summary.get("serving")

def table(rows: list[ClaimRow]):
    return [r["claim"] for r in rows]

claims = [r for r in summary.claims]
claims[0]["verdict"]
best = min(summary.acceptance, key=lambda r: r.break_even_alpha)
best["k"]
'''
    assert [f.split(":")[0] for f in string_reads(planted)] == ["line 4", "line 6", "line 9", "line 12", "line 15",
                                                                 "line 17"]
    tables = '''
summary = read_summary(results)
rows = pd.DataFrame(summary.claims)
rows["configuration"]
runs = pd.read_parquet(path)
runs["latency_s"]
summary = serve(engine, trace, out, options)
summary["completed"]
def f(result):
    return result["completed"]
'''
    assert string_reads(tables) == []
    serving = "from rakv.serving.metrics import summarize\ndef finish(summary):\n    return summarize(x)['completed']\n"
    assert string_reads(serving) == []  # a served run's summary (rakv.serving)


def test_nothing_outside_the_schema_reads_the_summary_by_a_string_key():
    files = [p for p in sorted((ROOT / "src" / "rakv").rglob("*.py")) if p != Path(schema.__file__)]
    files += sorted((ROOT / "scripts").glob("*.py"))
    found = [f"{p.relative_to(ROOT)} {read}" for p in files for read in string_reads(p.read_text())]
    found += [f"{p.relative_to(ROOT)} {read}" for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
              for read in string_reads(notebook_code(p))]
    assert len(files) > 50
    assert not found, f"read the summary's attributes (rakv.experiments.summary): {found}"


def test_every_field_of_the_summary_has_a_type_the_loader_checks():
    def walk(record):
        for f in fields(record):
            hint = schema._hints(record)[f.name]
            for inner in re.findall(r"\w+", str(hint)):
                candidate = getattr(schema, inner, None)
                if isinstance(candidate, type) and is_dataclass(candidate) and candidate is not record:
                    yield from walk(candidate)
            yield record.__name__, f.name, hint
    assert len(list(walk(Summary))) > 100
