"""vLLM's speculation schedule chosen by the artifact's cost model on this machine, and checked by serving with it.

    scripts/setup_vllm_peer.sh            # once
    .venv/bin/python scripts/tune_vllm.py [--alpha A --match-rate M] [--ks 0 2 4] [--batches 1 2 4 8 16] [--out DIR]

vLLM 0.32 takes `speculative_config.num_speculative_tokens_per_batch_size`, a list of (batch_start, batch_end, k)
ranges, usually set by hand. Here:
1. measure: vLLM's own step time per (batch b, k) on this machine, apart from acceptance: its steps are counted
   from its own counters (a step confirms the accepted drafts + 1 per request) over a long and a short run, with
   the draft rows each step actually verified (scripts/vllm_peer.py, mode "steps"; vLLM's synthetic rejection
   sampler, which would fix acceptance, is GPU-only);
2. fit: the batch cost model's pass form (rakv.serving.batchcost: a fixed part, a part per request, a part per
   row) to those steps by non-negative least squares;
3. choose: for each batch size the k that maximises expected tokens per second, b * (m * E_k(alpha) + 1 - m) /
   step(b, rows = b * (1 + m * k)), with E_k(alpha) = (1 - alpha^(k+1)) / (1 - alpha) (rakv.runtime.costmodel)
   and m the share of rounds in which prompt lookup finds an n-gram; alpha and m default to the calibration of
   rakv's smollm2-lookup configuration on this machine (its prompt lookup is vLLM's n-gram method with the same
   n-gram sizes), or are given;
4. check: serve the same requests through vLLM with the schedule, with fixed k (each of --ks) and with a hand-set
   table (--hand), real acceptance, batches of c = each --batches value: tokens/s side by side, with the model's
   prediction for each. Goal: the schedule >= the best fixed k within noise at every c, and > the worst by about
   the predicted margin.

Prints the fitted model, the schedule as vLLM's config (ready to paste) and the check; writes DIR/tune.json.
On a GPU machine the same command runs unchanged with a CUDA build of vLLM in the peer venv.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rakv.bench.peer_reports import ConfigsJob, PeerConfigs, PeerSteps, StepsJob, TuneReport
from rakv.bench.peers import config, fit, k_of, rate, run_peer_job, schedule, step_model, step_s
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import to_json, write_record
from rakv.runtime.models import smollm2_tokenizer
from rakv.runtime.proposers import PromptLookupProposer
from rakv.runtime.run_layout import PeerLayout
from rakv.runtime.workloads import dataset_texts
from rakv.serving.trace import generate_trace

HAND = [[1, 4, 4], [5, 8, 2], [9, 1024, 0]]  # a plausible hand-set table: deeper when the batch is small


def run_peer(job, result_type: type, args):
    """scripts/vllm_peer.py on `job` (a StepsJob or ConfigsJob): its answer as a `result_type` record."""
    python = Path(args.vllm_venv) / "bin" / "python"
    if not python.exists() or not Path(args.vllm_weights, "config.json").exists():
        raise RakvError("the vLLM peer is not set up: run scripts/setup_vllm_peer.sh")
    result, stderr = run_peer_job(job, result_type, python)
    if result is None:
        lines = stderr.strip().splitlines() or ["no output"]
        reason = next((line for line in reversed(lines) if "Error" in line), lines[-1])
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "peer_stderr.log").write_text(stderr)
        raise RakvError(f"the vLLM peer failed: {reason.strip()} (whole log: {args.out}/peer_stderr.log)")
    return result


def calibrated_alpha() -> tuple[float, float]:
    """Prompt lookup's acceptance and match rate from rakv's calibration of smollm2 / prompt-lookup here."""
    from rakv.runtime.calibration import calibration_for
    from rakv.runtime.engine import open_engine

    table = calibration_for(open_engine("smollm2", "prompt-lookup", cache_budget_mib=64), "auto")
    return table.acceptance, table.match_rate




def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alpha", type=float, default=None)
    parser.add_argument("--match-rate", type=float, default=None)
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 2, 4])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--check-concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--hand", default=json.dumps(HAND), help="the hand-set table to check against (JSON)")
    parser.add_argument("--vllm-venv", default=".venv-vllm")
    parser.add_argument("--vllm-weights", default="results/peer/smollm2-fp32")
    parser.add_argument("--vllm-eager", action="store_true")
    parser.add_argument("--out", default="results/peer/tune_vllm")
    return parser.parse_args()


def acceptance_and_match(args) -> tuple[float, float]:
    """--alpha and --match-rate, each from rakv's calibration when not given."""
    alpha, match = args.alpha, args.match_rate
    if alpha is None or match is None:
        measured = calibrated_alpha()
        alpha = measured[0] if alpha is None else alpha
        match = measured[1] if match is None else match
    if not (0 <= alpha < 1 and 0 <= match <= 1):
        raise RakvError("--alpha must be in [0, 1) and --match-rate in [0, 1]")
    return alpha, match


def tune(args, hand: list, alpha: float, match: float) -> tuple[PeerSteps, object, list, list, PeerConfigs]:
    """Measure vLLM's steps, fit the step model, choose the schedule and serve every config to check it."""
    tokenizer = smollm2_tokenizer()
    trace = generate_trace(dataset_texts("humaneval"), requests=args.requests, rate=1.0,
                           max_new_tokens=args.new_tokens, prompt_words=args.prompt_words, seed=0)
    prompts = [tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in trace]
    max_ngram = PromptLookupProposer.max_ngram
    measured = run_peer(StepsJob(args.vllm_weights, prompts, args.vllm_eager, max_ngram, args.ks, args.batches,
                                 short=8, long=40, repeats=args.repeats), PeerSteps, args)
    model = fit(measured.steps)
    tuned = schedule(model, args.ks, alpha, match, max(args.batches))
    configs = [[f"k={k}", config(k, max_ngram)] for k in args.ks]
    configs += [["hand-set", config(hand, max_ngram)], ["tuned", config(tuned, max_ngram)]]
    checked = run_peer(ConfigsJob(args.vllm_weights, prompts, args.vllm_eager, max_ngram, configs,
                                  args.check_concurrency, args.new_tokens, args.repeats), PeerConfigs, args)
    return measured, model, tuned, configs, checked


def print_result(args, measured: PeerSteps, model, tuned, configs, checked: PeerConfigs, hand, alpha,
                 match) -> None:
    print(f"vLLM {measured.vllm}: step = {model[0] * 1e3:.2f} ms + {model[1] * 1e3:.2f} ms x requests + "
          f"{model[2] * 1e3:.2f} ms x rows (NNLS over {len(measured.steps)} measured (b, k) points)")
    print(f"{'b':>3} {'k':>2} {'measured ms':>11} {'model ms':>8}")
    for s in measured.steps:
        rows = s.draft_rows_per_step / s.b / s.k if s.k else 0.0
        print(f"{s.b:>3} {s.k:>2} {s.step_s * 1e3:11.1f} {step_s(model, s.b, s.k, rows) * 1e3:8.1f}")
    print(f"acceptance {alpha:.3f}, n-gram match rate {match:.3f}: the schedule (batch_start, batch_end, k): {tuned}")
    print("speculative_config = " + json.dumps(to_json(config(tuned, PromptLookupProposer.max_ngram))))
    labels = [label for label, _ in configs]
    print(f"{'c':>3} " + " ".join(f"{label:>9}" for label in labels) + "   tok/s measured (predicted)")
    table = {(r.config, r.c): r.tok_s for r in checked.configs}
    tables = {f"k={k}": [[1, 1024, k]] for k in args.ks} | {"hand-set": hand, "tuned": tuned}
    for c in args.check_concurrency:
        cells = [f"{table[(label, c)]:5.1f}({rate(model, c, k_of(tables[label], c), alpha, match):.0f})"
                 for label in labels]
        print(f"{c:>3} " + " ".join(f"{cell:>9}" for cell in cells))


def main() -> int:
    args = parse_args()
    try:
        hand = json.loads(args.hand)
        if 0 not in args.ks or any(k < 0 for k in args.ks):
            raise RakvError("--ks must include 0 and be >= 0")
        alpha, match = acceptance_and_match(args)
        measured, model, tuned, configs, checked = tune(args, hand, alpha, match)
    except RakvError as exc:
        print(f"tune_vllm: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = TuneReport(vllm=measured.vllm, alpha=alpha, match_rate=match, steps=measured.steps,
                        model=step_model(model), schedule=tuned, hand=hand, check=checked.configs)
    write_record(result, PeerLayout.tune_in(out))
    print_result(args, measured, model, tuned, configs, checked, hand, alpha, match)
    return 0


if __name__ == "__main__":
    sys.exit(main())
