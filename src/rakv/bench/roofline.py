"""What this machine allows a forward pass, and where a pass's time goes: the two limits measured here (the FMA
peak of kernels.cpp, the memory's streaming bandwidth), the floor of one pass and of a whole all-at-once trace
built from them, and a batched step's time split by kernel (scripts/bench_engine.py and scripts/bench_serving.py
print both; docs/engine.md says how to read them).

A pass over `rows` new tokens costs at least the larger of its FLOPs at the FMA peak and its bytes (every weight
once, each request's K/V once) at the streaming bandwidth: a decode step is bound by the bytes, a prefill by the
FLOPs. The trace's bound adds the prefills (FLOPs at the peak) and the decode steps (bytes at the bandwidth, or
FLOPs where more rows make them the larger): it is what the hardware allows, not what any schedule reaches.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from rakv.runtime.calibration import CalibrationPlan, Point, measure_interleaved, time_once
from rakv.runtime.compact import Segment
from rakv.runtime.decoding import crop_cache, forward, forward_rows
from rakv.runtime.kernels import attention, compact_of, new_kv_cache


@dataclass(frozen=True)
class Limits:
    """The machine's two limits as measured here: fp32 FMA GFLOPS of all threads, streaming GB/s."""

    fma_peak_gflops: float
    stream_gb_s: float


def distinct_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (a tied or shared tensor counted once)."""
    seen = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def model_tensors(module) -> list:
    """Every tensor a model holds: its state and its compact copy's packed tensors (a compact-only model: those)."""
    compact = compact_of(module)
    if compact is not None and compact is module:  # a compact-only model (the int8 draft)
        return compact.tensors()
    return list(module.state_dict().values()) + (compact.tensors() if compact is not None else [])


def weight_bytes(module) -> int:
    """Bytes of the distinct parameter storages (a tied embedding counted once): what one token streams."""
    return distinct_bytes(model_tensors(module))


def streaming_bandwidth(device, repeats: int = 7) -> float:
    """Bytes per second of a reduction over 512 MiB (a sum reads each byte once)."""
    x = torch.ones(2**27, device=device)
    times = [time_once(Point(x.sum), device) for _ in range(repeats + 1)][1:]
    return 2**29 / statistics.median(times)


def measured_limits(device) -> Limits:
    """The FMA peak kernels.cpp reaches here (twelve independent chains per thread; CPU only) and the stream."""
    from rakv.runtime.kernels import native

    peak = statistics.median(native().fma_peak_gflops(50_000_000) for _ in range(3))
    return Limits(peak, streaming_bandwidth(device) / 1e9)


@dataclass(frozen=True)
class Geometry:
    """What a pass of a compact model reads and computes, from its loaded tensors."""

    weight_bytes: int  # every tensor a one-token step reads whole (projections, head, norms)
    body_macs: int  # multiply-adds per row of the layers' projections (the output head excluded)
    head_macs: int  # multiply-adds per row of the output head (computed only for rows whose logits are kept)
    layers: int
    heads: int
    head_dim: int
    kv_bytes_per_position: int  # K and V of every layer, fp32

    @classmethod
    def of(cls, module) -> Geometry:
        model = compact_of(module)
        if model is None:
            raise ValueError("the roofline needs a compact model (kernels=compact)")
        body = [p for b in model.blocks for p in (b.qkv, b.out, b.up, b.down)]
        return cls(weight_bytes=distinct_bytes(model.projection_tensors()),
                   body_macs=sum(p.out_features * p.in_features for p in body),
                   head_macs=model.lm_head.out_features * model.lm_head.in_features, layers=len(model.blocks),
                   heads=model.heads, head_dim=model.head_dim,
                   kv_bytes_per_position=2 * len(model.blocks) * model.kv_heads * model.head_dim * 4)

    def prefill_flops(self, tokens: int) -> float:
        """A prompt's prefill: every row through the layers (attention's QK and PV over its causal prefix
        included), logits for its last row only."""
        attention_macs = 2 * self.layers * self.heads * self.head_dim * tokens * (tokens + 1) / 2
        return 2 * (tokens * self.body_macs + attention_macs + self.head_macs)

    def decode_step_s(self, positions: list[int], limits: Limits) -> float:
        """The floor of one decode step of len(positions) requests, each attending over its own positions."""
        kv = sum(positions) * self.kv_bytes_per_position
        flops = 2 * len(positions) * (self.body_macs + self.head_macs) + sum(
            4 * self.layers * self.heads * self.head_dim * p for p in positions)
        return max((self.weight_bytes + kv) / (limits.stream_gb_s * 1e9), flops / (limits.fma_peak_gflops * 1e9))


@dataclass(frozen=True)
class TraceBound:
    """The fastest this machine could serve a trace (`trace_bound`): seconds, its two parts, output tokens/s."""

    seconds: float
    prefill_s: float
    decode_s: float
    tok_s: float


def trace_bound(geometry: Geometry, limits: Limits, prompt_tokens: list[int], new_tokens: int, c: int) -> TraceBound:
    """The fastest this machine could serve `prompt_tokens` requests arriving at once, `new_tokens` each, at most
    `c` at a time: every prefill at the FMA peak (its first token included), then the decode steps of waves of `c`
    requests in arrival order, each step at its floor (`Geometry.decode_step_s`). Returns the seconds, its two
    parts and the output tokens/s it allows."""
    prefill_s = sum(geometry.prefill_flops(n) for n in prompt_tokens) / (limits.fma_peak_gflops * 1e9)
    decode_s = 0.0
    for first in range(0, len(prompt_tokens), c):
        wave = prompt_tokens[first:first + c]
        decode_s += sum(geometry.decode_step_s([n + t for n in wave], limits) for t in range(1, new_tokens))
    seconds = prefill_s + decode_s
    return TraceBound(seconds, prefill_s, decode_s,
                      len(prompt_tokens) * new_tokens / seconds if seconds > 0 else math.inf)


@dataclass(frozen=True)
class RowCost:
    """A batched decode step of b requests and its parts (`row_costs`; ms, K/V in MB), a line of the per-row table
    (the benchmarks' reports keep it under the key b as written)."""

    step_ms: float
    over_one: float
    gemm_ms: float
    attention_ms: float
    other_ms: float
    kv_mb: float
    floor_ms: float


def row_costs(model, device, contexts: list[list[int]], sizes, repeats: int, limits: Limits) -> dict[int, RowCost]:
    """A batched decode step of b requests (each one new token after its own context) for each b in `sizes`, and
    its parts timed alone on the same rows: the projections (GEMM, every layer's and the head's), attention (every
    layer's call over the b requests' K/V) and the rest (norms, activation, embedding, the Python between kernels:
    the step minus the two). Beside it the step's floor (`Geometry.decode_step_s`). Medians of interleaved
    repeats, ms. The parts are timed as calls from Python, one per kernel, while the step on the CPU runs every
    layer in one call (rakv.runtime.kernels.forward_blocks): the rest is negative where the step saves more
    dispatch than its norms and activations cost."""
    compact, geometry = compact_of(model), Geometry.of(model)
    caches = [new_kv_cache(model) for _ in contexts]
    with torch.inference_mode():
        for cache, context in zip(caches, contexts):
            forward(model, torch.tensor([context[:-1]], device=device), cache, keep=1)
        lengths = [c.get_seq_length() for c in caches]

        def crop_back():
            for cache, length in zip(caches, lengths):
                crop_cache(cache, length)

        segments = [Segment(torch.tensor(context[-1:], device=device), cache, 1)
                    for context, cache in zip(contexts, caches)]
        width = (compact.heads + 2 * compact.kv_heads) * compact.head_dim
        qkv = torch.randn(max(sizes), width, device=device)
        hidden = {k: torch.randn(max(sizes), k, device=device) for k in {p.in_features for p in compact.projections()}}

        def attend(b):
            rotary = ((compact.rotary.cos[lengths[:b]], compact.rotary.sin_signed[lengths[:b]])
                      if compact.rotary is not None else None)
            for index in range(len(compact.blocks)):
                layers = [cache.layers[index] for cache in caches[:b]]
                for layer in layers:
                    layer.extend(1, compact.kv_heads, compact.head_dim, qkv)
                attention(qkv[:b].clone(), layers, lengths[:b], [1] * b, compact.heads, compact.kv_heads,
                          compact.scale, rotary)

        points = {}
        for b in sizes:
            points["step", b] = Point(lambda b=b: forward_rows(model, segments[:b]), crop_back)
            points["gemm", b] = Point(lambda b=b: [p(hidden[p.in_features][:b]) for p in compact.projections()])
            points["attention", b] = Point(lambda b=b: attend(b), crop_back)
        measure_interleaved(points, device, CalibrationPlan(repeats=repeats))
    ms = {key: point.median * 1e3 for key, point in points.items()}
    one = ms["step", sizes[0]]
    return {b: RowCost(step_ms=ms["step", b], over_one=ms["step", b] / one, gemm_ms=ms["gemm", b],
                       attention_ms=ms["attention", b],
                       other_ms=ms["step", b] - ms["gemm", b] - ms["attention", b],
                       kv_mb=sum(lengths[:b]) * geometry.kv_bytes_per_position / 1e6,
                       floor_ms=geometry.decode_step_s(lengths[:b], limits) * 1e3) for b in sizes}


def format_row_costs(rows: dict[int, RowCost]) -> list[str]:
    """The per-row cost table, one line per batch size."""
    lines = [f"{'rows':>4} {'step ms':>8} {'/ one':>6} {'GEMM':>7} {'attention':>9} {'other':>6} {'K/V MB':>7} "
             f"{'floor ms':>8} {'step/floor':>10}"]
    for b, r in rows.items():
        lines.append(f"{b:>4} {r.step_ms:8.1f} {r.over_one:6.2f} {r.gemm_ms:7.1f} {r.attention_ms:9.1f} "
                     f"{r.other_ms:6.1f} {r.kv_mb:7.1f} {r.floor_ms:8.1f} {r.step_ms / r.floor_ms:10.2f}")
    return lines


def goal_verdict(numerator: float, baseline: float, goal: float, numerator_limit: float | None,
                 higher_is_better: bool = False) -> str:
    """A ratio goal's verdict, `numerator / baseline` against `goal` (e.g. a 16-row step over the measured one-row
    step <= 1.6, or tokens/s at c = 16 over the measured c = 8 >= 1.2): `met`, `missed`, or `out of reach at this
    baseline`, and the last only where it is a claim no faster engine can contradict (docs/engine.md).

    `numerator_limit` is what the machine allows the numerator in this run: the step's floor
    (`Geometry.decode_step_s`; the numerator is a time, lower is better) or the trace's bound in tokens/s
    (`trace_bound`; higher is better). The claim: with the limits measured in this run, no engine whose baseline is
    no slower than the one measured here meets the goal. It holds because every engine's numerator is on the far
    side of its limit (a step takes at least its floor, a trace serves at most its bound), and a faster baseline only
    moves the ratio further from the goal (a smaller one-row time raises 16 rows / one; more tokens/s at c = 8 lower
    c = 16 / c = 8); so it is judged from `numerator_limit / baseline`, the baseline measured, never from a ratio of
    two limits: a ratio of lower bounds is no bound on a ratio, and an engine whose one-row step sits above its floor
    can meet a 16 / 1 goal that the floors' own ratio misses. An engine with a slower baseline could meet the goal;
    the claim does not cover it (a slower engine is no remedy). Two limits of the claim: the floors are at the
    streaming bandwidth and FMA peak measured in the same run, which move with a shared machine's load; and where
    this run's own numerator beats its limit, the limit is no bound here and the verdict is `missed`, not the third.
    Without a limit (no compact model, or not on the CPU) the verdict is `met` or `missed`."""
    def meets(value: float) -> bool:
        return value >= goal if higher_is_better else value <= goal

    if meets(numerator / baseline):
        return "met"
    if numerator_limit is None:
        return "missed"
    within_limit = numerator <= numerator_limit if higher_is_better else numerator >= numerator_limit
    allowed = numerator_limit / baseline
    if within_limit and not meets(allowed):
        return f"out of reach at this baseline: its limit over the measured baseline is {allowed:.2f}"
    return "missed"
