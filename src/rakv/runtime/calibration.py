"""Calibration: measuring the cost model's tables on the machine and pair in use, and storing them.

It times the operations the decode loops actually perform (target prefill, target one-token step,
target verify of k+1 tokens, the proposer's k candidates and its prefill, the KV copy of a store
hit) at a grid of points, and saves the table under a key made of the pair's and the machine's
fingerprints and the measuring method; a table measured for another key is never used.

Measuring robustly on a noisy machine: every point gets a warm-up, then the points are timed in
interleaved passes in a shuffled order (a burst of noise lands on many points once, not on one point
five times); each point's cost is the median of its repeats, its noise the median absolute deviation over
the median; points noisier than `remeasure_spread` are measured again; a calibration with a point still
noisier than `refuse_spread` is refused with the points named. Each cost is then a per-point table
(rakv.runtime.costmodel.Curve, kind "table") interpolated between the measured points and made non-decreasing
in context or length; the cost of each k is its own measured table, not a smooth curve in k.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

from rakv.runtime.actions import SPEC_K, Action
from rakv.runtime.cache import PrefixKVStore, kv_nbytes
from rakv.runtime.costmodel import CostTable, Curve, acceptance_estimate, read_cost_table
from rakv.runtime.decoding import Sampling, crop_cache, forward, synchronize
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import new_kv_cache, target_arch, target_isa
from rakv.runtime.models import PRECISION_QUANTISATION, derived_files_dir
from rakv.runtime.workloads import calibration_prompts

# The vector extensions that decide which of kernels.cpp's paths runs (and so a round's price): two machines sold
# under one name ("AMD EPYC") can differ here, and a run must say which it was.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile")


def instruction_set() -> str | None:
    """The vector extensions of this CPU that the kernels use, joined by '+' (e.g. 'avx2+fma'); None off Linux."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = set(next(line.split(":", 1)[1].split() for line in fh if line.startswith("flags")))
    except (OSError, StopIteration):
        return None
    return "+".join(flag for flag in VECTOR_FLAGS if flag in flags) or "none"


def cpu_caches() -> str | None:
    """This CPU's data and unified caches as 'L1d 32K, L2 512K, L3 32768K' (Linux sysfs; None elsewhere): the
    kernels' blocking is sized for them, so two machines of one name and ISA but other caches are other machines."""
    found = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            found.append(f"L{level}{'d' if kind == 'Data' else ''} {size}")
    return ", ".join(found) or None


def usable_cores() -> int:
    """The cores this process may run on (its affinity, which a container or taskset narrows), else the count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def processor_name(device: torch.device) -> str:
    """The device's model name: the GPU's, or the CPU's as /proc/cpuinfo says it (platform's guess without it)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    processor = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            processor = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return processor


def hardware_fingerprint(device: torch.device, dtype: str) -> dict:
    processor = processor_name(device)
    cpu = device.type == "cpu"
    # what changes the kernels' code path or their blocking: the ISA, the compile target, the cores, the caches; a
    # calibration keyed by them never travels to a machine of another class (rakv.runtime.calibration.load_table)
    return {"processor": processor, "isa": instruction_set() if cpu else None,
            "kernels_march": target_arch() if cpu else None, "kernels_isa": kernels_isa() if cpu else None,
            "cores": usable_cores() if cpu else None,
            "caches": cpu_caches() if cpu else None, "device": device.type, "dtype": dtype,
            "threads": torch.get_num_threads() if cpu else None,
            "torch": torch.__version__, "transformers": transformers.__version__}


def kernels_isa() -> str | None:
    """What the compact kernels compile for on this machine (rakv.runtime.kernels.target_isa: the -march resolved and
    the vector extensions it enables, which set the quantised GEMMs' code path), None without a compiler."""
    try:
        return target_isa()
    except RakvError:
        return None


def precision_of(pair) -> str:
    """The precision a loaded pair's target runs at (rakv.runtime.models.PRECISIONS), read off its fingerprint's
    quantisation (PRECISION_QUANTISATION); fp32 for a target no precision converted."""
    named = {quantisation: precision for precision, quantisation in PRECISION_QUANTISATION.items()}
    return named.get(pair.target.fingerprint.quantisation, "fp32")


METHOD = "interleaved-median-table/2"  # part of the key: a table measured another way is stale


def calibration_key(pair, proposer: str) -> dict:
    dtype = pair.target.fingerprint.dtype
    key = {"pair": pair.fingerprint(), "proposer": proposer, "hardware": hardware_fingerprint(pair.device, dtype),
           "method": METHOD}
    # what else makes the proposer another one (the heads: the shipped set's key; a retrained set is stale here)
    from rakv.runtime.proposers import proposer_type

    key.update(proposer_type(proposer).calibration_identity(pair.name))
    return key


def key_digest(key: dict) -> str:
    return hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=10).hexdigest()


@dataclass(frozen=True)
class CalibrationPlan:
    prefill_lengths: tuple[int, ...] = (1, 16, 64, 128, 256, 512)
    contexts: tuple[int, ...] = (64, 256, 512)
    k_values: tuple[int, ...] = SPEC_K
    copy_lengths: tuple[int, ...] = (16, 128, 512)
    repeats: int = 5  # per point and pass; the points are measured in interleaved, shuffled passes
    acceptance_prompts: int = 3
    acceptance_new_tokens: int = 48
    remeasure_spread: float = 0.05  # a point whose MAD / median exceeds this is measured again ...
    remeasure_passes: int = 3  # ... up to this many times
    refuse_spread: float = 0.15  # still above this afterwards: the calibration is refused (RakvError)
    noise_floor_s: float = 5e-4  # a MAD below this is never noise worth re-measuring (sub-ms operations)


@dataclass
class Point:
    """One measured cost: the operation (`run`), what must happen before each timing (`setup`), its samples."""

    run: Callable[[], object]
    setup: Callable[[], object] | None = None
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Median absolute deviation over median: the repeat-to-repeat noise of this point. Robust to a minority
        of outliers (the median is too), which on a shared machine arrive as single slow repeats."""
        if len(self.samples) < 2 or self.median <= 0:
            return 0.0
        return statistics.median(abs(x - self.median) for x in self.samples) / self.median

    def noisy(self, plan: CalibrationPlan, limit: float) -> bool:
        return self.spread > limit and self.spread * self.median > plan.noise_floor_s


def time_once(point: Point, device) -> float:
    if point.setup is not None:
        point.setup()
    synchronize(device)
    start = time.perf_counter()
    point.run()
    synchronize(device)
    return time.perf_counter() - start


def measure_interleaved(points: dict, device, plan: CalibrationPlan, seed: int = 0,
                        progress: tqdm | None = None) -> None:
    """Fill every point's samples: one warm-up each, then `plan.repeats` passes over all points in a fresh
    shuffled order, so a burst of machine noise spreads over many points instead of ruining one; points whose
    spread stays high are measured again (a fresh set of passes), keeping the quieter set."""
    rng = random.Random(seed)
    for point in points.values():
        time_once(point, device)

    def passes(keys):
        fresh = {key: [] for key in keys}
        for _ in range(plan.repeats):
            order = list(keys)
            rng.shuffle(order)
            for key in order:
                fresh[key].append(time_once(points[key], device))
            if progress is not None:
                progress.update(len(order))
        return fresh

    for key, samples in passes(list(points)).items():
        points[key].samples = samples
    for _ in range(plan.remeasure_passes):
        noisy = [key for key, point in points.items() if point.noisy(plan, plan.remeasure_spread)]
        if not noisy:
            break
        if progress is not None:
            progress.total += len(noisy) * plan.repeats
        for key, samples in passes(noisy).items():
            retry = Point(points[key].run, points[key].setup, samples)
            if retry.spread < points[key].spread:
                points[key].samples = samples


def forward_points(model, ids: torch.Tensor, cache, context: int, widths) -> dict[int, Point]:
    """One point per width: `model`'s forward over `width` new tokens of `ids` after the `context` positions that
    `cache` holds (cropped back to them before each timing); logits of the last row only for a one-token step."""

    def crop_back():
        crop_cache(cache, context)

    return {width: Point(lambda width=width: forward(model, ids[:, context:context + width], cache,
                                                     keep=1 if width == 1 else 0), crop_back)
            for width in widths}


def calibrate(engine, prompts: list[list[int]], plan: CalibrationPlan = CalibrationPlan(),
              progress: bool = True) -> CostTable:
    """Measure every cost the model needs on `engine`'s pair and proposer. `prompts`: token ids for acceptance.

    Raises RakvError naming the points whose noise stayed above `plan.refuse_spread` after re-measuring."""
    pair, device = engine.pair, engine.pair.device
    generator = torch.Generator().manual_seed(0)
    filler = torch.randint(100, pair.vocab_size - 100, (1, pair.max_context), generator=generator).to(device)
    plan = fitted_plan(plan, pair.max_context)
    load_before = warn_if_busy(device)
    started = time.perf_counter()
    with torch.inference_mode():
        points = model_points(engine, filler, plan)
        copies, target_bytes = copy_points(pair.target.module, filler, plan, pair.vocab_size)
        points |= copies
        bar = tqdm(total=len(points) * plan.repeats + plan.acceptance_prompts, unit="measure", disable=not progress,
                   desc=f"calibrating {pair.name}/{engine.proposer}")
        measure_interleaved(points, device, plan, progress=bar)
        proposer_bytes = proposer_kv_bytes_per_token(engine, filler)
        round_log, empty_rounds = acceptance_rounds(engine, prompts, plan, bar)
    bar.close()
    refuse_if_noisy(points, plan, pair.name, engine.proposer)
    alpha = acceptance_estimate(round_log)

    def curve(name, *k, monotone=True):
        keys = sorted((key for key in points if key[0] == name and key[1:1 + len(k)] == k), key=lambda key: key[-1])
        return Curve.table([key[-1] for key in keys], [points[key].median for key in keys],
                           [points[key].spread for key in keys], [len(points[key].samples) for key in keys], monotone)

    return CostTable(
        key=calibration_key(pair, engine.proposer),
        target_prefill=curve("target_prefill"), target_step=curve("target_step"),
        verify={k: curve("verify", k) for k in plan.k_values}, propose={k: curve("propose", k) for k in plan.k_values},
        proposer_prefill=curve("proposer_prefill"), kv_copy=curve("kv_copy"),
        target_kv_bytes_per_token=target_bytes, proposer_kv_bytes_per_token=proposer_bytes,
        acceptance=alpha if alpha is not None else 0.0, acceptance_rounds=len(round_log),
        match_rate=len(round_log) / max(len(round_log) + empty_rounds, 1),
        measured_s=time.perf_counter() - started, load_average=[load_before, os.getloadavg()[0]])


def fitted_plan(plan: CalibrationPlan, limit: int) -> CalibrationPlan:
    """`plan` without the points that would not fit in the pair's context of `limit` tokens."""
    return CalibrationPlan(**{**asdict(plan),
                              "prefill_lengths": tuple(n for n in plan.prefill_lengths if n < limit - 16),
                              "contexts": tuple(n for n in plan.contexts if n + max(plan.k_values) + 1 < limit),
                              "copy_lengths": tuple(n for n in plan.copy_lengths if n < limit)})


def warn_if_busy(device) -> float:
    """The 1-minute load average as calibration starts, with a warning when the CPUs look busy."""
    load = os.getloadavg()[0]
    if load > 0.75 * (os.cpu_count() or 1) and device.type == "cpu":
        print(f"rakv: warning: the machine may be busy (1-minute load {load:.1f} on {os.cpu_count()} CPUs) "
              "as calibration starts; its timings may be too slow", flush=True)
    return load


def model_points(engine, filler: torch.Tensor, plan: CalibrationPlan) -> dict[tuple, Point]:
    """The prefills, the target's step and verifies and the proposer's candidates, each at the plan's points."""
    target = engine.pair.target.module
    points: dict[tuple, Point] = {}
    for n in plan.prefill_lengths:
        points["target_prefill", n] = Point(lambda n=n: forward(target, filler[:, :n], new_kv_cache(target), keep=1))
    for n in plan.prefill_lengths:
        proposer = engine.make_proposer()
        points["proposer_prefill", n] = Point(lambda n=n, p=proposer: p.start(filler[0, :n].tolist()))
    sampling = Sampling()
    for ctx in plan.contexts:
        cache = new_kv_cache(target)
        forward(target, filler[:, :ctx], cache, keep=1)
        steps = forward_points(target, filler, cache, ctx, (1, *(k + 1 for k in plan.k_values)))
        points["target_step", ctx] = steps[1]
        for k in plan.k_values:
            points["verify", k, ctx] = steps[k + 1]
        context = filler[0, :ctx].tolist()
        for k in plan.k_values:
            # steady state: the last confirmed token is new to the proposer, as after every round
            proposer = engine.make_proposer()
            proposer.start(context)
            if proposer.needs_target_hidden:  # as after a verify: the hidden states of the context's positions
                proposer.observe_target_hidden(0, forward(target, filler[:, :ctx], new_kv_cache(target),
                                                          return_hidden=True)[1])
            points["propose", k, ctx] = Point(
                lambda p=proposer, c=context, k=k: p.propose(c, k, sampling, None),
                lambda p=proposer, n=ctx: p.rollback(n - 1))
    return points


def copy_points(target, filler: torch.Tensor, plan: CalibrationPlan, vocab_size: int) -> tuple[dict, float]:
    """The K/V copy of a store hit at each of the plan's lengths, and the target's K/V bytes per token."""
    store = PrefixKVStore(budget_bytes=1 << 40)
    ns = "calibration"
    longest = max(plan.copy_lengths)
    cache = new_kv_cache(target)
    logits = forward(target, filler[:, :longest + 1], cache, keep=1)[-1]
    entry_ids = filler[0, :longest + 1].cpu().numpy()
    store.insert(ns, entry_ids, [(layer.keys, layer.values) for layer in cache.layers], logits)
    target_bytes = kv_nbytes([(layer.keys, layer.values) for layer in cache.layers]) / (longest + 1)
    points = {}
    for n in plan.copy_lengths:  # a prompt that shares n + 1 tokens reuses n positions
        query = entry_ids.copy()[: n + 2]
        query[-1] = (query[-1] + 1) % vocab_size
        points["kv_copy", n] = Point(lambda q=query: new_kv_cache(target, store.lookup(ns, q)[1]))
    return points, target_bytes


def proposer_kv_bytes_per_token(engine, filler: torch.Tensor) -> float:
    probe = engine.make_proposer()
    probe.start(filler[0, :64].tolist())
    return (kv_nbytes([(layer.keys, layer.values) for layer in probe.cache.layers]) / 64
            if getattr(probe, "cache", None) is not None else 0.0)


def acceptance_rounds(engine, prompts: list[list[int]], plan: CalibrationPlan, bar) -> tuple[list, int]:
    """The rounds of spec-k4 runs over the plan's acceptance prompts, and how many rounds offered no candidates."""
    round_log, empty_rounds = [], 0
    for ids in prompts[: plan.acceptance_prompts]:
        result = engine.run(ids, Action(False, 4), plan.acceptance_new_tokens, ignore_eos=True)
        round_log.extend(result.round_log)
        empty_rounds += result.empty_rounds
        bar.update(1)
    return round_log, empty_rounds


def refuse_if_noisy(points: dict, plan: CalibrationPlan, pair: str, proposer: str) -> None:
    noisy = {key: point for key, point in points.items() if point.noisy(plan, plan.refuse_spread)}
    if noisy:
        named = ", ".join(f"{'/'.join(map(str, key))} (spread {point.spread:.0%} of {point.median * 1e3:.1f} ms)"
                          for key, point in sorted(noisy.items(), key=lambda item: -item[1].spread)[:6])
        raise RakvError(f"calibration of {pair}/{proposer} is too noisy to use: {named} (1-minute load "
                        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, this process included); rerun when the "
                        "machine is quiet")


def calibration_dir() -> Path:
    path = Path(os.environ.get("RAKV_CALIBRATION_DIR") or derived_files_dir() / "calibrations")
    path.mkdir(parents=True, exist_ok=True)
    return path


def calibration_path(key: dict) -> Path:
    return calibration_dir() / f"{key['pair']['pair']}-{key['proposer']}-{key_digest(key)}.json"


def save_table(table: CostTable, path: Path) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table.to_json(), indent=1))
    tmp.replace(path)


def load_table(path: Path, expected_key: dict) -> CostTable:
    """Read a calibration and refuse it when it was measured for another pair, proposer or machine."""
    try:
        table = read_cost_table(path)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise RakvError(f"cannot read calibration {path}: {exc}") from None
    if table.key != expected_key:
        differs = sorted(name for name in expected_key if table.key.get(name) != expected_key[name])
        raise StaleCalibration(f"calibration {path} was measured for another {'/'.join(differs)}")
    return table


class StaleCalibration(RakvError):
    pass


def calibration_for(engine, recalibrate: str = "auto") -> CostTable:
    """The engine's calibration, measured on the standard prompts (HumanEval/0-2) when missing or stale."""
    return load_or_calibrate(engine, calibration_prompts(engine.encode), recalibrate=recalibrate)


def load_or_calibrate(engine, prompts, *, path: Path | None = None, recalibrate: str = "auto",
                      plan: CalibrationPlan = CalibrationPlan(), progress: bool = True) -> CostTable:
    """The calibration for this pair, proposer and machine; measured anew when missing or stale.

    recalibrate: "auto" (measure when missing or stale), "always", or "never" (error instead).
    """
    key = calibration_key(engine.pair, engine.proposer)
    path = Path(path) if path else calibration_path(key)
    if recalibrate != "always" and path.exists():
        try:
            return load_table(path, key)
        except StaleCalibration as exc:
            if recalibrate == "never":
                raise RakvError(f"{exc}; recalibrate with `rakv calibrate --pair {engine.pair.name}`") from None
            print(f"rakv: {exc}; recalibrating", flush=True)
    elif recalibrate == "never":
        raise RakvError(f"no calibration for pair {engine.pair.name} / proposer {engine.proposer} on this machine "
                        f"({path}); run `rakv calibrate --pair {engine.pair.name}`")
    table = calibrate(engine, prompts, plan, progress=progress)
    save_table(table, path)
    return table
