"""The map of the package in docs/layout.md, generated from the modules themselves: one row per module, its layer
and the first sentence of its docstring, between the `<!-- module-map -->` markers. A module's job is written once,
in its docstring; this map only gathers them, so it cannot drift (tests/test_config.py runs `--check`).

    .venv/bin/python scripts/write_module_map.py           # rewrite the map in docs/layout.md
    .venv/bin/python scripts/write_module_map.py --check   # exit 1 when the map is stale
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rakv"
MAP = ROOT / "docs" / "layout.md"
START, END = "<!-- module-map -->\n", "<!-- /module-map -->"
# The layers, lowest first; each may import the ones before it only (tests/test_config.py keeps the rule).
LAYERS = [("runtime", "what serves one request; imports no other layer"),
          ("serving", "several requests in flight through one engine; imports the runtime"),
          ("bench", "the benchmarks' logic behind scripts/bench_*.py and the HTTP checks; imports the runtime and "
                    "serving"),
          ("experiments", "the pipeline: stages, statistics, figures, the paper's text; imports the runtime, "
                          "serving and the bench"),
          ("", "the `rakv` command; imports the runtime and serving, never the experiments")]


def first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring, on one line (up to the first full stop that ends a sentence)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    if not paragraph:
        raise SystemExit(f"write_module_map: error: {path.relative_to(ROOT)} has no docstring")
    depth, end = 0, len(paragraph)
    for i, char in enumerate(paragraph):  # a full stop inside parentheses or backquotes does not end the sentence
        depth += char in "(" or 0
        depth -= char in ")" or 0
        if char == "." and depth <= 0 and (i + 1 == len(paragraph) or paragraph[i + 1] == " ") \
                and not re.search(r"(e\.g|i\.e|vs|etc)$", paragraph[:i]):
            end = i + 1
            break
    return paragraph[:end].replace("|", "\\|")


def module_map() -> str:
    lines = []
    for layer, job in LAYERS:
        folder = PACKAGE / layer if layer else PACKAGE
        modules = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
        if not layer:
            modules = [p for p in modules if p.parent == PACKAGE]
        title = f"`rakv.{layer}`" if layer else "`rakv`"
        lines += [f"**{title}** — {job}.", "", "| module | its job (first sentence of its docstring) |",
                  "| --- | --- |"]
        lines += [f"| `{p.stem}` | {first_sentence(p)} |" for p in modules]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/layout.md's map is stale")
    args = parser.parse_args()
    text = MAP.read_text()
    if START not in text or END not in text:
        print(f"write_module_map: error: {MAP.relative_to(ROOT)} has no {START.strip()} ... {END} markers")
        return 1
    head, rest = text.split(START, 1)
    fresh = head + START + module_map() + rest[rest.index(END):]
    if args.check:
        if fresh != text:
            print("write_module_map: docs/layout.md's module map is stale: run .venv/bin/python "
                  "scripts/write_module_map.py")
            return 1
        return 0
    MAP.write_text(fresh)
    print(f"write_module_map: {MAP.relative_to(ROOT)} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
