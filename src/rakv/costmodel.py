"""Measured cost model (paper/main.tex, Method: "Cost model and controller"): calibration on the machine and pair in use, and C(r, k).

Calibration times the operations the decode loops actually perform (target prefill, target
one-token step, target verify of k+1 tokens, the proposer's k candidates and its prefill, the KV
copy of a store hit), fits a small curve to each, and saves the table under a key made of the
pair's and the machine's fingerprints. `estimate_latency` is a pure function of
(cost table, request features, alpha) so that the analysis can call it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers
from tqdm import tqdm

from rakv.cache import PrefixKVStore, kv_nbytes
from rakv.decoding import Sampling, forward, synchronize
from rakv.errors import RakvError
from rakv.kernels import new_kv_cache

K_VALUES = (1, 2, 4, 6, 8)


@dataclass
class Curve:
    """A least-squares polynomial in one variable, with its fit quality."""

    coefficients: list[float]  # highest power first (numpy.polyval order)
    r2: float
    max_rel_error: float
    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)

    def __call__(self, x: float) -> float:
        value = 0.0
        for c in self.coefficients:  # Horner in plain Python: ~10x faster than np.polyval on scalars
            value = value * x + c
        return max(value, 0.0)

    @classmethod
    def fit(cls, xs, ys, degree: int = 1) -> "Curve":
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        degree = min(degree, len(set(xs.tolist())) - 1)
        coefficients = np.polyfit(xs, ys, degree)
        predicted = np.polyval(coefficients, xs)
        total = float(((ys - ys.mean()) ** 2).sum())
        r2 = 1.0 - float(((ys - predicted) ** 2).sum()) / total if total > 0 else 1.0
        rel = np.abs(predicted - ys) / np.maximum(ys, 1e-12)
        return cls(coefficients.tolist(), r2, float(rel.max()), xs.tolist(), ys.tolist())


@dataclass
class CostTable:
    key: dict
    target_prefill: Curve  # seconds vs tokens computed
    target_step: Curve  # seconds of one target token vs context length
    verify: dict[int, Curve]  # seconds of one target forward over k+1 tokens vs context length
    propose: dict[int, Curve]  # seconds for the proposer's k candidates vs context length
    proposer_prefill: Curve  # seconds vs context length (0 for a model-free proposer)
    kv_copy: Curve  # seconds to copy reused K/V out of the store vs tokens reused
    target_kv_bytes_per_token: float
    proposer_kv_bytes_per_token: float
    acceptance: float  # per-token acceptance of the proposer, greedy, on the calibration prompts
    acceptance_rounds: int
    measured_s: float = 0.0

    def to_json(self) -> dict:
        row = asdict(self)
        row["verify"] = {str(k): v for k, v in row["verify"].items()}
        row["propose"] = {str(k): v for k, v in row["propose"].items()}
        return row

    @classmethod
    def from_json(cls, row: dict) -> "CostTable":
        row = dict(row)
        for name in ("target_prefill", "target_step", "proposer_prefill", "kv_copy"):
            row[name] = Curve(**row[name])
        for name in ("verify", "propose"):
            row[name] = {int(k): Curve(**v) for k, v in row[name].items()}
        return cls(**row)


@dataclass(frozen=True)
class RequestFeatures:
    prompt_tokens: int
    hit_tokens: int  # reusable positions if the store is used (0 on a miss)
    new_tokens: int
    exact_hit: bool = False


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E_k(alpha) = (1 - alpha^(k+1)) / (1 - alpha): confirmed tokens per round (accepted + 1)."""
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def action_kv_bytes(table: CostTable, features: RequestFeatures, k: int) -> float:
    """K/V bytes an action holds at its peak: the target's whole sequence, plus the proposer's when k > 0."""
    length = features.prompt_tokens + features.new_tokens
    draft = table.proposer_kv_bytes_per_token * (length + k) if k else 0.0
    return table.target_kv_bytes_per_token * length + draft


def estimate_latency(table: CostTable, features: RequestFeatures, reuse: bool, k: int, alpha: float,
                     memory_penalty_s_per_byte: float = 0.0) -> float:
    """C(r, k): prefill of the non-reused part (+ proposer prefill when k > 0) + copy cost when r = 1
    + decode (N - 1 target steps for k = 0; (N - 1) / E_k(alpha) rounds of propose + verify for k > 0)
    + lambda * bytes. The first token comes from the prefill logits, hence N - 1."""
    hit = features.hit_tokens if reuse else 0
    exact = reuse and features.exact_hit
    computed = 0 if exact else features.prompt_tokens - hit
    cost = table.target_prefill(computed) if computed else 0.0
    if reuse and hit:
        cost += table.kv_copy(hit)
    steps = max(features.new_tokens - 1, 0)
    mid_context = features.prompt_tokens + features.new_tokens / 2
    if k == 0:
        cost += steps * table.target_step(mid_context)
    else:
        cost += table.proposer_prefill(features.prompt_tokens + 1)
        rounds = steps / expected_tokens_per_round(alpha, k)
        cost += rounds * (table.propose[k](mid_context) + table.verify[k](mid_context))
    return cost + memory_penalty_s_per_byte * action_kv_bytes(table, features, k)


def break_even_alpha(table: CostTable, features: RequestFeatures, reuse: bool, k: int,
                     memory_penalty_s_per_byte: float = 0.0, tolerance: float = 1e-4) -> float | None:
    """Smallest alpha at which speculating with k beats k = 0 (None: not even at alpha = 1)."""
    baseline = estimate_latency(table, features, reuse, 0, 0.0, memory_penalty_s_per_byte)

    def gain(alpha):
        return baseline - estimate_latency(table, features, reuse, k, alpha, memory_penalty_s_per_byte)

    if gain(1.0) <= 0:
        return None
    if gain(0.0) > 0:
        return 0.0
    low, high = 0.0, 1.0
    while high - low > tolerance:  # latency is monotone decreasing in alpha
        mid = (low + high) / 2
        low, high = (low, mid) if gain(mid) > 0 else (mid, high)
    return high


def crossover_alpha(table, features, reuse, k_values=K_VALUES, memory_penalty_s_per_byte=0.0):
    values = [a for k in k_values if (a := break_even_alpha(table, features, reuse, k, memory_penalty_s_per_byte))
              is not None]
    return min(values) if values else None


def acceptance_estimate(round_log: list[tuple[int, int]]) -> float | None:
    """Per-token acceptance alpha from rounds: accepted / (accepted + rounds that ended in a rejection).

    This is the maximum-likelihood estimate when each candidate is accepted independently with
    probability alpha until the first rejection; the plain accepted/proposed ratio is biased low.
    """
    accepted = sum(a for _, a in round_log)
    rejections = sum(a < p for p, a in round_log)
    if accepted + rejections == 0:
        return None
    return accepted / (accepted + rejections)


# ---------------------------------------------------------------------------------------------
# Calibration


def hardware_fingerprint(device: torch.device, dtype: str) -> dict:
    if device.type == "cuda":
        processor = torch.cuda.get_device_name(device)
    else:
        processor = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as fh:
                processor = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return {"processor": processor, "device": device.type, "dtype": dtype,
            "threads": torch.get_num_threads() if device.type == "cpu" else None,
            "torch": torch.__version__, "transformers": transformers.__version__}


def calibration_key(pair, proposer: str) -> dict:
    dtype = pair.target.fingerprint.dtype
    return {"pair": pair.fingerprint(), "proposer": proposer, "hardware": hardware_fingerprint(pair.device, dtype)}


def key_digest(key: dict) -> str:
    return hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=10).hexdigest()


@dataclass(frozen=True)
class CalibrationPlan:
    prefill_lengths: tuple[int, ...] = (16, 64, 128, 256, 512)
    contexts: tuple[int, ...] = (64, 256, 512)
    k_values: tuple[int, ...] = K_VALUES
    copy_lengths: tuple[int, ...] = (16, 128, 512)
    repeats: int = 5
    acceptance_prompts: int = 3
    acceptance_new_tokens: int = 48


def _median_time(fn, device, repeats: int, setup=None) -> float:
    samples = []
    for i in range(repeats + 1):  # the first call is a warm-up
        if setup is not None:
            setup()
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        if i:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def calibrate(engine, prompts: list[list[int]], plan: CalibrationPlan = CalibrationPlan(),
              progress: bool = True) -> CostTable:
    """Measure every cost the model needs on `engine`'s pair and proposer. `prompts`: token ids for acceptance."""
    from rakv.engine import Action

    pair, device = engine.pair, engine.pair.device
    target = pair.target.module
    limit = pair.max_context
    generator = torch.Generator().manual_seed(0)
    filler = torch.randint(100, pair.vocab_size - 100, (1, limit), generator=generator).to(device)
    plan = CalibrationPlan(**{**asdict(plan),
                              "prefill_lengths": tuple(n for n in plan.prefill_lengths if n < limit - 16),
                              "contexts": tuple(n for n in plan.contexts if n + max(plan.k_values) + 1 < limit),
                              "copy_lengths": tuple(n for n in plan.copy_lengths if n < limit)})
    total = (len(plan.prefill_lengths) * 2 + len(plan.contexts) * (1 + 2 * len(plan.k_values))
             + len(plan.copy_lengths) + plan.acceptance_prompts)
    bar = tqdm(total=total, desc=f"calibrating {pair.name}/{engine.proposer}", disable=not progress, unit="measure")
    started = time.perf_counter()

    def tick():
        bar.update(1)

    with torch.inference_mode():
        def prefill_time(n):
            return _median_time(lambda: forward(target, filler[:, :n], new_kv_cache(target), keep=1),
                                device, plan.repeats)

        target_prefill = []
        for n in plan.prefill_lengths:
            target_prefill.append(prefill_time(n))
            tick()

        proposer = engine.make_proposer()
        proposer_prefill = []
        for n in plan.prefill_lengths:
            context = filler[0, :n].tolist()
            proposer_prefill.append(_median_time(lambda: proposer.start(context), device, plan.repeats))
            tick()

        step, verify, propose = [], {k: [] for k in plan.k_values}, {k: [] for k in plan.k_values}
        sampling = Sampling()
        for ctx in plan.contexts:
            cache = new_kv_cache(target)
            forward(target, filler[:, :ctx], cache, keep=1)

            def crop_back():
                excess = cache.get_seq_length() - ctx
                if excess > 0:
                    cache.crop(-excess)

            step.append(_median_time(lambda: forward(target, filler[:, ctx:ctx + 1], cache, keep=1), device,
                                     plan.repeats, setup=crop_back))
            tick()
            for k in plan.k_values:
                verify[k].append(_median_time(lambda: forward(target, filler[:, ctx:ctx + k + 1], cache), device,
                                              plan.repeats, setup=crop_back))
                tick()
            context = filler[0, :ctx].tolist()
            proposer.start(context)
            for k in plan.k_values:
                # steady state: the last confirmed token is new to the proposer, as after every round
                propose[k].append(_median_time(lambda: proposer.propose(context, k, sampling, None), device,
                                               plan.repeats, setup=lambda: proposer.rollback(ctx - 1)))
                tick()

        copy_times = []
        store = PrefixKVStore(budget_bytes=1 << 40)
        ns = "calibration"
        longest = max(plan.copy_lengths)
        cache = new_kv_cache(target)
        logits = forward(target, filler[:, :longest + 1], cache, keep=1)[-1]
        entry_ids = filler[0, :longest + 1].cpu().numpy()
        store.insert(ns, entry_ids, [(layer.keys, layer.values) for layer in cache.layers], logits)
        target_bytes = kv_nbytes([(layer.keys, layer.values) for layer in cache.layers]) / (longest + 1)
        for n in plan.copy_lengths:  # a prompt that shares n + 1 tokens reuses n positions
            query = entry_ids.copy()[: n + 2]
            query[-1] = (query[-1] + 1) % pair.vocab_size

            def copy_out():
                _, kv, _ = store.lookup(ns, query)
                new_kv_cache(target, kv)

            copy_times.append(_median_time(copy_out, device, plan.repeats))
            tick()

        proposer_bytes = 0.0
        if getattr(proposer, "cache", None) is not None:
            proposer.start(filler[0, :64].tolist())
            proposer_bytes = kv_nbytes([(layer.keys, layer.values) for layer in proposer.cache.layers]) / 64

        round_log = []
        for ids in prompts[: plan.acceptance_prompts]:
            result = engine.run(ids, Action(False, 4), plan.acceptance_new_tokens, ignore_eos=True)
            round_log.extend(result.round_log)
            tick()
    bar.close()
    alpha = acceptance_estimate(round_log)
    return CostTable(
        key=calibration_key(pair, engine.proposer),
        target_prefill=Curve.fit(plan.prefill_lengths, target_prefill, 2),
        target_step=Curve.fit(plan.contexts, step, 1),
        verify={k: Curve.fit(plan.contexts, v, 1) for k, v in verify.items()},
        propose={k: Curve.fit(plan.contexts, v, 1) for k, v in propose.items()},
        proposer_prefill=Curve.fit(plan.prefill_lengths, proposer_prefill, 2),
        kv_copy=Curve.fit(plan.copy_lengths, copy_times, 1),
        target_kv_bytes_per_token=target_bytes, proposer_kv_bytes_per_token=proposer_bytes,
        acceptance=alpha if alpha is not None else 0.0, acceptance_rounds=len(round_log),
        measured_s=time.perf_counter() - started)


def calibration_dir() -> Path:
    from rakv.models import cache_dir

    path = Path(os.environ.get("RAKV_CALIBRATION_DIR") or cache_dir() / "calibrations")
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
        table = CostTable.from_json(json.loads(Path(path).read_text()))
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
    from rakv.workloads import calibration_prompts

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
