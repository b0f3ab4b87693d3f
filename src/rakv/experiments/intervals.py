"""Confidence intervals: every interval method the analysis uses, in one place (paper/main.tex, "Statistics").

    t_interval(values)                       mean of independent values, Student t
    geometric_mean_interval(log_ratios)      geometric mean of ratios: t interval of their logs, exponentiated
    ratio_interval(numerator, denominator)   sum(numerator) / sum(denominator) over independent units (delta method)
    cluster_interval(clusters, numerator, denominator)
                                             the same ratio with prompts as the units: rows summed per cluster first

Why not a bootstrap: the study has 8 prompts per configuration (24 in the paper profile) and the serving study 5
repeats per cell. tests/test_intervals.py simulates each method on data shaped like the study's (per-prompt
heterogeneity, skew, two datasets, paired ratios) at those counts: a percentile cluster bootstrap over 8 prompts
covers ~0.88 of a nominal 0.95 (it ignores that the spread of 8 resampled means understates the spread of the mean),
while the delta-method ratio with a t quantile on clusters - 1 degrees of freedom holds >= 0.93 (the table is in
docs/outputs.md). A ratio of positive sums is taken on the log scale (the interval of log R, exponentiated), so a
reduction 1 - R can never pass 100 % nor a gain R - 1 fall below -100 %; `bounds` clips an interval to the range
the statistic can take (a proportion's [0, 1]), which can only raise coverage.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from rakv.runtime.json_records import CI

CONFIDENCE = 0.95
NAN = float("nan")
NO_INTERVAL = CI(NAN, NAN, NAN)  # no value to estimate (NaN: written as null in summary.json)


def _quantile(count: int, confidence: float = CONFIDENCE) -> float:
    return float(stats.t.ppf(0.5 + confidence / 2, count - 1))


def t_interval(values, confidence: float = CONFIDENCE) -> CI:
    """CI(mean, low, high): the mean of independent values and its Student-t interval (no bounds from one value)."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], float)
    if not len(x):
        return NO_INTERVAL
    mean = float(x.mean())
    if len(x) < 2:
        return CI(mean, NAN, NAN)
    half = _quantile(len(x), confidence) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return CI(mean, mean - half, mean + half)


def geometric_mean_interval(log_ratios) -> CI:
    """The geometric mean of ratios with its CI, from their logs (a t interval, exponentiated)."""
    return CI(*(math.exp(x) if np.isfinite(x) else NAN for x in t_interval(log_ratios)))


SCALES = ("log", "linear", "proportion", "lognormal")


def ratio_interval(numerator, denominator=None, *, scale: str = "log", bounds=(-math.inf, math.inf),
                   transform=None, confidence: float = CONFIDENCE) -> CI:
    """CI(value, low, high) of R = sum(numerator) / sum(denominator) over independent units (`denominator` None: a
    mean), with a CI on units - 1 degrees of freedom. `scale` says what R is, and so which interval holds its level
    at few units (tests/test_intervals.py):

    - "log": a positive ratio (latencies, throughputs): the delta method's standard error of R (from the units'
      linearised residuals (n_i - R d_i) / mean(d)) on the log scale (SE / R), the t interval exponentiated; the
      linear one where R <= 0 or a numerator is negative.
    - "linear": a quantity of either sign (regret, a correlation): the delta method's t interval.
    - "proportion": R in [0, 1] (an accuracy, an acceptance): Korn and Graubard's interval, Clopper-Pearson's at
      the effective number of trials R (1 - R) / SE^2 (the clusters' design effect; all trials where SE is 0)
      scaled by (z / t)^2 for the clusters' degrees of freedom. A Wald interval near 0 or 1 covers ~0.80 at 8
      prompts, Wilson's at the effective count ~0.92 at 0.97.
    - "lognormal": the mean of positive, right-skewed unit values (an error rate): Cox's interval for a lognormal
      mean over the units' logs (log-mean + s^2/2 +- t sqrt(s^2/n + s^4/(2(n - 1)))); the value is the mean of the
      units' ratios n_i / d_i.

    `transform` (monotone) is applied to the value and both bounds, reordered if it decreases; `bounds` clips the
    interval (before the transform) to the range R can take."""
    if scale not in SCALES:
        raise ValueError(f"interval scale {scale!r}: expected one of {', '.join(SCALES)}")
    num = np.asarray(numerator, float)
    den = np.ones_like(num) if denominator is None else np.asarray(denominator, float)
    keep = np.isfinite(num) & np.isfinite(den)
    num, den = num[keep], den[keep]
    if not len(num) or not den.sum() > 0:
        return NO_INTERVAL
    n = len(num)
    ratio = float(num.sum() / den.sum())
    low = high = NAN
    if scale == "lognormal":
        units = num / den
        ratio = float(units.mean())
        if n >= 2 and (units > 0).all():
            logs = np.log(units)
            s2 = float(logs.var(ddof=1))
            centre = float(logs.mean()) + s2 / 2
            half = _quantile(n, confidence) * math.sqrt(s2 / n + s2 * s2 / (2 * (n - 1)))
            low, high = math.exp(centre - half), math.exp(centre + half)
    elif n >= 2:
        se = float(((num - ratio * den) / den.mean()).std(ddof=1)) / math.sqrt(n)
        t = _quantile(n, confidence)
        if scale == "proportion":
            trials = min(float(den.sum()), ratio * (1 - ratio) / se ** 2) if se > 0 else float(den.sum())
            trials *= (stats.norm.ppf(0.5 + confidence / 2) / t) ** 2  # Korn and Graubard's degrees-of-freedom term
            successes, tail = ratio * trials, (1 - confidence) / 2
            low = float(stats.beta.ppf(tail, successes, trials - successes + 1)) if successes > 0 else 0.0
            high = float(stats.beta.ppf(1 - tail, successes + 1, trials - successes)) if successes < trials else 1.0
        elif scale == "log" and ratio > 0 and (num >= 0).all():
            low, high = ratio * math.exp(-t * se / ratio), ratio * math.exp(t * se / ratio)
        else:
            low, high = ratio - t * se, ratio + t * se
    if np.isfinite(low):
        low, high = max(low, bounds[0]), min(high, bounds[1])
    if transform is None:
        return CI(ratio, low, high)
    value, a, b = (float(transform(x)) if np.isfinite(x) else NAN for x in (ratio, low, high))
    return CI(value, *((a, b) if not (a > b) else (b, a)))


def cluster_interval(clusters, numerator, denominator=None, **options) -> CI:
    """`ratio_interval` with whole clusters (prompts) as the units: rows of one prompt share its text and length, so
    their numerators and denominators are summed per cluster first. No interval from one cluster."""
    num = np.asarray(numerator, float)
    den = np.ones_like(num) if denominator is None else np.asarray(denominator, float)
    keep = np.isfinite(num) & np.isfinite(den)
    codes, _ = pd.factorize(pd.Series(list(clusters))[keep].astype(str))
    if not keep.any():
        return NO_INTERVAL
    count = int(codes.max()) + 1
    return ratio_interval(np.bincount(codes, num[keep], count), np.bincount(codes, den[keep], count), **options)


def prompt_keys(frame: pd.DataFrame) -> list[str]:
    """The cluster of each row: its prompt (dataset/prompt_id)."""
    return (frame.dataset + "/" + frame.prompt_id).tolist()
