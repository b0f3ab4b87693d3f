"""summary.json: the statistics of a served trace, under vLLM `benchmark_serving`'s names, as typed records.

Per request (requests.jsonl): `ttft_s` from arrival to the first token, `itl_s` the gaps between successive
emissions (a speculative round's tokens arrive together: one gap), `tpot_s` = (e2el - ttft) / (new tokens - 1)
for requests of more than one token, `e2el_s` from arrival to the last token. `goodput` counts the requests
per second that meet every SLO given (`ttft:MS`, `tpot:MS`, `e2el:MS`), as vLLM's `--goodput`.

`served_statistics` gives a run's `ServedStatistics`; rakv.serving.server.finish_summary adds the settings it was served
with (`ServeSettings`) into a `RunSummary` and writes it: summary.json is one flat object, the statistics' keys, then
`outputs_equal_alone` (with --check-alone), the settings' and `peak_rss_mib`, in that order (docs/serving.md).
`read_run_summary` reads it back, every key checked (the records' codec, rakv.runtime.json_records).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import from_json, inline, optional, to_json
from rakv.serving.records import IterationRecord, RequestRecord

SLO_METRICS = ("ttft", "tpot", "e2el")


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:100"]` -> {"ttft": 500.0, "tpot": 100.0} (milliseconds)."""
    slos = {}
    for item in items or ():
        name, _, value = item.partition(":")
        if name not in SLO_METRICS:
            raise RakvError(f"--goodput takes {', '.join(m + ':MS' for m in SLO_METRICS)}, got '{item}'")
        try:
            slos[name] = float(value)
        except ValueError:
            raise RakvError(f"--goodput {name}: '{value}' is not a number of milliseconds") from None
        if slos[name] <= 0:
            raise RakvError(f"--goodput {name}: the SLO must be positive, got {value}")
    return slos


@dataclass(frozen=True)
class ServedStatistics:
    """The statistics of one served trace (`served_statistics`): counts over its finished requests, latencies in ms over
    them (None without one), and what its iterations ran."""

    completed: int
    failed: int  # requests that did not finish: refused, aborted or failed
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    p99_tpot_ms: float | None
    mean_itl_ms: float | None
    median_itl_ms: float | None
    p99_itl_ms: float | None
    mean_e2el_ms: float | None
    median_e2el_ms: float | None
    p99_e2el_ms: float | None
    goodput: float | None  # requests per second meeting every SLO (None: no SLO given)
    goodput_slos_ms: dict[str, float] | None
    mean_batch_tokens: float
    max_concurrency: int
    prefix_hit_rate: float
    iterations: int
    preemptions: int
    peak_kv_bytes: int
    scheduler_share: float  # of the busy time, the scheduler's
    accepted: int
    proposed: int


@dataclass(frozen=True)
class ServeSettings:
    """What a trace was served with: the options (rakv.serving.server.ServeOptions) and the engine's proposer and
    pair; `token_budget` None without chunking."""

    strategy: str
    speculation: str
    proposer: str
    pair: str
    token_budget: int | None
    chunking: bool
    max_batch: int
    kv_budget_mib: float
    itl_slo_ms: float | None
    acceptance: str
    proposers: list[str] = optional()  # several proposers, rakv-asd choosing per request (`proposer` the first)
    proposer_choice: str = optional()  # ... by the batch-one latency or the service time (`--proposer-choice`)


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """A served run's summary.json: its statistics, how many finished outputs equal the request's batch-one greedy
    output (ABSENT: not checked, then left out of the file), its settings and the process's peak RSS. The statistics
    and settings are `inline()`: their keys are summary.json's own, one flat object as vLLM's benchmark writes its
    result (docs/serving.md)."""

    statistics: ServedStatistics = inline()
    outputs_equal_alone: int = optional()
    settings: ServeSettings = inline()
    peak_rss_mib: float

    def to_json(self) -> dict:
        """summary.json's object: flat, in the order the module docstring gives."""
        return to_json(self)


def read_run_summary(path: Path) -> RunSummary:
    """A served run's summary.json; RakvError naming the file and the key where it is not one."""
    try:
        return from_json(RunSummary, json.loads(Path(path).read_text()))
    except ValueError as exc:  # not JSON, or a SchemaError naming the field
        raise RakvError(f"{path}: not a served run's summary.json ({exc})") from None


def _stats(name: str, values_s: list[float]) -> dict:
    ms = np.asarray(values_s, dtype=float) * 1e3
    if ms.size == 0:
        return {f"mean_{name}_ms": None, f"median_{name}_ms": None, f"p99_{name}_ms": None}
    return {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
            f"p99_{name}_ms": float(np.percentile(ms, 99))}


def meets(record: RequestRecord, slos: dict[str, float]) -> bool:
    for name, limit_ms in slos.items():
        value = getattr(record, f"{name}_s")
        if value is not None and value * 1e3 > limit_ms:
            return False
    return True


def served_statistics(records: list[RequestRecord], duration_s: float, slos: dict[str, float],
              iterations: list[IterationRecord]) -> ServedStatistics:
    """The statistics of one served trace; `iterations`: what each iteration ran, and its times."""
    ok = [r for r in records if r.ok]
    output = sum(r.new_tokens for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)
    duration_s = max(duration_s, 1e-9)
    busy = sum(i.iteration_s for i in iterations)
    return ServedStatistics(
        completed=len(ok), failed=len(records) - len(ok), duration_s=duration_s,
        total_input_tokens=prompt, total_output_tokens=output,
        request_throughput=len(ok) / duration_s, output_throughput=output / duration_s,
        total_token_throughput=(prompt + output) / duration_s,
        **_stats("ttft", [r.ttft_s for r in ok]),
        **_stats("tpot", [r.tpot_s for r in ok if r.tpot_s is not None]),
        **_stats("itl", [gap for r in ok for gap in r.itl_s]),
        **_stats("e2el", [r.e2el_s for r in ok]),
        goodput=(sum(meets(r, slos) for r in ok) / duration_s) if slos else None,
        goodput_slos_ms=slos or None,
        mean_batch_tokens=float(np.mean([i.rows for i in iterations])) if iterations else 0.0,
        max_concurrency=max((i.running for i in iterations), default=0),
        prefix_hit_rate=(sum(r.hit_tokens for r in ok) / prompt) if prompt else 0.0,
        iterations=len(iterations),
        preemptions=sum(r.preempted for r in records),
        peak_kv_bytes=max((i.kv_bytes for i in iterations), default=0),
        scheduler_share=(sum(i.schedule_s for i in iterations) / busy) if busy else 0.0,
        accepted=sum(r.accepted for r in ok), proposed=sum(r.proposed for r in ok),
    )
