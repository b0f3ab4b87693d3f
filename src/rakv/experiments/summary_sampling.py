"""The sampling stage's part of the summary (rakv.experiments.sampling_stats builds it): acceptance against its
closed form, speculation at each temperature, block against token-wise verification, the distribution tests and
the structured and long-context workloads, declared as rakv.experiments.summary declares the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from rakv.experiments.verdicts import BlockAcceptance, CheckVerdict, Payoff
from rakv.runtime.json_records import (
    CI,
    optional,
)

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
