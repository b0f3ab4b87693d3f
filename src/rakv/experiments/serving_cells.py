"""The serving study's tables read as cells and paired comparisons, with their intervals (the statistics every goal,
power figure and table of rakv.experiments.serving_stats is built from).

`data` is the study's tables as rakv.experiments.serving_stats.load reads them (results/<name>/serving/): "cells"
(one row per run: its summary.json), "requests" and "iterations". The unit is the run (docs/serving.md): a cell's
metric is its mean over repeats with a Student-t interval; a comparison of two policies in one cell is paired by
repeat, relative (mean(a) / mean(b) - 1, the delta method's interval on the log scale) or absolute (the t interval of
the per-repeat differences), rakv.experiments.intervals.
"""

from __future__ import annotations

import math

import pandas as pd

from rakv.experiments.intervals import CONFIDENCE, ratio_interval, t_interval

METRICS = ("goodput", "output_throughput", "p99_itl_ms", "median_ttft_ms", "concurrency")


def runs(data: dict) -> pd.DataFrame:
    """One row per run with its metrics (cells.parquet has them: summary.json of each run)."""
    return data["cells"]


def rates_of(data: dict, family: str) -> list[float]:
    """The loads `family` was measured at, in order."""
    cells = runs(data)
    return sorted(float(r) for r in cells[cells.family == family].rate.unique())


def cell_table(data: dict) -> pd.DataFrame:
    """Every cell's metrics: the mean over repeats and its t interval."""
    rows = []
    for (family, rate, policy), part in runs(data).groupby(["family", "rate", "policy"], sort=False):
        row = {"family": family, "rate": float(rate), "policy": policy, "repeats": int(len(part)),
               "configuration": part.configuration.iloc[0] if "configuration" in part else None}
        for metric in METRICS:
            if metric in part:
                row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = t_interval(part[metric].astype(float))
        rows.append(row)
    return pd.DataFrame(rows)


def paired_values(data: dict, family: str, rate: float, a: str, b: str, metric: str) -> pd.DataFrame | None:
    """metric of `a` and `b` over the repeats both ran (columns a, b), None where either lacks them."""
    cells = runs(data)
    part = cells[(cells.family == family) & (cells.rate == rate) & cells.policy.isin([a, b])]
    wide = part.pivot_table(index="repeat", columns="policy", values=metric)
    if a not in wide or b not in wide:
        return None
    both = wide[[a, b]].dropna()
    return both if len(both) else None


def relative_interval(both: pd.DataFrame | None, confidence: float = CONFIDENCE) -> list[float]:
    """mean(a) / mean(b) - 1 over paired repeats (columns: a, b) with the delta method's t interval on the log scale
    (rakv.experiments.intervals.ratio_interval), so it never passes -100 %; NaN without pairs."""
    if both is None:
        return [float("nan")] * 3
    a, b = both.columns
    try:
        return ratio_interval(both[a], both[b], scale="log", transform=lambda r: r - 1.0, confidence=confidence)
    except OverflowError:  # a quantile so far out (a p-value's search) that exp() of the bound leaves float range
        return [ratio_interval(both[a], both[b], scale="log", transform=lambda r: r - 1.0)[0], -1.0, math.inf]


def paired_difference(data: dict, family: str, rate: float, a: str, b: str, metric: str,
                      relative: bool = True, confidence: float = CONFIDENCE) -> list[float]:
    """metric(a) - metric(b) over the repeats both ran, with its interval over repeats: relative, mean(a) / mean(b)
    - 1 (`relative_interval`); absolute, the t interval of the per-repeat differences."""
    both = paired_values(data, family, rate, a, b, metric)
    if relative or both is None:
        return relative_interval(both, confidence)
    return t_interval(both[a] - both[b], confidence)


def residual_sd(both: pd.DataFrame | None) -> float | None:
    """The standard deviation of the per-repeat residuals a - (sum a / sum b) b relative to b's mean (columns a, b:
    paired repeats), what relative_interval's delta method is made of; None with fewer than two pairs or where b's
    mean is not positive (no relative difference to it)."""
    if both is None or len(both) < 2:
        return None
    a, b = both.columns
    if not both[b].mean() > 0:
        return None
    ratio = both[a].sum() / both[b].sum()
    return float(((both[a] - ratio * both[b]) / both[b].mean()).std(ddof=1))


def judged_loads(data: dict, family: str) -> dict[float, bool]:
    """rate -> whether goodput can tell the family's policies apart there: some policy, in some repeat, served a
    request that missed an SLO (goodput below the completed requests' rate) or failed one. Where every request of
    every policy meets every SLO, goodput is the rate requests finish at, set by the arrivals, and "no worse in
    goodput" tests nothing. The rule reads no policy's value against another's, so it cannot favour one."""
    cells = runs(data)
    part = cells[cells.family == family]
    out = {}
    for rate, group in part.groupby("rate"):
        missed = (group.goodput < group.request_throughput * (1 - 1e-9)) | (group.failed > 0)
        out[float(rate)] = bool(missed.any())
    return out


def request_values(requests: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per finished request, `error`: `latency` |served prediction - service| / service (admission's load-aware
    prediction, rakv.serving.admission.service_prediction), `batch_one` the controller's batch-one prediction the
    same way, `acceptance` |alpha at admission - realised alpha|, or `regret` (ex post)."""
    rows = requests[requests.status == "ok"]
    if column == "latency":
        rows = rows[rows.served_predicted_s.notna() & rows.service_s.notna() & (rows.service_s > 0)]
        error = (rows.served_predicted_s - rows.service_s).abs() / rows.service_s
    elif column == "batch_one":
        rows = rows[rows.predicted_s.notna() & rows.service_s.notna() & (rows.service_s > 0)]
        error = (rows.predicted_s - rows.service_s).abs() / rows.service_s
    elif column == "acceptance":
        if "realised_alpha" not in rows:
            return rows.iloc[:0].assign(error=pd.Series(dtype=float))
        rows = rows[rows.alpha.notna() & rows.realised_alpha.notna()]
        error = (rows.alpha - rows.realised_alpha).abs()
    else:  # ex-post regret: computed for prompt lookup only (rakv.experiments.serving.expost_regret)
        if "expost_regret" not in rows:
            return rows.iloc[:0].assign(error=pd.Series(dtype=float))
        rows = rows[rows.expost_regret.notna()]
        error = rows.expost_regret
    return rows.assign(error=error.astype(float))


def per_repeat_mean(frame: pd.DataFrame) -> pd.Series:
    return frame.groupby("repeat").error.mean()
