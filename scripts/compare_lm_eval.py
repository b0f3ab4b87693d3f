"""lm-evaluation-harness through `rakv serve --http` against its HF backend and batch-one AR (scripts/run_lm_eval.sh):
    .venv/bin/python scripts/compare_lm_eval.py SERVED_DIR HF_DIR OUT.json [--atol 1e-3]

SERVED_DIR / HF_DIR: lm-eval's --output_path folders of the same tasks run through `local-completions` (the server)
and `hf` (the same fp32 weights under transformers). Checks, and writes as a typed record:
- every multiple-choice choice's log-likelihood from the server equals the HF backend's within `atol`;
- every generated answer equals the smollm2 target's own greedy output, batch one, autoregressive (rakv.runtime's
  engine, no reuse, no speculation) cut at the task's `until` stops as lm-eval cuts it.
Exits 1 (one line) when a check fails."""

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rakv.runtime.actions import Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.engine import Engine
from rakv.runtime.json_records import write_record
from rakv.runtime.models import load_pair


@dataclass(frozen=True)
class LmEvalComparison:
    tasks: list[str]
    loglikelihoods: int  # choices compared
    max_abs_loglikelihood_diff: float
    atol: float
    same_choice_picked: int  # questions where both backends pick the same choice
    questions: int
    generations: int
    generations_equal_ar: int
    served_metrics: dict[str, float]  # lm-eval's metrics through the server, task/metric -> value
    hf_metrics: dict[str, float]


def samples(folder: Path, task: str) -> list[dict]:
    files = sorted(folder.rglob(f"samples_{task}_*.jsonl"))
    if not files:
        sys.exit(f"compare_lm_eval: no samples of {task} under {folder}")
    return sorted((json.loads(line) for line in files[-1].read_text().splitlines()), key=lambda s: s["doc_id"])


def metrics(folder: Path) -> dict[str, float]:
    results = json.loads(sorted(folder.rglob("results_*.json"))[-1].read_text())["results"]
    return {f"{task}/{name.split(',')[0]}": float(value) for task, values in results.items()
            for name, value in values.items() if isinstance(value, (int, float)) and "stderr" not in name
            and name != "alias"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("served", type=Path)
    parser.add_argument("hf", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--atol", type=float, default=1e-3)
    parser.add_argument("--mc-task", default="rakv_wikitext_mc")
    parser.add_argument("--gen-task", default="rakv_humaneval_gen")
    args = parser.parse_args()
    served, hf = samples(args.served, args.mc_task), samples(args.hf, args.mc_task)
    if [s["doc_id"] for s in served] != [s["doc_id"] for s in hf]:
        sys.exit("compare_lm_eval: the two runs scored different documents")
    diffs, same = [], 0
    for a, b in zip(served, hf):
        la = [float(r[0][0]) for r in a["resps"]]
        lb = [float(r[0][0]) for r in b["resps"]]
        diffs += [abs(x - y) for x, y in zip(la, lb)]
        same += la.index(max(la)) == lb.index(max(lb))
    pair = load_pair("smollm2")
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30))
    generated = samples(args.served, args.gen_task)
    equal = 0
    for sample in generated:
        request = sample["arguments"]["gen_args_0"]
        context, kwargs = request["arg_0"], request["arg_1"]
        ids = pair.tokenizer(context, add_special_tokens=False)["input_ids"]
        fresh = Engine(pair, PrefixKVStore(budget_bytes=1 << 30))
        tokens = fresh.run(ids, Action(False, 0), int(kwargs.get("max_gen_toks", 256))).token_ids
        text = pair.tokenizer.decode(tokens, skip_special_tokens=True)
        for stop in kwargs.get("until", []):
            text = text.split(stop)[0]
        answer = sample["resps"][0][0]
        equal += answer == text
        if answer != text:
            print(f"compare_lm_eval: doc {sample['doc_id']}: served {answer!r} != AR {text!r}")
    del engine
    record = LmEvalComparison(tasks=[args.mc_task, args.gen_task], loglikelihoods=len(diffs),
                              max_abs_loglikelihood_diff=max(diffs, default=0.0), atol=args.atol,
                              same_choice_picked=same, questions=len(served), generations=len(generated),
                              generations_equal_ar=equal, served_metrics=metrics(args.served),
                              hf_metrics=metrics(args.hf))
    write_record(record, args.out)
    print(f"compare_lm_eval: {len(diffs)} choices, max |log-likelihood difference| "
          f"{record.max_abs_loglikelihood_diff:.2e} (atol {args.atol:g}); {same}/{len(served)} questions pick the "
          f"same choice; {equal}/{len(generated)} generations equal batch-one AR; written to {args.out}")
    if record.max_abs_loglikelihood_diff > args.atol or equal != len(generated):
        sys.exit("compare_lm_eval: the server's answers differ from the references (see above)")


if __name__ == "__main__":
    main()
