"""The serving study's part of the summary (rakv.experiments.serving_stats builds it): cells, goals with their
verdicts, power and the batch cost model's errors, declared as rakv.experiments.summary declares the rest (its
docstring states the on-disk conventions).
"""

from __future__ import annotations

from dataclasses import dataclass

from rakv.experiments.serving_goal_ids import GoalId
from rakv.experiments.verdicts import Verdict
from rakv.runtime.json_records import (
    CI,
    ci_keys,
    optional,
)

ALL_ITERATIONS = "all"  # ServingSummary.iteration_mape's key over every served iteration (the others: families, shapes)

# ---------------------------------------------------------------------------------------------
# The serving study (rakv.experiments.serving_stats)


@dataclass(frozen=True)
class SloSteps:
    """The SLOs as multiples of the machine's one-request decode step."""
    itl: int
    ttft: int
    tpot: int


@dataclass(frozen=True)
class Slos:
    """One configuration's SLOs in milliseconds."""
    slo_itl_ms: float | None
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None


@dataclass(frozen=True)
class Margins:
    """The equivalence margins of the "no worse" goals (relative), fixed in conf/experiment/serving.yaml before any
    data: the study's defaults and any family's own (family -> metric -> margin)."""
    goodput: float
    ttft: float
    by_family: dict[str, dict[str, float]] = optional()  # absent: a run before families had their own


@dataclass(frozen=True)
class FamilyPower:
    """A serving family's paired noise over its goal comparisons and the minimum detectable relative difference (95 %
    CI, 80 % power) at the run's repeats, against its margin; `source`: "pilot" (the plan's) or "run" (this run's)."""
    source: str
    family: str
    metric: str
    paired_sd: float
    largest_sd: float
    largest_at: str
    repeats: int
    mdd: float
    own_repeats: int
    margin: float | None


@dataclass(frozen=True)
class GoalPower:
    """One goal's power, planned before the run from the pilot (rakv.experiments.serving_power.goal_power): the
    minimum detectable difference at the run's repeats (two-sided `confidence`: 95 % family-wise over the family's
    goals and, for a goal met at some load, its loads; 80 % power) from the pilot's SD at the load that binds,
    against the goal's margin; `powered` False: the goal is reported "underpowered", with the repeats (and, if a
    run's requests were independent, the requests per trace) that would power it. None where the pilot cannot say."""
    key: str
    family: str
    metric: str
    repeats: int
    confidence: float
    margin: float | None
    loads: list[float]  # the loads the pilot has this statistic at
    load: float | None
    paired_sd: float | None
    mdd: float | None
    powered: bool | None
    repeats_needed: int | None
    requests_needed: int | None
    note: str


@dataclass(frozen=True)
class ServedExact:
    """Served outputs identical to the request's batch-one greedy output."""
    equal: int
    total: int


@dataclass(frozen=True)
class Cell:
    """One cell (family x rate x policy): each metric's mean over repeats with its t interval."""
    family: str
    rate: float
    policy: str
    repeats: int
    configuration: str | None
    goodput: float | None
    goodput_low: float | None
    goodput_high: float | None
    output_throughput: float | None
    output_throughput_low: float | None
    output_throughput_high: float | None
    p99_itl_ms: float | None
    p99_itl_ms_low: float | None
    p99_itl_ms_high: float | None
    median_ttft_ms: float | None
    median_ttft_ms_low: float | None
    median_ttft_ms_high: float | None
    concurrency: float | None
    concurrency_low: float | None
    concurrency_high: float | None


@dataclass(frozen=True)
class GoalPair:
    """One load's judgement of a speculation goal: the relative goodput difference and its verdict."""
    family: str
    rate: float
    policy: str
    against: str
    metric: str
    kind: str  # rakv.experiments.serving_power.GoalKind's first four: no worse, higher, part: ...
    ci: CI = ci_keys("value", "ci_low", "ci_high")  # the value and its 95 % CI, written as these three keys
    verdict: Verdict  # the load's alone, under the goal's rule
    judged: bool = optional()  # whether some policy missed an SLO at this load (serving_cells.judged_loads)


@dataclass(frozen=True)
class IterationMape:
    """The batch cost model's held-out error per served iteration: online-scaled and from the table alone."""
    scaled: CI
    table: CI
    iterations: int


@dataclass(frozen=True)
class LatencyMape:
    """Admission's service-time prediction error under load, the batch-one prediction's, and by rate."""
    served: CI
    requests: int
    batch_one: CI
    by_rate: dict[str, CI]


@dataclass(frozen=True)
class AcceptanceErrors:
    """One acceptance source's |alpha at admission - realised| and ex-post regret (ours: also against the other)."""
    acceptance_error: CI
    regret: CI
    vs_baseline: CI = optional()


@dataclass(frozen=True)
class ChosenK:
    """Mean candidates per decoding request at one batch size, per family and policy."""
    family: str
    policy: str
    batch: int
    mean_k: float
    speculating: float
    iterations: int


@dataclass(frozen=True)
class BatchBreakEven:
    """The least common acceptance at which k beats k = 0 at batch size `batch` (None: not even alpha = 1)."""
    batch: int
    k: int
    break_even_alpha: float | None
    context: int


@dataclass(frozen=True)
class Goal:
    """A goal named before the serving run: its value, CI, verdict and rule (the rest where the goal has them)."""
    goal: str
    key: str
    ci: CI = ci_keys("value", "ci_low", "ci_high")  # the value and its 95 % CI, written as these three keys
    verdict: Verdict
    rule: str
    family: str = optional()
    rival: str = optional()
    rate: float = optional()
    unit: str = optional()
    status: dict[str, dict[str, str]] = optional()  # policy -> rate -> serving_goals.SloStatus: meets/fails/unclear
    # the goal's own p-value (its loads corrected within it) and Holm's within its family (the verdict: met or
    # missed where p_holm < 0.05); absent: a run analysed before, or a goal not tested (underpowered, not in the data)
    p_value: float | None = optional()
    p_holm: float | None = optional()
    reason: str = optional()  # why "underpowered" or "missing" (rakv.experiments.verdicts.GOAL_VERDICTS)

    @property
    def goal_id(self) -> GoalId:
        """The goal's family and kind (and rival, where the key names one), read from `key`."""
        return GoalId.from_key(self.key)


@dataclass(frozen=True)
class Comparison:
    """A relative paired difference (policy over `against`, minus 1) at one rate, for the paper's sentences."""
    family: str
    rate: float
    policy: str
    against: str
    metric: str
    ci: CI = ci_keys("value", "ci_low", "ci_high")  # the value and its 95 % CI, written as these three keys


@dataclass(frozen=True)
class ServingSummary:
    """Everything the serving study's analysis reports (paper/main.tex, "Serving under load")."""
    configuration: str
    configurations: list[str]
    calibrated_acceptance: float | None
    runs: int
    requests: int
    repeats: int
    commit: str | None
    slo_steps: SloSteps
    slos_ms: dict[str, Slos]
    margins: Margins
    mape_goal: float
    itl_slo_ms: float | None
    exact: ServedExact
    cells: list[Cell]
    pairs: list[GoalPair]
    iteration_mape: dict[str, IterationMape]  # ALL_ITERATIONS, each family, "shape: <class>"
    latency: dict[str, LatencyMape]  # per family
    acceptance: dict[str, AcceptanceErrors]  # per acceptance source
    chosen_k: list[ChosenK]
    break_even_by_batch: list[BatchBreakEven]
    goals: list[Goal]
    comparisons: list[Comparison]
    # per family the paired noise and minimum detectable difference: the plan's (from the pilot, before the run) and
    # this run's own (serving_power.power_rows)
    power: list[FamilyPower] = optional()  # absent: a run analysed before it was reported
    goal_power: list[GoalPower] = optional()  # each goal's power planned from the pilot; absent: analysed before
