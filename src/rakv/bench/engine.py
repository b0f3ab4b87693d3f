"""The engine benchmark's measurements (scripts/bench_engine.py prints them; docs/engine.md): our engine beside
transformers (and llama.cpp: rakv.bench.llama_cpp), the GEMM by row count, the store's TTFT, the draft's reuse,
batched steps and prefill; memory and start-up in fresh processes (rakv.bench.engine_load). Timings go through
rakv.runtime.calibration's measurement functions (`Point`, `measure_interleaved`, `forward_points`): one warm-up,
interleaved shuffled passes, medians, noisy points measured again. The report is rakv.bench.engine_report's
`EngineReport`; each goal's threshold and verdict are rakv.bench.goals'.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

import torch

from rakv.bench.engine_load import fresh_rss, probe_memory, startup
from rakv.bench.engine_report import (
    Acceptance,
    BatchRow,
    ChunkRow,
    DraftReuse,
    DraftReuseRow,
    DraftRow,
    EngineReport,
    FloorRow,
    GemmRow,
    GemmSide,
    GemmTable,
    GenerationRow,
    PrecisionDraft,
    PrecisionFloor,
    PrecisionMachine,
    PrecisionPeerFile,
    PrecisionPeerTable,
    PrecisionRatio,
    PrecisionSide,
    PrefillRow,
    PrefillSeconds,
    TtftRow,
    VerifyRow,
)
from rakv.bench.goals import (
    AR_OVER_FLOOR,
    BATCH_GOALS,
    CHUNK_BESIDE_DECODES,
    DRAFT_OVER_FLOOR,
    DRAFT_OVER_TARGET,
    GENERATION_GOALS,
    PEER_Q4_DECODE,
    PEER_Q4_PREFILL,
    VERIFY_OVER_STEP,
    judge,
)
from rakv.bench.llama_cpp import llama_cpp_peer, llama_cpp_row
from rakv.bench.options import EngineBenchOptions
from rakv.bench.roofline import (
    RowCost,
    distinct_bytes,
    measured_limits,
    row_costs,
    streaming_bandwidth,
    weight_bytes,
)
from rakv.runtime.actions import AR, JOINT_K4, KV_ONLY, SPEC_K, SPEC_K4, Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.calibration import CalibrationPlan, Point, forward_points, measure_interleaved
from rakv.runtime.compact import Segment
from rakv.runtime.costmodel import CostTable, acceptance_estimate, read_cost_table
from rakv.runtime.decoding import crop_cache, forward, forward_rows, synchronize
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import compact_of, new_kv_cache
from rakv.runtime.models import load_pair
from rakv.runtime.run_layout import RunLayout
from rakv.runtime.workloads import load_humaneval

K = TypeVar("K", bound=Hashable)  # a measured point's name: a forward's width, or a case's name


def side(who: str, strategy: str) -> str:
    """A generation call's name, as --probe takes it: `who` ("ours" or "hf") and the strategy (`ours-ar`)."""
    return f"{who}-{strategy}"


SIDES = tuple(side(who, s) for s in (AR, SPEC_K4) for who in ("ours", "hf"))  # the four generation calls


def medians_ms(points: dict[K, Point], device, repeats: int) -> dict[K, float]:
    """Each point's median in ms, measured as calibration measures (rakv.runtime.calibration.measure_interleaved)."""
    measure_interleaved(points, device, CalibrationPlan(repeats=repeats))
    return {key: point.median * 1e3 for key, point in points.items()}


def make_sides(pair, stock, engine, ids, n) -> dict[str, Callable[[], object]]:
    """The four generation calls compared: ours (on `pair`) and transformers' (on `stock`), plain and speculative."""
    target, draft = stock.target.module, stock.draft.module
    hf_input = torch.tensor([ids], device=pair.device)
    # transformers stops at EOS even with min_new_tokens-free configs; we time exactly n tokens on both sides
    target.generation_config.eos_token_id = None
    config = copy.deepcopy(target.generation_config)
    config.update(max_new_tokens=n, do_sample=False, pad_token_id=pair.tokenizer.pad_token_id or 0,
                  num_assistant_tokens=4, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)

    def ours(strategy):
        engine.store.clear()
        return engine.run(ids, Action.of_strategy(strategy), n, ignore_eos=True)

    def theirs(assistant):
        with torch.inference_mode():
            out = target.generate(hf_input, attention_mask=torch.ones_like(hf_input), generation_config=config,
                                  assistant_model=assistant)
        return out[0, len(ids):].tolist()

    return {side("ours", AR): lambda: ours(AR), side("hf", AR): lambda: theirs(None),
            side("ours", SPEC_K4): lambda: ours(SPEC_K4), side("hf", SPEC_K4): lambda: theirs(draft)}


def verify_ratios(engine, context: list[int], repeats: int) -> dict[int, float]:
    """Median target forward over k + 1 new tokens / median one-token step, on a cache holding `context`;
    key 0: the step in seconds."""
    ms = step_ms(engine.pair.target.module, engine.pair.device, context, (1, *(k + 1 for k in SPEC_K)), repeats)
    return {width - 1: t / ms[1] for width, t in ms.items() if width > 1} | {0: ms[1] / 1e3}


def step_ms(model, device, context: list[int], widths, repeats: int) -> dict[int, float]:
    """Median ms of one forward over `width` new tokens on a cache holding `context`, interleaved over widths."""
    ids = torch.tensor([context], device=device)
    cache = new_kv_cache(model)
    with torch.inference_mode():
        forward(model, ids[:, :-max(widths)], cache, keep=1)
        return medians_ms(forward_points(model, ids, cache, cache.get_seq_length(), widths), device, repeats)


def batched_steps_ms(model, device, contexts: list[list[int]], sizes, repeats: int) -> dict[int, float]:
    """Median ms of one batched decode step of b requests (each one new token on its own context)."""
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
        points = {b: Point(lambda b=b: forward_rows(model, segments[:b]), crop_back) for b in sizes}
        return medians_ms(points, device, repeats)


def reuse_prompts(engine, problems, tokens: int) -> tuple[list[int], list[int]]:
    """A ~`tokens`-token prompt of HumanEval text, and one sharing its first half."""
    prompts = list(problems["prompt"])
    long_ids = engine.encode("\n".join(prompts))[:tokens]
    half = len(long_ids) // 2
    return long_ids, long_ids[:half] + engine.encode("\n".join(reversed(prompts)))[: len(long_ids) - half]


def draft_reuse_rows(engine, prompt: list[int], partial: list[int], repeats: int) -> DraftReuse:
    """A joint-k4 request's draft prefill (the time before its first round that is the draft's) on an exact repeat
    and on a 50 % partial hit of a speculating earlier request, with the draft's K/V in the store entry and without
    (conf/cache: reuse_draft), interleaved; medians."""
    rows = []
    for ids in (prompt, partial):
        seconds, hits = {True: [], False: []}, {}
        for _ in range(repeats):
            for reuse_draft in (True, False):
                engine.reuse_draft = reuse_draft
                engine.store.clear()
                engine.run(prompt, Action(False, 1), 1)  # the earlier request: the draft prefills, nothing verified
                result = engine.run(ids, Action.of_strategy(JOINT_K4), 2, ignore_eos=True)
                seconds[reuse_draft].append(result.draft_prefill_s)
                hits[reuse_draft] = result.draft_hit_tokens
        engine.reuse_draft = True
        with_s, without_s = statistics.median(seconds[True]), statistics.median(seconds[False])
        rows.append(DraftReuseRow(with_s * 1e3, without_s * 1e3, with_s / without_s, hits[True]))
    return DraftReuse(*rows)


def gemm_table(pair, repeats: int, rows=(1, 2, 4, 5, 8, 12, 16, 32, 64, 128, 256, 512)) -> GemmTable:
    """kernels.cpp's GEMM by row count: one pass through every projection of the pair's compact target (fp32) and
    of its int8 draft (when it has one), on random inputs; and the FMA peak the kernels measure on this machine."""
    from rakv.runtime.kernels import native

    target, draft = compact_of(pair.target.module), compact_of(pair.draft.module)
    sides = {"fp32": target.projections()}
    if draft is not None and draft.projections()[0].scale is not None:
        sides["int8"] = draft.projections()
    inputs = {k: torch.randn(max(rows), k) for k in {p.in_features for ps in sides.values() for p in ps}}
    macs = {name: sum(p.out_features * p.in_features for p in ps) for name, ps in sides.items()}
    nbytes = {name: distinct_bytes([t for p in ps for t in p.tensors()]) for name, ps in sides.items()}
    points = {(name, m): Point(lambda name=name, m=m: [p(inputs[p.in_features][:m]) for p in sides[name]])
              for name in sides for m in rows}
    with torch.inference_mode():
        measure_interleaved(points, pair.device, CalibrationPlan(repeats=repeats))
    times = {key: point.samples for key, point in points.items()}
    peak = statistics.median(native().fma_peak_gflops(50_000_000) for _ in range(3))
    table = GemmTable(fma_peak_gflops=peak, threads=torch.get_num_threads(), sides={})
    for name in sides:
        one = statistics.median(times[name, 1])
        median = {m: statistics.median(times[name, m]) for m in rows}
        table.sides[name] = GemmSide(nbytes[name], [
            GemmRow(rows=m, ms=median[m] * 1e3, over_one=median[m] / one, gflops=2 * m * macs[name] / median[m] / 1e9,
                    gb_s=nbytes[name] / median[m] / 1e9) for m in rows])
    return table


def chunk_beside_decodes_ms(model, device, contexts: list[list[int]], chunk: int,
                            repeats: int) -> tuple[float, float]:
    """A batched step of 4 decoding requests (256-token contexts) alone and with a `chunk`-token prefill chunk of a
    fifth request (after 256 positions of its own) in the same pass; medians of interleaved repeats (ms): (alone,
    with the chunk)."""
    caches = [new_kv_cache(model) for _ in range(5)]
    with torch.inference_mode():
        for cache, context in zip(caches, contexts):
            forward(model, torch.tensor([context[:256]], device=device), cache, keep=1)
        decodes = [Segment(torch.tensor(c[256:257], device=device), cache, 1) for c, cache in zip(contexts, caches)]
        piece = Segment(torch.tensor(contexts[4][256:256 + chunk], device=device), caches[4], 1)

        def crop_back():
            for cache in caches:
                crop_cache(cache, 256)

        points = {alone: Point(lambda segments=segments: forward_rows(model, segments), crop_back)
                  for alone, segments in ((True, decodes[:4]), (False, decodes[:4] + [piece]))}
        ms = medians_ms(points, device, repeats)
        return ms[True], ms[False]


def prefill_seconds(target, draft, device, ids: list[int], lengths, repeats: int) -> PrefillSeconds:
    """Median seconds of a cold prefill of `n` tokens (logits of the last one), per model, interleaved."""
    models = {"target": target, "draft": draft}
    points = {(name, n): Point(lambda model=model, n=n: forward(model, torch.tensor([ids[:n]], device=device),
                                                                 new_kv_cache(model), keep=1))
              for name, model in models.items() for n in lengths}
    with torch.inference_mode():
        ms = medians_ms(points, device, repeats)
    return PrefillSeconds(*({n: ms[name, n] / 1e3 for n in lengths} for name in models))


def previous_prefill(pair_name: str) -> CostTable | None:
    """The previous engine's calibration (data/reference/offline-fast-kernels): its prefill curves, target and
    draft."""
    path = RunLayout.reference("offline-fast-kernels").calibration(pair_name, "draft")
    if not path.exists():
        return None
    return read_cost_table(path)


def load_sides(options: EngineBenchOptions):
    """Our pair (with `options.kernels`), a stock copy for transformers, our engine and the prompt (HumanEval/2)."""
    pair = load_pair(options.pair, device=options.device, threads=options.threads, kernels=options.kernels,
                     precision=options.precision)
    stock = load_pair(options.pair, device=options.device, threads=options.threads, kernels="stock")
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30))
    return pair, stock, engine, engine.encode(load_humaneval()[2]["prompt"])


@dataclass(frozen=True)
class Generations:
    """The four generation calls (`SIDES`) timed interleaved: ms per token, our AR's ms per token after the first
    (as llama.cpp's decode rate is counted), each side's output and peak memory increase."""

    ms: dict[str, float]
    outputs: dict[str, object]
    memory: dict[str, float]
    decode_ms: float

    def row(self, kind: str) -> GenerationRow:
        """Ours beside transformers for the strategy `kind` (AR or SPEC_K4 of rakv.runtime.actions)."""
        ours, hf = side("ours", kind), side("hf", kind)
        return GenerationRow(ours_ms_per_token=self.ms[ours], hf_ms_per_token=self.ms[hf],
                             ratio=self.ms[ours] / self.ms[hf], goal=GENERATION_GOALS[kind].threshold,
                             same_output=self.outputs[ours].token_ids == self.outputs[hf],
                             ours_peak_mib=self.memory[ours], hf_peak_mib=self.memory[hf])


def generations(options: EngineBenchOptions, sides: dict, device) -> Generations:
    """The four generation calls, interleaved (drift on a noisy machine hits both sides alike)."""
    n = options.new_tokens
    for fn in sides.values():  # warm-up of every path
        fn()
    times = {label: [] for label in sides}
    decode_ms = []
    for _ in range(options.repeats):
        for label, fn in sides.items():
            start = time.perf_counter()
            result = fn()
            synchronize(device)
            times[label].append(time.perf_counter() - start)
            if label == side("ours", AR):
                decode_ms.append((result.latency_s - result.ttft_s) / (n - 1) * 1e3)
    outputs = {label: fn() for label, fn in sides.items()}
    memory = {label: probe_memory(options, label) for label in sides}
    return Generations({label: statistics.median(t) / n * 1e3 for label, t in times.items()}, outputs, memory,
                       statistics.median(decode_ms))


def store_ttft(engine, long_ids: list[int], other: list[int], repeats: int) -> TtftRow:
    """TTFT with the store: a ~512-token prompt cold, as an exact repeat, and after a 50 % shared prefix."""

    def ttft(prompt, warm=None):
        engine.store.clear()
        if warm is not None:
            engine.run(warm, Action.of_strategy(AR), 1)
        return engine.run(prompt, Action.of_strategy(KV_ONLY), 1).ttft_s

    cold = statistics.median(ttft(long_ids) for _ in range(repeats))
    exact = statistics.median(ttft(long_ids, warm=long_ids) for _ in range(repeats))
    partial = statistics.median(ttft(other, warm=long_ids) for _ in range(repeats))
    return TtftRow(len(long_ids), cold * 1e3, exact * 1e3, partial * 1e3, exact / cold, partial / cold)


def draft_against_target(pair, context: list[int], repeats: int, bandwidth: float) -> DraftRow:
    """The draft's one-token step against the target's (interleaved) and against its own floor."""
    device, draft_model, target_model = pair.device, pair.draft.module, pair.target.module
    target_steps, draft_steps = [], []
    for _ in range(repeats):
        target_steps.append(step_ms(target_model, device, context, (1,), 1)[1])
        draft_steps.append(step_ms(draft_model, device, context, (1,), 1)[1])
    target_step, draft_step = statistics.median(target_steps), statistics.median(draft_steps)
    compact_draft = compact_of(draft_model)
    draft_bytes = (distinct_bytes(compact_draft.projection_tensors()) if compact_draft is not None
                   else weight_bytes(draft_model) - draft_model.get_input_embeddings().weight.nbytes)
    draft_floor = draft_bytes / bandwidth * 1e3
    compact_target = compact_of(target_model)
    target_bytes = (distinct_bytes(compact_target.projection_tensors()) if compact_target is not None
                    else weight_bytes(target_model) - target_model.get_input_embeddings().weight.nbytes)
    return DraftRow(context_tokens=256, target_step_ms=target_step, draft_step_ms=draft_step,
                    draft_over_target=draft_step / target_step, goal_over_target=DRAFT_OVER_TARGET.threshold,
                    weight_bytes=draft_bytes, floor_ms=draft_floor, over_floor=draft_step / draft_floor,
                    goal_over_floor=DRAFT_OVER_FLOOR.threshold, floors_over_target=draft_bytes / target_bytes,
                    floor_over_measured_target=draft_floor / target_step,
                    verdict_over_target=judge(DRAFT_OVER_TARGET, draft_step, target_step, draft_floor))


def prefill_row(prefill: PrefillSeconds, before: CostTable | None, long_ids: list[int], tokens_per_s: float,
                lengths) -> PrefillRow:
    """Prefill at 64-512 tokens, target and draft, against the previous engine's calibrated prefill (its target's
    prefill curve and its draft's)."""
    previous = None if before is None else PrefillSeconds(
        {n: before.target_prefill(n) for n in lengths}, {n: before.proposer_prefill(n) for n in lengths})
    return PrefillRow(prompt_tokens=len(long_ids), ours_tokens_per_s=tokens_per_s, seconds=prefill,
                      previous_engine_seconds=previous,
                      faster_than_previous_everywhere=None if previous is None else all(
                          t < getattr(previous, name)[n] for name, n, t in prefill.points()))


def batch_row(batch: dict[int, float], rows: dict[int, RowCost] | None) -> BatchRow:
    """Batched steps against one request, each goal's verdict (rakv.bench.goals.judge: the step's floor over the
    measured one-row step, where the per-row table measured floors), and the floors' own ratio beside it as context
    only (it bounds no ratio of measured steps)."""
    floors = None if rows is None else {b: row.floor_ms for b, row in rows.items()}
    return BatchRow(context_tokens=256, step_ms=dict(batch), over_one={b: t / batch[1] for b, t in batch.items()},
                    goal_8=BATCH_GOALS[8].threshold, goal_16=BATCH_GOALS[16].threshold,
                    verdicts={b: judge(goal, batch[b], batch[1], floors and floors[b])
                              for b, goal in BATCH_GOALS.items() if b in batch},
                    floor_over_measured_one=None if floors is None else {b: f / batch[1] for b, f in floors.items()},
                    floors_over_one=None if floors is None else {b: f / floors[1] for b, f in floors.items()},
                    by_kernel=rows)


@dataclass(frozen=True)
class KernelRows:
    """What `kernel_rows` measures: the report's kernel rows, and the bandwidth and prefill the others need."""

    bandwidth: float
    prefill: PrefillSeconds
    lengths: tuple[int, ...]
    verify: VerifyRow
    draft: DraftRow
    batch: BatchRow
    chunk_beside_decodes: ChunkRow
    gemm: GemmTable | None


def kernel_rows(pair, engine, long_ids: list[int], repeats: int) -> KernelRows:
    """Verify against one step, the draft's step, batched steps, a chunk beside decodes, prefill, the GEMM."""
    device, target_model = pair.device, pair.target.module
    ratios = verify_ratios(engine, long_ids[:265], repeats * 4)
    steps = [ratios[k] for k in SPEC_K]
    bandwidth = streaming_bandwidth(device)
    prompts = list(load_humaneval()["prompt"])
    contexts = [engine.encode("\n".join(prompts[i::32]))[:257] for i in range(32)]
    sizes = (1, 2, 4, 8, 16, 32)
    compact_cpu = compact_of(target_model) is not None and device.type == "cpu"
    if compact_cpu:  # the per-row cost table, by kernel
        rows = row_costs(target_model, device, contexts, sizes, repeats * 2, measured_limits(device))
        batch = {b: row.step_ms for b, row in rows.items()}
    else:
        rows, batch = None, batched_steps_ms(target_model, device, contexts, sizes, repeats * 2)
    decodes, with_chunk = chunk_beside_decodes_ms(target_model, device, contexts[:5], 32, repeats * 2)
    lengths = (64, 128, 256, 512)
    prefill = prefill_seconds(target_model, pair.draft.module, device, long_ids, lengths, repeats)
    return KernelRows(
        bandwidth=bandwidth, prefill=prefill, lengths=lengths,
        verify=VerifyRow(context_tokens=256, step_ms=ratios[0] * 1e3, goal_k_le_4=VERIFY_OVER_STEP.threshold,
                         verify_over_step={k: ratios[k] for k in SPEC_K},
                         monotone=all(a <= b for a, b in zip(steps, steps[1:]))),
        draft=draft_against_target(pair, long_ids[:257], repeats * 4, bandwidth), batch=batch_row(batch, rows),
        chunk_beside_decodes=ChunkRow(chunk_tokens=32, decodes=decodes, with_chunk=with_chunk,
                                      ratio=with_chunk / decodes, goal=CHUNK_BESIDE_DECODES.threshold),
        gemm=gemm_table(pair, repeats * 2) if compact_cpu else None)


def bench(options: EngineBenchOptions, pair, stock, engine, ids) -> EngineReport:
    """Every measurement of the full benchmark (docs/engine.md), as one report."""
    device, n = pair.device, options.new_tokens
    measured = generations(options, make_sides(pair, stock, engine, ids, n), device)
    spec = measured.outputs[side("ours", SPEC_K4)]
    long_ids, other = reuse_prompts(engine, load_humaneval(), options.long_prompt_tokens)
    ttft = store_ttft(engine, long_ids, other, options.repeats)
    draft_reuse = (draft_reuse_rows(engine, long_ids, other, options.repeats)
                   if engine.proposer_type.has_draft_model else None)
    kernels = kernel_rows(pair, engine, long_ids, options.repeats)
    target_bytes = weight_bytes(stock.target.module)
    floor_ms = target_bytes / kernels.bandwidth * 1e3
    # llama.cpp beside us (optional extra), and this process's own prefill speed on the same long prompt
    peer = None if options.no_peer else llama_cpp_peer(load_humaneval()[2]["prompt"], pair.tokenizer.decode(long_ids),
                                                       n, options.repeats, torch.get_num_threads())
    prefill_tps = (len(long_ids) / kernels.prefill.target[512] if len(long_ids) >= 512
                   else len(long_ids) / (ttft.cold_ms / 1e3))
    return EngineReport(
        pair=pair.name, device=str(device), threads=torch.get_num_threads(), kernels=options.kernels, new_tokens=n,
        prompt_tokens=len(ids), repeats=options.repeats, ar=measured.row(AR), spec_k4=measured.row(SPEC_K4),
        floor=FloorRow(weight_bytes=target_bytes, bandwidth_gb_s=kernels.bandwidth / 1e9, floor_ms=floor_ms,
                       ar_over_floor=measured.ms[side("ours", AR)] / floor_ms, goal=AR_OVER_FLOOR.threshold),
        ttft=ttft, draft_reuse=draft_reuse,
        spec_k4_acceptance=Acceptance(spec.accepted / max(spec.proposed, 1), acceptance_estimate(spec.round_log),
                                      spec.rounds),
        verify=kernels.verify, draft=kernels.draft, batch=kernels.batch,
        chunk_beside_decodes=kernels.chunk_beside_decodes, gemm=kernels.gemm,
        prefill=prefill_row(kernels.prefill, previous_prefill(options.pair), long_ids, prefill_tps, kernels.lengths),
        memory=fresh_rss(options), startup=startup(options),
        llama_cpp=llama_cpp_row(peer, measured.outputs[side("ours", AR)].token_ids, measured.decode_ms, prefill_tps))


def greedy_decode_and_prefill(model, device, ids: list[int], long_ids: list[int], n: int,
                              repeats: int) -> tuple[float, float, list[int]]:
    """Our target alone, as llama.cpp's side is measured (rakv.bench.llama_cpp): greedy decode ms/token after the
    first token (`n` tokens after `ids`) and prefill tokens/s of `long_ids` on an empty cache, medians of `repeats`
    after a warm-up; and the tokens decoded."""
    decode, prefill, tokens = [], [], []
    prompt, long_prompt = torch.tensor([ids], device=device), torch.tensor([long_ids], device=device)
    with torch.inference_mode():
        for repeat in range(repeats + 1):
            cache = new_kv_cache(model)
            token = forward(model, prompt, cache, keep=1)[-1].argmax()
            tokens = [int(token)]
            synchronize(device)
            start = time.perf_counter()
            for _ in range(n - 1):
                token = forward(model, token.view(1, 1), cache, keep=1)[-1].argmax()
                tokens.append(int(token))
            synchronize(device)
            decode_s = (time.perf_counter() - start) / (n - 1)
            start = time.perf_counter()
            forward(model, long_prompt, new_kv_cache(model), keep=1)
            synchronize(device)
            if repeat:
                decode.append(decode_s * 1e3)
                prefill.append(len(long_ids) / (time.perf_counter() - start))
    return statistics.median(decode), statistics.median(prefill), tokens


def precision_peer(options: EngineBenchOptions, thread_counts=(1, 2)) -> PrecisionPeerTable:
    """Our engine's target at each precision (rakv.runtime.models.PRECISIONS) beside llama.cpp on the same GGUF
    (q4_1: the shipped file; fp32: its F32 conversion), at each thread count: decode after the first token and
    prefill of `options.long_prompt_tokens` tokens, with each precision's floor (the bytes a decode step streams /
    the measured stream bandwidth, rakv.bench.roofline), and the pair's draft step over its target step (256
    positions of context). llama.cpp runs in its own venv (rakv.bench.llama_cpp);
    without it, our rows alone."""
    from rakv.bench.llama_cpp import f32_path, peer_python, run_child
    from rakv.runtime.models import PRECISIONS, smollm2_gguf_path

    if options.pair != "smollm2":
        raise RakvError("--precision-peer compares the smollm2 pair with llama.cpp on its GGUF: use --pair smollm2")
    pairs = {p: load_pair("smollm2", device=options.device, threads=max(thread_counts), precision=p)
             for p in PRECISIONS}
    device = pairs["fp32"].device
    engine = Engine(pairs["fp32"], PrefixKVStore(budget_bytes=1 << 20))
    prompt = load_humaneval()[2]["prompt"]
    ids = engine.encode(prompt)
    long_ids, _ = reuse_prompts(engine, load_humaneval(), options.long_prompt_tokens)
    context = (long_ids * (256 // len(long_ids) + 1))[:257]  # a step at 256 positions (step_ms: the last is new)
    bandwidth = streaming_bandwidth(device)
    step_bytes = {p: distinct_bytes(compact_of(pair.target.module).projection_tensors()) for p, pair in pairs.items()}
    floors = {p: PrecisionFloor(p, step_bytes[p], step_bytes[p] / bandwidth * 1e3) for p in pairs}
    python = None if options.no_peer else peer_python()
    sides, ratios, drafts = [], [], []
    for threads in thread_counts:
        torch.set_num_threads(threads)
        ours = {}
        for p, pair in pairs.items():
            decode, prefill, _ = greedy_decode_and_prefill(pair.target.module, device, ids, long_ids,
                                                           options.new_tokens, options.repeats)
            ours[p] = (decode, prefill)
            sides.append(PrecisionSide("ours", p, threads, decode, prefill, decode / floors[p].floor_ms))
            target_ms, draft_ms = (step_ms(model, device, context, (1,), options.repeats)[1]
                                   for model in (pair.target.module, pair.draft.module))
            drafts.append(PrecisionDraft(p, threads, target_ms, draft_ms, draft_ms / target_ms))
        if python is None:
            continue
        q4 = smollm2_gguf_path()
        for p, path in (("q4_1", q4), ("fp32", f32_path(q4))):
            got = run_child(python, "q4_1" if p == "q4_1" else "f32", q4, path, prompt,
                            pairs["fp32"].tokenizer.decode(long_ids), options.new_tokens, options.repeats, threads)
            if got.error is not None:
                sides.append(PrecisionSide("llama.cpp", p, threads, error=got.error))
                continue
            sides.append(PrecisionSide("llama.cpp", p, threads, got.ms_per_token, got.prefill_tokens_per_s,
                                       got.ms_per_token / floors[p].floor_ms))
            decode_ratio = ours[p][0] / got.ms_per_token
            prefill_ratio = got.prefill_tokens_per_s / ours[p][1]  # our time over theirs
            judged = p == "q4_1"  # the goals are at the precision users run; fp32's ratios are context
            ratios.append(PrecisionRatio(p, threads, decode_ratio,
                                         judge(PEER_Q4_DECODE, decode_ratio) if judged else "context, not judged",
                                         prefill_ratio,
                                         judge(PEER_Q4_PREFILL, prefill_ratio) if judged else "context, not judged"))
    return PrecisionPeerTable(pair=options.pair, new_tokens=options.new_tokens, prefill_tokens=len(long_ids),
                              repeats=options.repeats, bandwidth_gb_s=bandwidth / 1e9, floors=list(floors.values()),
                              sides=sides, ratios=ratios, drafts=drafts)


def cpu_label(processor: str) -> str:
    """A CPU's model name as a file name's part: lower case, each run of other characters than letters and digits
    one '-' ("AMD EPYC 9R14 96-Core Processor" -> "amd-epyc-9r14-96-core-processor")."""
    import re

    return re.sub(r"[^a-z0-9]+", "-", processor.lower()).strip("-") or "unknown-cpu"


def precision_machine(load_1min: float) -> PrecisionMachine:
    """This machine as a precision benchmark records it (hardware_fingerprint's processor, kernels' ISA, cores),
    with the checkout's commit, today's UTC date and `load_1min` (read before the benchmark started)."""
    import os
    import subprocess

    from rakv.runtime.calibration import kernels_isa, processor_name, usable_cores
    from rakv.runtime.paths import ROOT

    processor = processor_name(torch.device("cpu"))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                                check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return PrecisionMachine(processor=processor, label=cpu_label(processor),
                            kernels_isa=kernels_isa(), cores=usable_cores() or os.cpu_count() or 1,
                            commit=commit, date=time.strftime("%Y-%m-%d", time.gmtime()), load_1min=load_1min)


def precision_peer_file(options: EngineBenchOptions) -> PrecisionPeerFile:
    """precision_peer's table with the machine it ran on (the load read before it starts): the shipped record."""
    import os

    load = os.getloadavg()[0]
    table = precision_peer(options)
    return PrecisionPeerFile(machine=precision_machine(load), table=table)
