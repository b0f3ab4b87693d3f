"""Statistics of the serving study (results/<name>/serving/, rakv.experiments.serving), as pure functions.

Units and CIs: a run serves one trace once; its requests share that run's machine state, so every CI is a
bootstrap over *repeats* (95 %, percentile), each resample drawing whole repeats and pooling their requests (a
percentile of ITL over the pooled gaps, a goodput as requests meeting the SLOs over the runs' summed durations).
A comparison of two policies in the same cell is paired by repeat (the same draw of repeats for both). With three
repeats a CI is wide: it says what these runs can and cannot tell apart.

Goals (`goals`): each a statistic with its CI and a verdict from the CI's side of a threshold: `met` (the CI
lies on the goal's side), `missed` (wholly on the other side) or `inconclusive`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rakv.experiments.verdicts import ci_side
from rakv.runtime.costmodel import expected_tokens_per_round

RESAMPLES = 2000
FIXED_K = ("k0", "k2", "k4")  # the fixed speculation policies
FIXED_BUDGETS = ("fixed-32", "fixed-128", "fixed-512")


def load(results: Path) -> dict[str, pd.DataFrame]:
    folder = Path(results) / "serving"
    return {name: pd.read_parquet(folder / f"{name}.parquet") for name in ("requests", "cells", "iterations")}


def available(results: Path) -> bool:
    return (Path(results) / "serving" / "cells.parquet").exists()


def bootstrap(groups: list, statistic, seed: int = 0, resamples: int = RESAMPLES) -> list[float]:
    """[value, low, high]: statistic(list of groups) and its 95 % CI over resampled groups (repeats)."""
    value = float(statistic(groups))
    if len(groups) < 2 or not np.isfinite(value):
        return [value, float("nan"), float("nan")]
    rng = np.random.default_rng(seed)
    # every statistic here depends on the multiset of groups drawn, and with a few repeats there are few
    # multisets (10 for 3 repeats): each is evaluated once
    seen: dict[tuple, float] = {}
    draws = []
    for _ in range(resamples):
        key = tuple(sorted(rng.integers(len(groups), size=len(groups)).tolist()))
        if key not in seen:
            seen[key] = statistic([groups[i] for i in key])
        draws.append(seen[key])
    draws = np.asarray([d for d in draws if np.isfinite(d)], float)
    if not len(draws):
        return [value, float("nan"), float("nan")]
    low, high = np.percentile(draws, [2.5, 97.5])
    return [value, float(low), float(high)]


@dataclass(frozen=True)
class Run:
    """One served trace, as the statistics need it (parsed once: the bootstrap resamples these)."""

    gaps_s: np.ndarray  # every inter-token gap of its finished requests
    ttft_s: np.ndarray
    goodput: float
    output_throughput: float
    duration_s: float


def p99_itl_ms(parts) -> float:
    gaps = np.concatenate([p.gaps_s for p in parts]) if parts else np.array([])
    return float(np.percentile(gaps, 99) * 1e3) if gaps.size else float("nan")


def median_ttft_ms(parts) -> float:
    values = np.concatenate([p.ttft_s for p in parts]) if parts else np.array([])
    return float(np.median(values) * 1e3) if values.size else float("nan")


def goodput(parts) -> float:
    return float(sum(p.goodput * p.duration_s for p in parts) / sum(p.duration_s for p in parts))


def throughput(parts) -> float:
    return float(sum(p.output_throughput * p.duration_s for p in parts) / sum(p.duration_s for p in parts))


METRICS = {"p99_itl_ms": p99_itl_ms, "median_ttft_ms": median_ttft_ms, "goodput": goodput,
           "output_throughput": throughput}


def runs_of(data: dict, family: str, rate: float, policy: str) -> dict[int, Run]:
    """repeat -> its Run, for one cell (parsed once per data set)."""
    cache = data.setdefault("_runs", {})
    if not cache:
        requests = data["requests"][data["requests"].status == "ok"]
        grouped = {key: part for key, part in requests.groupby(["family", "rate", "policy", "repeat"])}
        for row in data["cells"].itertuples(index=False):
            key = (row.family, row.rate, row.policy, int(row.repeat))
            part = grouped.get(key, requests.iloc[:0])
            gaps = np.asarray([g for text in part.itl_s for g in json.loads(text)], float)
            cache[key] = Run(gaps, part.ttft_s.dropna().to_numpy(float), float(row.goodput or 0.0),
                             float(row.output_throughput), float(row.duration_s))
    return {key[3]: run for key, run in cache.items() if key[:3] == (family, rate, policy)}


def cell_table(data: dict, seed: int = 0) -> pd.DataFrame:
    """Every cell's metrics with CIs over repeats."""
    rows = []
    cells = data["cells"]
    for (family, rate, policy), _ in cells.groupby(["family", "rate", "policy"], sort=False):
        parts = list(runs_of(data, family, rate, policy).values())
        row = {"family": family, "rate": rate, "policy": policy, "repeats": len(parts)}
        for name, fn in METRICS.items():
            row[name], row[f"{name}_low"], row[f"{name}_high"] = bootstrap(parts, fn, seed)
        rows.append(row)
    return pd.DataFrame(rows)


def paired_difference(data: dict, family: str, rate: float, a: str, b: str, metric: str, seed: int = 0,
                      relative: bool = True) -> list[float]:
    """metric(a) - metric(b) (relative to b's when `relative`) in one cell, resampling the repeats both ran."""
    runs_a, runs_b = runs_of(data, family, rate, a), runs_of(data, family, rate, b)
    common = sorted(set(runs_a) & set(runs_b))
    fn = METRICS[metric]

    def stat(repeats):
        va, vb = fn([runs_a[r] for r in repeats]), fn([runs_b[r] for r in repeats])
        if not relative:
            return va - vb
        return (va - vb) / vb if vb > 0 else float("nan")  # a resample where b scores 0 has no ratio

    return bootstrap(common, stat, seed)


def verdict(ci: list[float], threshold: float, above: bool) -> str:
    """met: the CI lies wholly on the goal's side of the threshold; missed: wholly on the other; else inconclusive."""
    side = ci_side(ci, threshold)
    if side in ("missing", "straddles"):
        return "missing" if side == "missing" else "inconclusive"  # the CI straddles or touches the threshold
    return "met" if side == ("above" if above else "below") else "missed"


def no_worse(ci: list[float], worse: str) -> str:
    """A no-worse goal: missed only when the CI lies wholly on the `worse` side of 0 ("above" or "below")."""
    return "missed" if ci_side(ci, 0.0, point_if_no_interval=False) == worse else "met"


def best_fixed(table: pd.DataFrame, family: str, rate: float, policies, metric: str, largest: bool = True) -> str:
    """The fixed policy with the best point value in a cell (chosen on the same runs it is judged on)."""
    rows = table[(table.family == family) & (table.rate == rate) & table.policy.isin(policies)]
    return rows.sort_values(metric, ascending=not largest).policy.iloc[0]


def speculation_goals(data: dict, table: pd.DataFrame, seed: int = 0) -> list[dict]:
    rows = []
    spec = table[table.family == "speculation"]
    for rate in sorted(spec.rate.unique()):
        best = best_fixed(table, "speculation", rate, FIXED_K, "goodput")
        for rival, goal in ((best, "no worse than the best fixed k"), ("disable-by-batch-size", "higher than"),
                            ("smartspec", "higher than")):
            if rival not in set(spec.policy) or "rakv-asd" not in set(spec.policy):
                continue
            # in requests/s: a relative difference is undefined where the rival's goodput is 0
            ci = paired_difference(data, "speculation", rate, "rakv-asd", rival, "goodput", seed, relative=False)
            at_least = goal.startswith("no worse")
            rows.append({"goal": f"RAKV-ASD under load goodput vs {rival} ({'best fixed' if at_least else goal}) "
                                 f"at {rate:g} req/s, difference in req/s",
                         "key": f"goodput_vs_{'best_fixed' if at_least else rival}", "unit": "req/s",
                         "rate": rate, "rival": rival, "value": ci[0], "ci_low": ci[1], "ci_high": ci[2],
                         # no worse: the CI does not lie wholly below 0; higher: the CI lies above 0
                         "verdict": no_worse(ci, "below") if at_least else verdict(ci, 0.0, above=True)})
    return rows


def slo_rate(table: pd.DataFrame, policy: str, slo_ms: float) -> float | None:
    """The highest rate up to which the policy's p99 ITL point value meets the SLO (None: not even the lowest)."""
    rows = table[(table.family == "chunking") & (table.policy == policy)].sort_values("rate")
    met = None
    for row in rows.itertuples(index=False):
        if not row.p99_itl_ms <= slo_ms:
            break
        met = row.rate
    return met


def chunking_goals(data: dict, table: pd.DataFrame, slo_ms: float, seed: int = 0) -> list[dict]:
    policies = set(table[table.family == "chunking"].policy)
    if "cost-model-slo" not in policies:
        return []
    fixed = [p for p in FIXED_BUDGETS if p in policies]
    reach = {p: slo_rate(table, p, slo_ms) for p in fixed + ["cost-model-slo"]}
    # the best fixed budget: the one meeting the SLO to the highest rate, then the lowest median TTFT there
    ranked = sorted(fixed, key=lambda p: (-(reach[p] or 0), _at(table, p, reach[p], "median_ttft_ms")))
    best = ranked[0] if ranked else None
    rows = [{"goal": f"cost-model budget meets the ITL SLO ({slo_ms:g} ms) up to a rate >= the best fixed budget's "
                     f"({best}: {reach[best] or 'none'})", "key": "slo_rate", "rival": best,
             "value": reach["cost-model-slo"], "ci_low": None, "ci_high": None,
             "verdict": ("missed" if reach["cost-model-slo"] is None
                         else "met" if reach["cost-model-slo"] >= (reach[best] or 0) else "missed")}]
    rates = sorted(table[table.family == "chunking"].rate.unique())
    rate = reach[best] or rates[0]
    ci = paired_difference(data, "chunking", rate, "cost-model-slo", best, "median_ttft_ms", seed)
    rows.append({"goal": f"cost-model budget median TTFT vs {best} at {rate:g} req/s (no worse)",
                 "key": "ttft_vs_best_fixed", "rate": rate, "rival": best, "value": ci[0], "ci_low": ci[1],
                 "ci_high": ci[2], "verdict": no_worse(ci, "above")})
    return rows


def _at(table, policy, rate, metric) -> float:
    rows = table[(table.family == "chunking") & (table.policy == policy) & (table.rate == rate)]
    return float(rows[metric].iloc[0]) if len(rows) else float("inf")


def request_errors(requests: pd.DataFrame, policy: str, column: str) -> dict[int, np.ndarray]:
    """repeat -> per-request values of the acceptance family under `policy`: `mape` (|predicted - service| /
    service, the controller's predicted latency against first admission to last token) or `regret` (ex-post)."""
    rows = requests[(requests.family == "acceptance") & (requests.policy == policy) & (requests.status == "ok")]
    if column == "mape":
        rows = rows[rows.predicted_s.notna() & rows.service_s.notna()]
        values = ((rows.predicted_s - rows.service_s).abs() / rows.service_s)
    else:
        if "expost_regret" not in rows:
            return {}
        rows = rows[rows.expost_regret.notna()]
        values = rows.expost_regret
    return {int(r): values[rows.repeat == r].to_numpy(float) for r in sorted(rows.repeat.unique())}


def _mean_of(parts) -> float:
    return float(np.concatenate(parts).mean()) if parts else float("nan")


def request_mean(requests: pd.DataFrame, policy: str, column: str, seed: int = 0) -> list[float]:
    groups = list(request_errors(requests, policy, column).values())
    return bootstrap(groups, _mean_of, seed) if groups else [float("nan")] * 3


def request_mean_difference(requests: pd.DataFrame, a: str, b: str, column: str, seed: int = 0) -> list[float]:
    """mean(a) - mean(b), paired by repeat (a resample draws the same repeats for both)."""
    ga, gb = request_errors(requests, a, column), request_errors(requests, b, column)
    common = sorted(set(ga) & set(gb))
    if not common:
        return [float("nan")] * 3
    return bootstrap(common, lambda rs: _mean_of([ga[r] for r in rs]) - _mean_of([gb[r] for r in rs]), seed)


def acceptance_goals(requests: pd.DataFrame, seed: int = 0) -> tuple[list[dict], dict]:
    stats = {p: {"mape": request_mean(requests, p, "mape", seed), "regret": request_mean(requests, p, "regret", seed)}
             for p in ("ewma", "prefix-keyed") if ((requests.family == "acceptance") & (requests.policy == p)).any()}
    if "prefix-keyed" not in stats:
        return [], stats
    prefix = stats["prefix-keyed"]
    rows = [{"goal": "prefix-keyed acceptance: latency MAPE on the multi-turn trace < 10 %", "key": "mape_prefix",
             "value": prefix["mape"][0], "ci_low": prefix["mape"][1], "ci_high": prefix["mape"][2],
             "verdict": verdict(prefix["mape"], 0.10, above=False)}]
    if "ewma" in stats:
        for column, label in (("mape", "latency MAPE"), ("regret", "ex-post regret")):
            ci = request_mean_difference(requests, "prefix-keyed", "ewma", column, seed)
            if not np.isfinite(ci[0]):
                continue
            stats["prefix-keyed"][f"{column}_vs_ewma"] = ci
            # below the EWMA's: the CI of (prefix-keyed - EWMA) lies below 0; equal values are inconclusive
            rows.append({"goal": f"prefix-keyed acceptance: {label} below the global EWMA's "
                                 f"({stats['ewma'][column][0]:.1%}), difference", "key": f"{column}_vs_ewma",
                         "value": ci[0], "ci_low": ci[1], "ci_high": ci[2],
                         "verdict": verdict(ci, 0.0, above=False)})
    return rows, stats


def iteration_mape(iterations: pd.DataFrame, seed: int = 0) -> dict:
    """The batch cost model's held-out check: |predicted - measured| / measured per served iteration, by family."""
    known = iterations[iterations.predicted_s.notna() & (iterations.iteration_s > 0)].copy()
    known["error"] = (known.predicted_s - known.iteration_s).abs() / known.iteration_s
    out = {}
    for name, part in [("all", known), *known.groupby("family")]:
        groups = [g.error.to_numpy() for _, g in part.groupby("repeat")]
        out[name] = bootstrap(groups, lambda parts: float(np.concatenate(parts).mean()), seed)
        out[f"{name}_iterations"] = int(len(part))
    return out


def chosen_k(iterations: pd.DataFrame, policies=("smartspec", "rakv-asd")) -> pd.DataFrame:
    """Mean candidates per decoding request by the number of decoding requests, per policy (speculation family)."""
    rows = []
    part = iterations[(iterations.family == "speculation") & iterations.policy.isin(policies)]
    for row in part.itertuples(index=False):
        ks = json.loads(row.k)
        if ks:
            rows.append({"policy": row.policy, "rate": row.rate, "batch": len(ks), "mean_k": float(np.mean(ks)),
                         "speculating": float(np.mean([k > 0 for k in ks]))})
    frame = pd.DataFrame(rows)
    if not len(frame):
        return frame
    return frame.groupby(["policy", "batch"], as_index=False).agg(mean_k=("mean_k", "mean"),
                                                                 speculating=("speculating", "mean"),
                                                                 iterations=("mean_k", "size"))


def break_even_by_batch(cost, k_values=(1, 2, 4), batches=(1, 2, 4, 8, 16), context: int = 256,
                        match: float = 1.0) -> pd.DataFrame:
    """From the batch cost table: per batch size b and k, the least acceptance (the same for every request) at
    which speculating with k gives more expected tokens per second than k = 0 (None: not even alpha = 1)."""
    rows = []
    for b in batches:
        base = b / cost.decode_s([(1, context)] * b, [0] * b)
        for k in k_values:
            time_k = cost.decode_s([(1 + k, context)] * b, [k] * b)

            def gain(alpha):
                return b * (match * expected_tokens_per_round(alpha, k) + 1 - match) / time_k - base

            alpha = None
            if gain(1.0) > 0:
                low, high = 0.0, 1.0
                if gain(0.0) > 0:
                    high = 0.0
                while high - low > 1e-4:
                    mid = (low + high) / 2
                    low, high = (low, mid) if gain(mid) > 0 else (mid, high)
                alpha = high
            rows.append({"batch": b, "k": k, "break_even_alpha": alpha, "context": context})
    return pd.DataFrame(rows)


COMPARISONS = (  # (family, policy, against, metric): the paper's sentences, one per rate
    ("chunking", "cost-model-slo", "none", "p99_itl_ms"),
    ("chunking", "cost-model-slo", "none", "median_ttft_ms"),
    ("chunking", "fixed-128", "none", "p99_itl_ms"),
    ("speculation", "rakv-asd", "k0", "goodput"),
    ("speculation", "k4", "k0", "goodput"),
    ("speculation", "smartspec", "k0", "goodput"),
)


def comparisons(data: dict, seed: int = 0) -> list[dict]:
    """Relative paired differences (policy over `against`, minus 1) per rate, with CIs over repeats."""
    cells, rows = data["cells"], []
    for family, a, b, metric in COMPARISONS:
        for rate in sorted(cells[cells.family == family].rate.unique()):
            present = set(cells[(cells.family == family) & (cells.rate == rate)].policy)
            if {a, b} <= present:
                ci = paired_difference(data, family, rate, a, b, metric, seed)
                rows.append({"family": family, "rate": float(rate), "policy": a, "against": b, "metric": metric,
                             "value": ci[0], "ci_low": ci[1], "ci_high": ci[2]})
    return rows


def serving_summary(results: Path, seed: int = 0) -> dict:
    """Everything the serving study's analysis reports (summary.json's `serving`)."""
    from rakv.experiments.config import configuration
    from rakv.serving.batchcost import BatchCost

    results = Path(results)
    data = load(results)
    meta = json.loads((results / "serving" / "metadata.json").read_text())
    grid = meta["config"]["profile"]["serving"]
    table = cell_table(data, seed)
    cells = data["cells"]
    goals = speculation_goals(data, table, seed) + chunking_goals(data, table, grid["itl_slo_ms"], seed)
    acceptance_rows, acceptance = acceptance_goals(data["requests"], seed)
    goals += acceptance_rows
    equal, total = int(cells.outputs_equal_ar.sum()), int((cells.completed + cells.failed).sum())
    goals.append({"goal": "every served output identical to batch-one greedy AR", "key": "exact", "value": equal / total,
                  "ci_low": None, "ci_high": None, "verdict": "met" if equal == total else "missed"})
    cost = BatchCost.from_json(json.loads((results / "serving" / "batch_cost.json").read_text()))
    chosen = configuration(grid["configuration"])
    calibration = results / "calibration" / f"{chosen.pair}-{chosen.proposer}.json"
    alpha = json.loads(calibration.read_text())["acceptance"] if calibration.exists() else None
    return {"configuration": grid["configuration"], "calibrated_acceptance": alpha, "runs": int(len(cells)), "requests": int(len(data["requests"])),
            "repeats": int(cells.repeat.nunique()), "commit": meta.get("git_commit"),
            "itl_slo_ms": grid["itl_slo_ms"], "goodput_slos": list(grid["goodput"]),
            "exact": {"equal": equal, "total": total}, "cells": table.to_dict("records"),
            "iteration_mape": iteration_mape(data["iterations"], seed), "acceptance": acceptance,
            "chosen_k": chosen_k(data["iterations"]).to_dict("records"),
            "break_even_by_batch": break_even_by_batch(cost).to_dict("records"), "goals": goals,
            "comparisons": comparisons(data, seed)}
