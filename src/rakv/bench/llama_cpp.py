"""llama.cpp beside our engine (scripts/bench_engine.py, docs/engine.md): llama-cpp-python on the shipped Q4_1 GGUF and
on its F32 conversion (the same dequantised fp32 weights as our target), decode ms/token and prefill tokens/s,
each model in a child process of its own.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from rakv.bench.engine_report import LlamaCppMeasure, LlamaCppModel, LlamaCppRow
from rakv.bench.goals import LLAMA_CPP_DECODE, LLAMA_CPP_PREFILL


@dataclass(frozen=True)
class LlamaCppRun:
    """Both llama.cpp models as measured."""

    f32: LlamaCppMeasure
    q4_1: LlamaCppMeasure


def llama_cpp_peer(prompt: str, long_prompt: str, n: int, repeats: int, threads: int) -> LlamaCppRun | None:
    """llama.cpp (llama-cpp-python) on the shipped Q4_1 GGUF and on its F32 conversion: decode ms/token (greedy,
    `n` tokens) and prefill tokens/s on `long_prompt`; None when llama-cpp-python is not
    installed. Each model runs in a child process of its own, so that a crash inside llama.cpp (its Q4_1 kernels
    built with GGML_NATIVE on a Sapphire Rapids guest die with SIGSEGV in 0.3.36) is one line of the report (its
    `error`), not the end of the benchmark."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from rakv.runtime.models import derived_files_dir, file_hash, smollm2_gguf_path

    q4 = smollm2_gguf_path()
    f32 = derived_files_dir() / "gguf" / f"{file_hash(q4)}-f32.gguf"
    out = {}
    for label, path in (("f32", f32), ("q4_1", q4)):
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as child:
            try:
                out[label] = child.submit(_llama_cpp_model, label, str(q4), str(path), prompt, long_prompt, n,
                                          repeats, threads).result()
            except BrokenProcessPool:
                out[label] = LlamaCppMeasure(error="llama.cpp's process died (a crash inside llama.cpp)")
            except RuntimeError as exc:
                out[label] = LlamaCppMeasure(error=str(exc))
    return LlamaCppRun(**out)


def _llama_cpp_model(label: str, q4: str, path: str, prompt: str, long_prompt: str, n: int, repeats: int,
                     threads: int) -> LlamaCppMeasure:
    """One model of llama_cpp_peer, in its child process (the F32 file converted from the Q4_1 one first, once)."""
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
    return LlamaCppMeasure(version=getattr(llama_cpp, "__version__", "?"), ms_per_token=statistics.median(decode),
                           prefill_tokens_per_s=statistics.median(prefill), prefill_tokens=len(long_tokens),
                           tokens=text)


def model_row(measured: LlamaCppMeasure, ours_tokens: list[int]) -> LlamaCppModel:
    if measured.error is not None:
        return LlamaCppModel(error=measured.error)
    return LlamaCppModel(version=measured.version, ms_per_token=measured.ms_per_token,
                         prefill_tokens_per_s=measured.prefill_tokens_per_s, prefill_tokens=measured.prefill_tokens,
                         same_first_tokens_as_ours=measured.tokens[:16] == ours_tokens[:16])


def llama_cpp_row(peer: LlamaCppRun | None, ours_tokens: list[int], ours_decode_ms: float,
                  prefill_tps: float) -> LlamaCppRow | None:
    """Each llama.cpp model's row (only its error where its process died), and ours against F32 where F32 ran."""
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
