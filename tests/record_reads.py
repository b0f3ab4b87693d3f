"""Finds string-key reads (x["key"], x.get("key")) of the records the pipeline writes, for tests/test_records.py.

The records are the frozen dataclasses of RECORD_MODULES: each file the pipeline writes is one of them, written and
read through the codec rakv.runtime.json_records (docs/layout.md). A record has no mapping methods, so a string-key
read of one fails at run time; this check finds the reads no test runs, by following names through the code.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from dataclasses import is_dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the modules that declare the records of the files the pipeline writes (and the bench's reports, all of rakv.bench)
RECORD_MODULES = (
    "rakv.experiments.summary",  # results/<name>/summary.json, feasibility/summary.json
    "rakv.experiments.summary_serving",  # the summary's serving part
    "rakv.experiments.summary_sampling",  # the summary's sampling part
    "rakv.experiments.metadata",  # study/metadata.json, serving/metadata.json, about.json, the sampling design
    "rakv.experiments.serving_runs",  # a serving study run's summary.json
    "rakv.experiments.peer_tables",  # the vLLM peer's files as docs/peers.md reads them
    "rakv.serving.records",  # requests.jsonl, iterations.jsonl
    "rakv.serving.metrics",  # a served run's summary.json
)
BENCH = ROOT / "src" / "rakv" / "bench"

# the codec's readers, whose record type is their argument's: what they return is a record
CODEC_READERS = {"load_record", "read_record", "from_json", "read_lines", "check_part"}
# calls whose value is their argument's JSON or fields: a string-key read of it reads the record
PASSED_ON = {"to_json", "record_items", "vars", "asdict"}
# methods of a record (or of a part of one: a map, a list) that return parts of it
PASSING = {"items", "values", "get", "against", "to_json", "metric", "by_concurrency", "rates", "cases"}
ELEMENTS = {"sorted", "list", "tuple", "min", "max", "next", "reversed", "iter", "enumerate", "zip", "filter"}


def record_modules() -> list[str]:
    return [*RECORD_MODULES, *(f"rakv.bench.{p.stem}" for p in sorted(BENCH.glob("*.py")) if p.stem != "__init__")]


def record_types() -> set[str]:
    """The names of every record type the pipeline writes (the dataclasses declared in record_modules())."""
    names = set()
    for name in record_modules():
        module = importlib.import_module(name)
        names |= {n for n, v in vars(module).items()
                  if isinstance(v, type) and is_dataclass(v) and v.__module__ == module.__name__}
    return names


def record_sources(records: set[str]) -> set[str]:
    """The functions of src/rakv whose value is a record: those annotated to return one (alone, in a list, a tuple
    or a map), and the codec's readers."""
    sources = set(CODEC_READERS)
    for path in sorted((ROOT / "src" / "rakv").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
                if records & set(re.findall(r"\w+", ast.unparse(node.returns))):
                    sources.add(node.name)
    return sources


class RecordReads(ast.NodeVisitor):
    """String-key reads (x["key"], x.get("key")) of a record or of a part of one, found by following names.

    What is a record: the value of a call to one of `sources` (a function annotated to return a record, or a codec
    reader) imported from rakv or defined in the same file; a parameter annotated with a record type, or named
    `summary` in code that imports from rakv; and, within a scope, every name bound to an attribute, item,
    iteration element or a PASSING method's value of a record (assignments, for loops, comprehensions; a rebinding
    to something else clears the name), or to a PASSED_ON call of one (to_json(record)). What is not: the value of
    any other call (but a builtin's such as sorted, min or next over parts of a record, and a comprehension over
    them, is the record's), so a pandas table built from records (`pd.DataFrame(summary.claims)["configuration"]`),
    a parquet table's columns or another program's JSON are not flagged. Lambda parameters and values passed
    through containers are not followed; the records' lack of mapping methods catches them at run time, and a
    pipeline file parsed raw with json.loads is caught by tests/test_records.py's JSON-parsing rule."""

    def __init__(self, imported: set[str], defined: set[str], records: set[str], sources: set[str]):
        self.imported = imported  # names imported from rakv (its modules, functions, records)
        self.defined = defined  # the file's own functions
        self.records, self.sources = records, sources
        self.found: list[str] = []
        self.scopes: list[set[str]] = [set()]

    def is_record(self, node) -> bool:
        names = self.scopes[-1]
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            return self.is_record(node.value)
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else called
            if called in self.sources and (owner in self.imported or called in self.defined):
                return True
            if isinstance(func, ast.Name) and called in ELEMENTS | PASSED_ON:
                return any(self.is_record(a) for a in node.args)
            return isinstance(func, ast.Attribute) and func.attr in PASSING and self.is_record(func.value)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return any(self.is_record(g.iter) for g in node.generators)
        if isinstance(node, ast.BoolOp):
            return any(self.is_record(v) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self.is_record(node.body) or self.is_record(node.orelse)
        return False

    def bind(self, target, value_is_record: bool) -> None:
        """Binds the names `target` assigns (x, or x, y, *rest; not x in x["key"] = ..., which stores into x)."""
        if isinstance(target, ast.Name):
            (self.scopes[-1].add if value_is_record else self.scopes[-1].discard)(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.bind(element, value_is_record)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, value_is_record)

    def visit_Assign(self, node):
        self.generic_visit(node)
        for target in node.targets:
            self.bind(target, self.is_record(node.value))

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        if node.value is not None:
            self.bind(node.target, self.is_record(node.value))

    def visit_NamedExpr(self, node):
        self.generic_visit(node)
        self.bind(node.target, self.is_record(node.value))

    def visit_For(self, node):
        self.visit(node.iter)
        self.bind(node.target, self.is_record(node.iter))
        for statement in node.body + node.orelse:
            self.visit(statement)

    def visit_comprehension(self, node):
        self.visit(node.iter)
        self.bind(node.target, self.is_record(node.iter))
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
            if (arg.arg == "summary" and self.imported) or self.records & set(re.findall(r"\w+", annotation)):
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
        if (isinstance(node.ctx, ast.Load) and isinstance(key, ast.Constant) and isinstance(key.value, str)
                and self.is_record(node.value)):
            self.found.append(f"line {node.lineno}: {ast.unparse(node)}")

    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "get" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and self.is_record(func.value)):
            self.found.append(f"line {node.lineno}: {ast.unparse(node)}")


def string_reads(source: str, records: set[str], sources: set[str]) -> list[str]:
    """Every string-key read of a record in `source` (Python), as 'line N: the expression'."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("rakv") for alias in node.names}
    imported |= {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names if alias.name.startswith("rakv")}
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    checker = RecordReads(imported, defined, records, sources)
    checker.visit(tree)
    return checker.found


def notebook_code(path: Path) -> str:
    """A notebook's code cells, one after another (their IPython magics left out)."""
    cells = json.loads(path.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
