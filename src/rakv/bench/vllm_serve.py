"""scripts/bench_vllm_serve.py's servers and client: rakv serve --http and vLLM's OpenAI server, each started,
driven by vLLM's own benchmark client (`vllm bench serve`) over the same workloads, and their prefix hit counts
(docs/peers.md).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
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
        command = [f"{args.vllm_venv}/bin/vllm", "serve", args.vllm_weights, "--served-model-name", NAME,
                   "--dtype", "float32", "--port", str(port),
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


def prefix_cache_counts(port: int) -> tuple[float, float]:
    """(hit tokens, queried tokens) of the server's prefix cache so far, from its Prometheus counters under vLLM's
    names, which rakv serve --http exports too (rakv.serving.prometheus: counted as each request ends, so when the
    client returns all of its requests are in)."""
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
            before = prefix_cache_counts(port)
            result = client(port, dataset, rate, args, out, f"{engine}-{label}")
            after = prefix_cache_counts(port)
            queried = after[1] - before[1]
            result["prefix_hit_rate"] = (after[0] - before[0]) / queried if queried else None
            results[label] = result
    finally:
        server.terminate()
        server.wait(timeout=120)
    return results


def vllm_version(args) -> str:
    return subprocess.run([f"{args.vllm_venv}/bin/python", "-c", "import importlib.metadata as m; "
                           "print(m.version('vllm-cpu'))"], capture_output=True, text=True).stdout.strip()


def machine() -> dict:
    """Where this was measured: the CPU's model name and core count (Linux), and the date."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else \
        platform.processor()
    return {"cpu": cpu, "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
