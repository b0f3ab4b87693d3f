"""The layout's seams that a reader would otherwise have to take on trust (docs/layout.md).

Proposers are types: a configuration's proposer name means a kind of proposer only in the registry
(rakv.runtime.proposers.PROPOSERS); everywhere else a kind's behaviour is read from its class's data, so no
proposer name is compared outside that module.

Strategy names and action labels are spelled once, in rakv.runtime.actions (its constants, `spec(k)`, `joint(k)`,
`Action.label`); the code elsewhere names them through it, so no strategy name is a literal outside that module.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from rakv.runtime import actions, proposers
from rakv.runtime.actions import ADAPTIVE, BEST_FIXED, FIXED_STRATEGIES, ORACLE
from rakv.runtime.proposers import PROPOSERS

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = Path(proposers.__file__).resolve()
VOCABULARY = Path(actions.__file__).resolve()


def _names_a_proposer(node: ast.AST, names: set[str]) -> bool:
    """A string literal naming a proposer, or a literal tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_proposer(e, names) for e in node.elts)
    return False


def proposer_name_comparisons(source: str, names: set[str]) -> list[int]:
    """Lines where a proposer name literal is compared (==, !=, is, in / not in a literal collection, or a
    match-case pattern)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_names_a_proposer(n, names)
                                                 for n in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif isinstance(node, ast.match_case) and any(
                isinstance(p, ast.MatchValue) and _names_a_proposer(p.value, names) for p in ast.walk(node.pattern)):
            lines.append(node.pattern.lineno)
    return sorted(lines)


def test_the_checker_catches_a_planted_comparison_and_passes_names_as_data():
    names = set(PROPOSERS)
    draft, lookup = sorted(names)[0], sorted(names)[-1]  # any two of the registry's names
    planted = f'''
def cost(engine, proposer):
    if engine.proposer == "{draft}":
        return 1
    if "{lookup}" != proposer:
        return 2
    if proposer in ("{lookup}", "other"):
        return 3
    if proposer not in {{"{draft}"}}:
        return 4
    match proposer:
        case "{lookup}":
            return 5
        case "x" | "{draft}":
            return 6
    return 0
'''
    assert proposer_name_comparisons(planted, names) == [3, 5, 7, 9, 12, 14]
    as_data = f'''
def open(name="{draft}"):
    path = f"pair-{{name}}.json"
    parts = {{"{draft}": 1}}
    return engine(name, "{lookup}"), [p for p in ("{draft}", "{lookup}")], name == other
'''
    assert proposer_name_comparisons(as_data, names) == []


def test_no_proposer_name_is_compared_outside_the_registry():
    names = set(PROPOSERS)
    files = sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "scripts").rglob("*.py"))
    assert REGISTRY in [f.resolve() for f in files]
    found = [f"{path.relative_to(ROOT)}:{line}" for path in files if path.resolve() != REGISTRY
             for line in proposer_name_comparisons(path.read_text(), names)]
    assert not found, ("proposer names compared outside rakv.runtime.proposers (read the class's data instead): "
                       + ", ".join(found))


STRATEGY_NAMES = {*FIXED_STRATEGIES, ADAPTIVE, BEST_FIXED, ORACLE}
ACTION_LABEL = re.compile(r"r[01]k\d+")
# an f-string's literal parts with each placeholder as {}: a strategy name or an action label built by hand
BUILT_NAME = re.compile(r"(?:^|[^\w-])(?:(?:spec|joint)-k\{\}|r(?:[01]|\{\})k\{\})")
# Literals allowed outside rakv.runtime.actions, each "path:line" with why. Docstrings are never scanned (they may
# name a strategy), nor are prose and help texts that mention one inside a longer sentence. Empty today.
STRATEGY_LITERAL_EXCEPTIONS: dict[str, str] = {}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def strategy_literals(source: str) -> list[int]:
    """Lines where a string literal is a strategy name (rakv.runtime.actions' fixed ones, the controller's, the
    study's two comparators in hindsight) or an action label, or an f-string builds one (`spec-k{k}`, `r{r}k{k}`)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value in STRATEGY_NAMES or ACTION_LABEL.fullmatch(node.value):
                lines.add(node.lineno)
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            if BUILT_NAME.search(text):
                lines.add(node.lineno)
    return sorted(lines)


def test_the_strategy_scan_catches_planted_names_and_passes_prose():
    planted = '''
def pick(runs, k, r):
    fixed = runs[runs.strategy == "joint-k4"]
    rows = {"ar": 1, "kv-only": 2}
    name = f"spec-k{k}"
    label = f"r{r}k{k}"
    return fixed, rows, name, label, "r1k0", ("oracle", "best-fixed"), "rakv-asd"
'''
    assert strategy_literals(planted) == [3, 4, 5, 6, 7]
    as_prose = '''
"""A module naming rakv-asd and joint-k4 in its docstring."""
def pick(runs, strategy, who):
    """Only "ar" and "spec-k4" (a docstring)."""
    help = "rakv-asd: fail rather than calibrate here"
    side = f"{who}-{strategy}"
    return runs.oracle_s, help, side, f"latency_reduction.{strategy}", "our spec-k4 / theirs", "arm", "r1k4x"
'''
    assert strategy_literals(as_prose) == []


def _code_cells(notebook: Path) -> str:
    """A notebook's code cells as one source, its magics and shell lines left out."""
    cells = json.loads(notebook.read_text())["cells"]
    code = ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return "\n".join(line for cell in code for line in cell.splitlines() if not line.lstrip().startswith(("%", "!")))


def test_no_strategy_name_is_a_literal_outside_the_actions_module():
    files = sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "scripts").rglob("*.py"))
    assert VOCABULARY in [f.resolve() for f in files]
    sources = [(path.relative_to(ROOT), path.read_text()) for path in files if path.resolve() != VOCABULARY]
    sources += [(path.relative_to(ROOT), _code_cells(path)) for path in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    assert any(str(path).endswith(".ipynb") for path, _ in sources)
    found = [f"{path}:{line}" for path, source in sources for line in strategy_literals(source)]
    unexplained = [place for place in found if place not in STRATEGY_LITERAL_EXCEPTIONS]
    assert not unexplained, ("strategy names spelled outside rakv.runtime.actions (use its constants, spec(k), "
                             "joint(k) or Action.label): " + ", ".join(unexplained))
    stale = sorted(set(STRATEGY_LITERAL_EXCEPTIONS) - set(found))
    assert not stale, f"exceptions that no longer match a literal: {stale}"
