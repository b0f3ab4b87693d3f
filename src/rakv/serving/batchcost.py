"""The batch cost model: what one serving iteration costs, measured on this machine (README: "Serving study").

An iteration (rakv.serving.runner) is one batched target forward that `rakv.runtime.decoding.forward_rows`
runs as passes over the weights: the small rows (decode and verify rows, a short prompt's prefill) in passes of
at most 16 rows through the C++ kernels, the large ones (prefill chunks of long prompts) in one MKL pass; before
it, the proposer's candidates (a draft model's steps batched across requests, or prompt lookup per request).
So its cost is

    T = small(rows, context) + large(rows, context) + proposer(requests, k)

with `small` and `large` measured 2-D tables over the rows computed and the K/V positions each row attends
over (their mean), interpolated linearly between measured points and made non-decreasing along both axes,
as the per-request tables are (rakv.runtime.calibration: interleaved shuffled passes, medians, re-measured when
noisy, refused when still noisy). The draft's batched step is a 1-D table over requests. The tables are stored
under the pair's and the machine's fingerprints, like the per-request calibration; `iteration_s` predicts an
iteration, and the serving study checks it against every iteration it runs (held-out MAPE).
"""

from __future__ import annotations

import bisect
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from rakv.runtime.calibration import (CalibrationPlan, Point, calibration_dir, calibration_key, key_digest,
                                      measure_interleaved, refuse_if_noisy)
from rakv.runtime.compact import Segment
from rakv.runtime.costmodel import Curve, non_decreasing
from rakv.runtime.decoding import crop_cache, forward, forward_rows
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import SKINNY_MAX_ROWS, new_kv_cache
from rakv.runtime.proposers import DraftModelProposer

METHOD = "batch-grid/1"  # part of the key: a table measured another way is stale


@dataclass(frozen=True)
class BatchPlan:
    small_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    large_rows: tuple[int, ...] = (12, 32, 64, 128, 256, 512)
    contexts: tuple[int, ...] = (64, 512, 1024)  # mean K/V positions a row attends over
    large_contexts: tuple[int, ...] = (0, 512)  # positions already computed before a prefill chunk
    proposer_requests: tuple[int, ...] = (1, 2, 4, 8, 16)
    proposer_context: int = 256
    repeats: int = 5


@dataclass
class Grid:
    """A measured cost over (rows, context): one table Curve over rows per measured context, interpolated
    linearly between the contexts (and along the end segments beyond them)."""

    contexts: list[float]
    by_context: list[Curve]

    def __call__(self, rows: float, context: float) -> float:
        if rows <= 0:
            return 0.0
        values = [curve(rows) for curve in self.by_context]
        if len(values) == 1:
            return values[0]
        # linear between the two measured contexts around `context` (the end pair beyond the ends)
        i = min(max(bisect.bisect_right(self.contexts, context), 1), len(self.contexts) - 1)
        c0, c1 = self.contexts[i - 1], self.contexts[i]
        return max(values[i - 1] + (values[i] - values[i - 1]) * (context - c0) / (c1 - c0), 0.0)

    @classmethod
    def measured(cls, rows: list[int], contexts: list[int], medians: np.ndarray, spread: np.ndarray,
                 samples: np.ndarray) -> "Grid":
        """medians[i, j]: rows[i] at contexts[j]; made non-decreasing along rows, then along contexts."""
        values = np.asarray(medians, float).copy()
        for _ in range(2):  # pooling one axis can break the other's order only at ties: twice settles it
            values = np.stack([non_decreasing(values[:, j]) for j in range(values.shape[1])], axis=1)
            values = np.stack([non_decreasing(values[i]) for i in range(values.shape[0])], axis=0)
        curves = []
        for j in range(len(contexts)):
            curve = Curve.table(rows, values[:, j], spread[:, j], samples[:, j], monotone=False)
            curve.max_rel_error = float((np.abs(values[:, j] - medians[:, j]) / np.maximum(medians[:, j], 1e-12)).max())
            curves.append(curve)
        return cls([float(c) for c in contexts], curves)

    def to_json(self) -> dict:
        return {"contexts": self.contexts, "by_context": [asdict(c) for c in self.by_context]}

    @classmethod
    def from_json(cls, row: dict) -> "Grid":
        return cls(row["contexts"], [Curve(**c) for c in row["by_context"]])


@dataclass
class BatchCost:
    key: dict
    small: Grid  # seconds of the small-row passes vs (rows, mean context)
    large: Grid  # seconds of the MKL pass over prefill chunks vs (rows, context before the chunk)
    proposer: str
    proposer_step: Curve  # draft: one batched draft step vs requests; prompt lookup: proposals vs requests
    measured_s: float = 0.0
    load_average: list[float] = field(default_factory=list)

    def propose_s(self, ks: list[int]) -> float:
        """The proposer's part of an iteration whose decodes propose `ks` candidates each."""
        ks = [k for k in ks if k > 0]
        if not ks:
            return 0.0
        if self.proposer != "draft":
            return self.proposer_step(len(ks))  # one lookup per proposing request, whatever its k
        # a draft round: the catch-up pass, then k - 1 steps over the requests still drafting (propose_batch)
        return sum(self.proposer_step(sum(k > step for k in ks)) for step in range(max(ks)))

    def iteration_s(self, small_rows: int, small_context: float, large_rows: int = 0, large_context: float = 0.0,
                    ks: list[int] = ()) -> float:
        return (self.small(small_rows, small_context) + self.large(large_rows, large_context)
                + self.propose_s(list(ks)))

    def decode_s(self, decodes: list[tuple[int, int]], ks: list[int] | None = None) -> float:
        """An iteration of decodes only: (rows, context) per request, `ks` its candidates (rows - 1 if None)."""
        rows = sum(r for r, _ in decodes)
        if not rows:
            return 0.0
        context = sum(r * c for r, c in decodes) / rows
        return self.iteration_s(rows, context, ks=[r - 1 for r, _ in decodes] if ks is None else ks)

    def to_json(self) -> dict:
        row = asdict(self)
        row["small"], row["large"] = self.small.to_json(), self.large.to_json()
        return row

    @classmethod
    def from_json(cls, row: dict) -> "BatchCost":
        row = dict(row)
        row["small"], row["large"] = Grid.from_json(row["small"]), Grid.from_json(row["large"])
        row["proposer_step"] = Curve(**row["proposer_step"])
        return cls(**row)


def batch_cost_key(engine) -> dict:
    return {**calibration_key(engine.pair, engine.proposer), "method": METHOD}


def calibrate_batch(engine, plan: BatchPlan = BatchPlan(), progress: bool = True,
                    noise: CalibrationPlan = CalibrationPlan()) -> BatchCost:
    """Measure the small and large passes and the proposer's batched step on `engine`'s pair."""
    pair, device = engine.pair, engine.pair.device
    target = pair.target.module
    limit = pair.max_context
    contexts = [c for c in plan.contexts if c + max(plan.small_rows) < limit] or [min(plan.contexts[0], limit // 4)]
    large_contexts = [c for c in plan.large_contexts if c + max(plan.large_rows) < limit]
    large_rows = [n for n in plan.large_rows if n + max(large_contexts) < limit]
    filler = torch.randint(100, pair.vocab_size - 100, (1, limit), generator=torch.Generator().manual_seed(0))
    filler = filler.to(device)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    points: dict[tuple, Point] = {}
    with torch.inference_mode():
        prefix = new_kv_cache(target)
        forward(target, filler[:, :max(contexts + large_contexts) + 1], prefix, keep=1)
        layers = [(layer.keys, layer.values) for layer in prefix.layers]
        del prefix
        for context in contexts:
            # a decode-like pass: up to 16 requests (SKINNY_MAX_ROWS) of rows / requests rows each, one cache each
            caches = [new_kv_cache(target, [(k[:, :, :context], v[:, :, :context]) for k, v in layers])
                      for _ in range(min(max(plan.small_rows), SKINNY_MAX_ROWS))]
            for rows in plan.small_rows:
                requests = min(rows, SKINNY_MAX_ROWS)
                per = rows // requests
                ids = filler[0, context:context + per]
                used = caches[:requests]
                points["small", rows, context] = Point(
                    lambda used=used, ids=ids: forward_rows(target, [Segment(ids, c, 0, small=True) for c in used]),
                    lambda used=used, n=context: [crop_cache(c, n) for c in used])
        for context in large_contexts:
            cache = new_kv_cache(target, [(k[:, :, :context], v[:, :, :context]) for k, v in layers])
            for rows in large_rows:
                ids = filler[0, context:context + rows]
                points["large", rows, context] = Point(
                    lambda c=cache, ids=ids: forward_rows(target, [Segment(ids, c, 1, small=False)]),
                    lambda c=cache, n=context: crop_cache(c, n))
        context = min(plan.proposer_context, limit // 2)
        history = filler[0, :context + 1].tolist()
        for requests in plan.proposer_requests:
            proposers = [engine.make_proposer() for _ in range(requests)]
            for p in proposers:
                p.start(history[:context])
            if isinstance(proposers[0], DraftModelProposer):
                model = proposers[0].model
                points["proposer", requests] = Point(
                    lambda ps=proposers, m=model, n=context: forward_rows(
                        m, [Segment(filler[0, n:n + 1], p.cache, 1) for p in ps]),
                    lambda ps=proposers, n=context: [crop_cache(p.cache, n) for p in ps])
            else:
                from rakv.runtime.decoding import Sampling

                points["proposer", requests] = Point(
                    lambda ps=proposers, h=history: [p.propose(h, 4, Sampling(), None) for p in ps])
        bar = tqdm(total=len(points) * plan.repeats, unit="measure", disable=not progress,
                   desc=f"calibrating batches {pair.name}/{engine.proposer}")
        measure_interleaved(points, device, CalibrationPlan(**{**asdict(noise), "repeats": plan.repeats}), progress=bar)
        bar.close()
    refuse_if_noisy(points, noise, pair.name, f"{engine.proposer} (batch cost)")

    def grid(name, rows, ctxs):
        shape = (len(rows), len(ctxs))
        medians, spread, samples = np.zeros(shape), np.zeros(shape), np.zeros(shape, int)
        for i, r in enumerate(rows):
            for j, c in enumerate(ctxs):
                point = points[name, r, c]
                medians[i, j], spread[i, j], samples[i, j] = point.median, point.spread, len(point.samples)
        return Grid.measured(list(rows), list(ctxs), medians, spread, samples)

    keys = sorted(key[1] for key in points if key[0] == "proposer")
    proposer_step = Curve.table(keys, [points["proposer", n].median for n in keys],
                                [points["proposer", n].spread for n in keys],
                                [len(points["proposer", n].samples) for n in keys])
    return BatchCost(batch_cost_key(engine), grid("small", plan.small_rows, contexts),
                     grid("large", large_rows, large_contexts), engine.proposer, proposer_step,
                     measured_s=time.perf_counter() - started, load_average=[load_before, os.getloadavg()[0]])


def batch_cost_path(key: dict) -> Path:
    return calibration_dir() / f"{key['pair']['pair']}-{key['proposer']}-batch-{key_digest(key)}.json"


def load_or_calibrate_batch(engine, *, recalibrate: str = "auto", plan: BatchPlan = BatchPlan(),
                            progress: bool = True) -> BatchCost:
    """The batch cost table for this pair, proposer and machine (the calibration folder); measured when missing
    or stale. recalibrate: auto, always, never (a one-line error instead)."""
    key = batch_cost_key(engine)
    path = batch_cost_path(key)
    if recalibrate != "always" and path.exists():
        try:
            table = BatchCost.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise RakvError(f"cannot read batch cost table {path}: {exc}") from None
        if table.key == key:
            return table
        if recalibrate == "never":
            raise RakvError(f"batch cost table {path} was measured for another pair, proposer or machine")
    elif recalibrate == "never":
        raise RakvError(f"no batch cost table for {engine.pair.name}/{engine.proposer} on this machine ({path})")
    table = calibrate_batch(engine, plan, progress=progress)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table.to_json(), indent=1))
    tmp.replace(path)
    return table
