"""Confidence intervals: the cluster bootstrap over prompts (paper/main.tex, "Statistics").

Repeats and scenarios of one prompt share the prompt's text and length, so they are not independent: every CI
of the study is a cluster bootstrap over prompts (95 %, percentile; `cluster_ci`). Each statistic is a ratio of
sums over units (instances, scenarios, scenario-actions), so resampling whole prompts resamples their units' sums.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def cluster_ci(clusters, numerator, denominator=None, *, transform=lambda x: x, seed: int = 0,
               resamples: int = 2000) -> list[float]:
    """[value, low, high]: transform(sum(numerator) / sum(denominator)) with a 95 % percentile CI from a
    bootstrap that resamples whole clusters (prompts). `denominator` None: a mean over units."""
    numerator = np.asarray(numerator, float)
    denominator = np.ones_like(numerator) if denominator is None else np.asarray(denominator, float)
    keep = np.isfinite(numerator) & np.isfinite(denominator)
    codes, _ = pd.factorize(pd.Series(list(clusters))[keep].astype(str))
    numerator, denominator = numerator[keep], denominator[keep]
    if len(numerator) == 0:
        return [float("nan")] * 3
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample with an empty denominator is dropped
        value = float(transform(numerator.sum() / denominator.sum()))
        count = codes.max() + 1
        if count < 2:
            return [value, float("nan"), float("nan")]
        num, den = np.bincount(codes, numerator, count), np.bincount(codes, denominator, count)
        draws = np.random.default_rng(seed).integers(count, size=(resamples, count))
        ratios = transform(num[draws].sum(axis=1) / den[draws].sum(axis=1))
    ratios = ratios[np.isfinite(ratios)]
    if len(ratios) == 0:
        return [value, float("nan"), float("nan")]
    low, high = np.percentile(ratios, [2.5, 97.5])
    return [value, float(low), float(high)]


def prompt_keys(frame: pd.DataFrame) -> list[str]:
    return (frame.dataset + "/" + frame.prompt_id).tolist()
