"""The benchmarks' goals as the documents quote them are the records the code judges (rakv.bench.goals).

docs/engine.md and docs/serving.md ("Over HTTP") state each goal's threshold in prose and in the goal column of
their measured tables; a goal changed in rakv.bench.goals and not in the text (or the other way) fails here, so a
reader can take the documents' numbers for the ones judged.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rakv.bench import goals as g
from rakv.bench.goals import AT_LEAST, Goal

ROOT = Path(__file__).resolve().parents[1]


def text_of(name: str) -> str:
    """A document with its line breaks and runs of spaces as one space (a phrase may wrap)."""
    return " ".join((ROOT / "docs" / name).read_text().split())


def sign(goal: Goal) -> str:
    return ">=" if goal.direction == AT_LEAST else "<="


def same_threshold(goals: dict[int, Goal]) -> Goal:
    """One goal standing for several concurrencies quoted as one ("at 8 and 16"): their thresholds are one."""
    assert len({(x.threshold, x.direction) for x in goals.values()}) == 1, goals
    return next(iter(goals.values()))


def engine_phrases() -> list[str]:
    """docs/engine.md's prose, each phrase built from the record it quotes (in the document's number format)."""
    seq, hf, bound = g.OVER_SEQUENTIAL, same_threshold(g.OVER_TRANSFORMERS), same_threshold(g.OF_BOUND)
    assert sorted(g.OVER_TRANSFORMERS) == sorted(g.OF_BOUND) == [8, 16]  # "at 8 and 16"
    return [
        # bench_serving.py
        f"(goals: {sign(seq[8])} {seq[8].threshold:g}x sequential at 8 and {sign(seq[16])} {seq[16].threshold:g}x "
        f"at 16, {sign(hf)} {hf.threshold:g}x transformers at 8 and 16)",
        f"of the iteration time (goal {g.SCHEDULER_SHARE.bound_text()})",
        f"with ours as a fraction of it (goal {bound.bound_text()} at 8 and 16)",
        # bench_engine.py
        f"first token against llama.cpp F32 (goal {sign(g.LLAMA_CPP_DECODE)} {g.LLAMA_CPP_DECODE.threshold:.1f})",
        f"~512 tokens (goal {sign(g.LLAMA_CPP_PREFILL)} {g.LLAMA_CPP_PREFILL.threshold:g}x)",
        f"target step (goal {sign(g.DRAFT_OVER_TARGET)} {g.DRAFT_OVER_TARGET.threshold:.2f})",
        f"verify(k+1) / one step for each k (goal {sign(g.VERIFY_OVER_STEP)} {g.VERIFY_OVER_STEP.threshold:.2f} for "
        f"k <= {g.VERIFY_JUDGED_UP_TO_K})",
        f"(goals: 8 {sign(g.BATCH_GOALS[8])} {g.BATCH_GOALS[8].threshold:g}x, "
        f"16 {sign(g.BATCH_GOALS[16])} {g.BATCH_GOALS[16].threshold:g}x)",
        f"against the 4 decodes alone (goal {sign(g.CHUNK_BESIDE_DECODES)} {g.CHUNK_BESIDE_DECODES.threshold:g}x)",
        f"(exact repeat: goal {g.DRAFT_REUSE_EXACT.bound_text()};",
        f"the goal's measure as first stated, {g.MEMORY.bound_text()}, met or missed",
        f"(goal warm {g.STARTUP_WARM.bound_text()};",
    ]


# docs/engine.md's measured tables: a row (by the start of its first cell) -> the goals of its goal column, in order
ENGINE_TABLE_ROWS = {
    "AR, ms/token (prefill included)": [g.AR_VS_TRANSFORMERS],
    "AR / its floor": [g.AR_OVER_FLOOR],
    "spec-k4 (int8 draft), ms/token": [g.SPEC_VS_TRANSFORMERS],
    "draft step / target step": [g.DRAFT_OVER_TARGET],
    "verify(k+1) / step": [g.VERIFY_OVER_STEP],
    "batched step, 8 requests / one": [g.BATCH_GOALS[8]],
    "batched step, 16 requests / one": [g.BATCH_GOALS[16]],
    "32-token prefill chunk beside 4 decodes": [g.CHUNK_BESIDE_DECODES],
    "TTFT, 512-token prompt": [g.TTFT_EXACT, g.TTFT_PARTIAL],
    "joint-k4's draft prefill before its first round": [g.DRAFT_REUSE_EXACT],
    "peak RSS / (weights + K/V), fresh process: the goal's measure": [g.MEMORY],
    "peak RSS / (weights 678 MB + K/V 13 MB): the goal's measure": [g.MEMORY],
    "fresh `rakv generate` to its first token, packed weights warm": [g.STARTUP_WARM],
    "fresh `rakv generate` (AR) to its first token": [g.STARTUP_WARM],
    "fresh `rakv serve --http` to the first token": [g.SERVE_STARTUP_WARM],
}
BOUND = re.compile(r"(<=|>=) (\d+(?:\.\d+)?)(?: s| %)?")


def goal_cells(table_row: str) -> list[tuple[str, float]]:
    """The goal column (the last cell) of a markdown table row: each `<= x` / `>= x`, with its unit's scale."""
    cell = table_row.strip().strip("|").split("|")[-1]
    return [(m[1], float(m[2]) / (100 if m[0].endswith("%") else 1)) for m in BOUND.finditer(cell)]


def test_docs_engine_prose_quotes_the_goal_records():
    text = text_of("engine.md")
    missing = [phrase for phrase in engine_phrases() if phrase not in text]
    assert not missing, "docs/engine.md quotes these goals otherwise than rakv.bench.goals: " + "; ".join(missing)


def test_docs_engine_tables_show_the_goal_records():
    lines = (ROOT / "docs" / "engine.md").read_text().splitlines()
    seen = set()
    for line in lines:
        first = line.strip("| ").split(" | ")[0] if line.startswith("|") else ""
        for start, expected in ENGINE_TABLE_ROWS.items():
            if first.startswith(start):
                seen.add(start)
                assert goal_cells(line) == [(sign(x), pytest.approx(x.threshold)) for x in expected], line
    assert seen == set(ENGINE_TABLE_ROWS), f"rows not found in docs/engine.md: {set(ENGINE_TABLE_ROWS) - seen}"


def test_docs_serving_over_http_quotes_the_goal_records():
    text = text_of("serving.md")
    phrases = [f"resident memory after the first minute within {100 * g.RSS_SPREAD.threshold:g} %",
               f"back to within {g.THREAD_GROWTH.threshold:g} threads and {g.SOCKET_GROWTH.threshold:g} sockets or fds "
               "of their level before the load",
               f"interleaved runs; goal {g.HTTP_OVER_REPLAY.bound_text()})"]
    missing = [phrase for phrase in phrases if phrase not in text]
    assert not missing, "docs/serving.md quotes these goals otherwise than rakv.bench.goals: " + "; ".join(missing)


def test_a_changed_threshold_is_caught():
    """Planted: the batched-step goal at a threshold the document does not state."""
    changed = Goal(g.BATCH_GOALS[8].name, g.BATCH_GOALS[8].measure, 1.4, g.BATCH_GOALS[8].direction)
    row = "| batched step, 8 requests / one | 38.8 / 26.8 ms | | 1.45 | <= 1.3 |"
    assert goal_cells(row) != [(sign(changed), pytest.approx(changed.threshold))]
    assert goal_cells(row) == [("<=", pytest.approx(1.3))]
    assert goal_cells("| x | 0.007; 0.404 | <= 0.05; >= 60 % |") == [("<=", 0.05), (">=", 0.6)]
