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
from dataclasses import dataclass
from pathlib import Path

from rakv.bench.options import VllmServeOptions
from rakv.bench.peer_reports import RAKV, ClientOutput, EngineSetting, Machine
from rakv.runtime.errors import RakvError
from rakv.runtime.workloads import dataset_texts
from rakv.serving.trace import generate_trace

NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Workload:
    """The prompts of one workload and their Poisson rate (requests/s)."""

    prompts: list[str]
    rate: float


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


def start(engine: str, port: int, options: VllmServeOptions, out: Path, threads: int = 0,
          key: str | None = None) -> subprocess.Popen:
    """rakv serve --http or vllm serve on `port`; vLLM with OMP_NUM_THREADS = `threads` (0: its own choice, which
    on 2 cores gives its model one thread)."""
    if engine == RAKV:
        command = [".venv/bin/rakv", "serve", "--pair", "smollm2", "--http", f"127.0.0.1:{port}", "--strategy",
                   options.strategy, "--max-batch", "16", "--out", str(out / "rakv-server"), "--quiet"]
    else:
        command = [f"{options.vllm_venv}/bin/vllm", "serve", options.vllm_weights, "--served-model-name", NAME,
                   "--dtype", "float32", "--port", str(port),
                   "--host", "127.0.0.1", "--max-num-seqs", "16", "--max-model-len", "2048", "--seed", "0",
                   ] + (["--enforce-eager"] if options.vllm_eager else [])
    log = open(out / f"{key or engine}-server.log", "w")
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", **os.environ}
    if engine == "vllm" and threads:
        env["OMP_NUM_THREADS"] = str(threads)
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_ready(port, server, 900)
    return server


def _client(port: int, dataset: Path, rate: float, options: VllmServeOptions, out: Path, label: str,
           seed: int) -> dict:
    """vLLM's benchmark client on one workload: its result file, in vLLM's own format (ClientOutput.of_client reads
    it)."""
    command = [f"{options.vllm_venv}/bin/vllm", "bench", "serve", "--backend", "openai", "--base-url",
               f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions", "--model", NAME, "--tokenizer",
               options.vllm_weights, "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
               "--custom-output-len", str(options.new_tokens), "--num-prompts", str(options.requests), "--request-rate",
               str(rate), "--seed", str(seed), "--ignore-eos", "--temperature", "0", "--disable-shuffle",
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


def workloads(options: VllmServeOptions, seed: int) -> dict[str, Workload]:
    """Each workload its own prompts: a later workload must not find an earlier one's in the caches."""
    texts = dataset_texts("humaneval")
    out = {}
    n = options.requests
    plain = [r.prompt for r in generate_trace(texts, requests=n * len(options.rates), rate=1.0,
                                             prompt_words=options.prompt_words, seed=seed)]
    for i, rate in enumerate(options.rates):
        out[f"plain-{rate:g}"] = Workload(plain[i * n:(i + 1) * n], rate)
    trace = generate_trace(texts, requests=n, rate=1.0, kind="shared-prefix", groups=options.groups,
                           prompt_words=options.prompt_words, seed=seed + len(options.rates))
    out[f"shared-prefix-{options.rates[0]:g}"] = Workload([r.prompt for r in trace], options.rates[0])
    return out


def settings(options: VllmServeOptions) -> dict[str, EngineSetting]:
    """The engine settings served, by key: rakv, and vLLM at each --vllm-threads (0: its default, key "vllm"; N:
    OMP_NUM_THREADS = N, key "vllm-Nthreads")."""
    out = {RAKV: EngineSetting(RAKV, None)}
    for threads in options.vllm_threads:
        out["vllm" if threads == 0 else f"vllm-{threads}threads"] = EngineSetting("vllm", threads)
    return out


def run_engine(key: str, setting: EngineSetting, port: int, loads: list[dict[str, Workload]],
               options: VllmServeOptions, out: Path) -> list[dict[str, ClientOutput]]:
    """One server started once, then every repeat's workloads (`loads[r]`) in turn, each with repeat r's seed:
    per repeat, the client's output per workload with the server's prefix hit rate over it."""
    server = start(setting.engine, port, options, out, setting.threads or 0, key)
    results: list[dict[str, ClientOutput]] = []
    try:
        for repeat, repeat_loads in enumerate(loads):
            results.append({})
            for label, load in repeat_loads.items():
                dataset = out / f"r{repeat}-{label}.jsonl"
                dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in load.prompts))
                before = prefix_cache_counts(port)
                name = f"{key}-r{repeat}-{label}"
                result = _client(port, dataset, load.rate, options, out, name, options.repeat_seed(repeat))
                after = prefix_cache_counts(port)
                queried = after[1] - before[1]
                output = ClientOutput.of_client(result, (after[0] - before[0]) / queried if queried else None,
                                                str(out / f"{name}.json"))
                results[-1][label] = output
                print(f"bench_vllm_serve: {key} repeat {repeat} {label}: {output.run.output_throughput:.1f} tok/s, "
                      f"p99 TTFT {output.run.p99_ttft_ms:.0f} ms", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=120)
    return results


def vllm_version(options: VllmServeOptions) -> str:
    return subprocess.run([f"{options.vllm_venv}/bin/python", "-c", "import importlib.metadata as m; "
                           "print(m.version('vllm-cpu'))"], capture_output=True, text=True).stdout.strip()


def machine() -> Machine:
    """Where this was measured: the CPU's model name and core count (Linux), and the date."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else \
        platform.processor()
    return Machine(cpu, os.cpu_count(), time.strftime("%Y-%m-%d"))
