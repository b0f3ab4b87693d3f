"""The statistics of the sampling stage (rakv.experiments.sampling; paper/main.tex, "Sampling and workloads").

Intervals here are 95 %, on the unit that is independent:
- the closed-form check needs no units: at every position a round reaches, the token-wise rule's outcome is
  Bernoulli(alpha_j) given everything before it, so accepted - sum of alpha_j has mean zero and variance
  sum of alpha_j (1 - alpha_j) (a martingale's predictable variation), whatever the prompts; the interval is the
  normal one with that variance (a z interval, not a t interval);
- the block rule's check sets its accepted count against the rule's own expected count given each round's draft
  (rakv.runtime.verification.expected_accepted): each round's difference has mean zero given the past, so each
  request's sum does whatever its prompt, and the requests are the units (a t interval over them, its degrees of
  freedom recorded: the count's variance given the draft is not logged). Token-wise's closed form is no bound
  on what block accepts round by round, only on average over drafts (docs/sampling.md);
- a check whose difference has no variance (greedy: alpha_j is 1 exactly where the candidate passes, so measured
  equals its closed form by construction) cannot fail: its verdict is "identity", and `agreement_tally` never
  counts it, nor the biased control, as agreement (docs/sampling.md, "What counts as agreement");
- latencies, acceptance per round and the workloads' ratios take prompts (or documents) as clusters: the
  requests of one prompt share its text, so their per-request values are averaged per prompt first.
Relative differences are geometric means of ratios (a t interval of the mean log ratio, exponentiated), so a
reduction can never pass 100 % (rakv.experiments.intervals; coverage simulated in tests/test_intervals.py).

The distribution tests (`distribution_tests`) compare each speculative arm with plain sampling of the same prompts:
a chi-square test of the token counts at every position and prompt, and per prompt a two-sample Kolmogorov-Smirnov
test of the samples' log-likelihood under the target and a Mann-Whitney test of how many of their tokens were the
target's most likely (an ordinal count, so a rank test: a chi-square over its histogram spends a degree of freedom on
every count and had a quarter of the power against the control), Holm-corrected over the arm's family. The biased arm is
the positive control; the tests' power against it is estimated on random halves of the samples (`half_sample`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from rakv.experiments.intervals import geometric_mean_interval, ratio_interval, t_interval
from rakv.experiments.summary_sampling import (
    CLOSED_FORM,
    DISTRIBUTION_SAMPLES,
    EXPECTED_GIVEN_DRAFT,
    FIRST_ROUNDS,
    GIVEN_THE_DRAFTS,
    BlockVsToken,
    ClosedFormCheck,
    DistributionTest,
    LongContextRow,
    SamplingSummary,
    StructuredRow,
    TemperatureResult,
)
from rakv.experiments.verdicts import BlockAcceptance, CheckVerdict, Payoff, Side, ci_side
from rakv.runtime.actions import ADAPTIVE, AR, KV_ONLY, SPEC_K4, Action, spec
from rakv.runtime.json_records import ABSENT

NAN = float("nan")
# one prompt's distribution samples: first tokens [samples, positions], log-likelihoods, target-argmax counts or None
PromptSamples = tuple[np.ndarray, np.ndarray, np.ndarray | None]
PLAIN = "plain"
CONTROL = "biased"  # the positive control's rule (rakv.runtime.verification.CONTROL_RULES)
RUNS = "runs"  # ClosedFormCheck.source of the runs table's cells
CELL = ["configuration", "temperature", "verify", "k"]  # one acceptance check's rows
NO_WIDTH = 1e-9  # an interval (and a difference) this narrow is rounding: the difference has no variance


def reached(frame: pd.DataFrame) -> pd.Series:
    """The positions the rounds reached: the accepted candidates and the rejected one of each rejecting round."""
    return frame.accepted + frame.rejections


def check_verdict(difference) -> CheckVerdict:
    """agrees | differs by the side of 0 the difference's CI lies on; identity where the CI has no width and the
    difference is 0 (the measurement equals its expectation whatever happened: a check that cannot fail); not
    judged where there is no interval (one request)."""
    value, low, high = difference
    if not (np.isfinite(low) and np.isfinite(high)):
        return CheckVerdict.NOT_JUDGED
    if high - low <= NO_WIDTH and abs(value) <= NO_WIDTH:
        return CheckVerdict.IDENTITY
    return CheckVerdict.AGREES if ci_side(difference, 0.0) == Side.STRADDLES else CheckVerdict.DIFFERS


def closed_form_difference(group: pd.DataFrame, positions: int) -> list[float]:
    """(accepted - sum of alpha_j) per position reached, with the normal interval of the variance the closed form
    implies, sum of alpha_j (1 - alpha_j) (each reached position a Bernoulli(alpha_j) given the past), which holds
    with few requests and rare rejections where a sample variance would not."""
    value = float(group.accepted.sum() - group.closed_form_accepted.sum()) / positions
    half = float(stats.norm.ppf(0.975)) * math.sqrt(float(group.closed_form_variance.sum())) / positions
    return [value, value - half, value + half]


def given_drafts_difference(group: pd.DataFrame, rule: str = "block") -> list[float]:
    """(accepted - `rule`'s expected accepted count given each round's draft) per position reached, each request's
    rounds summed: the delta method's t interval over the requests (requests - 1 degrees of freedom)."""
    return ratio_interval(group.accepted - group[f"expected_accepted_{rule}"], reached(group), scale="linear")


def acceptance_check(key: tuple, group: pd.DataFrame, source: str = RUNS) -> ClosedFormCheck | None:
    """One cell's check (key: configuration, temperature, rule, k): measured acceptance against its closed form
    (token-wise, greedy, and the biased control, which must be told from it) or, for the block rule, against its
    expectation given the drafts; None where no round reached a position or a block table lacks the expectation."""
    name, temperature, rule, k = key
    group = group[reached(group) > 0]
    positions = int(reached(group).sum())
    if positions == 0 or (rule == "block" and "expected_accepted_block" not in group):
        return None
    measured = float(group.accepted.sum()) / positions
    versus_token = ABSENT
    if rule == "block":
        difference, expectation = given_drafts_difference(group), GIVEN_THE_DRAFTS
        freedom = len(group) - 1 if np.isfinite(difference[1]) else None
        if "expected_accepted_token" in group:
            versus_token = given_drafts_difference(group, "token")
    else:
        difference, expectation, freedom = closed_form_difference(group, positions), CLOSED_FORM, None
    value, low, high = difference
    return ClosedFormCheck(name, float(temperature), str(rule), int(k), len(group), positions,
                           [measured, measured - (value - low), measured + (high - value)], measured - value,
                           difference, check_verdict(difference), expectation=expectation,
                           degrees_of_freedom=freedom, source=source, control=rule == CONTROL,
                           versus_token=versus_token)


def closed_form_checks(runs: pd.DataFrame) -> list[ClosedFormCheck]:
    """Per (configuration, temperature, rule, k) of the fixed spec-k runs: measured acceptance (accepted / positions
    reached) against what the rule must accept in expectation (`acceptance_check`)."""
    spec = runs[(runs.strategy != ADAPTIVE) & (runs.k > 0)]
    checks = (acceptance_check(key, group) for key, group in spec.groupby(CELL))
    return [c for c in checks if c is not None]


def distribution_checks(samples: pd.DataFrame) -> list[ClosedFormCheck]:
    """The same check on the distribution samples' speculative arms (hundreds of requests per arm): token-wise
    against its closed form, block against its expectation given the drafts, and the biased control against
    token-wise's closed form, which the check must reject for its agreement elsewhere to mean anything."""
    if "expected_block" not in samples:
        return []  # a table from before the columns
    arms = samples[samples.arm != PLAIN].rename(columns={"arm": "verify", "expected_block": "expected_accepted_block",
                                                   "expected_token": "expected_accepted_token"})
    checks = (acceptance_check(key, group, DISTRIBUTION_SAMPLES)
              for key, group in arms.groupby(CELL))
    return [c for c in checks if c is not None]


@dataclass(frozen=True)
class CheckTally:
    """Acceptance checks by what they can say: `agree` of the `judged` ones that can fail, `identities` that cannot,
    `not_judged` without an interval, and the positive controls `controls_rejected` of `controls`."""
    agree: int
    judged: int
    identities: int
    not_judged: int
    controls: int
    controls_rejected: int


def counted_verdict(check: ClosedFormCheck) -> CheckVerdict:
    """The verdict a check's interval gives now (`check_verdict`), not the one it carries, so a check that cannot
    fail is refused as agreement whatever it was labelled; a block cell of a summary from before its expectation
    given the drafts (then labelled "bound", against token-wise's closed form, no bound of it) is not judged."""
    if check.verify == "block" and check.expectation is ABSENT:
        return CheckVerdict.NOT_JUDGED
    return check_verdict(check.difference)


def agreement_tally(checks: list[ClosedFormCheck]) -> CheckTally:
    """Counts the checks by `counted_verdict`, the positive controls apart (they must differ)."""
    controls = [c for c in checks if c.control is True]
    verdicts = [counted_verdict(c) for c in checks if c.control is not True]
    agree, differ = verdicts.count(CheckVerdict.AGREES), verdicts.count(CheckVerdict.DIFFERS)
    return CheckTally(agree=agree, judged=agree + differ, identities=verdicts.count(CheckVerdict.IDENTITY),
                      not_judged=verdicts.count(CheckVerdict.NOT_JUDGED), controls=len(controls),
                      controls_rejected=sum(counted_verdict(c) == CheckVerdict.DIFFERS for c in controls))


def per_prompt_log_ratio(runs: pd.DataFrame, ours: tuple[str, str], baseline: tuple[str, str]) -> pd.Series:
    """Mean log(latency ours / latency baseline) per prompt, pairing each (prompt, seed)."""
    key = ["prompt_id", "seed_index"]
    a = runs[(runs.strategy == ours[0]) & (runs.verify == ours[1])].set_index(key).latency_s
    b = runs[(runs.strategy == baseline[0]) & (runs.verify == baseline[1])].set_index(key).latency_s
    both = pd.concat([a.rename("a"), b.rename("b")], axis=1).dropna()
    return np.log(both.a / both.b).groupby(level="prompt_id").mean()


def temperature_results(runs: pd.DataFrame, tables: dict) -> list[TemperatureResult]:
    """Per (configuration, temperature): rakv-asd against AR and against the best fixed strategy (least mean
    latency over prompts), the k the controller chose, spec-k4's measured token-wise acceptance and the cost
    model's break-even acceptance for k = 4 (cold, the prompts' mean length); `tables`: configuration -> CostTable."""
    from rakv.runtime.costmodel import RequestFeatures, break_even_alpha

    out = []
    for (name, temperature), group in runs.groupby(["configuration", "temperature"]):
        fixed = group[group.strategy != ADAPTIVE]
        means = fixed.groupby(["strategy", "verify"]).latency_s.mean()
        best = means.idxmin()
        spec4 = group[(group.strategy == SPEC_K4) & (group.verify.isin(["token", "greedy"]))]
        positions = reached(spec4).sum()
        rule = "greedy" if temperature == 0 else "token"
        vs_ar = geometric_mean_interval(per_prompt_log_ratio(group, (ADAPTIVE, rule), (AR, rule)))
        vs_best = geometric_mean_interval(per_prompt_log_ratio(group, (ADAPTIVE, rule), best))
        spec_vs_ar = geometric_mean_interval(per_prompt_log_ratio(group, (SPEC_K4, rule), (AR, rule)))
        chosen = group[group.strategy == ADAPTIVE].k.value_counts().sort_index()
        table = tables.get(name)
        break_even = None
        if table is not None:
            features = RequestFeatures(int(round(group.prompt_tokens.mean())), 0, int(group.new_tokens.max()))
            break_even = break_even_alpha(table, features, False, 4)
        out.append(TemperatureResult(
            configuration=name, temperature=float(temperature),
            acceptance=float(spec4.accepted.sum() / positions) if positions else None,
            controller_alpha0=float(group.controller_alpha0.iloc[0]),
            spec_k4_vs_ar=spec_vs_ar, vs_ar=vs_ar, vs_best_fixed=vs_best,
            best_fixed=f"{best[0]}/{best[1]}", best_k=Action.of_strategy(best[0]).k,
            chosen_k={str(k): int(n) for k, n in chosen.items()},
            break_even_alpha=break_even,
            speculation=speculation_payoff(spec_vs_ar)))
    return out


def speculation_payoff(spec_vs_ar) -> Payoff:
    """Whether spec-k4 pays against AR at a temperature: its latency ratio's CI wholly below 1 (pays) or above
    (costs), else inconclusive. Without an interval too: the word the sampling summary has always written there,
    where rakv.experiments.verdicts.payoff (a reduction's CI) says no interval."""
    side = ci_side(spec_vs_ar, 1.0, point_if_no_interval=False)
    return {Side.BELOW: Payoff.PAYS, Side.ABOVE: Payoff.COSTS}.get(side, Payoff.INCONCLUSIVE)


def more_or_fewer(difference: list[float]) -> BlockAcceptance:
    """Block against token-wise verification from the CI of their difference in accepted candidates per round."""
    side = ci_side(difference, 0.0, point_if_no_interval=False)
    return {Side.ABOVE: BlockAcceptance.MORE, Side.BELOW: BlockAcceptance.FEWER}.get(side, BlockAcceptance.INCONCLUSIVE)


def block_vs_token(runs: pd.DataFrame) -> list[BlockVsToken]:
    """Per (configuration, temperature > 0, k): accepted candidates per round under block and token-wise
    verification of the same (prompt, seed), the difference per prompt with its CI, and the latency ratio."""
    sampled = runs[(runs.temperature > 0) & (runs.strategy != ADAPTIVE) & (runs.k > 0)]
    out = []
    for (name, temperature, k), group in sampled.groupby(["configuration", "temperature", "k"]):
        per = group.groupby(["verify", "prompt_id"])[["accepted", "rounds"]].sum()
        if not {"block", "token"} <= set(per.index.get_level_values(0)) or not per.rounds.all():
            continue  # a rule missing, or a prompt without rounds (a proposer that never matched)
        rate = per.accepted / per.rounds
        difference = t_interval((rate.loc["block"] - rate.loc["token"]).dropna())
        strategy = spec(k)
        latency = geometric_mean_interval(per_prompt_log_ratio(group, (strategy, "block"), (strategy, "token")))
        out.append(BlockVsToken(
            configuration=name, temperature=float(temperature), k=int(k), requests=int(len(group) // 2),
            token_per_round=float(per.loc["token"].accepted.sum() / per.loc["token"].rounds.sum()),
            block_per_round=float(per.loc["block"].accepted.sum() / per.loc["block"].rounds.sum()),
            difference=difference, latency_ratio=latency,
            verdict=more_or_fewer(difference), source="runs"))
    return out


def block_vs_token_first_round(samples: pd.DataFrame) -> list[BlockVsToken]:
    """Per (configuration, temperature): the distribution samples' first round (k candidates, never cut short) under
    block and token-wise verification, paired by (prompt, seed index), whose speculative arms share a seed and so
    verify the same draft candidates: accepted candidates per round, the paired difference's t interval over the
    pairs (the prompts fixed), and the geometric mean of the samples' latency ratios."""
    if "first_accepted" not in samples:
        return []  # a table from before the column
    out = []
    for (name, temperature), group in samples.groupby(["configuration", "temperature"]):
        full = group[group.first_proposed == group.k]
        wide = full.pivot_table(index=["prompt_id", "seed_index"], columns="arm",
                                values=["first_accepted", "latency_s"])
        if not {"block", "token"} <= set(wide.columns.get_level_values(1)):
            continue
        both = wide.dropna(subset=[("first_accepted", "block"), ("first_accepted", "token")])
        accepted = both["first_accepted"]
        difference = t_interval(accepted.block - accepted.token)
        latency = geometric_mean_interval(np.log(both["latency_s"].block / both["latency_s"].token))
        out.append(BlockVsToken(
            configuration=name, temperature=float(temperature), k=int(full.k.max()), requests=int(len(both)),
            token_per_round=float(accepted.token.mean()), block_per_round=float(accepted.block.mean()),
            difference=difference, latency_ratio=latency,
            verdict=more_or_fewer(difference), source=FIRST_ROUNDS))
    return out


def block_vs_token_given_draft(samples: pd.DataFrame) -> list[BlockVsToken]:
    """Per (configuration, temperature): on every round of the distribution samples' token-wise and block arms, both
    rules' expected accepted candidates given that round's draft (rakv.runtime.verification.expected_accepted), so the
    rules are compared on the same drafts without their own coin flips: per request the difference per round, its t
    interval over the requests (the prompts fixed), and the latency ratio of the arms' paired (prompt, seed) samples.
    Averaged over drafts, block keeps at least as many as token-wise (Sun et al.); on one draft it may keep fewer, so
    the interval can lie on either side of zero."""
    if "expected_block" not in samples:
        return []  # a table from before the columns
    out = []
    arms = samples[samples.arm.isin(["token", "block"]) & (samples.rounds > 0)]
    for (name, temperature), group in arms.groupby(["configuration", "temperature"]):
        per_round = (group.expected_block - group.expected_token) / group.rounds
        wide = group.pivot_table(index=["prompt_id", "seed_index"], columns="arm", values="latency_s").dropna()
        latency = (geometric_mean_interval(np.log(wide.block / wide.token))
                   if {"block", "token"} <= set(wide.columns) else [NAN, NAN, NAN])
        difference = t_interval(per_round)
        rounds = float(group.rounds.sum())
        out.append(BlockVsToken(
            configuration=name, temperature=float(temperature), k=int(group.k.max()), requests=int(len(group)),
            token_per_round=float(group.expected_token.sum() / rounds),
            block_per_round=float(group.expected_block.sum() / rounds),
            difference=difference, latency_ratio=latency,
            verdict=more_or_fewer(difference), source=EXPECTED_GIVEN_DRAFT))
    return out


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error rate)."""
    p = np.asarray(p_values, float)
    order = np.argsort(p)
    adjusted = np.empty_like(p)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[index]))
        adjusted[index] = running
    return adjusted


def token_test(a, b, min_count: int = 5) -> float:
    """p-value of a chi-square test that two samples of tokens come from one distribution; tokens seen fewer than
    `min_count` times in both samples together are pooled into one category."""
    a, b = np.asarray(a), np.asarray(b)
    values, inverse = np.unique(np.concatenate([a, b]), return_inverse=True)
    counts = np.stack([np.bincount(inverse[:len(a)], minlength=len(values)),
                       np.bincount(inverse[len(a):], minlength=len(values))])
    rare = counts.sum(axis=0) < min_count
    if rare.any():
        counts = np.concatenate([counts[:, ~rare], counts[:, rare].sum(axis=1, keepdims=True)], axis=1)
    counts = counts[:, counts.sum(axis=0) > 0]
    if counts.shape[1] < 2:
        return 1.0
    return float(stats.chi2_contingency(counts, correction=False).pvalue)


def mode_count_test(a, b) -> float:
    """p-value of a two-sided Mann-Whitney test that two samples' counts of the target's most likely tokens come from
    one distribution (1.0 when both samples are one constant: nothing to rank)."""
    a, b = np.asarray(a), np.asarray(b)
    if np.unique(np.concatenate([a, b])).size < 2:
        return 1.0
    return float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def by_prompt(frame: pd.DataFrame) -> dict[str, PromptSamples]:
    """prompt -> (its samples' first tokens [samples, positions], their log-likelihoods, how many of their tokens
    were the target's most likely; None where the table predates that column)."""
    out = {}
    for prompt, group in frame.groupby("prompt_id"):
        tokens = [json.loads(t) for t in group.tokens]
        width = min(map(len, tokens))
        modes = group.argmax_tokens.to_numpy(int) if "argmax_tokens" in group else None
        out[prompt] = np.array([t[:width] for t in tokens]), group.loglik.to_numpy(float), modes
    return out


def family_p_values(plain: dict, arm: dict) -> list[float]:
    """The arm's tests against plain sampling: per (prompt, position) a token test; per prompt a KS test of the
    log-likelihood and a Mann-Whitney test of how many tokens were the target's most likely (both samples as
    `by_prompt` gives them)."""
    p_values = []
    for prompt, (tokens_a, loglik_a, modes_a) in plain.items():
        if prompt not in arm:
            continue
        tokens_b, loglik_b, modes_b = arm[prompt]
        for position in range(min(tokens_a.shape[1], tokens_b.shape[1])):
            p_values.append(token_test(tokens_a[:, position], tokens_b[:, position]))
        p_values.append(float(stats.ks_2samp(loglik_a, loglik_b, method="asymp").pvalue))
        if modes_a is not None and modes_b is not None:
            p_values.append(mode_count_test(modes_a, modes_b))
    return p_values


def half_sample(samples: dict[str, PromptSamples], rng: np.random.Generator) -> dict[str, PromptSamples]:
    """Half of each prompt's samples, drawn without replacement: itself an independent sample of half the size from
    the arm's true distribution (a bootstrap resample would not be: it treats the observed difference between two
    arms, noise included, as the truth, and rejects too often). An extrapolation of the power to the full size
    along subsamples of a quarter, a third and a half (probit linear in sqrt(n)) was tried and dropped: on synthetic
    data it put 0.85 where fresh full-size data sets rejected 0.59 of the time."""
    out = {}
    for prompt, (tokens, loglik, modes) in samples.items():
        pick = rng.permutation(len(loglik))[: len(loglik) // 2]
        out[prompt] = tokens[pick], loglik[pick], modes[pick] if modes is not None else None
    return out


def distribution_tests(samples: pd.DataFrame, level: float = 0.05, resamples: int = 200,
                       seed: int = 0) -> list[DistributionTest]:
    """Per (configuration, arm): the family's smallest Holm-adjusted p-value, whether it rejects at `level`, and
    how often the family rejects on random halves of both arms' samples: for the biased control an unbiased estimate
    of the tests' power at half the size (so a lower bound of their power at the full size), for the other arms of
    their size at half the size (at most `level` when the arm preserves the distribution)."""
    out = []
    for (name, temperature), group in samples.groupby(["configuration", "temperature"]):
        plain = by_prompt(group[group.arm == PLAIN])
        for arm_name, frame in group[group.arm != PLAIN].groupby("arm"):
            arm = by_prompt(frame)
            adjusted = holm(family_p_values(plain, arm))
            rng = np.random.default_rng(seed)
            rejections = sum(holm(family_p_values(half_sample(plain, rng), half_sample(arm, rng))).min() < level
                             for _ in range(resamples))
            out.append(DistributionTest(
                configuration=name, arm=str(arm_name), temperature=float(temperature),
                samples_per_prompt=int(frame.groupby("prompt_id").size().min()), prompts=len(arm),
                tests=len(adjusted), min_adjusted_p=float(adjusted.min()), rejected=bool(adjusted.min() < level),
                half_sample_rejection_rate=rejections / resamples if resamples else NAN,
                control=arm_name == CONTROL))
    return out


def structured_rows(rows: pd.DataFrame) -> list[StructuredRow]:
    """Per (configuration, strategy): how many outputs parse and follow the schema, latency, and whether every
    output equals AR's (greedy decoding: speculation must not change a token)."""
    out = []
    ar = rows[rows.strategy == AR].set_index(["configuration", "prompt_id"]).text
    for (name, strategy), group in rows.groupby(["configuration", "strategy"], sort=False):
        same = all(ar.get((name, p)) == t for p, t in zip(group.prompt_id, group.text, strict=True))
        out.append(StructuredRow(name, str(strategy), len(group), float(group.parses.mean()),
                                 float(group.valid.mean()), float(group.latency_s.mean()),
                                 float(group.tokens_per_s.mean()), same))
    return out


def long_context_rows(rows: pd.DataFrame) -> list[LongContextRow]:
    """Per (configuration, budget, document length, strategy): reuse, evictions, TTFT and latency, the latency ratio
    to AR of the same requests and, for rakv-asd, to kv-only's (speculation on top of reuse): geometric means over
    the documents of the bin (a document's questions averaged first), t intervals over them with their degrees of
    freedom (documents - 1: 2 for the offline profile's three documents a bin, a t quantile of 4.30)."""
    out = []
    key = ["configuration", "budget_mib", "document", "question"]
    latency = rows.set_index([*key, "strategy"]).latency_s

    def ratio_to(group: pd.DataFrame, baseline: str) -> tuple[list[float], int | None]:
        mine = group.set_index(key).latency_s
        base = latency.xs(baseline, level="strategy").reindex(mine.index)
        per_document = np.log(mine / base).groupby(level="document").mean()
        per_document = per_document[np.isfinite(per_document)]
        return geometric_mean_interval(per_document), len(per_document) - 1 if len(per_document) > 1 else None

    by = ["configuration", "budget_mib", "length_bin", "strategy"]
    for (name, budget, length_bin, strategy), group in rows.groupby(by, sort=False):
        # AR never reads the store: its rows under a later budget are copies of the first budget's, whose evictions
        # say nothing of this budget (None: not measured here)
        measured = (group[group.measured_under_mib == group.budget_mib] if "measured_under_mib" in group
                    else group)
        vs_ar, vs_ar_df = ratio_to(group, AR)
        vs_reuse, vs_reuse_df = ratio_to(group, KV_ONLY) if strategy == ADAPTIVE else ([NAN, NAN, NAN], None)
        out.append(LongContextRow(
            configuration=name, budget_mib=float(budget), strategy=str(strategy), requests=len(group),
            document_tokens=float(group.document_tokens.mean()), hit_tokens=float(group.hit_tokens.mean()),
            evictions=int(measured.evictions.sum()) if len(measured) else None, ttft_s=float(group.ttft_s.mean()),
            latency_s=float(group.latency_s.mean()), vs_ar=vs_ar, length_bin=str(length_bin),
            documents=int(group.document.nunique()), vs_reuse=vs_reuse,
            vs_ar_degrees_of_freedom=vs_ar_df, vs_reuse_degrees_of_freedom=vs_reuse_df))
    return out


def sampling_summary(results, tables: dict, seed: int = 0) -> SamplingSummary | None:
    """The sampling stage's statistics from results/<name>/sampling/ (None: the stage has not run); the tests' level
    and the power's resamples are the stage's design (conf/experiment/sampling.yaml, kept in design.json)."""
    from rakv.experiments.metadata import read_sampling_design
    from rakv.experiments.sampling import read_part
    from rakv.runtime.run_layout import RunLayout

    runs = read_part(results, "runs")
    if runs is None:
        return None
    design = read_sampling_design(RunLayout.of(results))
    level, resamples = (design.distribution_level, design.power_resamples) if design else (0.05, 200)
    distribution = read_part(results, "distribution")
    structured = read_part(results, "structured")
    long_context = read_part(results, "long_context")
    return SamplingSummary(
        closed_form=closed_form_checks(runs), temperatures=temperature_results(runs, tables),
        block_vs_token=block_vs_token(runs) + (block_vs_token_first_round(distribution)
                                               + block_vs_token_given_draft(distribution)
                                               if distribution is not None else []),
        distribution=distribution_tests(distribution, level, resamples, seed) if distribution is not None else [],
        structured=structured_rows(structured) if structured is not None else [],
        long_context=long_context_rows(long_context) if long_context is not None else [],
        distribution_checks=distribution_checks(distribution) if distribution is not None else [])
