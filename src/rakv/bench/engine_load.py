"""The engine benchmark's fresh processes (scripts/bench_engine.py; docs/engine.md, "Memory and start-up"): the peak
memory of each generation, a fresh process's resident set against what it holds (the memory goal), and start-up to
the first token of `rakv generate` and `rakv serve --http`. Each runs in a process of its own, so that no earlier
call has grown the allocator's arenas or warmed a cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from rakv.bench.engine_report import LoadReport, MemoryRow, RssProbe, StartupRow
from rakv.bench.goals import MEMORY, STARTUP_WARM, judge
from rakv.bench.options import EngineBenchOptions
from rakv.bench.roofline import distinct_bytes, model_tensors
from rakv.runtime.actions import AR, SPEC_K4, Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.engine import Engine
from rakv.runtime.json_records import load_record
from rakv.runtime.models import derived_files_dir, load_pair
from rakv.runtime.paths import ROOT
from rakv.runtime.workloads import humaneval_prompts

SCRIPT = ROOT / "scripts" / "bench_engine.py"  # run again in fresh processes for the memory probes
STARTUP_PROMPT = "def fibonacci(n):"


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def peak_increase_mib(fn, device) -> float:
    """Peak memory increase while `fn` runs: CUDA allocator peak, or the process's peak RSS (Linux)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset the peak-RSS high-water mark to the current RSS
    base = rss_kib("VmRSS")
    fn()
    return (rss_kib("VmHWM") - base) / 1024


def probe_output(options: EngineBenchOptions, probe: str, check: bool = False) -> str:
    """The last line scripts/bench_engine.py --probe PROBE prints in a fresh process."""
    out = subprocess.run([sys.executable, str(SCRIPT), *options.process_flags(), "--new-tokens",
                          str(options.new_tokens), "--probe", probe], capture_output=True, text=True, check=check)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    return out.stdout.strip().splitlines()[-1]


def probe_memory(options: EngineBenchOptions, side: str) -> float:
    """The peak memory increase of one generation side (`peak_increase_mib`), in a fresh process."""
    return float(probe_output(options, side))


def rss_probe(options: EngineBenchOptions) -> RssProbe:
    """In a fresh process: load only our pair, generate (AR, spec-k4), and compare the peak resident set with the
    bytes of the weights held plus the most K/V held; also the resident set before loading (the interpreter and its
    libraries) and its peak once the pair is loaded (dequantisation and packing). The prompt is read without
    `datasets`, which a server does not hold (rakv.runtime.workloads.humaneval_prompts)."""
    before_load = rss_kib("VmRSS") * 1024
    pair = load_pair(options.pair, device=options.device, threads=options.threads, kernels=options.kernels)
    loaded_peak = rss_kib("VmHWM") * 1024
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30))
    ids = engine.encode(humaneval_prompts()["HumanEval/2"])
    runs = [engine.run(ids, Action.of_strategy(s), options.new_tokens, ignore_eos=True) for s in (AR, SPEC_K4)]
    held = distinct_bytes(model_tensors(pair.target.module) + model_tensors(pair.draft.module))
    return RssProbe(peak_rss_bytes=rss_kib("VmHWM") * 1024, weight_bytes=held,
                    kv_bytes=max(r.peak_kv_bytes for r in runs), store_bytes=engine.store.stats.bytes,
                    rss_before_load_bytes=before_load, peak_rss_after_load_bytes=loaded_peak)


def torch_baseline_rss() -> int:
    """The resident set of a fresh interpreter that has imported torch (bytes): what no loading can save."""
    code = "import torch; print(int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1]) * 1024


def memory_goal(rss: RssProbe, torch_baseline_bytes: int) -> MemoryRow:
    """An rss_probe's peak against the bytes it holds (weights + the most K/V), judged as the goal was first stated
    (scripts/bench_engine.py, docs/engine.md): the whole process's peak resident set over them (rakv.bench.goals
    .MEMORY). Beside it, not judged, the same peak less an interpreter that has only imported torch
    (`torch_baseline_bytes`): what loading and generating add. That second figure was once made the goal's measure
    after the whole one had missed; a measure changed after seeing the data is no test of the goal, so it is printed
    as information only."""
    held = rss.weight_bytes + rss.kv_bytes
    return MemoryRow(**vars(rss), over_weights_and_kv=rss.peak_rss_bytes / held,
                     torch_baseline_bytes=torch_baseline_bytes,
                     above_torch_over_weights_and_kv=(rss.peak_rss_bytes - torch_baseline_bytes) / held,
                     goal=MEMORY.threshold, verdict=judge(MEMORY, rss.peak_rss_bytes, held))


def fresh_rss(options: EngineBenchOptions) -> MemoryRow:
    """rss_probe in a fresh process (this one has grown its arenas), judged by `memory_goal` (docs/engine.md)."""
    probe = load_record(RssProbe, json.loads(probe_output(options, "rss", check=True)), "bench_engine.py --probe rss")
    return memory_goal(probe, torch_baseline_rss())


def first_token_seconds(options: EngineBenchOptions, env: dict) -> tuple[float, float]:
    """A fresh `rakv generate` process (AR, one new token) from its start: (seconds to its first token on stdout,
    seconds to its exit). The first token is the first byte after the request's "[0] " header."""
    command = [sys.executable, "-m", "rakv.cli", "generate", "--pair", options.pair, "--prompt", STARTUP_PROMPT,
               "--strategy", AR, "--max-new-tokens", "1", "--ignore-eos", *options.process_flags()[2:]]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    seen, first = b"", None
    while first is None and (byte := process.stdout.read(1)):
        if b"[0] " in seen:
            first = time.perf_counter() - started
        seen += byte
    process.stdout.read()
    if process.wait() != 0 or first is None:
        raise RuntimeError(f"rakv generate failed (exit {process.returncode}): {seen.decode(errors='replace')}")
    return first, time.perf_counter() - started


def serve_first_token_seconds(options: EngineBenchOptions, env: dict) -> float:
    """A fresh `rakv serve --http` process (AR, a free port) from its start to the first token of one completion
    (one new token) asked as soon as it says it is ready; the server is then drained with SIGTERM."""
    command = [sys.executable, "-m", "rakv.cli", "serve", "--http", "127.0.0.1:0", "--pair", options.pair,
               "--strategy", AR, "--no-calibrate", *options.process_flags()[2:], "--quiet"]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        line = process.stdout.readline()
        where = re.search(r"rakv serve: (.+) on http://([^/]+)/v1", line)
        if where is None:
            raise RuntimeError(f"rakv serve --http did not say where it listens: {line.strip() or 'no output'}")
        body = json.dumps({"model": where[1], "prompt": STARTUP_PROMPT, "max_tokens": 1}).encode()
        request = urllib.request.Request(f"http://{where[2]}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            json.loads(response.read())
        return time.perf_counter() - started
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


def startup(options: EngineBenchOptions, warm_runs: int = 2) -> StartupRow:
    """Start-up to the first token of fresh `rakv generate` processes: once with the packed weights' cache cold (a
    derived-files folder without them: the GGUF is read and packed, then written), then warm (mapped). The folder
    is a temporary copy of this machine's tokenizer exports and file hashes, removed afterwards."""
    source = derived_files_dir()
    with tempfile.TemporaryDirectory(prefix="rakv-startup-") as folder:
        for name in ("tokenizers", "file_hashes.json"):
            if (source / name).is_dir():
                shutil.copytree(source / name, Path(folder) / name)
            elif (source / name).exists():
                shutil.copyfile(source / name, Path(folder) / name)
        env = {**os.environ, "RAKV_CACHE_DIR": folder}
        cold = first_token_seconds(options, env)
        warm = [first_token_seconds(options, env) for _ in range(warm_runs)]
        serve_warm = [serve_first_token_seconds(options, env) for _ in range(warm_runs)]
    return StartupRow(cold_first_token_s=cold[0], cold_exit_s=cold[1],
                      warm_first_token_s=statistics.median(w[0] for w in warm),
                      warm_exit_s=statistics.median(w[1] for w in warm), warm_runs=warm_runs,
                      goal_warm_s=STARTUP_WARM.threshold, serve_warm_first_token_s=statistics.median(serve_warm))


def load_report(options: EngineBenchOptions) -> LoadReport:
    """scripts/bench_engine.py --load: memory and start-up only."""
    return LoadReport(fresh_rss(options), startup(options))
