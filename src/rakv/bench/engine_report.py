"""The engine benchmark's report as typed records (scripts/bench_engine.py --json prints `EngineReport`; docs/engine.md
says what each measure is). The fields keep the keys and order the report had as a dict; each goal's threshold in
it is its `rakv.bench.goals` record's, and the verdicts written in it are `rakv.bench.goals.judge`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from rakv.bench.roofline import RowCost
from rakv.runtime.json_records import ABSENT, json_name, optional


@dataclass(frozen=True)
class GenerationRow:
    """Ours beside transformers on one kind of generation (AR, or spec-k4 against assisted generation)."""

    ours_ms_per_token: float
    hf_ms_per_token: float
    ratio: float
    goal: float
    same_output: bool
    ours_peak_mib: float
    hf_peak_mib: float


@dataclass(frozen=True)
class FloorRow:
    """The target's weight bytes at the streaming bandwidth: one token's floor, and our AR over it."""

    weight_bytes: int
    bandwidth_gb_s: float
    floor_ms: float
    ar_over_floor: float
    goal: float


@dataclass(frozen=True)
class TtftRow:
    """TTFT with the prefix store: a prompt cold, as an exact repeat, after a 50 % shared prefix."""

    prompt_tokens: int
    cold_ms: float
    exact_ms: float
    partial_ms: float
    exact_over_cold: float
    partial_over_cold: float


@dataclass(frozen=True)
class DraftReuseRow:
    """A joint-k4 request's draft prefill with the draft's K/V in the store entry and without."""

    with_ms: float
    without_ms: float
    ratio: float
    draft_hit_tokens: int


@dataclass(frozen=True)
class DraftReuse:
    exact_repeat: DraftReuseRow = json_name("exact repeat", ABSENT)
    partial_hit: DraftReuseRow = json_name("50 % partial hit", ABSENT)

    def cases(self) -> list[tuple[str, DraftReuseRow]]:
        """(the case in words, its row), in the report's order."""
        return [("exact repeat", self.exact_repeat), ("50 % partial hit", self.partial_hit)]


@dataclass(frozen=True)
class Acceptance:
    """spec-k4 on the benchmark's prompt: accepted / proposed, the per-token acceptance, rounds."""

    accepted_over_proposed: float
    alpha: float
    rounds: int


@dataclass(frozen=True)
class VerifyRow:
    """verify(k + 1) / one step for each k of the k set, on a 256-token context."""

    context_tokens: int
    step_ms: float
    goal_k_le_4: float
    verify_over_step: dict[int, float]
    monotone: bool


@dataclass(frozen=True)
class DraftRow:
    """The draft's one-token step against the target's and against its own floor."""

    context_tokens: int
    target_step_ms: float
    draft_step_ms: float
    draft_over_target: float
    goal_over_target: float
    weight_bytes: int
    floor_ms: float
    over_floor: float
    goal_over_floor: float
    floors_over_target: float
    floor_over_measured_target: float
    verdict_over_target: str


@dataclass(frozen=True)
class BatchRow:
    """Batched steps of b requests against one; the goals' verdicts; the floors (where measured) beside them."""

    context_tokens: int
    step_ms: dict[int, float]
    over_one: dict[int, float]
    goal_8: float
    goal_16: float
    verdicts: dict[int, str]
    floor_over_measured_one: dict[int, float] | None
    floors_over_one: dict[int, float] | None
    by_kernel: dict[int, RowCost] | None


@dataclass(frozen=True)
class ChunkRow:
    """4 decoding requests alone and with a prefill chunk of a fifth in the same pass (ms)."""

    chunk_tokens: int
    decodes: float
    with_chunk: float
    ratio: float
    goal: float


@dataclass(frozen=True)
class GemmRow:
    rows: int
    ms: float
    over_one: float
    gflops: float
    gb_s: float


@dataclass(frozen=True)
class GemmSide:
    weight_bytes: int
    rows: list[GemmRow]


@dataclass(frozen=True)
class GemmTable:
    """kernels.cpp's GEMM by row count, per side (fp32 target, int8 draft), beside the FMA peak measured here."""

    fma_peak_gflops: float
    threads: int
    sides: dict[str, GemmSide]


@dataclass(frozen=True)
class PrefillSeconds:
    """Prefill seconds by prompt length, of the target and of the draft."""

    target: dict[int, float]
    draft: dict[int, float]

    def points(self) -> list[tuple[str, int, float]]:
        return [(name, n, t) for name, by_n in (("target", self.target), ("draft", self.draft))
                for n, t in by_n.items()]


@dataclass(frozen=True)
class PrefillRow:
    """Prefill seconds by model and length, against the previous engine's calibrated prefill."""

    prompt_tokens: int
    ours_tokens_per_s: float
    seconds: PrefillSeconds
    previous_engine_seconds: PrefillSeconds | None
    faster_than_previous_everywhere: bool | None

    def share_faster(self) -> float | None:
        """The share of (model, length) points faster than the previous engine's (None: no previous engine)."""
        if self.previous_engine_seconds is None:
            return None
        ours = {(name, n): t for name, n, t in self.seconds.points()}
        before = self.previous_engine_seconds.points()
        return sum(ours[name, n] < t for name, n, t in before) / len(before)


@dataclass(frozen=True)
class RssProbe:
    """A fresh process's resident set (bytes) around loading and generating, and what it holds
    (scripts/bench_engine.py --probe rss prints it as JSON for the process that started it)."""

    peak_rss_bytes: int
    weight_bytes: int
    kv_bytes: int
    store_bytes: int
    rss_before_load_bytes: int
    peak_rss_after_load_bytes: int


@dataclass(frozen=True)
class MemoryRow(RssProbe):
    """An RssProbe judged by the memory goal, and the peak less a torch-only interpreter beside it (not judged)."""

    over_weights_and_kv: float
    torch_baseline_bytes: int
    above_torch_over_weights_and_kv: float
    goal: float
    verdict: str


@dataclass(frozen=True)
class StartupRow:
    """Fresh processes to their first token: `rakv generate` cold and warm, `rakv serve --http` warm (seconds)."""

    cold_first_token_s: float
    cold_exit_s: float
    warm_first_token_s: float
    warm_exit_s: float
    warm_runs: int
    goal_warm_s: float
    serve_warm_first_token_s: float


@dataclass(frozen=True)
class LlamaCppMeasure:
    """One llama.cpp model as its child process measured it (decode, prefill, its tokens), or why it could not."""

    version: str = ""
    ms_per_token: float = 0.0
    prefill_tokens_per_s: float = 0.0
    prefill_tokens: int = 0
    tokens: list[int] | None = None
    error: str | None = None


@dataclass(frozen=True)
class LlamaCppRun:
    """Both llama.cpp models as measured (rakv.bench.llama_cpp.llama_cpp_peer)."""

    f32: LlamaCppMeasure
    q4_1: LlamaCppMeasure


@dataclass(frozen=True)
class PrecisionFloor:
    """One precision's bandwidth floor of a decode step: the bytes a step streams / the measured stream rate."""

    precision: str
    weight_bytes: int
    floor_ms: float


@dataclass(frozen=True)
class PrecisionSide:
    """One engine at one thread count: ours at a precision, or llama.cpp on a file (q4_1: the shipped GGUF; fp32:
    its F32 conversion); decode ms/token after the first token and prefill tokens/s, or why not measured."""

    who: str
    precision: str
    threads: int
    decode_ms_per_token: float = optional()
    prefill_tokens_per_s: float = optional()
    decode_over_floor: float = optional()
    error: str = optional()


@dataclass(frozen=True)
class PrecisionDraft:
    """The pair's draft against its target at a precision: one decode step each at 256 positions of context."""

    precision: str
    threads: int
    target_step_ms: float
    draft_step_ms: float
    draft_over_step: float


@dataclass(frozen=True)
class PrecisionRatio:
    """Ours over llama.cpp at the same precision and thread count: decode time, and prefill time (their tokens/s
    over ours), each with its goal's verdict."""

    precision: str
    threads: int
    decode_over_llama_cpp: float
    decode_verdict: str
    prefill_over_llama_cpp: float
    prefill_verdict: str


@dataclass(frozen=True)
class PrecisionPeerTable:
    """scripts/bench_engine.py --precision-peer: our engine at each precision beside llama.cpp on the same GGUF."""

    pair: str
    new_tokens: int
    prefill_tokens: int
    repeats: int
    bandwidth_gb_s: float
    floors: list[PrecisionFloor]
    sides: list[PrecisionSide]
    ratios: list[PrecisionRatio]
    drafts: list[PrecisionDraft]


@dataclass(frozen=True)
class LlamaCppModel:
    """One llama.cpp model's row: its figures, or only `error` where its process died."""

    version: str = optional()
    ms_per_token: float = optional()
    prefill_tokens_per_s: float = optional()
    prefill_tokens: int = optional()
    same_first_tokens_as_ours: bool = optional()
    error: str = optional()


@dataclass(frozen=True)
class LlamaCppRow:
    """llama.cpp F32 and Q4_1 beside us, and ours over F32 where F32 ran."""

    f32: LlamaCppModel
    q4_1: LlamaCppModel
    ours_decode_ms_per_token: float
    ar_over_f32: float | None
    goal: float
    prefill_over_f32: float | None
    prefill_goal: float

    def models(self) -> list[tuple[str, LlamaCppModel]]:
        return [("f32", self.f32), ("q4_1", self.q4_1)]


@dataclass(frozen=True)
class LoadReport:
    """scripts/bench_engine.py --load: memory and start-up only."""

    memory: MemoryRow
    startup: StartupRow


@dataclass(frozen=True)
class EngineReport:
    """Every measurement of the full engine benchmark (rakv.bench.engine.bench)."""

    pair: str
    device: str
    threads: int
    kernels: str
    new_tokens: int
    prompt_tokens: int
    repeats: int
    ar: GenerationRow
    spec_k4: GenerationRow
    floor: FloorRow
    ttft: TtftRow
    draft_reuse: DraftReuse | None
    spec_k4_acceptance: Acceptance
    verify: VerifyRow
    draft: DraftRow
    batch: BatchRow
    chunk_beside_decodes: ChunkRow
    gemm: GemmTable | None
    prefill: PrefillRow
    memory: MemoryRow
    startup: StartupRow
    llama_cpp: LlamaCppRow | None


@dataclass(frozen=True)
class PrecisionMachine:
    """Where a precision benchmark ran: the CPU as /proc/cpuinfo names it (`label`, its file-name form:
    rakv.runtime.run_layout.PeerLayout.precision), what the kernels compile for (rakv.runtime.kernels.target_isa),
    the usable cores, the commit and UTC date, and the one-minute load average when it started."""

    processor: str
    label: str
    kernels_isa: str | None
    cores: int
    commit: str | None
    date: str
    load_1min: float


@dataclass(frozen=True)
class PrecisionPeerFile:
    """scripts/bench_engine.py --precision-peer's record as shipped (data/reference/peer/bench_engine/): the machine
    and the table; docs/engine.md's "Precision" tables are rendered from it (scripts/write_precision_table.py)."""

    machine: PrecisionMachine
    table: PrecisionPeerTable


def _cell(value: float | None, digits: int) -> str:
    return "--" if value is None or value is ABSENT else f"{value:.{digits}f}"


def precision_markdown(record: PrecisionPeerFile, source: str) -> str:
    """One shipped precision benchmark as markdown: where and when it ran, each precision's floor, each engine's
    decode and prefill, ours over llama.cpp with the goals' verdicts, and the draft over its target step."""
    m, t = record.machine, record.table
    lines = [f"From `{source}` (commit {m.commit[:7] if m.commit else 'unknown'}, {m.date}; {m.processor}, "
             f"kernels for {m.kernels_isa or 'unknown'}, {m.cores} cores, one-minute load {m.load_1min:.1f} at "
             f"the start): {t.pair}, decode after the first token ({t.new_tokens} tokens), prefill of "
             f"{t.prefill_tokens} tokens, medians of {t.repeats}. Floors (the bytes a decode step streams / "
             f"{t.bandwidth_gb_s:.1f} GB/s measured): " + ", ".join(
                 f"{f.precision} {f.weight_bytes / 1e6:.0f} MB = {f.floor_ms:.2f} ms" for f in t.floors) + ".", "",
             "| engine | precision | threads | decode ms/token | / floor | prefill tokens/s |",
             "|--------|-----------|--------:|----------------:|--------:|-----------------:|"]
    for s in t.sides:
        if s.error is not ABSENT and s.error:
            lines.append(f"| {s.who} | {s.precision} | {s.threads} | not measured: {s.error} | | |")
        else:
            lines.append(f"| {s.who} | {s.precision} | {s.threads} | {_cell(s.decode_ms_per_token, 2)} | "
                         f"{_cell(s.decode_over_floor, 2)} | {_cell(s.prefill_tokens_per_s, 0)} |")
    if t.ratios:
        lines += ["", "| ours / llama.cpp | threads | decode time | verdict | prefill time | verdict |",
                  "|------------------|--------:|------------:|---------|-------------:|---------|"]
        lines += [f"| {r.precision} | {r.threads} | {r.decode_over_llama_cpp:.3f}x | {r.decode_verdict} | "
                  f"{r.prefill_over_llama_cpp:.3f}x | {r.prefill_verdict} |" for r in t.ratios]
    if t.drafts:
        lines += ["", "| target precision | threads | target step ms | draft step ms | draft / step |",
                  "|------------------|--------:|---------------:|--------------:|-------------:|"]
        lines += [f"| {d.precision} | {d.threads} | {d.target_step_ms:.2f} | {d.draft_step_ms:.2f} | "
                  f"{d.draft_over_step:.2f} |" for d in t.drafts]
    return "\n".join(lines)
