"""rakv serve --http and vLLM's OpenAI server driven by the same client, vLLM's own `benchmark_serving`
(`vllm bench serve`, from the peer's venv): the same prompts, the same seeded Poisson arrivals, the same metrics.

    scripts/setup_vllm_peer.sh            # once: .venv-vllm and the fp32 weights
    .venv/bin/python scripts/bench_vllm_serve.py [--rates 0.5 1] [--requests 32] [--new-tokens 32] [--out DIR]

Workloads (prompts from `rakv trace`'s generator, token counts as each engine's tokenizer gives them: the same):
- `plain` at each Poisson --rate: HumanEval prompts of --prompt-words words;
- `shared-prefix` at the first rate: --groups system prompts shared round-robin (prefix caching's case: vLLM
  caches blocks of 16 tokens, rakv's store hits at token granularity).
Both servers run with their defaults (vLLM's prefix caching is on by default, as rakv's store is), --max-batch /
max_num_seqs 16, greedy, --ignore-eos; vLLM's engine starts once (torch.compile; --vllm-eager skips it). Printed per
workload and engine setting, over --repeats repeats (each its own prompts and arrivals): completed / failed, output
tok/s, TTFT / TPOT / ITL p50 and p99, mean and p99 end-to-end latency (ms), prefix hit rate (ours: summary.json;
vLLM: its /metrics counters) as means with their 95 % t intervals; rakv / each vLLM setting per metric, paired by
repeat (rakv.experiments.peer_tables); how many requests' outputs are equal token for token. Written to
--out/summary.json (scripts/ship_peer.sh ships it, docs/peers.md's tables are rendered from the shipped copy) beside
the client's JSON results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rakv.bench.options import VllmServeOptions, add_flags, options_from
from rakv.bench.peer_reports import RAKV, Agreement, ClientOutput, EngineSetting, RepeatRecord, VllmServeSummary
from rakv.bench.peers import agreement
from rakv.bench.vllm_serve import machine, run_engine, settings, vllm_version, workloads
from rakv.experiments.peer_tables import paired_markdown, serve_aggregates, serve_markdown, serve_paired
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import write_record
from rakv.runtime.run_layout import PeerLayout


def parse_args(argv=None) -> VllmServeOptions:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser, VllmServeOptions)
    return options_from(VllmServeOptions, parser.parse_args(argv))


def text_agreement(ours: ClientOutput, theirs: ClientOutput, tokenizer) -> Agreement:
    """Of the requests both engines completed, how many generated texts are equal, and where the others first differ
    (by token, re-tokenised); `failed`: the requests either engine failed (no text to compare)."""
    count = len(ours.generated_texts)
    failed = [i for i, (a, b) in enumerate(zip(ours.errors or [""] * count, theirs.errors or [""] * count)) if a or b]
    done = [i for i in range(count) if i not in failed]
    same, divergences = agreement({f"request {i}": ours.generated_texts[i] for i in done},
                                  {f"request {i}": theirs.generated_texts[i] for i in done}, tokenizer.encode)
    return Agreement(same, len(done), len(failed), divergences)


def repeat_records(results: dict[str, list[dict[str, ClientOutput]]], settings: dict[str, EngineSetting],
                   tokenizer) -> list[RepeatRecord]:
    """Per repeat: each setting's client metrics per workload (lists dropped) and rakv's agreement with each vLLM
    setting."""
    repeats = []
    for r in range(len(results[RAKV])):
        engines = {key: {label: output.run for label, output in results[key][r].items()} for key in settings}
        agreed = {key: {label: text_agreement(results[RAKV][r][label], results[key][r][label], tokenizer)
                        for label in results[key][r]} for key in settings if key != RAKV}
        repeats.append(RepeatRecord(engines, agreed))
    return repeats


def main() -> int:
    options = parse_args()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    settings_ = settings(options)
    try:
        if not Path(options.vllm_venv, "bin", "python").exists() or \
                not Path(options.vllm_weights, "config.json").exists():
            raise RakvError("the vLLM peer is not set up: run scripts/setup_vllm_peer.sh")
        loads = [workloads(options, options.repeat_seed(r)) for r in range(options.repeats)]
        results = {key: run_engine(key, setting, 8311 + i, loads, options, out)
                   for i, (key, setting) in enumerate(settings_.items())}
    except RakvError as exc:
        print(f"bench_vllm_serve: error: {exc}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    repeats = repeat_records(results, settings_, AutoTokenizer.from_pretrained(options.vllm_weights))
    summary = VllmServeSummary(
        settings=settings_, workloads={label: load.rate for label, load in loads[0].items()}, repeats=repeats,
        aggregate=serve_aggregates(repeats), paired=serve_paired(repeats), requests=options.requests,
        new_tokens=options.new_tokens, strategy=options.strategy,
        seeds=[options.repeat_seed(r) for r in range(options.repeats)], vllm=vllm_version(options), machine=machine())
    written = write_record(summary, PeerLayout.vllm_serve_summary_in(out))
    print(serve_markdown(summary))
    print(paired_markdown(summary))
    print(f"bench_vllm_serve: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
