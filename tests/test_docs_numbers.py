"""Every measured number in README.md and docs/*.md is rendered from a shipped file or marked as a dated excerpt.

A *measured number* is a number written with a unit of time (ms, s, min, h), of speed (tok/s, tokens/s, req/s,
GB/s, GFLOPS), of a ratio (x, ×) or a percent (%), in the prose, lists and tables of a document. It is not one
when it stands
- in code (a fenced block or an inline `code span`: commands and their flags),
- in a generated block (between `<!-- name -->` and `<!-- /name -->`, rendered from a shipped file by a script
  whose test holds the block to that file: rakv.experiments.readme_writer, scripts/write_peer_docs.py),
- in the paragraph, list or table directly after a line `Excerpt (commit <short sha>, <YYYY-MM-DD>, from
  \\`<command>\\`):` (a dated excerpt: what that command printed at that commit), or
- as a stated bound rather than a measurement: a goal, margin, SLO, threshold, bound, budget or timeout, or a
  rule's "exceeds", "above", "below", "at most", "at least", "up to", "more than" or "less than" (the word within
  the few characters before it, in its clause), or a comparison sign directly before it (>=, <=, <, >, ≥, ≤); or a
  confidence or significance level (a percent followed by CI, interval, confidence, level, family-wise, t or
  bootstrap).
A ratio's x is written against its number (1.74x); "4 x 576" is a shape, not a ratio.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

UNIT = r"(?: ?(?:ms|s|min|minutes|h|hours|seconds|tok/s|tokens/s|req/s|requests/s|GB/s|GFLOPS|%)|x|×)"
MEASURED = re.compile(r"(?<![\w.\-/])([+-]?~?\d[\d,]*(?:\.\d+)?)" + UNIT + r"(?![\w/])")
EXCERPT = re.compile(r"^Excerpt \(commit [0-9a-f]{7,40}, \d{4}-\d{2}-\d{2}, from `[^`]+`\):\s*$")
BOUND_WORDS = re.compile(r"(goals?|margin|SLOs?|threshold|bound|budget|timeout|exceeds?|above|below|at most|at least|"
                         r"up to|more than|less than)\b[^.;:()]{0,24}$", re.I)
COMPARISON = re.compile(r"(>=|<=|≥|≤|<|>)\s*~?$")
LEVEL_AFTER = re.compile(r"^\s*(CIs?\b|interval|confidence|level|family-wise|t\b|bootstrap)", re.I)
GENERATED = re.compile(r"<!-- ([\w-]+(?:: [\w-]+)?) -->.*?<!-- /\1 -->", re.S)


def blank_out(text: str, pattern: re.Pattern) -> str:
    """`text` with every match of `pattern` replaced by spaces (newlines kept, so line numbers stay)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def unmarked_numbers(text: str) -> list[tuple[int, str]]:
    """(line number, the number with its unit and context) of each measured number `text` neither renders nor
    marks, by the rules of this module's docstring."""
    markers = {number for number, line in enumerate(text.splitlines(), start=1) if EXCERPT.match(line.strip())}
    text = blank_out(text, GENERATED)
    text = blank_out(text, re.compile(r"^```.*?^```", re.S | re.M))
    text = blank_out(text, re.compile(r"`[^`\n]*`"))
    found, excerpt, previous_blank = [], False, True
    for number, line in enumerate(text.splitlines(), start=1):
        if number in markers:
            excerpt = True
            previous_blank = False
            continue
        if not line.strip():
            if not previous_blank and excerpt and number - 1 not in markers:
                excerpt = False  # the excerpt's block has ended (a blank line right after the marker does not end it)
            previous_blank = True
            continue
        previous_blank = False
        if excerpt:
            continue
        for match in MEASURED.finditer(line):
            before, after = line[:match.start()], line[match.end():]
            if BOUND_WORDS.search(before) or COMPARISON.search(before):
                continue
            if match.group(0).rstrip().endswith("%") and LEVEL_AFTER.match(after):
                continue
            found.append((number, line[max(0, match.start() - 30):match.end() + 10].strip()))
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_measured_number_is_rendered_or_a_dated_excerpt(document):
    found = unmarked_numbers(document.read_text())
    assert not found, (f"{len(found)} measured number(s) in {document.relative_to(ROOT)} neither rendered from a "
                       f"shipped file nor under an `Excerpt (commit ..., date, from `command`):` line; first: "
                       f"{found[:5]}")


def test_the_scan_finds_an_unmarked_number_and_passes_marked_ones():
    """Positive control: an unmarked latency, speedup and share are found; the same numbers in code, in a generated
    block, under an excerpt line, as a goal or as a confidence level are not."""
    bad = "The copy of a hit takes 3.6 ms at the median.\n\n- 1.74x faster, 12.5 % of the time, 92.2 tokens/s\n"
    assert [n for n, _ in unmarked_numbers(bad)] == [1, 3, 3, 3]
    good = ("Run `bench.py --timeout 5 s` first.\n\n```bash\nsleep 10s  # 3.6 ms\n```\n\n"
            "<!-- facts -->\nIt took 58 s.\n<!-- /facts -->\n\n"
            "Excerpt (commit 3c6a0fb, 2026-12-06, from `scripts/bench_engine.py`):\n"
            "| step | 13.9 ms |\n| ratio | 1.24x |\n\n"
            "The goal is 1.6x; the margin 10 %; speedup >= 5x; with 95 % CIs, Holm at 5 % family-wise.\n")
    assert unmarked_numbers(good) == []
    after = good + "\nThe next paragraph, unmarked: 2.5 minutes and 4 min.\n"
    assert len(unmarked_numbers(after)) == 2  # an excerpt covers its own block only
