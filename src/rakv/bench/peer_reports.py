"""The vLLM peer's reports as typed records (docs/peers.md): what scripts/bench_serving.py --out,
scripts/bench_vllm_serve.py (summary.json) and scripts/tune_vllm.py (tune.json) write, what scripts/vllm_peer.py
answers a job with, and the jobs themselves. The shipped copies (data/reference/peer/) are read back through these
records (rakv.experiments.peer_tables renders docs/peers.md's tables from them), so their fields keep the keys and
the order the files have (rakv.runtime.json_records: `load_record` names a missing or unknown field).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rakv.bench.options import ServingBenchOptions
from rakv.bench.roofline import Limits, RowCost
from rakv.runtime.json_records import ABSENT, CI, load_record, optional, read_record

# ---------------------------------------------------------------------------------------------
# scripts/bench_serving.py's report (its --out file: the report and the options it ran with)


@dataclass(frozen=True)
class ServingBenchArgs(ServingBenchOptions):
    """The options a bench_serving.py file was measured with, and the script's own two flags."""

    json: bool = False
    out: str | None = None

    @classmethod
    def of(cls, options: ServingBenchOptions, json: bool, out: str | None) -> ServingBenchArgs:
        return cls(**{f.name: getattr(options, f.name) for f in fields(options)}, json=json, out=out)


@dataclass(frozen=True, kw_only=True)
class ConcurrencyRow:
    """One concurrency c (medians of the repeats, each repeat's tok/s in `*_tok_s_runs`); the vLLM fields only where
    vLLM ran at this c, the bound's only where the roofline was measured (CPU)."""

    vllm_tok_s: float = optional()
    ours_over_vllm: float = optional()
    vllm_tok_s_runs: list[float] = optional()
    vllm_equal: int = optional()
    vllm_divergences: list[str] = optional()
    vllm_start_s: float = optional()
    concurrency: int
    ours_tok_s: float
    sequential_tok_s: float
    transformers_tok_s: float | None
    ours_tok_s_runs: list[float] = optional()
    sequential_tok_s_runs: list[float] = optional()
    transformers_tok_s_runs: list[float] = optional()
    ours_over_sequential: float
    ours_over_transformers: float | None
    scheduler_share: float
    mean_batch_rows: float
    sequential_prefill_share: float
    amdahl_over_sequential: float
    bound_tok_s: float = optional()
    of_bound: float = optional()
    bound_prefill_s: float = optional()
    bound_decode_s: float = optional()

    @property
    def has_vllm(self) -> bool:
        return self.vllm_tok_s is not ABSENT

    @property
    def has_bound(self) -> bool:
        return self.bound_tok_s is not ABSENT


@dataclass(frozen=True)
class OverloadRow:
    """--overload N: N requests above capacity under a small K/V budget."""

    requests: int
    completed: int
    failed: int
    duration_s: float
    arrival_span_s: float
    peak_kv_mib: float
    kv_budget_mib: float
    preemptions: int
    max_concurrency: int
    p99_ttft_ms: float | None
    peak_rss_mib: float


@dataclass(frozen=True, kw_only=True)
class ServingBenchReport:
    """scripts/bench_serving.py's result (--json prints it, --out writes it with `args`)."""

    pair: str
    strategy: str
    proposer: str
    requests: int
    new_tokens: int
    token_budget: int
    rows: list[ConcurrencyRow]
    outputs_equal_alone: bool
    limits: Limits | None
    row_costs: dict[int, RowCost] | None
    vllm: str = optional()
    vllm_ngram: int = optional()
    overload: OverloadRow = optional()
    args: ServingBenchArgs = optional()

    def by_concurrency(self) -> dict[int, ConcurrencyRow]:
        return {row.concurrency: row for row in self.rows}


def read_serving_report(path: Path) -> ServingBenchReport:
    return read_record(ServingBenchReport, path)


# ---------------------------------------------------------------------------------------------
# scripts/bench_vllm_serve.py's summary.json


@dataclass(frozen=True)
class Metric:
    """A client metric shown in docs/peers.md's tables: its field in `ClientRun`, its name, its digits."""

    field: str
    label: str
    digits: int

    @property
    def is_latency(self) -> bool:
        return self.field.endswith("_ms")


# all but the first and last are latencies in ms
SERVE_METRICS = (Metric("output_throughput", "tok/s", 1), Metric("p50_ttft_ms", "TTFT p50", 0),
                 Metric("p99_ttft_ms", "TTFT p99", 0), Metric("p50_tpot_ms", "TPOT p50", 0),
                 Metric("p99_tpot_ms", "TPOT p99", 0), Metric("p50_itl_ms", "ITL p50", 0),
                 Metric("p99_itl_ms", "ITL p99", 0), Metric("mean_e2el_ms", "E2E mean", 0),
                 Metric("p99_e2el_ms", "E2E p99", 0), Metric("prefix_hit_rate", "hits", 1))
RATIO_METRICS = tuple(m for m in SERVE_METRICS if m.is_latency) + (SERVE_METRICS[0],)


@dataclass(frozen=True, kw_only=True)
class ClientRun:
    """One workload's result from vLLM's benchmark client (`vllm bench serve --save-result`), its lists dropped, and
    the server's prefix hit rate over it. The fields rakv reads are required; the client's others are kept as it
    wrote them where it wrote them."""

    date: str = optional()
    endpoint_type: str = optional()
    backend: str = optional()
    label: Any = optional()
    model_id: str = optional()
    tokenizer_id: str = optional()
    num_prompts: int = optional()
    request_rate: Any = optional()
    burstiness: float = optional()
    max_concurrency: int | None = optional()
    duration: float = optional()
    completed: int
    failed: int
    total_input_tokens: int = optional()
    total_output_tokens: int = optional()
    request_throughput: float = optional()
    request_goodput: float | None = optional()
    output_throughput: float
    total_token_throughput: float = optional()
    max_output_tokens_per_s: float = optional()
    max_concurrent_requests: int = optional()
    rtfx: float = optional()
    mean_ttft_ms: float = optional()
    median_ttft_ms: float = optional()
    std_ttft_ms: float = optional()
    p50_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float = optional()
    median_tpot_ms: float = optional()
    std_tpot_ms: float = optional()
    p50_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float = optional()
    median_itl_ms: float = optional()
    std_itl_ms: float = optional()
    p50_itl_ms: float
    p99_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float = optional()
    std_e2el_ms: float = optional()
    p50_e2el_ms: float = optional()
    p99_e2el_ms: float
    prefix_hit_rate: float | None = None

    def metric(self, metric: Metric) -> float | None:
        return getattr(self, metric.field)


@dataclass(frozen=True)
class ClientOutput:
    """What the client answered for one workload: its run's metrics, and the texts it received (None where a request
    failed; `errors`, one per request, empty where none)."""

    run: ClientRun
    generated_texts: list[str]
    errors: list[str] | None

    @classmethod
    def of_client(cls, result: dict, prefix_hit_rate: float | None, source: str) -> ClientOutput:
        """vLLM's result file (its own format: the fields `ClientRun` declares are kept, the rest dropped)."""
        declared = {f.name for f in fields(ClientRun)}
        run = load_record(ClientRun, {k: v for k, v in result.items() if k in declared and not isinstance(v, list)}
                          | {"prefix_hit_rate": prefix_hit_rate}, source)
        return cls(run, result.get("generated_texts") or [], result.get("errors"))


@dataclass(frozen=True)
class Agreement:
    """rakv's outputs against one vLLM setting's on one workload: equal texts of the requests both completed."""

    equal: int
    requests: int
    failed: int
    divergences: list[str]


@dataclass(frozen=True)
class RepeatRecord:
    """One repeat: each setting's client metrics per workload, and rakv's agreement with each vLLM setting."""

    engines: dict[str, dict[str, ClientRun]]
    agreement: dict[str, dict[str, Agreement]]


@dataclass(frozen=True, kw_only=True)
class WorkloadAggregate:
    """One setting on one workload over the repeats: each metric's mean with its t interval, requests summed."""

    output_throughput: CI
    p50_ttft_ms: CI
    p99_ttft_ms: CI
    p50_tpot_ms: CI
    p99_tpot_ms: CI
    p50_itl_ms: CI
    p99_itl_ms: CI
    mean_e2el_ms: CI
    p99_e2el_ms: CI
    prefix_hit_rate: CI
    completed: int
    failed: int
    repeats: int

    def metric(self, metric: Metric) -> CI:
        return getattr(self, metric.field)


@dataclass(frozen=True, kw_only=True)
class PairedRatios:
    """rakv / one vLLM setting on one workload, per metric: the geometric mean of the repeats' ratios and its CI."""

    p50_ttft_ms: CI
    p99_ttft_ms: CI
    p50_tpot_ms: CI
    p99_tpot_ms: CI
    p50_itl_ms: CI
    p99_itl_ms: CI
    mean_e2el_ms: CI
    p99_e2el_ms: CI
    output_throughput: CI

    def metric(self, metric: Metric) -> CI:
        return getattr(self, metric.field)


RAKV = "rakv"  # rakv serve's engine setting: its key in bench_vllm_serve.py's settings and its `engine`


@dataclass(frozen=True)
class EngineSetting:
    """An engine setting served: rakv, or vLLM at OMP_NUM_THREADS `threads` (0: its own choice)."""

    engine: str
    threads: int | None

    @property
    def is_rakv(self) -> bool:
        return self.engine == RAKV


@dataclass(frozen=True)
class Machine:
    """Where it was measured: the CPU's model name, its cores, the date."""

    cpu: str
    cores: int
    date: str


@dataclass(frozen=True)
class VllmServeSummary:
    """scripts/bench_vllm_serve.py's summary.json."""

    settings: dict[str, EngineSetting]
    workloads: dict[str, float]  # label -> request rate
    repeats: list[RepeatRecord]
    aggregate: dict[str, dict[str, WorkloadAggregate]]
    paired: dict[str, dict[str, PairedRatios]]
    requests: int
    new_tokens: int
    strategy: str
    seeds: list[int]
    vllm: str
    machine: Machine


def read_serve_summary(path: Path) -> VllmServeSummary:
    return read_record(VllmServeSummary, path)


# ---------------------------------------------------------------------------------------------
# scripts/vllm_peer.py's jobs and answers, and scripts/tune_vllm.py's tune.json (the jobs are read there as
# attributes: that script runs in the peer's venv and cannot import rakv)


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's speculative_config for n-gram drafts (its names): k tokens, n-grams of 1 to `prompt_lookup_max` tokens
    as rakv's prompt lookup; with a schedule, k per batch size as (batch_start, batch_end, k) ranges."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int
    num_speculative_tokens_per_batch_size: list[list[int]] = optional()


@dataclass(frozen=True)
class ThroughputJob:
    """bench_serving.py --peer vllm's job: every prompt at once, per concurrency (scripts/vllm_peer.py's default)."""

    model: str
    prompts: list[list[int]]
    max_tokens: int
    concurrency: list[int]
    repeats: int
    eager: bool
    speculative: SpeculativeConfig | None
    prefix_caching: bool = False
    mode: str = "throughput"


@dataclass(frozen=True)
class StepsJob:
    """tune_vllm.py's step measurement (mode "steps")."""

    model: str
    prompts: list[list[int]]
    eager: bool
    max_ngram: int
    ks: list[int]
    batches: list[int]
    short: int
    long: int
    repeats: int
    prefix_caching: bool = False
    mode: str = "steps"


@dataclass(frozen=True)
class ConfigsJob:
    """tune_vllm.py's check (mode "configs"): each (label, speculative_config or None) served at each c."""

    model: str
    prompts: list[list[int]]
    eager: bool
    max_ngram: int
    configs: list[list]  # [label, SpeculativeConfig or None]
    concurrency: list[int]
    max_tokens: int
    repeats: int
    prefix_caching: bool = False
    mode: str = "configs"


@dataclass(frozen=True)
class PeerRun:
    """One concurrency of a throughput job: the engine's start, each timed run's seconds, the last run's outputs."""

    c: int
    start_s: float
    seconds: list[float]
    outputs: list[list[int]]


@dataclass(frozen=True)
class PeerThroughput:
    vllm: str
    results: list[PeerRun]


@dataclass(frozen=True)
class StepPoint:
    """vLLM's step at batch b with n-gram drafts of k (scripts/vllm_peer.py's `steps`)."""

    k: int
    b: int
    step_s: float
    draft_rows_per_step: float
    steps: float


@dataclass(frozen=True)
class PeerSteps:
    vllm: str
    steps: list[StepPoint]


@dataclass(frozen=True)
class ConfigRate:
    """One speculation config served at concurrency c: tokens/s (the best repeat) and mean TPOT."""

    config: str
    c: int
    tok_s: float
    tpot_s: float | None


@dataclass(frozen=True)
class PeerConfigs:
    vllm: str
    configs: list[ConfigRate]


@dataclass(frozen=True)
class StepModel:
    """vLLM's step = fixed + per request x b + per row x rows (rakv.bench.peers.fit)."""

    fixed_s: float
    per_request_s: float
    per_row_s: float


@dataclass(frozen=True)
class TuneReport:
    """scripts/tune_vllm.py's tune.json: the measured steps, the fitted model, the schedule, and the check."""

    vllm: str
    alpha: float
    match_rate: float
    steps: list[StepPoint]
    model: StepModel
    schedule: list[list[int]]
    hand: list[list[int]]
    check: list[ConfigRate]

    def rates(self) -> dict[tuple[str, int], float]:
        """The check's tok/s by (config, c)."""
        return {(r.config, r.c): r.tok_s for r in self.check}


def read_tune(path: Path) -> TuneReport:
    return read_record(TuneReport, path)
