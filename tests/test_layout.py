"""The layout's seams that a reader would otherwise have to take on trust (docs/layout.md).

Proposers are types: a configuration's proposer name means a kind of proposer only in the registry
(rakv.runtime.proposers.PROPOSERS); everywhere else a kind's behaviour is read from its class's data, so no
proposer name is compared outside that module.
"""

from __future__ import annotations

import ast
from pathlib import Path

from rakv.runtime import proposers
from rakv.runtime.proposers import PROPOSERS

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = Path(proposers.__file__).resolve()


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
    draft, lookup = sorted(names)
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
