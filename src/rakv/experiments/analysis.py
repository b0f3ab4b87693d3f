"""Statistics of the study, as pure functions over the results tables (definitions: paper/main.tex, "Setup",
"Statistics" and "Results").

Units and noise
    The study (rakv.experiments.study) measures every feasible action (r, k) of every (configuration, prompt,
    scenario) `sweep_repeats` times, and runs the controller (rakv-asd) `repeats` times per scenario.
    `measurements` expands the measurements to one row per (configuration, dataset, prompt, scenario,
    action, repeat); a fixed strategy is its action read from them (`kv-only` = r1k0, with r0k0 where
    the scenario offers no hit).

The noise-aware oracle
    The oracle of a scenario is its action with the lowest *mean* latency. Picking it and judging
    against it on the same runs favours the oracle (winner's curse), so regret is cross-fitted: for
    the controller's run of repeat r, the oracle is picked on the other repeats and both the chosen
    action and that oracle are judged on repeat r. Accuracy is reported strictly (the chosen action
    is the oracle) and *within noise* (Welch's t-test cannot tell the chosen action's repeats from
    the oracle's at the 5 % level: a tie, as paper/main.tex defines it).

Confidence intervals
    Repeats and scenarios of one prompt share the prompt's text and length, so they are not
    independent: every CI is a cluster bootstrap over prompts (95 %, percentile; `cluster_ci`). Each
    statistic is a ratio of sums over units (instances, scenarios, scenario-actions), so resampling
    whole prompts resamples their units' sums.

Claims
    `claims` sets each reproduced statistic beside the reference study's value, judged by its kind (Claim.kind):
    an *effect* gets two verdicts, *direction reproduced* (the CI lies on the reference's side of the statistic's
    null value) and *magnitude within band* (the CI lies inside a two-sided tolerance band around the reference;
    the bands are defined once, in TOLERANCE, with their rationale); an *equivalence* claim ("within 0.45 % of
    KV-only") and an *estimate* (a share, an error) only the band (a direction means nothing for them); an
    *extreme* over cells (a least or most) is one value with no interval, shown without a verdict; the reference's
    qualitative claim on the larger pair is a *finding* read from the feasibility stage. Each verdict is yes, no,
    inconclusive (the CI straddles the boundary), or n/a where the kind has none; `claim_counts` is the one count
    the paper and the README quote.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from rakv.experiments.verdicts import ci_side
from rakv.runtime.actions import ADAPTIVE, Action
from rakv.runtime.paths import shown

INSTANCE = ["configuration", "dataset", "prompt_id", "scenario", "repeat"]
SCENARIO = ["configuration", "dataset", "prompt_id", "scenario"]
PROMPT = ["dataset", "prompt_id"]  # the bootstrap's cluster
FIXED = ("ar", "kv-only", "spec-k4", "joint-k4")
BASELINES = ("kv-only", "best-fixed", "joint-k4", "spec-k4", "ar", "oracle")
NOISE_LEVEL = 0.05  # Welch's t-test: actions whose repeats differ at p >= this are ties

# Reference figures of the reproduced study (paper/main.tex, "Claims").
REFERENCE = {
    "latency_reduction_vs_joint_k4": 0.640,
    "throughput_gain_vs_joint_k4": 1.708,
    "latency_reduction_vs_kv_only": 0.0045,
    "throughput_gain_vs_kv_only": 0.0081,
    "exact_share": 1.0,
    "accuracy_k": 1.0,
    "accuracy_action": 0.833,
    "mape": 0.321,
    "spearman": 0.780,
    "mean_regret": 0.0032,
    "spec_slowdown_min": 0.14,
    "spec_slowdown_max": 2.35,
    "crossover_alpha_min": 0.894,
    "crossover_alpha_max": 0.973,
}

# Two-sided tolerance bands around a reference value, one rule per kind of statistic. Rationale: the
# reproduction differs from the reference in hardware, models and grid, so only the order of magnitude
# of an effect is expected to carry over -- a relative change may be half to one and a half times the
# reference's, and an effect near zero within 2 percentage points (the run-to-run spread of a mean
# latency here); a share, an accuracy or a correlation within 0.10 (one scenario in ten); a break-even
# acceptance within 0.05 (the step of the controlled-acceptance grid); a prediction error within half
# of the reference's.
TOLERANCE = {
    "effect": lambda ref: (ref - max(0.5 * abs(ref), 0.02), ref + max(0.5 * abs(ref), 0.02)),
    "share": lambda ref: (ref - 0.10, ref + 0.10),
    "alpha": lambda ref: (ref - 0.05, ref + 0.05),
    "error": lambda ref: (0.5 * ref, 1.5 * ref),
}

# ---------------------------------------------------------------------------------------------
# Measurements, strategies and the oracle


def measurements(runs: pd.DataFrame) -> pd.DataFrame:
    """The action sweep as one row per (configuration, dataset, prompt, scenario, action, repeat).

    An r = 0 action is measured once per prompt (scenario `cold`) and stands in every scenario of that
    prompt; a k = 0 action is measured under one configuration per pair and stands for all of them."""
    sweep = runs[runs.kind == "sweep"]
    scenarios = (runs[(runs.kind == "strategy") | runs.reuse].groupby(PROMPT).scenario.unique()
                 .apply(lambda s: sorted(set(s) | {"cold"})))
    parts = []
    for name, proposer, pair in runs[["configuration", "proposer", "pair"]].drop_duplicates().itertuples(index=False):
        own = sweep[(sweep.configuration == name) | ((sweep.pair == pair) & (sweep.k == 0))]
        own = own.drop_duplicates(PROMPT + ["scenario", "action", "repeat"])
        r1, r0 = own[own.reuse], own[~own.reuse]
        spread = []
        for key, group in r0.groupby(PROMPT):
            names = scenarios.get(key, ["cold"])
            spread.append(pd.concat([group.assign(scenario=s) for s in names]))
        part = pd.concat([r1, *spread]) if spread else r1
        parts.append(part.assign(configuration=name, proposer=proposer))
    return pd.concat(parts, ignore_index=True) if parts else sweep.iloc[0:0]


def action_stats(meas: pd.DataFrame) -> pd.DataFrame:
    """Per scenario and action: mean, standard deviation and count of the measured latency; the prediction."""
    return (meas.groupby(SCENARIO + ["action"])
            .agg(measured_s=("latency_s", "mean"), std_s=("latency_s", "std"), n=("latency_s", "size"),
                 predicted_s=("predicted_latency_s", "mean"), k=("k", "first"), reuse=("reuse", "first"),
                 peak_kv_bytes=("peak_kv_bytes", "mean"))
            .reset_index())


def oracle_table(meas: pd.DataFrame) -> pd.DataFrame:
    """Per scenario: the oracle (lowest mean latency), and the best mean with k = 0 and with k != 0."""
    table = action_stats(meas)
    best = table.loc[table.groupby(SCENARIO).measured_s.idxmin(), SCENARIO + ["action", "k", "measured_s"]]
    best = best.rename(columns={"action": "oracle_action", "k": "oracle_k", "measured_s": "oracle_s"})
    k0 = table[table.k == 0].groupby(SCENARIO).measured_s.min().rename("best_k0_s")
    spec = table[table.k != 0].groupby(SCENARIO).measured_s.min().rename("best_spec_s")
    return best.merge(k0.reset_index(), on=SCENARIO, how="left").merge(spec.reset_index(), on=SCENARIO, how="left")


def offers_hit(meas: pd.DataFrame) -> pd.Series:
    """Per scenario: whether the store offers a hit there (some r = 1 action was measured)."""
    return meas.groupby(SCENARIO).reuse.any()


def fixed_action_latencies(meas: pd.DataFrame, action: Action) -> pd.DataFrame:
    """A fixed action's measured runs per instance, with r = 1 read as r = 0 where the scenario offers no hit."""
    hit = offers_hit(meas).rename("hit").reset_index()
    m = meas.merge(hit, on=SCENARIO)
    wanted = np.where(m.hit & action.reuse, Action(True, action.k).label, Action(False, action.k).label)
    return m[m.action == wanted][INSTANCE + ["latency_s", "tokens_per_s"]]


def best_fixed_action(meas: pd.DataFrame) -> str:
    """The one action with the lowest mean latency over every instance (in hindsight), as a label."""
    labels = sorted(meas.action.unique(), key=lambda a: Action.parse(a))
    means = {a: fixed_action_latencies(meas, Action.parse(a)).latency_s.mean() for a in labels}
    return min(means, key=means.get)


def strategy_latencies(runs: pd.DataFrame, meas: pd.DataFrame | None = None) -> pd.DataFrame:
    """Latency and throughput of every strategy per instance: rakv-asd's own runs, the fixed strategies
    and the best fixed action (per configuration) read from the measurements, and the cross-fitted oracle."""
    meas = measurements(runs) if meas is None else meas
    parts = [runs[(runs.kind == "strategy")][INSTANCE + ["strategy", "latency_s", "tokens_per_s"]]]
    for _, part in meas.groupby("configuration"):
        for strategy in FIXED:
            parts.append(fixed_action_latencies(part, Action.of_strategy(strategy)).assign(strategy=strategy))
        best = best_fixed_action(part)
        parts.append(fixed_action_latencies(part, Action.parse(best)).assign(strategy="best-fixed"))
    oracle = held_out_oracle(meas)
    parts.append(oracle.rename(columns={"oracle_s": "latency_s", "oracle_tokens_per_s": "tokens_per_s"})
                 [INSTANCE + ["latency_s", "tokens_per_s"]].assign(strategy="oracle"))
    return pd.concat(parts, ignore_index=True)


def held_out_oracle(meas: pd.DataFrame) -> pd.DataFrame:
    """Per instance (scenario, repeat r): the action with the lowest mean over the *other* repeats and its
    measurement in repeat r (with one repeat: the in-sample oracle)."""
    rows = []
    for key, group in meas.groupby(SCENARIO):
        matrix = group.pivot_table(index="action", columns="repeat", values="latency_s")
        throughput = group.pivot_table(index="action", columns="repeat", values="tokens_per_s")
        for repeat in matrix.columns:
            others = matrix.drop(columns=repeat) if matrix.shape[1] > 1 else matrix
            pick = others.mean(axis=1).idxmin()
            rows.append({**dict(zip(SCENARIO, key)), "repeat": repeat, "oracle_action": pick,
                         "oracle_s": matrix.at[pick, repeat], "oracle_tokens_per_s": throughput.at[pick, repeat]})
    return pd.DataFrame(rows, columns=INSTANCE + ["oracle_action", "oracle_s", "oracle_tokens_per_s"])


def adaptive_mask(runs: pd.DataFrame, configuration: str | None = None) -> pd.Series:
    """Which rows are the controller's own (rakv-asd) runs, optionally of one configuration."""
    mask = (runs.kind == "strategy") & (runs.strategy == ADAPTIVE)
    return mask if configuration is None else mask & (runs.configuration == configuration)


def controller_choices(runs: pd.DataFrame, meas: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each rakv-asd run with its scenario's oracle, its cross-fitted regret, and whether it is a tie."""
    meas = measurements(runs) if meas is None else meas
    chosen = runs[adaptive_mask(runs)][INSTANCE + ["action", "k"]]
    oracle = oracle_table(meas)[SCENARIO + ["oracle_action", "oracle_k"]]
    samples = {key: group.groupby("action").latency_s.apply(np.asarray) for key, group in meas.groupby(SCENARIO)}
    matrices = {key: group.pivot_table(index="action", columns="repeat", values="latency_s")
                for key, group in meas.groupby(SCENARIO)}
    out = chosen.merge(oracle, on=SCENARIO, how="left")
    regrets, ties, random_regrets = [], [], []
    for row in out.itertuples(index=False):
        key = tuple(getattr(row, c) for c in SCENARIO)
        matrix, sample = matrices[key], samples[key]
        fold = sorted(matrix.columns)[row.repeat % matrix.shape[1]]
        others = matrix.drop(columns=fold) if matrix.shape[1] > 1 else matrix
        pick = others.mean(axis=1).idxmin()
        measured = matrix[fold]
        regrets.append(measured.get(row.action, np.nan) / measured[pick] - 1.0)
        random_regrets.append(float((measured / measured[pick] - 1.0).mean()))
        ties.append(row.action == row.oracle_action or is_tie(sample.get(row.action), sample[row.oracle_action]))
    out["regret"], out["within_noise"], out["random_regret"] = regrets, ties, random_regrets
    out["correct"] = out.action == out.oracle_action
    out["correct_k"] = out.k == out.oracle_k
    out["actions"] = [len(matrices[tuple(getattr(r, c) for c in SCENARIO)]) for r in out.itertuples(index=False)]
    return out


def is_tie(a, b) -> bool:
    """Whether two actions' repeated latencies are indistinguishable (Welch's t-test, p >= NOISE_LEVEL)."""
    if a is None or len(a) < 2 or len(b) < 2:
        return False
    if np.std(a) == 0 and np.std(b) == 0:
        return bool(np.mean(a) == np.mean(b))
    with warnings.catch_warnings():  # one constant sample: scipy warns of precision loss, the test is still sound
        warnings.simplefilter("ignore", RuntimeWarning)
        return bool(stats.ttest_ind(a, b, equal_var=False).pvalue >= NOISE_LEVEL)


# ---------------------------------------------------------------------------------------------
# Cluster bootstrap


def strategy_means(runs: pd.DataFrame, seed: int = 0, resamples: int = 2000) -> pd.DataFrame:
    """Per (configuration, strategy): instances, mean latency and mean throughput with 95 % cluster-bootstrap CIs
    over prompts (Table 1 and Figure 1; the oracle is the cross-fitted one, as the regret's)."""
    lat = strategy_latencies(runs)
    rows = []
    for (name, strategy), part in lat.groupby(["configuration", "strategy"]):
        clusters = part.dataset.astype(str) + "/" + part.prompt_id.astype(str)
        row = {"configuration": name, "strategy": strategy, "instances": int(len(part))}
        for metric in ("latency_s", "tokens_per_s"):
            row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = cluster_ci(
                clusters, part[metric], seed=seed, resamples=resamples)
        rows.append(row)
    return pd.DataFrame(rows)


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


# ---------------------------------------------------------------------------------------------
# Statistics


def paired(lat: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Latency and throughput of strategies a and b on the same instances (columns a_s, b_s, a_tps, b_tps)."""
    wide = lat[lat.strategy.isin([a, b])].pivot_table(index=INSTANCE, columns="strategy",
                                                     values=["latency_s", "tokens_per_s"])
    wide = wide.dropna()
    out = pd.DataFrame({"a_s": wide[("latency_s", a)], "b_s": wide[("latency_s", b)],
                        "a_tps": wide[("tokens_per_s", a)], "b_tps": wide[("tokens_per_s", b)]})
    return out.reset_index()


def latency_reduction(lat: pd.DataFrame, a: str = ADAPTIVE, b: str = "joint-k4", seed=0, resamples=2000):
    """1 - mean latency(a) / mean latency(b) over paired instances, with its cluster-bootstrap CI."""
    p = paired(lat, a, b)
    return cluster_ci(prompt_keys(p), p.a_s, p.b_s, transform=lambda r: 1.0 - r, seed=seed, resamples=resamples)


def throughput_gain(lat: pd.DataFrame, a: str = ADAPTIVE, b: str = "joint-k4", seed=0, resamples=2000):
    """mean throughput(a) / mean throughput(b) - 1 over paired instances, with its cluster-bootstrap CI."""
    p = paired(lat, a, b)
    return cluster_ci(prompt_keys(p), p.a_tps, p.b_tps, transform=lambda r: r - 1.0, seed=seed, resamples=resamples)


def per_scenario(choices: pd.DataFrame, column: str) -> pd.DataFrame:
    """A choice statistic averaged over a scenario's controller runs (the unit of accuracy and regret)."""
    return choices.groupby(SCENARIO)[column].mean().reset_index()


def scenario_mean(choices: pd.DataFrame, column: str, seed=0, resamples=2000) -> list[float]:
    """Mean over scenarios of a per-scenario statistic, with its cluster-bootstrap CI."""
    s = per_scenario(choices, column)
    return cluster_ci(prompt_keys(s), s[column].astype(float), seed=seed, resamples=resamples)


def mape_errors(meas: pd.DataFrame) -> pd.DataFrame:
    """Per (scenario, action): |predicted - mean measured| / mean measured; and the error of a predictor
    with no information about the action (the scenario's mean measured latency for every action)."""
    table = action_stats(meas)
    table["error"] = (table.predicted_s - table.measured_s).abs() / table.measured_s
    scenario_mean_s = table.groupby(SCENARIO).measured_s.transform("mean")
    table["null_error"] = (scenario_mean_s - table.measured_s).abs() / table.measured_s
    return table


def prompt_acceptance(meas: pd.DataFrame) -> pd.DataFrame:
    """Per (configuration, dataset, prompt), over all its speculative measurements: the per-token acceptance
    `alpha`, and the share of rounds with candidates `match_rate` (1 where empty rounds were not recorded)."""
    spec = meas[meas.k > 0].drop_duplicates(["configuration", "run_id"])
    spec = spec.assign(no_match=spec["empty_rounds"].fillna(0) if "empty_rounds" in spec else 0)
    totals = spec.groupby(["configuration"] + PROMPT)[["accepted", "rejections", "rounds", "no_match"]].sum()
    return pd.DataFrame({"alpha": totals["accepted"] / (totals["accepted"] + totals["rejections"]),
                         "match_rate": totals["rounds"] / (totals["rounds"] + totals["no_match"])})


def acceptance_mape(meas: pd.DataFrame, tables: dict, seed=0, resamples=2000) -> dict:
    """How much of the cost model's error is the acceptance it cannot know before a request: per configuration,
    the MAPE (as `mape_errors`) of C(r, k) re-evaluated with the calibrated acceptance for every prompt, and with
    each prompt's own acceptance and match rate measured in the study (an oracle no controller has)."""
    from rakv.runtime.costmodel import RequestFeatures, estimate_latency

    out = {}
    if not any(t is not None for t in tables.values()):
        return out  # nothing calibrated to re-evaluate
    own = prompt_acceptance(meas)
    features = ["prompt_tokens", "available_hit_tokens", "new_tokens", "exact_hit", "available_draft_tokens"]
    # a study (or its resumed part) from before the draft's state was stored: none offered
    meas = meas.assign(available_draft_tokens=meas.get("available_draft_tokens",
                                                       pd.Series(0, index=meas.index)).fillna(0))
    for name, part in meas.groupby("configuration"):
        table = tables.get(name)
        if table is None:
            continue
        rows = action_stats(part).merge(part.drop_duplicates(SCENARIO + ["action"])[SCENARIO + ["action"] + features],
                                        on=SCENARIO + ["action"])
        predicted = {"calibrated": [], "prompt": []}
        for r in rows.itertuples(index=False):
            request = RequestFeatures(int(r.prompt_tokens), int(r.available_hit_tokens) if r.reuse else 0,
                                      int(r.new_tokens), bool(r.exact_hit), int(r.available_draft_tokens))
            key = (name, r.dataset, r.prompt_id)
            alpha, match = own.loc[key] if key in own.index else (table.acceptance, 1.0)
            for variant, (a, m) in (("calibrated", (table.acceptance, 1.0)), ("prompt", (alpha, match))):
                predicted[variant].append(estimate_latency(table, request, bool(r.reuse), int(r.k), float(a), 0.0,
                                                           float(m)))
        out[name] = {variant: cluster_ci(prompt_keys(rows),
                                         (np.array(values) - rows.measured_s).abs() / rows.measured_s,
                                         seed=seed, resamples=resamples)
                     for variant, values in predicted.items()}
    return out


def spearman_table(meas: pd.DataFrame) -> pd.DataFrame:
    """Per scenario: Spearman's rho between predicted and mean measured latency over its actions."""
    table = action_stats(meas)
    rows = []
    for key, group in table.groupby(SCENARIO):
        rho = stats.spearmanr(group.predicted_s, group.measured_s).statistic if len(group) > 2 else np.nan
        rows.append({**dict(zip(SCENARIO, key)), "rho": rho, "actions": len(group)})
    return pd.DataFrame(rows)


def spec_slowdown(meas: pd.DataFrame) -> dict:
    """How much slower the best k != 0 action is than the best k = 0 one per scenario: min, max, share > 0."""
    o = oracle_table(meas)
    slow = (o.best_spec_s / o.best_k0_s - 1.0).dropna()
    if slow.empty:
        return {"min": None, "max": None, "share_slower": None}
    return {"min": float(slow.min()), "max": float(slow.max()), "share_slower": float((slow > 0).mean())}


def acceptance_table(runs: pd.DataFrame, tables: dict, seed=0, resamples=2000) -> pd.DataFrame:
    """Measured per-token acceptance per configuration x dataset (every speculative run; CI over prompts),
    beside the cost model's break-even alpha for the same setting: a cold request of the dataset's mean
    prompt length, the study's new tokens, least over k (and at k = 4). `tables`: configuration -> CostTable."""
    from rakv.runtime.costmodel import RequestFeatures, break_even_alpha

    spec = runs[runs.k > 0]
    rows = []
    for (name, dataset), part in spec.groupby(["configuration", "dataset"]):
        value = cluster_ci(prompt_keys(part), part.accepted, part.accepted + part.rejections, seed=seed,
                           resamples=resamples)
        table = tables.get(name)
        features = RequestFeatures(int(round(part.prompt_tokens.mean())), 0, int(part.new_tokens.max()))
        by_k = {k: break_even_alpha(table, features, False, k) for k in sorted(table.verify)} if table else {}
        paying = {k: a for k, a in by_k.items() if a is not None}
        least = min(paying.values()) if paying else None
        rows.append({"configuration": name, "dataset": dataset, "acceptance": value[0], "acceptance_low": value[1],
                     "acceptance_high": value[2], "break_even_alpha": least,
                     "break_even_k": min(paying, key=paying.get) if paying else None,
                     "break_even_alpha_k4": by_k.get(4), "prompt_tokens": features.prompt_tokens,
                     "calibrated_acceptance": table.acceptance if table else None,
                     "speculation_pays": None if least is None and not table else bool(least is not None
                                                                                         and value[1] > least),
                     "runs": len(part)})
    return pd.DataFrame(rows)


def measured_acceptance(runs: pd.DataFrame) -> dict[str, float]:
    """Per pair/proposer (the calibration files' names): accepted / (accepted + rejecting rounds), pooled over
    its speculative runs."""
    spec = runs[runs.k > 0]
    out = {}
    for (pair, proposer), part in spec.groupby(["pair", "proposer"]):
        total = part.accepted.sum() + part.rejections.sum()
        if total:
            out[f"{pair}-{proposer}"] = float(part.accepted.sum() / total)
    return out


def peak_memory_table(meas: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Peak K/V held during a request (the proposer's cache and rejected positions included), per configuration
    and k over the action measurements, and for the controller's own runs (`k` = rakv-asd)."""
    rows = meas.drop_duplicates(["configuration", "run_id"]).assign(k=lambda f: f.k.map(str))
    adaptive = runs[adaptive_mask(runs)].assign(k=ADAPTIVE)
    return (pd.concat([rows, adaptive]).groupby(["configuration", "k"], sort=False)
            .agg(peak_kv_mib=("peak_kv_bytes", lambda b: b.mean() / 2**20),
                 peak_kv_mib_max=("peak_kv_bytes", lambda b: b.max() / 2**20), runs=("peak_kv_bytes", "size"))
            .reset_index().sort_values(["configuration", "k"], key=lambda c: c.map(
                lambda v: (1, v) if v == ADAPTIVE else (0, int(v)) if str(v).isdigit() else (0, v))))


def configuration_statistics(runs: pd.DataFrame, meas: pd.DataFrame, lat: pd.DataFrame, seed: int,
                             resamples: int) -> dict:
    """Every statistic of one configuration's runs (the other arguments restricted to it)."""
    choices = controller_choices(runs, meas)
    errors, rhos = mape_errors(meas), spearman_table(meas)
    worst = per_scenario(choices, "regret")
    ci = dict(seed=seed, resamples=resamples)
    return {
        "latency_reduction": {b: latency_reduction(lat, ADAPTIVE, b, **ci) for b in BASELINES},
        "throughput_gain": {b: throughput_gain(lat, ADAPTIVE, b, **ci) for b in BASELINES},
        "best_fixed_action": best_fixed_action(meas),
        "accuracy_action": scenario_mean(choices, "correct", **ci),
        "accuracy_within_noise": scenario_mean(choices, "within_noise", **ci),
        "accuracy_k": scenario_mean(choices, "correct_k", **ci),
        "accuracy_chance": float((1.0 / choices.actions).mean()) if len(choices) else None,
        "mean_regret": scenario_mean(choices, "regret", **ci),
        "worst_regret": float(worst.regret.max()) if len(worst) else None,
        "random_regret": scenario_mean(choices, "random_regret", **ci),
        "mape": cluster_ci(prompt_keys(errors), errors.error, **ci),
        "mape_null": float(errors.null_error.mean()),
        "spearman": cluster_ci(prompt_keys(rhos), rhos.rho, **ci),
        "spearman_pooled": float(stats.spearmanr(errors.predicted_s, errors.measured_s).statistic),
        "spec_slowdown": spec_slowdown(meas),
        "scenarios": int(len(worst)), "controller_runs": int(len(choices)),
    }


def model_crossover(crossover: pd.DataFrame) -> dict:
    """Cost-model crossover alpha per setting = min over k of the break-even alpha; range over settings."""
    per = crossover.groupby(["configuration", "scenario", "prompt_tokens"]).break_even_alpha.min()
    finite = per.dropna()
    return {"min": float(finite.min()) if len(finite) else None, "max": float(finite.max()) if len(finite) else None,
            "median": float(finite.median()) if len(finite) else None, "settings": int(len(per)),
            "never": int(per.isna().sum())}


def first_crossing(alphas, speedups) -> float | None:
    """Smallest alpha at which a speedup curve exceeds 1, by linear interpolation between grid points."""
    for i, (alpha, speedup) in enumerate(zip(alphas, speedups)):
        if speedup > 1.0:
            if i == 0:
                return float(alpha)
            a0, s0 = alphas[i - 1], speedups[i - 1]
            return float(a0 + (1.0 - s0) * (alpha - a0) / (speedup - s0))
    return None


def measured_crossover(controlled: pd.DataFrame, column: str = "measured_speedup") -> dict:
    """Per configuration and k, the smallest alpha at which speculation beats AR in the controlled-acceptance
    runs (`column="predicted_speedup"`: where the cost model says it does, for the same prompts)."""
    out = {}
    for (configuration, k), group in controlled.groupby(["configuration", "k"]):
        curve = group.groupby("alpha")[column].mean().sort_index()
        out[f"{configuration}/k{k}"] = first_crossing(curve.index.to_numpy(), curve.to_numpy())
    return out


# ---------------------------------------------------------------------------------------------
# Claims


KINDS = ("effect", "equivalence", "estimate", "extreme", "finding")


@dataclass(frozen=True)
class Claim:
    label: str
    reference: float | None
    band: str | None  # a key of TOLERANCE (None: no band)
    null: float | None  # the value meaning "no effect"; direction = the reference's side of it
    unit: str = "%"
    kind: str = "effect"  # KINDS: which verdicts the claim gets


CLAIMS = {
    "latency_reduction_vs_joint_k4": Claim("RAKV-ASD vs Joint-k4: latency reduction", 0.640, "effect", 0.0),
    "throughput_gain_vs_joint_k4": Claim("RAKV-ASD vs Joint-k4: throughput gain", 1.708, "effect", 0.0),
    # the reference: "within 0.45 % of KV-only": an equivalence, judged by the band alone
    "latency_reduction_vs_kv_only": Claim("RAKV-ASD vs KV-only: latency reduction (equivalence)", 0.0045, "effect",
                                          None, kind="equivalence"),
    "throughput_gain_vs_kv_only": Claim("RAKV-ASD vs KV-only: throughput gain (equivalence)", 0.0081, "effect", None,
                                        kind="equivalence"),
    "accuracy_k": Claim("controller: oracle's k chosen (in-sample oracle)", 1.0, "share", None, kind="estimate"),
    "accuracy_action": Claim("controller: oracle's action chosen (strict, in-sample oracle)", 0.833, "share", None,
                             kind="estimate"),
    "mape": Claim("latency prediction MAPE", 0.321, "error", None, kind="estimate"),
    "spearman": Claim("Spearman rho, predicted vs measured (mean per scenario)", 0.780, "share", 0.0, ""),
    "mean_regret": Claim("mean regret vs the cross-fitted oracle", 0.0032, "effect", None, kind="estimate"),
    "spec_slowdown_min": Claim("best k > 0 vs best k = 0: slowdown, least over scenarios", 0.14, None, None,
                               kind="extreme"),
    "spec_slowdown_max": Claim("best k > 0 vs best k = 0: slowdown, most over scenarios", 2.35, None, None,
                               kind="extreme"),
    "crossover_alpha_min": Claim("break-even acceptance (cost model), least", 0.894, None, None, "", kind="extreme"),
    "crossover_alpha_max": Claim("break-even acceptance (cost model), most", 0.973, None, None, "", kind="extreme"),
    "larger_pair": Claim("GPT-2 Large/Medium: the gap narrows, speculation does not cross k = 0", None, None, None,
                         "", kind="finding"),
}


def verdict_direction(claim: Claim, ci: list) -> str:
    """yes: the CI lies on the reference's side of the null; no: on the other side; else inconclusive (n/a: the
    claim's kind has no direction)."""
    if claim.null is None or claim.kind != "effect":
        return "n/a"
    side = ci_side(ci, claim.null)
    if side == "missing":
        return "inconclusive"
    expected = "above" if claim.reference > claim.null else "below" if claim.reference < claim.null else None
    if expected is None or side == "straddles":
        return "inconclusive"
    return "yes" if side == expected else "no"


def verdict_band(claim: Claim, ci: list) -> str:
    """yes: the CI lies inside the tolerance band; no: it lies wholly outside; else inconclusive. A value without
    an interval is not judged (n/a)."""
    value, low, high = ci
    if claim.band is None or not (np.isfinite(low) and np.isfinite(high)):
        return "n/a"
    lo, hi = TOLERANCE[claim.band](claim.reference)
    if lo <= low and high <= hi:
        return "yes"
    if high < lo or low > hi:
        return "no"
    return "inconclusive"


def claim_row(key: str, configuration: str, ci, text: str | None = None) -> dict:
    """One claim's row: a CI [value, low, high] (an extreme: one value, no interval), or for a finding its `text`
    and verdict (`ci` then the verdict string)."""
    claim = CLAIMS[key]
    if claim.kind == "finding":
        return {"claim": claim.label, "key": key, "configuration": configuration, "unit": claim.unit,
                "kind": claim.kind, "reference": None, "reproduced": None, "ci_low": None, "ci_high": None,
                "band_low": None, "band_high": None, "null": None, "text": text, "direction": ci, "magnitude": "n/a"}
    if claim.kind == "extreme" or not isinstance(ci, (list, tuple)):
        ci = [ci, None, None]  # one value: no interval is invented for it
    ci = [float("nan") if v is None else float(v) for v in ci]
    if not np.isfinite(ci[0]):
        direction = band = "missing" if text is None else "n/a"
    else:
        direction, band = verdict_direction(claim, ci), verdict_band(claim, ci)
    lo, hi = TOLERANCE[claim.band](claim.reference) if claim.band else (None, None)
    return {"claim": claim.label, "key": key, "configuration": configuration, "unit": claim.unit, "kind": claim.kind,
            "reference": claim.reference, "reproduced": ci[0], "ci_low": ci[1], "ci_high": ci[2],
            "band_low": lo, "band_high": hi, "null": claim.null, "text": text, "direction": direction,
            "magnitude": band}


def larger_pair_row(summary: dict) -> dict:
    """The reference's claim on GPT-2 Large/Medium, from the feasibility stage: reproduced where the pair ran
    (yes if speculation did not cross k = 0), not tested where only its cost side could be measured."""
    feas = summary.get("feasibility") or {}
    name = feas.get("configuration") or "gpt2large-gpt2medium"
    if feas.get("status") == "ran":
        return claim_row("larger_pair", name, "no" if feas.get("crossed") else "yes",
                         "crosses" if feas.get("crossed") else "does not cross")
    return claim_row("larger_pair", name, "not tested", summary.get("feasibility_verdict") or "not run")


def claims(summary: dict) -> list[dict]:
    """Per configuration: each reference figure beside the reproduced one, its CI, band and verdicts by kind."""
    rows = []
    for name, s in summary["per_configuration"].items():
        values = {
            "latency_reduction_vs_joint_k4": s["latency_reduction"]["joint-k4"],
            "throughput_gain_vs_joint_k4": s["throughput_gain"]["joint-k4"],
            "latency_reduction_vs_kv_only": s["latency_reduction"]["kv-only"],
            "throughput_gain_vs_kv_only": s["throughput_gain"]["kv-only"],
            "accuracy_k": s["accuracy_k"], "accuracy_action": s["accuracy_action"], "mape": s["mape"],
            "spearman": s["spearman"], "mean_regret": s["mean_regret"],
        }
        rows.extend(claim_row(key, name, value) for key, value in values.items())
        for key in ("spec_slowdown_min", "spec_slowdown_max"):
            value = s["spec_slowdown"][key.rsplit("_", 1)[1]]
            # no scenario where both a k > 0 and a k = 0 action were measured: nothing to compare
            rows.append(claim_row(key, name, value, None if value is not None else "no scenario compared"))
        cross = summary.get("crossover_model_per_configuration", {}).get(name)
        if cross:
            for key in ("crossover_alpha_min", "crossover_alpha_max"):
                value = cross[key.rsplit("_", 1)[1]]
                rows.append(claim_row(key, name, value, None if value is not None else "never (not even alpha = 1)"))
    rows.append(larger_pair_row(summary))
    return rows


def claim_counts(rows: list[dict]) -> dict:
    """The one count of claims the paper and the README quote: rows, and per verdict the direction's (signed claims:
    effects) and the magnitude's (banded claims)."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return {"rows": 0, "signed": 0, "banded": 0, "unjudged": 0, "direction": {}, "magnitude": {}}
    signed = frame[frame.direction.isin(["yes", "no", "inconclusive"])]
    banded = frame[frame.magnitude.isin(["yes", "no", "inconclusive"])]
    unjudged = frame[~frame.index.isin(signed.index) & ~frame.index.isin(banded.index)]
    return {"rows": int(len(frame)), "signed": int(len(signed)), "banded": int(len(banded)),
            "unjudged": int(len(unjudged)),
            "direction": {v: int((signed.direction == v).sum()) for v in ("yes", "no", "inconclusive")},
            "magnitude": {v: int((banded.magnitude == v).sum()) for v in ("yes", "no", "inconclusive")}}


def cost_side_sentence(feas: dict) -> str:
    """What the twins say about the feasibility pair: the least break-even alpha over k, and the k that never pay."""
    rows = [r for r in feas["break_even"] if r["pair"] == feas["twin"]]
    paying = [r for r in rows if r["break_even_alpha"] is not None]
    never = [str(r["k"]) for r in rows if r["break_even_alpha"] is None]
    if paying:
        best = min(paying, key=lambda r: r["break_even_alpha"])
        text = f"pays only above alpha = {best['break_even_alpha']:.2f} (k = {best['k']})"
    else:
        text = "never pays, for any k, even at alpha = 1"
    if never and paying:
        text += f", never for k = {', '.join(never)}"
    return f"cost side only (architecture twins): {text}; acceptance needs the real weights"


def feasibility_verdict(feas: dict) -> str:
    """The feasibility study's answer to "does k != 0 ever beat k = 0 on the larger pair?"."""
    if feas.get("break_even"):
        return cost_side_sentence(feas)
    if feas.get("status") == "ran":
        return "crosses" if feas["crossed"] else "does not cross"
    return feas.get("status", "missing")


# ---------------------------------------------------------------------------------------------
# The summary


def break_even_table(results: Path) -> pd.DataFrame:
    """Break-even alpha per k for every calibration in results/<name>/calibration/ (a cold request of the
    feasibility cost side's prompt length and the study's new tokens), with the draft/target step-cost ratio."""
    from rakv.runtime.costmodel import break_even_rows

    meta = json.loads((results / "study" / "metadata.json").read_text())
    profile = meta["config"]["profile"]
    prompt_tokens, new_tokens = profile["feasibility"]["cost_side"]["prompt_tokens"], profile["study"]["new_tokens"]
    rows = []
    for name, table in calibration_tables(results).items():
        rows.extend(break_even_rows(name, table, prompt_tokens, new_tokens))
    return pd.DataFrame(rows)


def calibration_tables(results: Path) -> dict:
    """<pair>-<proposer> -> CostTable for every calibration kept in results/<name>/calibration/."""
    from rakv.runtime.costmodel import CostTable

    return {path.stem: CostTable.from_json(json.loads(path.read_text()))
            for path in sorted((Path(results) / "calibration").glob("*.json"))}


def tables_by_configuration(runs: pd.DataFrame, results: Path) -> dict:
    kept = calibration_tables(results)
    pairs = runs[["configuration", "pair", "proposer"]].drop_duplicates()
    return {r.configuration: kept.get(f"{r.pair}-{r.proposer}") for r in pairs.itertuples(index=False)}


def grid_of(runs: pd.DataFrame) -> dict:
    """What the study measured: prompts per dataset and length bin, repeats, new tokens."""
    sweep = runs[runs.kind == "sweep"]
    counts = sweep.groupby(["configuration", "dataset", "prompt_id", "scenario", "action"]).size()
    return {"prompts": {d: int(p.prompt_id.nunique()) for d, p in runs.groupby("dataset")},
            "length_bins": sorted(runs.length_bin.unique().tolist()),
            "scenarios": sorted(runs.scenario.unique().tolist()),
            "measurements_per_action_min": int(counts.min()) if len(counts) else 0,
            "controller_repeats": int(runs[runs.kind == "strategy"].repeat.nunique()),
            "new_tokens": int(runs.new_tokens.max()), "actions": sorted(sweep.action.unique().tolist())}


def summarize(results: Path, seed: int = 0, resamples: int = 2000) -> dict:
    """Every statistic of the study, sensitivity and feasibility results under `results`."""
    results = Path(results)
    runs = pd.read_parquet(results / "study" / "runs.parquet")
    meas = measurements(runs)
    lat = strategy_latencies(runs, meas)
    # the folder as typed from the repository root, so that a summary does not depend on where the checkout is
    summary: dict = {"results": shown(results), "runs": len(runs),
                     "strategy_runs": int((runs.kind == "strategy").sum()),
                     "sweep_runs": int((runs.kind == "sweep").sum()),
                     "configurations": sorted(runs.configuration.unique().tolist()), "grid": grid_of(runs)}
    summary["exact"] = {"equal": int(runs.equal_to_ar.sum()), "total": len(runs),
                        "share": float(runs.equal_to_ar.mean()) if len(runs) else None}
    ci = dict(seed=seed, resamples=resamples)
    summary["per_configuration"] = {
        name: configuration_statistics(runs[runs.configuration == name], meas[meas.configuration == name],
                                       lat[lat.configuration == name], seed, resamples)
        for name in summary["configurations"]}
    summary["pooled"] = {"latency_reduction": {b: latency_reduction(lat, ADAPTIVE, b, **ci) for b in BASELINES},
                         "throughput_gain": {b: throughput_gain(lat, ADAPTIVE, b, **ci) for b in BASELINES}}
    tables = tables_by_configuration(runs, results)
    summary["acceptance"] = acceptance_table(runs, tables, **ci).to_dict("records")
    summary["peak_kv"] = peak_memory_table(meas, runs).to_dict("records")
    summary["acceptance_mape"] = acceptance_mape(meas, tables, **ci)
    sens = results / "sensitivity"
    if (sens / "crossover.parquet").exists():
        crossover = pd.read_parquet(sens / "crossover.parquet")
        summary["crossover_model"] = model_crossover(crossover)
        summary["crossover_model_per_configuration"] = {name: model_crossover(part)
                                                        for name, part in crossover.groupby("configuration")}
    else:
        summary["crossover_model"] = {"min": None, "max": None}
    controlled = pd.read_parquet(sens / "controlled.parquet") if (sens / "controlled.parquet").exists() else None
    summary["crossover_measured"] = measured_crossover(controlled) if controlled is not None else {}
    summary["crossover_predicted_controlled"] = (measured_crossover(controlled, "predicted_speedup")
                                                 if controlled is not None else {})
    joint = sens / "reuse_output_length.parquet"
    summary["joint_reuse"] = joint_reuse_by_length(pd.read_parquet(joint), **ci) if joint.exists() else []
    feas = results / "feasibility" / "summary.json"
    summary["feasibility"] = json.loads(feas.read_text()) if feas.exists() else {"status": "missing"}
    summary["feasibility_verdict"] = feasibility_verdict(summary["feasibility"])
    summary["claims"] = claims(summary)
    from rakv.experiments import serving_stats

    if serving_stats.available(results):  # the serving study (stage `serving`): its own statistics and goals
        summary["serving"] = serving_stats.serving_summary(results, seed)
    return summary


NO_DRAFT_REUSE = "joint-k4-draft-reprefilled"  # rakv.experiments.sensitivity: joint-k4 with draft reuse off
JOINT_VERDICTS = {"above": "pays", "below": "costs", "straddles": "inconclusive", "missing": "no interval"}


def joint_reuse_by_length(rows: pd.DataFrame, seed: int = 0, resamples: int = 2000) -> list[dict]:
    """Whether speculating pays once the prefix is reused (the sensitivity stage's reuse_output_length part): per
    configuration, scenario and output length, 1 - mean latency(r = 1, k = 4) / mean latency(r = 1, k = 0) over the
    same prompts and repeats, with a cluster-bootstrap CI over prompts; `verdict` pays (the CI above 0), costs (below),
    inconclusive (it includes 0) or no interval (fewer than two prompts). `draft_hit_share`: the share of the reused
    positions whose draft state came from the store."""
    out = []
    for (name, scenario, n), part in rows.groupby(["configuration", "scenario", "new_tokens"], sort=True):
        wide = part.pivot_table(index=["dataset", "prompt_id", "repeat"], columns="strategy", values="latency_s")
        wide = wide.dropna(subset=[c for c in ("joint-k4", "kv-only") if c in wide.columns]).reset_index()
        if wide.empty or not {"joint-k4", "kv-only"} <= set(wide.columns):
            continue
        ci = cluster_ci(prompt_keys(wide), wide["joint-k4"], wide["kv-only"], transform=lambda r: 1.0 - r,
                        seed=seed, resamples=resamples)
        joint = part[part.strategy == "joint-k4"]
        ablated = NO_DRAFT_REUSE in wide.columns and wide[NO_DRAFT_REUSE].notna().any()
        draft_gain = (cluster_ci(prompt_keys(wide), wide["joint-k4"], wide[NO_DRAFT_REUSE],
                                 transform=lambda r: 1.0 - r, seed=seed, resamples=resamples)
                      if ablated else [float("nan")] * 3)
        out.append({"configuration": name, "scenario": scenario, "new_tokens": int(n), "pairs": len(wide),
                    "prompts": int(wide.prompt_id.nunique()), "latency_reduction": ci,
                    "joint_s": float(wide["joint-k4"].mean()), "reuse_s": float(wide["kv-only"].mean()),
                    "reprefilled_s": float(wide[NO_DRAFT_REUSE].mean()) if ablated else None,
                    "draft_reuse_reduction": draft_gain,
                    "draft_prefill_s": float(joint.draft_prefill_s.mean()),
                    "draft_hit_share": float(joint.draft_hit_tokens.sum() / max(joint.hit_tokens.sum(), 1)),
                    "reuse_draft": bool(joint.reuse_draft.all()),
                    "verdict": JOINT_VERDICTS[ci_side(ci, 0.0, point_if_no_interval=False)]})
    return out


def json_ready(value):
    """`value` with numpy scalars as Python numbers and NaN / infinity as None, as summary.json holds it."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def write_summary(summary: dict, results: Path) -> Path:
    """results/<name>/summary.json, written atomically (NaN written as null)."""
    from rakv.experiments.records import write_atomic

    path = Path(results) / "summary.json"
    write_atomic(path, json.dumps(json_ready(summary), indent=1))
    return path
