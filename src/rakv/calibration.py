"""Calibration: measuring the cost model's tables on the machine and pair in use, and storing them.

It times the operations the decode loops actually perform (target prefill, target one-token step,
target verify of k+1 tokens, the proposer's k candidates and its prefill, the KV copy of a store
hit), fits a small curve to each (rakv.costmodel.Curve), and saves the table under a key made of
the pair's and the machine's fingerprints; a table measured for another key is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

from rakv.actions import SPEC_K, Action
from rakv.cache import PrefixKVStore, kv_nbytes
from rakv.costmodel import CostTable, Curve, acceptance_estimate
from rakv.decoding import Sampling, crop_cache, forward, synchronize
from rakv.errors import RakvError
from rakv.kernels import new_kv_cache
from rakv.models import derived_files_dir
from rakv.workloads import calibration_prompts


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
    k_values: tuple[int, ...] = SPEC_K
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
                crop_cache(cache, ctx)

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
