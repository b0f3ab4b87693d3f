"""Simulated coverage of every interval method the analysis uses (rakv.experiments.intervals), at the counts the
shipped profiles have, on data shaped like the study's: the table of the paper's "Statistics" paragraph and the
cases tests/test_intervals.py holds to >= 0.93.

The shapes are the reference run's (data/reference/offline, per prompt): per-prompt log latency ratios of rakv-asd
against a baseline with SD 0.05-0.23 and sample skewness within +-1.6 (root mean square 0.65 over eight
comparisons: what eight values of a symmetric population give, whose sample skewness has SD 0.75), per-prompt
latency totals with log SD 0.03-0.21, two datasets with different means; per-scenario accuracy 0.3-0.93 with a
between-prompt SD of 0.09-0.19; the cost model's per-prompt error rate with log SD 0.2-0.63 over rows with log SD
~1.1; regret of either sign (cross-fitted). The simulated shapes are set at or past the worst of these, with a
population skewness of 0.5 for the ratios; `STRESS` holds the ratio at skewness 1, past what the data show, where
8 prompts are too few for any of the intervals tried (more prompts per configuration is the remedy there).

Each case draws per-prompt (or per-repeat) data and calls the interval on it, `trials` times, seeded; at a true
coverage of 0.95 the estimate's SD over 2,000 trials is 0.005.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rakv.experiments import intervals
from rakv.runtime.actions import SPEC_K4
from rakv.runtime.paths import conf_file

TRIALS = 2000


def study_clusters(profile: str) -> int:
    """Prompts per configuration in a profile's study: prompts per length bin x bins x datasets."""
    study = conf_file(f"profile/{profile}.yaml").profile.study
    return int(study.prompts_per_bin) * len(study.length_bins) * len(conf_file("config.yaml").datasets)


def counts() -> dict[str, int]:
    offline = conf_file("profile/offline.yaml").profile
    return {"offline": study_clusters("offline"), "paper": study_clusters("paper"),
            "serving repeats": int(offline.serving.repeats),
            "sampling prompts": 2 * int(offline.sampling.prompts_per_dataset)}


def skewed(rng, sd, skewness, size):
    """Centred values with standard deviation `sd` and skewness `skewness` (a shifted gamma; 0: normal)."""
    if skewness == 0:
        return rng.normal(0.0, sd, size)
    shape = (2.0 / skewness) ** 2
    return sd * np.sign(skewness) * (rng.gamma(shape, 1.0, size) - shape) / math.sqrt(shape)


def paired_latencies(rng, clusters, log_sd=0.25, skewness=0.5, shift=0.2, rows=15):
    """Per prompt (two datasets, half each) the summed latency of ours and of a baseline over its rows: baseline
    totals lognormal (log SD 0.2), ours = baseline x exp(-0.3 + dataset shift + a skewed per-prompt effect)."""
    half = clusters // 2
    baseline = rows * np.exp(rng.normal(0.0, 0.2, clusters))
    effect = -0.3 + np.r_[np.zeros(half), np.full(clusters - half, shift)] + skewed(rng, log_sd, skewness, clusters)
    return baseline * np.exp(effect), baseline


def paired_truth(**shape) -> float:
    """The population ratio of the sums (equal datasets), from a million simulated prompts."""
    ours, baseline = paired_latencies(np.random.default_rng(123), 1_000_000, **shape)
    return float(ours.sum() / baseline.sum())


def proportions(share, between_sd, clusters, trials_per_prompt=15):
    """Per prompt a share drawn from a beta with the given between-prompt SD, 15 trials (5 scenarios x 3 repeats)."""
    def draw(rng):
        if between_sd == 0:
            p = np.full(clusters, share)
        else:
            concentration = share * (1 - share) / between_sd ** 2 - 1
            p = rng.beta(share * concentration, (1 - share) * concentration, clusters)
        return rng.binomial(trials_per_prompt, p).astype(float), np.full(clusters, float(trials_per_prompt))
    return draw


def error_rates(between_log_sd, clusters, rows=60):
    """Per prompt 60 (scenario, action) errors, lognormal with log SD 1.1 around a prompt effect."""
    def draw(rng):
        effect = rng.normal(0.0, between_log_sd, clusters)
        errors = 0.1 * np.exp(effect[:, None] + rng.normal(0.0, 1.1, (clusters, rows)))
        return errors.sum(axis=1), np.full(clusters, float(rows))
    return draw


def regrets(clusters, scenarios=5):
    """Per-scenario regret around a skewed (skewness 1) prompt effect of SD 0.1, mean 0.03."""
    def draw(rng):
        effect = 0.03 + skewed(rng, 0.1, 1.0, clusters)
        return (effect[:, None] + rng.normal(0.0, 0.05, (clusters, scenarios))).sum(axis=1), np.full(clusters, 5.0)
    return draw


def serving_ratio(repeats, skewness):
    """Per repeat both policies serve the repeat's own trace: a trace effect moves both (log SD 0.3); ours / the
    baseline varies with log SD 0.08 around 0.9."""
    def draw(rng):
        trace = 100 * np.exp(rng.normal(0.0, 0.3, repeats))
        return trace * np.exp(math.log(0.9) + skewed(rng, 0.08, skewness, repeats)), trace
    return draw


def serving_truth(skewness) -> float:
    ours, trace = serving_ratio(1_000_000, skewness)(np.random.default_rng(7))
    return float(ours.sum() / trace.sum())


def log_ratios(prompts, skewness):
    return lambda rng: (math.log(0.9) + skewed(rng, 0.15, skewness, prompts),)


@dataclass(frozen=True)
class Case:
    statistic: str  # what the analysis computes with it
    method: str     # the interval, as the paper names it
    units: str      # what is resampled / counted, and how many
    shape: str
    draw: Callable
    interval: Callable
    truth: float


def cases() -> list[Case]:
    """Every interval method the analysis uses, at each shipped count, on the study's shapes."""
    n = counts()
    ratio = "delta method, log scale, t"
    out = []
    for profile in ("offline", "paper"):
        c = n[profile]
        units = f"{c} prompts ({profile})"
        for shape in (dict(log_sd=0.15, skewness=0.0, shift=0.0), dict(log_sd=0.25, skewness=0.5),
                      dict(log_sd=0.25, skewness=-0.5, shift=0.0)):
            words = f"log SD {shape['log_sd']}, skewness {shape['skewness']:+g}" + (
                "" if shape.get("shift", 0.2) == 0 else ", datasets differ")
            out.append(Case("latency reduction / throughput gain / strategy mean", ratio, units, words,
                            lambda rng, c=c, s=shape: paired_latencies(rng, c, **s), intervals.ratio_interval,
                            paired_truth(**shape)))
        for share, sd in ((0.3, 0.19), (0.6, 0.15), (0.93, 0.09), (0.97, 0.05), (1.0, 0.0)):
            out.append(Case("accuracy / acceptance", "Korn-Graubard (Clopper-Pearson, effective n)", units,
                            f"share {share:g}, between-prompt SD {sd:g}", proportions(share, sd, c),
                            lambda a, b: intervals.ratio_interval(a, b, scale="proportion"), share))
        for sd in (0.2, 0.65):
            out.append(Case("cost-model MAPE", "Cox (lognormal mean), t", units, f"between-prompt log SD {sd:g}",
                            error_rates(sd, c), lambda a, b: intervals.ratio_interval(a, b, scale="lognormal"),
                            0.1 * math.exp(sd ** 2 / 2 + 1.1 ** 2 / 2)))
        out.append(Case("regret", "delta method, linear, t", units, "skewness 1", regrets(c),
                        lambda a, b: intervals.ratio_interval(a, b, scale="linear"), 0.03))
    for skewness in (0.0, 1.0, -1.0):
        out.append(Case("serving relative difference", ratio, f"{n['serving repeats']} repeats",
                        f"skewness {skewness:+g}", serving_ratio(n["serving repeats"], skewness),
                        intervals.ratio_interval, serving_truth(skewness)))
    for skewness in (0.0, 1.0):
        out.append(Case("sampling latency ratio", "geometric mean, t", f"{n['sampling prompts']} prompts",
                        f"skewness {skewness:+g}", log_ratios(n["sampling prompts"], skewness),
                        intervals.geometric_mean_interval, 0.9))
    return out


STRESS = dict(log_sd=0.25, skewness=1.0, shift=0.0)


def simulate(case: Case, trials: int = TRIALS, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        _, low, high = case.interval(*case.draw(rng))
        hits += low <= case.truth <= high
    return hits / trials


def closed_form_coverage(trials: int = TRIALS, seed: int = 0) -> float:
    """The sampling stage's closed-form check (rakv.experiments.sampling_stats.closed_form_checks): per trial a
    cell of 12 requests of 8 token-wise rounds of k = 4, each candidate accepted with its own alpha_j (spread over
    0.05-0.99) until the first rejection; the share of trials whose interval of measured - closed form covers 0.
    The trials are configurations of one frame, so the check runs once over all of them."""
    from rakv.experiments.sampling_stats import closed_form_checks

    rng = np.random.default_rng(seed)
    shape = (trials, 12, 8, 4)
    alpha = rng.beta(3, 1.5, shape).clip(0.05, 0.99)
    accept = rng.random(shape) < alpha
    reached = np.cumprod(np.concatenate([np.ones((*shape[:-1], 1), bool), accept[..., :-1]], axis=-1), axis=-1) > 0

    def total(x):  # per request
        return x.sum(axis=(2, 3)).ravel()

    frame = pd.DataFrame({
        "configuration": np.repeat(np.arange(trials), 12), "temperature": 1.0, "verify": "token", "k": 4,
        "strategy": SPEC_K4, "accepted": total(accept & reached), "rejections": total(~accept & reached),
        "closed_form_accepted": total(alpha * reached), "closed_form_variance": total(alpha * (1 - alpha) * reached)})
    checks = closed_form_checks(frame)
    if len(checks) != trials:
        raise AssertionError(f"closed_form_checks returned {len(checks)} cells for {trials} trials")
    return float(np.mean([c.difference[1] <= 0.0 <= c.difference[2] for c in checks]))


def coverage_table(trials: int = TRIALS) -> pd.DataFrame:
    """One row per case: statistic, method, units, shape, simulated coverage of the nominal 95 % interval (the
    cases, then the closed-form check, the ratio's stress case at 8 prompts and the percentile bootstrap's
    control)."""
    rows = [{"statistic": c.statistic, "method": c.method, "units": c.units, "shape": c.shape,
             "coverage": simulate(c, trials)} for c in cases()]
    rows.append({"statistic": "closed-form acceptance check", "method": "normal, model variance",
                 "units": "12 requests x 8 rounds", "shape": "alpha_j ~ Beta(3, 1.5)",
                 "coverage": closed_form_coverage(trials)})
    c = counts()["offline"]
    stress = Case("latency reduction (stress)", "delta method, log scale, t", f"{c} prompts (offline)",
                  "log SD 0.25, skewness +1", lambda rng: paired_latencies(rng, c, **STRESS),
                  intervals.ratio_interval, paired_truth(**STRESS))
    rows.append({"statistic": stress.statistic, "method": stress.method, "units": stress.units,
                 "shape": stress.shape, "coverage": simulate(stress, trials)})
    control = percentile_control(c)
    rows.append({"statistic": control.statistic, "method": control.method, "units": control.units,
                 "shape": control.shape, "coverage": simulate(control, trials)})
    return pd.DataFrame(rows)


def percentile_cluster_bootstrap(numerator, denominator, resamples=1000, seed=0):
    """The interval earlier versions of the study used (a 95 % percentile bootstrap over prompts)."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(len(numerator), size=(resamples, len(numerator)))
    ratios = numerator[draws].sum(axis=1) / denominator[draws].sum(axis=1)
    return [numerator.sum() / denominator.sum(), *np.percentile(ratios, [2.5, 97.5])]


def percentile_control(clusters: int) -> Case:
    """The positive control: the percentile bootstrap on the normal shape the delta method passes."""
    shape = dict(log_sd=0.15, skewness=0.0, shift=0.0)
    return Case("latency reduction (control)", "percentile cluster bootstrap (earlier versions)",
                f"{clusters} prompts (offline)", "log SD 0.15, skewness +0",
                lambda rng: paired_latencies(rng, clusters, **shape), percentile_cluster_bootstrap,
                paired_truth(**shape))
