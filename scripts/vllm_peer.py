"""The vLLM side of `bench_serving.py --peer vllm`, run by the peer's own interpreter (.venv-vllm/bin/python, set up by
scripts/setup_vllm_peer.sh). No rakv imports: vLLM pins another transformers, so the two engines live in two venvs
and meet in JSON files.

    .venv-vllm/bin/python scripts/vllm_peer.py JOB.json RESULT.json

JOB: rakv.bench.peer_reports' ThroughputJob ({"model": folder, "prompts": [[token ids], ...], "max_tokens": n,
      "concurrency": [1, 8], "repeats": 3, "eager": false, "speculative": null or vLLM's speculative_config (e.g.
      ngram, k), "prefix_caching": false, "mode": "throughput"}), or its StepsJob / ConfigsJob (mode "steps" /
      "configs") for scripts/tune_vllm.py (the functions of those names say what they measure). Read as attributes
      (every field is written); the answers are read back through rakv.bench.peer_reports' PeerThroughput,
      PeerSteps and PeerConfigs.
Every prompt arrives at once (the offline `LLM.generate`), greedy, exactly `max_tokens` new tokens each; for each
concurrency c one engine with max_num_seqs = c, a warm-up on two prompts, then `repeats` timed runs. RESULT: per c
the engine's start time, each run's seconds, and the token ids of the last run.
"""

import json
import os
import sys
import time
from types import SimpleNamespace


def engine(job: SimpleNamespace, max_num_seqs: int, speculative: dict | None, stats: bool = False):
    """One vLLM engine; `stats`: keep its metrics (LLM.get_metrics), which the offline API turns off by default."""
    from vllm import LLM

    return LLM(model=job.model, dtype="float32", max_model_len=2048, max_num_seqs=max_num_seqs, seed=0,
               max_num_batched_tokens=2048, enable_prefix_caching=job.prefix_caching,
               enforce_eager=job.eager, speculative_config=speculative, disable_log_stats=not stats)


def counters(llm) -> dict[str, float]:
    """vLLM's counters by name (its spec-decode draft counts among them)."""
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        if hasattr(metric, "value") and isinstance(metric.value, (int, float)):
            out[metric.name] = out.get(metric.name, 0.0) + float(metric.value)
    return out


def steps(job: SimpleNamespace) -> dict:
    """Step cost per (batch b, k), apart from acceptance: b requests at once, n-gram drafts of k tokens, a short and
    a long run; the engine's steps are counted from its own counters (each step confirms the accepted drafts + 1
    per request, so steps = (new tokens - accepted) / b), and the step time is the difference of the two runs' times
    over the difference of their steps (the prefill cancels). Also the draft rows each step verified (the n-gram
    finds no match sometimes). (vLLM's synthetic rejection sampler, which would fix acceptance, is GPU-only.)"""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job.prompts]
    short, long = job.short, job.long
    rows = []
    for k in job.ks:
        speculative = None if k == 0 else {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
                                           "prompt_lookup_max": job.max_ngram}
        llm = engine(job, max(job.batches), speculative, stats=True)
        llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=short, ignore_eos=True), use_tqdm=False)
        for b in job.batches:
            timed = {}
            for length in (short, long):
                params = SamplingParams(temperature=0.0, max_tokens=length, ignore_eos=True)
                runs = []
                for _ in range(job.repeats):
                    before = counters(llm)
                    t0 = time.perf_counter()
                    llm.generate(prompts[:b], params, use_tqdm=False)
                    seconds = time.perf_counter() - t0
                    after = counters(llm)
                    delta = {n: after.get(n, 0) - before.get(n, 0) for n in after}
                    drafts = sum(v for n, v in delta.items() if n.endswith("num_draft_tokens"))
                    accepted = sum(v for n, v in delta.items() if n.endswith("num_accepted_tokens"))
                    runs.append((seconds, (length * b - accepted) / b, drafts))
                timed[length] = sorted(runs)[len(runs) // 2]
            steps_ = timed[long][1] - timed[short][1]
            step_s = (timed[long][0] - timed[short][0]) / steps_
            draft_rows = (timed[long][2] - timed[short][2]) / steps_  # per step, all b requests together
            rows.append({"k": k, "b": b, "step_s": step_s, "draft_rows_per_step": draft_rows, "steps": steps_})
            print(f"vllm_peer: k={k} b={b} step {step_s * 1e3:.1f} ms over {steps_:.0f} steps, "
                  f"{draft_rows:.2f} draft rows/step", flush=True)
        del llm
    return {"steps": rows}


def serve_configs(job: SimpleNamespace) -> dict:
    """Each speculation config (None, or a speculative_config with real acceptance) on one engine with
    max_num_seqs = the largest concurrency: for each concurrency c the prompts in groups of c, each group all at
    once (a batch of c throughout); tokens/s and mean TPOT over the groups, the best of `repeats`."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job.prompts]
    params = SamplingParams(temperature=0.0, max_tokens=job.max_tokens, ignore_eos=True)
    out = []
    for label, speculative in job.configs:
        llm = engine(job, max(job.concurrency), speculative)
        llm.generate(prompts[:2], params, use_tqdm=False)
        for c in job.concurrency:
            best = None
            for _ in range(job.repeats):
                t0, tpots = time.perf_counter(), []
                for i in range(0, len(prompts), c):
                    for o in llm.generate(prompts[i:i + c], params, use_tqdm=False):
                        m = o.metrics
                        if m is not None and getattr(m, "first_token_latency", None) is not None \
                                and getattr(m, "last_token_ts", None) and getattr(m, "first_token_ts", None):
                            tpots.append((m.last_token_ts - m.first_token_ts) / max(1, job.max_tokens - 1))
                seconds = time.perf_counter() - t0
                best = seconds if best is None else min(best, seconds)
            tokens = len(prompts) * job.max_tokens
            out.append({"config": label, "c": c, "tok_s": tokens / best,
                        "tpot_s": sum(tpots) / len(tpots) if tpots else None})
            print(f"vllm_peer: {label} c={c} {tokens / best:.1f} tok/s", flush=True)
        del llm
    return {"configs": out}


def main(job_path: str, result_path: str) -> None:
    job = SimpleNamespace(**json.load(open(job_path)))  # its fields as attributes (vLLM's configs stay dicts)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of K/V: SmolLM2 at 2,048 positions x 16 fits
    if job.mode != "throughput":
        result = steps(job) if job.mode == "steps" else serve_configs(job)
        json.dump({"vllm": __import__("vllm").__version__, **result}, open(result_path, "w"))
        return
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job.prompts]
    params = SamplingParams(temperature=0.0, max_tokens=job.max_tokens, ignore_eos=True)
    results = []
    for c in job.concurrency:
        began = time.perf_counter()
        llm = engine(job, c, job.speculative)
        llm.generate(prompts[:2], params, use_tqdm=False)
        started = time.perf_counter() - began
        seconds, outputs = [], None
        for _ in range(job.repeats):
            t0 = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            seconds.append(time.perf_counter() - t0)
        results.append({"c": c, "start_s": started, "seconds": seconds,
                        "outputs": [list(o.outputs[0].token_ids) for o in outputs]})
        print(f"vllm_peer: c={c} start {started:.0f} s, runs {', '.join(f'{s:.2f}' for s in seconds)} s", flush=True)
        del llm
    json.dump({"vllm": __import__("vllm").__version__, "results": results}, open(result_path, "w"))


if __name__ == "__main__":  # vLLM starts its engine in a process of its own: the guard is required
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
