"""llama.cpp beside our engine (scripts/bench_engine.py, docs/engine.md): llama-cpp-python on the shipped Q4_1 GGUF and
on its F32 conversion (the same dequantised fp32 weights as our fp32 target), decode ms/token and prefill tokens/s,
each model in a child process of its own.

The child runs in the peer's own venv when there is one (`peer_python`: $RAKV_LLAMA_PYTHON, else .venv-llama made by
scripts/setup_llama_cpp_peer.sh, else this interpreter where it imports llama_cpp), this file run as a script
(`CHILD`) with its arguments as JSON on stdin and its measure as JSON on stdout: this module imports only the
standard library at its top, so the peer's venv needs neither torch nor rakv. A crash inside llama.cpp (its AMX
kernels on a guest that lists AMX without granting it died with SIGILL) is one line of the report, not the end of
the benchmark.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PEER_VENV = ".venv-llama"  # scripts/setup_llama_cpp_peer.sh's default
CHILD_TIMEOUT_S = 1800
# the child: this file run as __main__ without its folder on the path (run as `python llama_cpp.py`, its folder
# would come first and `import llama_cpp` would import this very file instead of llama-cpp-python)
CHILD = "import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; " \
        "runpy.run_path({path!r}, run_name='__main__')"


def peer_python() -> str | None:
    """The interpreter that runs llama.cpp: $RAKV_LLAMA_PYTHON, the repository's .venv-llama, or this one where it
    has llama_cpp; None when none has it."""
    given = os.environ.get("RAKV_LLAMA_PYTHON")
    if given:
        return given
    venv = Path(__file__).resolve().parents[3] / PEER_VENV / "bin" / "python"
    if venv.exists():
        return str(venv)
    return sys.executable if importlib.util.find_spec("llama_cpp") is not None else None


def f32_path(q4: Path) -> Path:
    """Where the F32 conversion of the Q4_1 GGUF is kept (made by the first child that needs it)."""
    from rakv.runtime.models import derived_files_dir, file_hash

    return derived_files_dir() / "gguf" / f"{file_hash(q4)}-f32.gguf"


def run_child(python: str, label: str, q4: Path, path: Path, prompt: str, long_prompt: str, n: int, repeats: int,
              threads: int):
    """One model measured by a fresh peer process (`_measure`): its LlamaCppMeasure, or one with only `error`."""
    from rakv.bench.engine_report import LlamaCppMeasure

    request = {"label": label, "q4": str(q4), "path": str(path), "prompt": prompt, "long_prompt": long_prompt,
               "n": n, "repeats": repeats, "threads": threads}
    try:
        done = subprocess.run([python, "-c", CHILD.format(path=str(Path(__file__).resolve()))],
                              input=json.dumps(request), text=True, capture_output=True, timeout=CHILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return LlamaCppMeasure(error=f"llama.cpp's process did not finish: {type(exc).__name__}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:200]
        died = f"died with signal {-done.returncode}" if done.returncode < 0 else last
        return LlamaCppMeasure(error=f"llama.cpp's process: {died}")
    return LlamaCppMeasure(**json.loads(done.stdout.strip().splitlines()[-1]))


def _measure(label: str, q4: str, path: str, prompt: str, long_prompt: str, n: int, repeats: int,
             threads: int) -> dict:
    """In the peer's process: one model's decode ms/token after the first token (greedy, `n` tokens) and prefill
    tokens/s of `long_prompt`, medians of `repeats` after a warm-up (the F32 file converted from the Q4_1 one first,
    once)."""
    import llama_cpp

    if label == "f32" and not Path(path).exists():  # the same dequantised fp32 weights as our target
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = 0, True, threads  # 0 = LLAMA_FTYPE_ALL_F32
        tmp = Path(path).with_suffix(".tmp")
        if llama_cpp.llama_model_quantize(q4.encode(), str(tmp).encode(), params) != 0:
            raise RuntimeError("llama.cpp could not convert the GGUF to F32")
        tmp.replace(path)
    llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=2048, verbose=False)
    tokens = llm.tokenize(prompt.encode(), add_bos=False)
    long_tokens = llm.tokenize(long_prompt.encode(), add_bos=False)
    decode, prefill, text = [], [], []
    for repeat in range(repeats + 1):
        llm.reset()
        first, produced = None, []
        for token in llm.generate(tokens, temp=0.0, top_k=1, reset=True):
            first = first or time.perf_counter()
            produced.append(token)
            if len(produced) >= n:
                break
        end = time.perf_counter()
        llm.reset()
        start = time.perf_counter()
        llm.eval(long_tokens)
        long_s = time.perf_counter() - start
        if repeat:  # the first is a warm-up
            decode.append((end - first) / (n - 1) * 1e3)
            prefill.append(len(long_tokens) / long_s)
        text = produced
    return {"version": getattr(llama_cpp, "__version__", "?"), "ms_per_token": statistics.median(decode),
            "prefill_tokens_per_s": statistics.median(prefill), "prefill_tokens": len(long_tokens),
            "tokens": [int(t) for t in text]}


def llama_cpp_peer(prompt: str, long_prompt: str, n: int, repeats: int, threads: int):
    """llama.cpp on the shipped Q4_1 GGUF and on its F32 conversion, `threads` threads, each model in a fresh peer
    process (a LlamaCppRun); None when no interpreter has llama_cpp."""
    from rakv.bench.engine_report import LlamaCppRun
    from rakv.runtime.models import smollm2_gguf_path

    python = peer_python()
    if python is None:
        return None
    q4 = smollm2_gguf_path()
    return LlamaCppRun(**{label: run_child(python, label, q4, path, prompt, long_prompt, n, repeats, threads)
                          for label, path in (("f32", f32_path(q4)), ("q4_1", q4))})


def model_row(measured, ours_tokens: list[int]):
    from rakv.bench.engine_report import LlamaCppModel

    if measured.error is not None:
        return LlamaCppModel(error=measured.error)
    return LlamaCppModel(version=measured.version, ms_per_token=measured.ms_per_token,
                         prefill_tokens_per_s=measured.prefill_tokens_per_s, prefill_tokens=measured.prefill_tokens,
                         same_first_tokens_as_ours=measured.tokens[:16] == ours_tokens[:16])


def llama_cpp_row(peer, ours_tokens: list[int], ours_decode_ms: float, prefill_tps: float):
    """Each llama.cpp model's row (only its error where its process died), and ours against F32 where F32 ran."""
    from rakv.bench.engine_report import LlamaCppRow
    from rakv.bench.goals import LLAMA_CPP_DECODE, LLAMA_CPP_PREFILL

    if peer is None:
        return None
    f32 = peer.f32
    ran = f32.error is None
    return LlamaCppRow(f32=model_row(f32, ours_tokens), q4_1=model_row(peer.q4_1, ours_tokens),
                       ours_decode_ms_per_token=ours_decode_ms,
                       ar_over_f32=ours_decode_ms / f32.ms_per_token if ran else None,
                       goal=LLAMA_CPP_DECODE.threshold,
                       prefill_over_f32=prefill_tps / f32.prefill_tokens_per_s if ran else None,
                       prefill_goal=LLAMA_CPP_PREFILL.threshold)


if __name__ == "__main__":  # the peer's child process: JSON in, JSON out
    print(json.dumps(_measure(**json.loads(sys.stdin.read()))))
