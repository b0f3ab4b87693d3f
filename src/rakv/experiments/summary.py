"""The summary of a results folder, declared once: typed records, and results/<name>/summary.json as their on-disk
form (docs/layout.md names the modules around it, docs/outputs.md what the keys mean).

`rakv.experiments.analysis.summarize` builds a `Summary`; the paper's prose and LaTeX, the figures, the notebooks,
scripts/compare_runs.py and the tests read its attributes. summary.json is written and read only through this
module (`write_summary`, `read_summary`, `Summary.to_json`, `Summary.from_json`): reading checks every field's
presence and type against these declarations, so an old or edited file stops with one line naming the field
("summary.json: missing field 'claims[3].direction'"), not with a KeyError deep in the paper.

The records are frozen dataclasses with no mapping methods: a string-key read of one fails at once, and
tests/test_records.py fails on any such read outside this module. Where a part is an open-ended map (keyed by
configuration, family, rate or pair/proposer name) it is a `dict[str, Record]`; everything else is a field.

The codec is rakv.runtime.json_records, shared with every other file the pipeline writes. Conventions of the on-disk
form, kept as they were when the summary was a dict:
- a statistic with its 95 % CI is a `CI` (value, low, high; `None` where there is none), written as the JSON list
  `[value, low, high]`, or as three keys of its record where the field is declared with `ci_keys`;
- NaN and infinity are written as null; numpy scalars as Python numbers;
- a field whose default is `ABSENT` (declared with `optional()`) is left out of the file when it was not computed (a
  stage that did not run, a goal without a rate), which is not the same as computed and null; ABSENT is falsy, so
  `if summary.serving:` reads as "the serving stage ran";
- a field's JSON name is its attribute name, except where `json_name` says otherwise (baseline names with hyphens).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from rakv.experiments.serving_goal_ids import GoalId
from rakv.experiments.verdicts import BlockAcceptance, CheckVerdict, Payoff, Verdict
from rakv.runtime.actions import AR, BEST_FIXED, JOINT_K4, KV_ONLY, ORACLE, SPEC_K4
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import (
    CI,
    check_part,
    ci_keys,
    json_name,
    load_record,
    name_of,
    optional,
    read_json,
    to_json,
)
from rakv.runtime.run_layout import RunLayout

ALL_ITERATIONS = "all"  # ServingSummary.iteration_mape's key over every served iteration (the others: families, shapes)


# ---------------------------------------------------------------------------------------------
# The study (rakv.experiments.analysis): grid, per-configuration statistics, pooled effects


@dataclass(frozen=True)
class Grid:
    """What the study measured: prompts per dataset, length bins, scenarios, repeats, new tokens, actions."""
    prompts: dict[str, int]
    length_bins: list[str]
    scenarios: list[str]
    measurements_per_action_min: int
    controller_repeats: int
    new_tokens: int
    actions: list[str]


@dataclass(frozen=True)
class Exact:
    """How many outputs are identical to autoregressive greedy decoding."""
    equal: int
    total: int
    share: float | None


@dataclass(frozen=True)
class ByBaseline:
    """One statistic of RAKV-ASD against each baseline (rakv.experiments.study_stats.BASELINES, in that order)."""
    kv_only: CI = json_name(KV_ONLY)
    best_fixed: CI = json_name(BEST_FIXED)
    joint_k4: CI = json_name(JOINT_K4)
    spec_k4: CI = json_name(SPEC_K4)
    ar: CI = json_name(AR)
    oracle: CI = json_name(ORACLE)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The baselines as the study spells them, in the summary's order."""
        return tuple(name_of(f) for f in fields(cls))

    @classmethod
    def of(cls, value: Callable[[str], CI]) -> ByBaseline:
        """The record with `value(baseline)` for every baseline (its name as the study spells it)."""
        return cls(**{f.name: value(name_of(f)) for f in fields(cls)})

    def against(self, baseline: str) -> CI:
        """The statistic against `baseline` as the study spells it ("joint-k4", "kv-only", ...)."""
        for f in fields(self):
            if name_of(f) == baseline:
                return getattr(self, f.name)
        raise KeyError(baseline)


@dataclass(frozen=True)
class SpecSlowdown:
    """Best k != 0 against best k = 0 per scenario: least and most relative slowdown, share of scenarios slower, and
    over every scenario the relative slowdown of the sums (`pooled`, CI over prompts: the regime's sign)."""
    min: float | None
    max: float | None
    share_slower: float | None
    pooled: CI = optional()


@dataclass(frozen=True)
class ConfigurationStatistics:
    """Every statistic of one configuration's runs (paper/main.tex, "Statistics"); CIs over prompts."""
    latency_reduction: ByBaseline
    throughput_gain: ByBaseline
    best_fixed_action: str
    accuracy_action: CI
    accuracy_within_noise: CI
    accuracy_k: CI
    accuracy_chance: float | None
    mean_regret: CI
    worst_regret: float | None
    random_regret: CI
    mape: CI
    mape_null: float | None
    spearman: CI
    spearman_pooled: float | None
    spec_slowdown: SpecSlowdown
    scenarios: int
    controller_runs: int
    mape_minus_null: CI = optional()  # MAPE - the action-blind predictor's, paired by (scenario, action)
    # the oracle's action within the controller's tie set (the actions within the cost model's noise of its choice)
    accuracy_tie_set: CI = optional()


@dataclass(frozen=True)
class Pooled:
    """RAKV-ASD against each baseline over every configuration's instances."""
    latency_reduction: ByBaseline
    throughput_gain: ByBaseline


@dataclass(frozen=True)
class AcceptanceRow:
    """Measured acceptance of one configuration x dataset beside the cost model's break-even alpha."""
    configuration: str
    dataset: str
    acceptance: float | None
    acceptance_low: float | None
    acceptance_high: float | None
    break_even_alpha: float | None
    break_even_k: int | None
    break_even_alpha_k4: float | None
    prompt_tokens: int
    calibrated_acceptance: float | None
    speculation_pays: bool | None
    runs: int


@dataclass(frozen=True)
class PeakKv:
    """Peak K/V held per request, per configuration and k (`k` "rakv-asd": the controller's runs)."""
    configuration: str
    k: str
    peak_kv_mib: float | None
    peak_kv_mib_max: float | None
    runs: int


@dataclass(frozen=True)
class AcceptanceMape:
    """The cost model's MAPE with the calibrated acceptance and with each prompt's own."""
    calibrated: CI
    prompt: CI


@dataclass(frozen=True)
class Crossover:
    """The cost model's break-even alpha (least over k per setting): its range over settings."""
    min: float | None
    max: float | None
    median: float | None = optional()  # absent: the sensitivity stage did not run
    settings: int = optional()
    never: int = optional()


@dataclass(frozen=True)
class JointReuse:
    """Speculation on top of reuse (r = 1, k = 4 against r = 1, k = 0) in one configuration x scenario x length."""
    configuration: str
    scenario: str
    new_tokens: int
    pairs: int
    prompts: int
    latency_reduction: CI
    joint_s: float | None
    reuse_s: float | None
    reprefilled_s: float | None
    draft_reuse_reduction: CI
    draft_prefill_s: float | None
    draft_hit_share: float | None
    reuse_draft: bool
    verdict: Payoff


# ---------------------------------------------------------------------------------------------
# The feasibility stage (results/<name>/feasibility/summary.json, copied whole into the summary)


@dataclass(frozen=True)
class BreakEven:
    """One calibrated pair's break-even alpha at one k (rakv.runtime.costmodel.break_even_rows)."""
    pair: str
    k: int
    break_even_alpha: float | None
    draft_target_cost_ratio: float | None
    target_step_s: float | None
    prompt_tokens: int
    new_tokens: int


@dataclass(frozen=True)
class ControlledRun:
    """One controlled-acceptance run of the twin pair: measured against the cost model's speedup."""
    configuration: str
    prompt_id: str
    prompt_tokens: int
    repeat: int
    k: int
    alpha: float
    measured_alpha: float | None
    ar_latency_s: float | None
    spec_latency_s: float | None
    measured_speedup: float | None
    predicted_speedup: float | None
    predicted_speedup_at_measured_alpha: float | None
    equal_to_ar: bool


@dataclass(frozen=True)
class Feasibility:
    """The feasibility stage's outcome: `status` "ran" (the real pair: the gap), the cost side only (twins: break-
    even alphas and the controlled check), or "missing"; the other status's fields are absent."""
    status: str
    configuration: str = optional()
    scenarios: int = optional()
    gap_min: float | None = optional()
    gap_max: float | None = optional()
    gap_mean: float | None = optional()
    crossed: bool = optional()
    calibrated_alpha: float | None = optional()
    reason: str = optional()
    note: str = optional()
    twin: str = optional()
    twins: list[str] = optional()
    break_even: list[BreakEven] = optional()
    controlled: list[ControlledRun] = optional()
    controlled_speedup_error_mean: float | None = optional()
    controlled_speedup_error_max: float | None = optional()


# ---------------------------------------------------------------------------------------------
# Claims (rakv.experiments.claims)


@dataclass(frozen=True)
class ClaimRow:
    """One reference claim on one configuration: reference and reproduced value, CI, band, verdicts by kind."""
    claim: str
    key: str
    configuration: str
    unit: str
    kind: str
    reference: float | None
    reproduced: CI = ci_keys("reproduced", "ci_low", "ci_high")  # written as these three keys, as the table's row
    band_low: float | None
    band_high: float | None
    null: float | None
    text: str | None
    direction: str
    magnitude: str


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


# ---------------------------------------------------------------------------------------------
# The summary


# ---------------------------------------------------------------------------------------------
# The sampling stage (rakv.experiments.sampling_stats)


CLOSED_FORM = "closed form"  # ClosedFormCheck.expectation of token-wise (and greedy) cells: sum of alpha_j
# ClosedFormCheck.expectation of block cells: the block rule's expected accepted count given each round's draft
GIVEN_THE_DRAFTS = "expected given the drafts"
DISTRIBUTION_SAMPLES = "distribution samples"  # ClosedFormCheck.source of the distribution samples' checks


@dataclass(frozen=True)
class ClosedFormCheck:
    """Measured acceptance (accepted / positions reached) against what its rule must accept in expectation, per
    (configuration, temperature, rule, k) (rakv.experiments.sampling_stats.closed_form_checks); verdict: agrees |
    differs (the difference's CI includes 0 or not) | identity (the difference has no variance: measured equals its
    expectation by construction, as greedy's does, so the check cannot fail and is never counted as agreement) | not
    judged (no interval: one request)."""
    configuration: str
    temperature: float
    verify: str
    k: int
    requests: int
    positions: int
    measured: CI
    closed_form: float  # the expectation per position reached (token-wise: the closed form; block: given the drafts)
    difference: CI  # measured - closed form
    verdict: CheckVerdict
    expectation: str = optional()  # CLOSED_FORM | GIVEN_THE_DRAFTS; absent: CLOSED_FORM (block cells were "bound")
    # the difference's interval: None for the normal one with the variance the closed form implies, else a t
    # interval over the requests on this many degrees of freedom
    degrees_of_freedom: int | None = optional()
    source: str = optional()  # "runs" | DISTRIBUTION_SAMPLES; absent: "runs"
    control: bool = optional()  # the biased rule against token-wise's closed form: the check's positive control
    # block cells: measured - token-wise's expected count on the same drafts, the same interval as `difference`'s:
    # where it excludes 0 and `difference` does not, the check told the block rule from token-wise (its power)
    versus_token: CI = optional()


@dataclass(frozen=True)
class TemperatureResult:
    """Per (configuration, temperature): latency ratios (ours / theirs, geometric mean over prompts), the best fixed
    strategy, the controller's k, measured acceptance and the cost model's break-even acceptance for k = 4."""
    configuration: str
    temperature: float
    acceptance: float | None  # spec-k4, token-wise (greedy at T = 0)
    controller_alpha0: float  # where this temperature's controller started (the calibration prompts at T)
    spec_k4_vs_ar: CI
    vs_ar: CI  # rakv-asd / AR
    vs_best_fixed: CI  # rakv-asd / the best fixed strategy
    best_fixed: str  # strategy/rule
    best_k: int
    chosen_k: dict[str, int]  # rakv-asd's k -> requests
    break_even_alpha: float | None
    speculation: Payoff  # spec-k4 against AR: pays | costs | inconclusive (rakv.experiments.sampling_stats)


FIRST_ROUNDS = "first rounds"  # BlockVsToken.source of the distribution samples' paired first rounds
# BlockVsToken.source of both rules' expected accepted count given each draft, over the distribution samples' rounds
EXPECTED_GIVEN_DRAFT = "expected given the draft"


@dataclass(frozen=True)
class BlockVsToken:
    configuration: str
    temperature: float
    k: int
    requests: int  # pairs of (prompt, seed)
    token_per_round: float
    block_per_round: float
    difference: CI  # block - token, accepted candidates per round (prompts as clusters)
    latency_ratio: CI  # block / token
    verdict: BlockAcceptance
    # "runs": whole requests, CI over prompts; "first rounds": the distribution samples' first round, paired by
    # (prompt, seed) on the same draft candidates, CI over the pairs; "expected given the draft": both rules'
    # expected accepted count on every round's draft of the distribution samples, CI over the requests
    source: str = optional()  # absent: "runs" (a run analysed before the first rounds were)


@dataclass(frozen=True)
class DistributionTest:
    configuration: str
    arm: str  # token | block | biased (the positive control)
    temperature: float
    samples_per_prompt: int
    prompts: int
    tests: int
    min_adjusted_p: float  # Holm over the family
    rejected: bool
    # rejections on random halves of the samples: the control's power at half the size, the other rules' size
    half_sample_rejection_rate: float
    control: bool


@dataclass(frozen=True)
class StructuredRow:
    configuration: str
    strategy: str
    requests: int
    parse_rate: float
    valid_rate: float
    latency_s: float
    tokens_per_s: float
    same_as_ar: bool


@dataclass(frozen=True)
class LongContextRow:
    configuration: str
    budget_mib: float
    strategy: str
    requests: int
    document_tokens: float
    hit_tokens: float
    evictions: int | None  # None: no request of the row was measured under this budget (AR's copied rows)
    ttft_s: float
    latency_s: float
    vs_ar: CI  # latency / AR's, geometric mean over documents
    length_bin: str = optional()  # the documents' length in tokens; absent: every length pooled (older runs)
    documents: int = optional()
    # rakv-asd's latency / kv-only's on the same requests: speculation on top of reuse (NaN for other strategies)
    vs_reuse: CI = optional()
    # the t intervals' degrees of freedom (documents with a ratio - 1; None: no interval)
    vs_ar_degrees_of_freedom: int | None = optional()
    vs_reuse_degrees_of_freedom: int | None = optional()


@dataclass(frozen=True)
class SamplingSummary:
    closed_form: list[ClosedFormCheck]
    temperatures: list[TemperatureResult]
    block_vs_token: list[BlockVsToken]
    distribution: list[DistributionTest]
    structured: list[StructuredRow]
    long_context: list[LongContextRow]
    # the same check on the distribution samples' speculative arms (source DISTRIBUTION_SAMPLES), the biased control's
    # included; absent: a run analysed before it was made
    distribution_checks: list[ClosedFormCheck] = optional()


# ---------------------------------------------------------------------------------------------
# Replication: the shipped runs of one commit on one machine class together (rakv.experiments.replication)


@dataclass(frozen=True)
class PooledStatistic:
    """One headline statistic over the runs: each run's CI, the pooled CI (random effects), the run-level standard
    deviation `run_sd` on the statistic's `scale` (DerSimonian-Laird; 0 when the runs agree within their own
    intervals) and the heterogeneity test's p-value (Cochran's Q)."""
    name: str
    scale: str
    runs: list[CI]
    pooled: CI
    run_sd: float
    heterogeneity_p: float | None


@dataclass(frozen=True)
class ClaimAcrossRuns:
    """One claim's verdicts in each run and on the pooled estimate; `held`: every run's verdicts are the pooled
    ones (direction and magnitude)."""
    key: str
    configuration: str
    direction: list[str]
    magnitude: list[str]
    pooled_direction: str
    pooled_magnitude: str
    held: bool


@dataclass(frozen=True)
class Replication:
    """This run with the other shipped runs of its commit and machine class (`runs`, this one first): which
    headline differences are significant (Holm over `tests` per pair of runs; "run: statistic"), every statistic
    pooled, the claims judged on the pooled estimates (`claims`) and run by run (`claim_runs`), the pooled CIs'
    coverage of a held-out run beside an exact replication's, and how often the runs' controllers chose the same
    action (`decisions_same`) or actions within each other's tie sets (`decisions_tied`), per configuration."""
    runs: list[str]
    tests: int
    significant: list[str]
    statistics: list[PooledStatistic]
    claims: list[ClaimRow]
    claim_runs: list[ClaimAcrossRuns]
    coverage_inside: int
    coverage_total: int
    coverage_expected: float
    decisions_same: dict[str, float]
    decisions_tied: dict[str, float] = optional()


@dataclass(frozen=True)
class Summary:
    """Every statistic of the study, sensitivity, feasibility and serving results under `results`."""
    results: str  # the folder as typed from the repository root
    runs: int
    strategy_runs: int
    sweep_runs: int
    configurations: list[str]
    grid: Grid
    exact: Exact
    per_configuration: dict[str, ConfigurationStatistics]
    pooled: Pooled
    acceptance: list[AcceptanceRow]
    peak_kv: list[PeakKv]
    acceptance_mape: dict[str, AcceptanceMape]
    crossover_model: Crossover
    crossover_model_per_configuration: dict[str, Crossover] = optional()  # absent without the sensitivity stage
    crossover_measured: dict[str, float | None] = field(default_factory=dict)  # "<configuration>/k<k>" -> alpha
    crossover_predicted_controlled: dict[str, float | None] = field(default_factory=dict)
    joint_reuse: list[JointReuse] = field(default_factory=list)
    feasibility: Feasibility = field(default_factory=lambda: Feasibility("missing"))
    feasibility_verdict: str = "missing"
    claims: list[ClaimRow] = field(default_factory=list)
    serving: ServingSummary = optional()  # absent without the serving stage
    sampling: SamplingSummary = optional()  # absent without the sampling stage
    replication: Replication = optional()  # absent without another shipped run of the same commit and machine

    def to_json(self) -> dict:
        """The summary as summary.json holds it (JSON-ready: plain numbers, NaN as null, absent parts left out)."""
        return to_json(self, nan_as_null=True)

    @classmethod
    def from_json(cls, data, source: str = "summary.json") -> Summary:
        """A summary read back from its JSON form; RakvError naming the first missing or mistyped field."""
        return load_record(cls, data, source)


# ---------------------------------------------------------------------------------------------
# The files (read and written through rakv.runtime.json_records)


def summary_path(results: Path | RunLayout) -> Path:
    return RunLayout.of(results).summary


def write_summary(summary: Summary, results: Path) -> Path:
    """results/<name>/summary.json, written atomically (NaN written as null)."""
    from rakv.experiments.records import write_atomic

    path = summary_path(results)
    write_atomic(path, json.dumps(summary.to_json(), indent=1))
    return path


def read_summary(results: Path) -> Summary:
    """results/<name>/summary.json as a Summary, every field checked (RakvError naming the first that is not)."""
    path = summary_path(results)
    return Summary.from_json(read_json(path, "run the analysis stage first"), str(path))


def write_feasibility(feasibility: Feasibility, layout: RunLayout) -> Path:
    """The feasibility stage's outcome, results/<name>/feasibility/summary.json, written through its record."""
    from rakv.experiments.records import write_atomic

    path = layout.feasibility_summary
    write_atomic(path, json.dumps(to_json(feasibility, nan_as_null=True), indent=1))
    return path


def read_feasibility(results: Path | RunLayout) -> Feasibility:
    """results/<name>/feasibility/summary.json (the feasibility stage's outcome) as a Feasibility record;
    status "missing" where the stage has not run."""
    path = RunLayout.of(results).feasibility_summary
    if not path.exists():
        return Feasibility("missing")
    return load_record(Feasibility, read_json(path, "run the analysis stage first"), str(path))


@dataclass(frozen=True)
class EngineFacts:
    """What the engine comparison (rakv.experiments.enginecompare) reads of a run's summary. It also reads the
    earlier reference runs kept for the engine before/after table (data/reference/offline-*-kernels/), whose
    summaries predate parts of today's schema, so only these parts are read, each checked as its record."""
    best_fixed_action: dict[str, str]  # per configuration
    crossover: dict[str, Crossover]  # per configuration (empty: the sensitivity stage did not run)
    acceptance: list[AcceptanceRow]


def read_engine_facts(results: Path) -> EngineFacts:
    """results/<name>/summary.json's parts the engine comparison needs, from a summary of any version that has
    them (RakvError naming the first that is missing or malformed)."""
    path = summary_path(results)
    data = read_json(path, "run the analysis stage first")
    try:
        best = {name: check_part(str, stats["best_fixed_action"], f"per_configuration.{name}.best_fixed_action", path)
                for name, stats in data["per_configuration"].items()}
        crossover = check_part(dict[str, Crossover], data.get("crossover_model_per_configuration", {}),
                               "crossover_model_per_configuration", path)
        acceptance = check_part(list[AcceptanceRow], data.get("acceptance", []), "acceptance", path)
    except (KeyError, AttributeError, TypeError) as exc:
        raise RakvError(f"{path}: no per-configuration statistics ({type(exc).__name__}: {exc})") from None
    return EngineFacts(best, crossover, acceptance)

