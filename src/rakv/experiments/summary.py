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

from rakv.experiments.summary_sampling import SamplingSummary
from rakv.experiments.summary_serving import ServingSummary
from rakv.experiments.verdicts import Payoff
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

