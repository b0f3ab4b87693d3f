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
workload: completed / failed, output tok/s, TTFT / TPOT / ITL p50 and p99 (ms), prefix hit rate (ours: summary.json;
vLLM: its /metrics counters), and how many requests' outputs are equal token for token with the first divergences.
The client's JSON results are kept in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rakv.runtime.errors import RakvError
from rakv.runtime.workloads import dataset_texts
from rakv.serving.trace import generate_trace

NAME = "SmolLM2-135M-Instruct"


def wait_ready(port: int, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if server.poll() is not None:
            raise RakvError(f"the server on port {port} exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RakvError(f"the server on port {port} was not ready within {timeout_s:.0f} s")


def start(engine: str, port: int, args, out: Path) -> subprocess.Popen:
    if engine == "rakv":
        command = [".venv/bin/rakv", "serve", "--pair", "smollm2", "--http", f"127.0.0.1:{port}", "--strategy",
                   args.strategy, "--max-batch", "16", "--out", str(out / "rakv-server"), "--quiet"]
    else:
        command = [f"{args.vllm_venv}/bin/vllm", "serve", args.vllm_weights, "--served-model-name", NAME, "--dtype", "float32", "--port", str(port),
                   "--host", "127.0.0.1", "--max-num-seqs", "16", "--max-model-len", "2048", "--seed", "0",
                   ] + (["--enforce-eager"] if args.vllm_eager else [])
    log = open(out / f"{engine}-server.log", "w")
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", **os.environ}
    if engine == "vllm" and args.vllm_threads:
        env["OMP_NUM_THREADS"] = str(args.vllm_threads)
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_ready(port, server, 900)
    return server


def client(port: int, dataset: Path, rate: float, args, out: Path, label: str) -> dict:
    command = [f"{args.vllm_venv}/bin/vllm", "bench", "serve", "--backend", "openai", "--base-url",
               f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions", "--model", NAME, "--tokenizer",
               args.vllm_weights, "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
               "--custom-output-len", str(args.new_tokens), "--num-prompts", str(args.requests), "--request-rate",
               str(rate), "--seed", str(args.seed), "--ignore-eos", "--temperature", "0", "--disable-shuffle",
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--save-result",
               "--save-detailed", "--result-dir", str(out), "--result-filename", f"{label}.json"]
    done = subprocess.run(command, capture_output=True, text=True)
    (out / f"{label}.client.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RakvError(f"vLLM's benchmark client failed on {label} (see {out / (label + '.client.log')})")
    return json.loads((out / f"{label}.json").read_text())


def vllm_hit_rate(port: int) -> tuple[float, float]:
    """(hit tokens, queried tokens) of vLLM's prefix cache so far, from its Prometheus counters."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

    def counter(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^vllm:{name}_total{{[^}}]*}} ([0-9.eE+]+)$", text, re.M))
    return counter("prefix_cache_hits"), counter("prefix_cache_queries")


def workloads(args) -> dict[str, tuple[list[str], float]]:
    """Each workload its own prompts: a later workload must not find an earlier one's in the caches."""
    texts = dataset_texts("humaneval")
    out = {}
    plain = [r.prompt for r in generate_trace(texts, requests=args.requests * len(args.rates), rate=1.0,
                                             prompt_words=args.prompt_words, seed=args.seed)]
    for i, rate in enumerate(args.rates):
        out[f"plain-{rate:g}"] = (plain[i * args.requests:(i + 1) * args.requests], rate)
    trace = generate_trace(texts, requests=args.requests, rate=1.0, kind="shared-prefix", groups=args.groups,
                           prompt_words=args.prompt_words, seed=args.seed + len(args.rates))
    out[f"shared-prefix-{args.rates[0]:g}"] = ([r.prompt for r in trace], args.rates[0])
    return out


def run_engine(engine: str, port: int, loads: dict, args, out: Path) -> dict[str, dict]:
    server = start(engine, port, args, out)
    results = {}
    try:
        for label, (prompts, rate) in loads.items():
            dataset = out / f"{label}.jsonl"
            dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
            before = hits(engine, port, out)
            result = client(port, dataset, rate, args, out, f"{engine}-{label}")
            after = hits(engine, port, out)
            queried = after[1] - before[1]
            result["prefix_hit_rate"] = (after[0] - before[0]) / queried if queried else None
            results[label] = result
    finally:
        server.terminate()
        server.wait(timeout=120)
    return results


def hits(engine: str, port: int, out: Path) -> tuple[float, float]:
    """(prompt tokens reused, prompt tokens) so far: vLLM's counters, or our server's requests.jsonl (a line per
    request as it ends: when the client returns, all of its requests are in)."""
    if engine == "vllm":
        return vllm_hit_rate(port)
    path = out / "rakv-server" / "requests.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    ok = [r for r in records if r["status"] == "ok"]
    return float(sum(r["hit_tokens"] for r in ok)), float(sum(r["prompt_tokens"] for r in ok))


def vllm_version(args) -> str:
    return subprocess.run([f"{args.vllm_venv}/bin/python", "-c", "import importlib.metadata as m; "
                           "print(m.version('vllm-cpu'))"], capture_output=True, text=True).stdout.strip()


def machine() -> dict:
    """Where this was measured: the CPU's model name and core count (Linux), and the date."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else \
        platform.processor()
    return {"cpu": cpu, "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}


def agreement(ours: dict, theirs: dict, tokenizer) -> tuple[int, list[str]]:
    """Requests whose generated texts are equal, and where the others first differ (by token, re-tokenised)."""
    equal, divergences = 0, []
    for i, (a, b) in enumerate(zip(ours["generated_texts"], theirs["generated_texts"])):
        if a == b:
            equal += 1
            continue
        x, y = tokenizer.encode(a), tokenizer.encode(b)
        at = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        divergences.append(f"request {i} at token {at}")
    return equal, divergences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--strategy", default="ar", help="rakv serve's --strategy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm-venv", default=".venv-vllm")
    parser.add_argument("--vllm-weights", default="results/peer/smollm2-fp32")
    parser.add_argument("--vllm-eager", action="store_true")
    parser.add_argument("--vllm-threads", type=int, default=None, metavar="N",
                        help="OMP_NUM_THREADS for vLLM's server (default: its own choice, which on 2 cores is 1)")
    parser.add_argument("--out", default="results/peer/bench_vllm_serve")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        if not Path(args.vllm_venv, "bin", "python").exists() or not Path(args.vllm_weights, "config.json").exists():
            raise RakvError("the vLLM peer is not set up: run scripts/setup_vllm_peer.sh")
        loads = workloads(args)
        results = {"rakv": run_engine("rakv", 8311, loads, args, out), "vllm": run_engine("vllm", 8312, loads, args,
                                                                                          out)}
    except RakvError as exc:
        print(f"bench_vllm_serve: error: {exc}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.vllm_weights)
    print(f"{args.requests} requests x {args.new_tokens} new tokens per workload, Poisson arrivals (seed {args.seed}), "
          f"greedy; client: vLLM's benchmark_serving; rakv --strategy {args.strategy}")
    print(f"{'workload':<20} {'engine':<5} {'done':>4} {'fail':>4} {'tok/s':>6} {'TTFT p50':>8} {'p99':>6} "
          f"{'TPOT p50':>8} {'p99':>6} {'ITL p50':>7} {'p99':>6} {'hit rate':>8}")
    agreed = {}
    for label in loads:
        for engine in ("rakv", "vllm"):
            r = results[engine][label]
            hit = "-" if r.get("prefix_hit_rate") is None else f"{r['prefix_hit_rate']:.1%}"
            print(f"{label:<20} {engine:<5} {r['completed']:>4} {r['failed']:>4} {r['output_throughput']:6.1f} "
                  f"{r['p50_ttft_ms']:8.0f} {r['p99_ttft_ms']:6.0f} {r['p50_tpot_ms']:8.0f} {r['p99_tpot_ms']:6.0f} "
                  f"{r['p50_itl_ms']:7.0f} {r['p99_itl_ms']:6.0f} {hit:>8}")
        same, divergences = agreement(results["rakv"][label], results["vllm"][label], tokenizer)
        agreed[label] = {"equal": same, "requests": args.requests, "divergences": divergences}
        print(f"{label:<20} outputs equal on {same} of {args.requests}"
              + (f"; first divergences: {', '.join(divergences[:4])}" if divergences else ""))
    summary = {"engines": {e: {k: {m: v for m, v in r.items() if not isinstance(v, list)} for k, r in res.items()}
                           for e, res in results.items()},
               "agreement": agreed, "workloads": {label: rate for label, (_, rate) in loads.items()},
               "requests": args.requests, "new_tokens": args.new_tokens, "strategy": args.strategy,
               "vllm": vllm_version(args), "machine": machine()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
