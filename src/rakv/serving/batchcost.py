"""The batch cost model: what one serving iteration costs, measured on this machine (docs/serving.md: "The serving
study").

An iteration (rakv.serving.executor) is one batched target forward over every scheduled request's new rows (decode
and verify rows, prefill chunks), one pass over the weights (rakv.runtime.decoding.forward_rows), after the
proposer's candidates (a draft model's steps batched across requests, or prompt lookup per request). Its cost is
priced by what the pass does, each term measured:

    T = rows(R) + segment_s (S - 1) + kv_s C + attend_s (P - R (R - 1) / 2) + proposer(requests, k)

- `rows(R)`: a pass of R new rows of one request on an empty cache (a table over R, made non-decreasing): the
  weights streamed once and the FMAs of R rows, which the batch-invariant GEMM prices by the hardware;
- S requests in the pass (`segment_s`: each one's bookkeeping), C = the K/V positions their caches held before
  the pass (`kv_s`: each request's K/V is streamed once per layer, however many rows it has), P = the positions
  its rows attend to before their own (`attend_s`: the attention's arithmetic; R (R - 1) / 2 is what `rows(R)`
  already contains).

The three coefficients are fitted (non-negative least squares) to passes of other shapes: decode-like (one row for
each of several requests), verifies (k + 1 rows per request), prefill chunks after a context, and a chunk beside
decodes; the largest relative error of the fit is kept (`fit_error`). Measured with the calibration's own
machinery (interleaved shuffled passes, medians, re-measured when noisy, refused when still noisy), stored under
the pair's and the machine's fingerprints; the serving study checks `iteration_s` against every iteration it runs
(held-out MAPE).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import nnls
from tqdm import tqdm

from rakv.runtime.calibration import (
    CalibrationPlan,
    Point,
    calibration_dir,
    calibration_key,
    key_digest,
    measure_interleaved,
    refuse_if_noisy,
)
from rakv.runtime.compact import Segment
from rakv.runtime.costmodel import Curve
from rakv.runtime.decoding import Sampling, crop_cache, forward, forward_rows
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import new_kv_cache
from rakv.runtime.proposers import proposer_type

METHOD = "batch-pass/2"  # part of the key: a table measured another way is stale


@dataclass(frozen=True)
class BatchPlan:
    rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # one request's rows on an empty cache
    contexts: tuple[int, ...] = (256, 1024)  # positions held before the pass, in the fitted shapes
    decodes: tuple[int, ...] = (2, 4, 8, 16)  # requests of one row each
    verify: tuple[int, int] = (4, 5)  # requests, rows each
    chunks: tuple[int, ...] = (32, 128)  # one request's rows after a context
    proposer_requests: tuple[int, ...] = (1, 2, 4, 8, 16)
    proposer_context: int = 256
    repeats: int = 5


@dataclass(frozen=True)
class PassFeatures:
    """What the model prices of one batched pass (recorded per iteration in iterations.jsonl)."""

    rows: int  # new tokens of every request together
    segments: int  # requests in the pass
    kv_positions: int  # K/V positions the requests held before the pass
    attended: int  # (row, earlier position of its request) pairs attention reads, its own segment's rows included

    @property
    def extra_attended(self) -> float:
        """Attended pairs beyond what R rows of one request on an empty cache attend (the `rows` curve's own)."""
        return self.attended - self.rows * (self.rows - 1) / 2


def pass_features(segments: list[tuple[int, int]]) -> PassFeatures:
    """The features of one pass, from its segments' (new rows, positions held before them)."""
    return PassFeatures(rows=sum(n for n, _ in segments), segments=len(segments),
                        kv_positions=sum(c for _, c in segments),
                        attended=sum(n * c + n * (n - 1) // 2 for n, c in segments))


@dataclass
class BatchCost:
    key: dict
    rows: Curve  # seconds of one request's R rows on an empty cache, vs R
    segment_s: float  # each further request in the pass
    kv_s: float  # each K/V position held before the pass
    attend_s: float  # each (row, earlier position) pair beyond rows(R)'s own
    proposer: str  # its name (rakv.runtime.proposers.PROPOSERS)
    proposer_step: Curve  # draft: one batched draft step vs requests; prompt lookup: proposals vs requests
    fit_error: float = 0.0  # largest |fit - measured| / measured over the fitted passes
    measured_s: float = 0.0
    load_average: list[float] = field(default_factory=list)
    # several proposers served together (rakv-asd choosing per request): the other proposers' batched step curves,
    # each from its own table (`with_proposers`); a request's proposals are priced by its own kind's curve
    other_steps: dict[str, Curve] = field(default_factory=dict)

    def pass_s(self, features: PassFeatures) -> float:
        if features.rows <= 0:
            return 0.0
        extra = (self.segment_s * (features.segments - 1) + self.kv_s * features.kv_positions
                 + self.attend_s * features.extra_attended)
        return max(self.rows(features.rows) + extra, 0.0)

    def propose_s(self, ks: list[int], kinds: list[str] | None = None) -> float:
        """The proposers' part of an iteration whose decodes propose `ks` candidates each, with the proposers
        `kinds` (one name per decode; None or "": this table's own), each kind batched apart (propose_batch)."""
        kinds = [kind or self.proposer for kind in kinds] if kinds is not None else [self.proposer] * len(ks)
        return sum(self._kind_s(name, [k for k, kind in zip(ks, kinds) if kind == name and k > 0])
                   for name in dict.fromkeys(kinds))

    def _kind_s(self, name: str, ks: list[int]) -> float:
        if not ks:
            return 0.0
        if name != self.proposer and name not in self.other_steps:
            raise RakvError(f"the batch cost table of {self.proposer} has no step for proposer '{name}'")
        step = self.proposer_step if name == self.proposer else self.other_steps[name]
        if not proposer_type(name).pays_per_candidate:
            return step(len(ks))  # one proposal per proposing request, whatever its k (prompt lookup, the heads)
        # a draft round: the catch-up pass, then k - 1 steps over the requests still drafting (propose_batch)
        return sum(step(sum(k > i for k in ks)) for i in range(max(ks)))

    def iteration_s(self, features: PassFeatures, ks: list[int] = (), prefill_context: int | None = 0,
                    kinds: list[str] | None = None) -> float:
        """An iteration: its pass (`pass_features`) and the proposals of its decodes (`prefill_context`, the shape
        class ScaledCost scales by, does not change the table's price)."""
        return self.pass_s(features) + self.propose_s(list(ks), kinds)

    def decode_s(self, decodes: list[tuple[int, int]], ks: list[int] | None = None,
                 kinds: list[str] | None = None) -> float:
        """An iteration of decodes only: (rows, context) per request, `ks` its candidates (rows - 1 if None)."""
        return self.iteration_s(pass_features(decodes), [r - 1 for r, _ in decodes] if ks is None else ks, 0, kinds)

    def with_proposers(self, tables: dict[str, BatchCost]) -> BatchCost:
        """This table pricing the other proposers' steps too, each from its own table (measured on the same pair)."""
        assert all(t.key.get("pair") == self.key.get("pair") for t in tables.values()), "tables of another pair"
        return replace(self, other_steps={name: t.proposer_step for name, t in tables.items()
                                          if name != self.proposer})

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict) -> BatchCost:
        row = dict(row)
        row["rows"], row["proposer_step"] = Curve(**row["rows"]), Curve(**row["proposer_step"])
        row["other_steps"] = {name: Curve(**curve) for name, curve in row.get("other_steps", {}).items()}
        return cls(**row)


def batch_cost_key(engine) -> dict:
    # a proposer that reads the target's hidden states proposes nothing unless given them: its step is measured
    # after they are given (`proposer_points`), which its tables' method names
    hidden = "+hidden" if engine.proposer_type.needs_target_hidden else ""
    return {**calibration_key(engine.pair, engine.proposer), "method": METHOD + hidden}


def fit_pass_terms(rows: Curve, shapes: list[list[tuple[int, int]]], seconds: list[float]) -> tuple[np.ndarray, float]:
    """(segment_s, kv_s, attend_s) >= 0 by least squares on what `rows` leaves of each measured pass, and the
    largest relative error of the fitted passes."""
    features = [pass_features(shape) for shape in shapes]
    design = np.array([[f.segments - 1, f.kv_positions, f.extra_attended] for f in features], float)
    base = np.array([rows(f.rows) for f in features])
    measured = np.asarray(seconds, float)
    # relative errors matter (a decode pass is 1/30 of a chunk's): weight each pass by 1 / its time
    weight = 1.0 / measured
    coefficients, _ = nnls(design * weight[:, None], (measured - base) * weight)
    fitted = base + design @ coefficients
    return coefficients, float((np.abs(fitted - measured) / measured).max())


def fitted_shapes(plan: BatchPlan, limit: int) -> list[list[tuple[int, int]]]:
    """The passes the three coefficients are fitted to: (rows, context) per request."""
    shapes = []
    for context in [c for c in plan.contexts if c + max(plan.chunks) < limit]:
        shapes += [[(1, context)] * n for n in plan.decodes]
        shapes.append([(plan.verify[1], context)] * plan.verify[0])
        shapes += [[(n, context)] for n in plan.chunks]
        shapes.append([(1, context)] * 4 + [(plan.chunks[0], 0)])  # a prefill chunk beside decodes
    shapes += [[(1, 0)] * n for n in plan.decodes]
    return shapes


def calibrate_batch(engine, plan: BatchPlan = BatchPlan(), progress: bool = True,
                    noise: CalibrationPlan = CalibrationPlan()) -> BatchCost:
    """Measure one request's passes by rows, passes of other shapes (for the fitted terms) and the proposer's
    batched step on `engine`'s pair."""
    pair, device = engine.pair, engine.pair.device
    target = pair.target.module
    limit = pair.max_context
    rows = [n for n in plan.rows if n < limit]
    shapes = fitted_shapes(plan, limit)
    filler = torch.randint(100, pair.vocab_size - 100, (1, limit), generator=torch.Generator().manual_seed(0))
    filler = filler.to(device)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    points: dict[tuple, Point] = {}
    longest = max(c for shape in shapes for _, c in shape)
    with torch.inference_mode():
        prefix = new_kv_cache(target)
        forward(target, filler[:, :longest + 1], prefix, keep=1)
        layers = [(layer.keys, layer.values) for layer in prefix.layers]
        del prefix

        def measured_pass(shape):
            caches = [new_kv_cache(target, [(k[:, :, :c], v[:, :, :c]) for k, v in layers]) for _, c in shape]
            segments = [Segment(filler[0, c:c + n], cache, 1) for (n, c), cache in zip(shape, caches)]
            return Point(lambda: forward_rows(target, segments),
                         lambda: [crop_cache(cache, c) for (_, c), cache in zip(shape, caches)])

        for n in rows:
            points["rows", n] = measured_pass([(n, 0)])
        for i, shape in enumerate(shapes):
            points["shape", i] = measured_pass(shape)
        points.update(proposer_points(engine, plan, filler[0]))
        bar = tqdm(total=len(points) * plan.repeats, unit="measure", disable=not progress,
                   desc=f"calibrating batches {pair.name}/{engine.proposer}")
        measure_interleaved(points, device, CalibrationPlan(**{**asdict(noise), "repeats": plan.repeats}), progress=bar)
        bar.close()
    refuse_if_noisy(points, noise, pair.name, f"{engine.proposer} (batch cost)")

    def curve(name, xs):
        return Curve.table(xs, [points[name, x].median for x in xs], [points[name, x].spread for x in xs],
                           [len(points[name, x].samples) for x in xs])

    by_rows = curve("rows", rows)
    (segment_s, kv_s, attend_s), fit_error = fit_pass_terms(
        by_rows, shapes, [points["shape", i].median for i in range(len(shapes))])
    return BatchCost(batch_cost_key(engine), by_rows, float(segment_s), float(kv_s), float(attend_s),
                     engine.proposer, curve("proposer", sorted(plan.proposer_requests)), fit_error,
                     measured_s=time.perf_counter() - started, load_average=[load_before, os.getloadavg()[0]])


def proposer_points(engine, plan: BatchPlan, filler: torch.Tensor) -> dict[tuple, Point]:
    """The proposer's batched step for each number of requests: one draft step over their caches, or one prompt
    lookup each."""
    context = min(plan.proposer_context, engine.pair.max_context // 2)
    history = filler[:context + 1].tolist()
    hidden = None
    if engine.proposer_type.needs_target_hidden:  # as after a verify: the target's hidden states of the context
        target = engine.pair.target.module
        hidden = forward(target, filler[None, :context], new_kv_cache(target), return_hidden=True)[1]
    points = {}
    for requests in plan.proposer_requests:
        proposers = [engine.make_proposer() for _ in range(requests)]
        for p in proposers:
            p.start(history[:context])
            if hidden is not None:
                p.observe_target_hidden(0, hidden)
        if engine.proposer_type.pays_per_candidate:
            points["proposer", requests] = Point(
                lambda ps=proposers, m=proposers[0].model, n=context: forward_rows(
                    m, [Segment(filler[n:n + 1], p.cache, 1) for p in ps]),
                lambda ps=proposers, n=context: [crop_cache(p.cache, n) for p in ps])
        else:
            points["proposer", requests] = Point(
                lambda ps=proposers, h=history: [p.propose(h, 4, Sampling(), None) for p in ps])
    return points


def batch_cost_path(key: dict) -> Path:
    return calibration_dir() / f"{key['pair']['pair']}-{key['proposer']}-batch-{key_digest(key)}.json"


def read_batch_cost(path: Path) -> BatchCost:
    """A kept batch cost table (a one-line error when unreadable)."""
    try:
        return BatchCost.from_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise RakvError(f"cannot read batch cost table {path}: {exc}") from None


def load_or_calibrate_batch(engine, *, recalibrate: str = "auto", plan: BatchPlan = BatchPlan(),
                            progress: bool = True, noise: CalibrationPlan = CalibrationPlan()) -> BatchCost:
    """The batch cost table for this pair, proposer and machine (the calibration folder); measured when missing
    or stale, under the noise gate `noise`. recalibrate: auto, always, never (a one-line error instead)."""
    key = batch_cost_key(engine)
    path = batch_cost_path(key)
    if recalibrate != "always" and path.exists():
        table = read_batch_cost(path)
        if table.key == key:
            return table
        if recalibrate == "never":
            raise RakvError(f"batch cost table {path} was measured for another pair, proposer or machine")
    elif recalibrate == "never":
        raise RakvError(f"no batch cost table for {engine.pair.name}/{engine.proposer} on this machine ({path})")
    table = calibrate_batch(engine, plan, progress=progress, noise=noise)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table.to_json(), indent=1))
    tmp.replace(path)
    return table


DEEP_CONTEXT = 512  # a prefill chunk after this many positions of its prompt: priced on a scale of its own


def shape_class(prefill_context: int | None) -> str:
    """An iteration's kind for the online scale: decode-only (None), with a prefill chunk, or with a chunk deep in
    a long prompt (where the table's attention term misses most: 1.4-1.6x on consecutive chunks of a
    1,000-token prompt in the serving pilot)."""
    if prefill_context is None:
        return "decode"
    return "prefill-deep" if prefill_context >= DEEP_CONTEXT else "prefill"


@dataclass
class ScaledCost:
    """The batch cost table times what this run's own iterations measured: the machine's speed moves from run to
    run (measured / predicted 0.86-1.23 between the reference run's runs), so one scale per kind of iteration
    (`shape_class`) follows the measured / table ratio by an EWMA of its logarithm.

    Everything that prices an iteration while serving (the speculation policies, the ITL-SLO budget, admission's
    latency prediction) reads this object; `observe` is its one update, called by the serving loop
    (rakv.serving.server.step_once) after each executed iteration, so a prediction never sees its own
    iteration's time (iterations.jsonl keeps both `predicted_s`, scaled, and `model_s`, the table's)."""

    table: BatchCost
    beta: float = 0.8  # weight of the past: about five iterations' memory (a long prompt's chunks come in a run)
    scale: dict = field(default_factory=lambda: {"decode": 1.0, "prefill": 1.0, "prefill-deep": 1.0})

    @property
    def proposer(self) -> str:
        return self.table.proposer

    def iteration_s(self, features: PassFeatures, ks: list[int] = (), prefill_context: int | None = 0,
                    kinds: list[str] | None = None) -> float:
        """An iteration's time; `prefill_context`: the positions before its prefill chunk (None: decode-only)."""
        return self.table.iteration_s(features, ks, kinds=kinds) * self.scale[shape_class(prefill_context)]

    def decode_s(self, decodes: list[tuple[int, int]], ks: list[int] | None = None,
                 kinds: list[str] | None = None) -> float:
        return self.table.decode_s(decodes, ks, kinds) * self.scale["decode"]

    def observe(self, features: PassFeatures, ks: list[int], prefill_context: int | None, measured_s: float,
                kinds: list[str] | None = None) -> None:
        predicted = self.table.iteration_s(features, ks, kinds=kinds)
        if predicted <= 0 or measured_s <= 0:
            return
        kind = shape_class(prefill_context)
        ratio = float(np.clip(measured_s / predicted, 0.25, 4.0))  # one stalled iteration does not swing it
        self.scale[kind] = float(np.exp(self.beta * np.log(self.scale[kind]) + (1 - self.beta) * np.log(ratio)))
