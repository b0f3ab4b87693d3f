"""The study's statistics, as pure functions over the measurements (definitions: paper/main.tex, "Statistics" and
"Results"): RAKV-ASD against each baseline, the controller's accuracy and regret against the cross-fitted oracle
(rakv.experiments.oracle), the cost model's error, acceptance, peak memory, the crossovers of the sensitivity
stage and speculation on top of reuse; every CI is over prompts as clusters (rakv.experiments.intervals: the
delta method on the log scale for ratios, Wilson's at the effective count for proportions, Cox's for error rates).
They return the summary's records (rakv.experiments.summary) where the summary holds their result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from rakv.experiments.intervals import cluster_interval, prompt_keys
from rakv.experiments.oracle import (
    INSTANCE,
    PROMPT,
    SCENARIO,
    ScenarioTables,
    action_stats,
    adaptive_mask,
    best_fixed_action,
    controller_choices,
    oracle_table,
    strategy_latencies,
)
from rakv.experiments.summary import (
    AcceptanceMape,
    ByBaseline,
    ConfigurationStatistics,
    Crossover,
    JointReuse,
    SpecSlowdown,
)
from rakv.experiments.verdicts import payoff
from rakv.runtime.actions import ADAPTIVE, JOINT_K4, KV_ONLY
from rakv.runtime.json_records import ABSENT

BASELINES = ByBaseline.names()  # kv-only, best-fixed, joint-k4, spec-k4, ar, oracle: the summary declares them


def strategy_means(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (configuration, strategy): instances, mean latency and mean throughput with 95 % CIs over prompts
    (Table 1 and Figure 1; the oracle is the cross-fitted one, as the regret's)."""
    lat = strategy_latencies(runs)
    rows = []
    for (name, strategy), part in lat.groupby(["configuration", "strategy"]):
        clusters = part.dataset.astype(str) + "/" + part.prompt_id.astype(str)
        row = {"configuration": name, "strategy": strategy, "instances": int(len(part))}
        for metric in ("latency_s", "tokens_per_s"):
            row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = cluster_interval(clusters, part[metric])
        rows.append(row)
    return pd.DataFrame(rows)


def paired(lat: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Latency and throughput of strategies a and b on the same instances (columns a_s, b_s, a_tps, b_tps)."""
    wide = lat[lat.strategy.isin([a, b])].pivot_table(index=INSTANCE, columns="strategy",
                                                     values=["latency_s", "tokens_per_s"])
    wide = wide.dropna()
    out = pd.DataFrame({"a_s": wide[("latency_s", a)], "b_s": wide[("latency_s", b)],
                        "a_tps": wide[("tokens_per_s", a)], "b_tps": wide[("tokens_per_s", b)]})
    return out.reset_index()


def latency_reduction(lat: pd.DataFrame, a: str = ADAPTIVE, b: str = JOINT_K4):
    """1 - mean latency(a) / mean latency(b) over paired instances, with its CI over prompts (< 100 %)."""
    p = paired(lat, a, b)
    return cluster_interval(prompt_keys(p), p.a_s, p.b_s, transform=lambda r: 1.0 - r)


def throughput_gain(lat: pd.DataFrame, a: str = ADAPTIVE, b: str = JOINT_K4):
    """mean throughput(a) / mean throughput(b) - 1 over paired instances, with its CI over prompts (< 100 %)."""
    p = paired(lat, a, b)
    return cluster_interval(prompt_keys(p), p.a_tps, p.b_tps, transform=lambda r: r - 1.0)


def per_scenario(choices: pd.DataFrame, column: str) -> pd.DataFrame:
    """A choice statistic averaged over a scenario's controller runs (the unit of accuracy and regret)."""
    return choices.groupby(SCENARIO)[column].mean().reset_index()


def scenario_mean(choices: pd.DataFrame, column: str, scale: str = "proportion") -> list[float]:
    """Mean over scenarios of a per-scenario statistic, with its CI over prompts (`scale`: "proportion" for a share
    of runs, "linear" for regret, which the cross-fitted oracle lets fall below 0)."""
    s = per_scenario(choices, column)
    return cluster_interval(prompt_keys(s), s[column].astype(float), scale=scale)


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


def acceptance_mape(meas: pd.DataFrame, tables: dict) -> dict[str, AcceptanceMape]:
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
        out[name] = AcceptanceMape(**{
            variant: cluster_interval(prompt_keys(rows), (np.array(values) - rows.measured_s).abs() / rows.measured_s,
                                      scale="lognormal")
            for variant, values in predicted.items()})
    return out


def spearman_table(meas: pd.DataFrame) -> pd.DataFrame:
    """Per scenario: Spearman's rho between predicted and mean measured latency over its actions."""
    table = action_stats(meas)
    rows = []
    for key, group in table.groupby(SCENARIO):
        rho = stats.spearmanr(group.predicted_s, group.measured_s).statistic if len(group) > 2 else np.nan
        rows.append({**dict(zip(SCENARIO, key)), "rho": rho, "actions": len(group)})
    return pd.DataFrame(rows)


def spec_slowdown(meas: pd.DataFrame) -> SpecSlowdown:
    """How much slower the best k != 0 action is than the best k = 0 one per scenario: min, max, share > 0."""
    o = oracle_table(meas).dropna(subset=["best_spec_s", "best_k0_s"])
    slow = o.best_spec_s / o.best_k0_s - 1.0
    if slow.empty:
        return SpecSlowdown(None, None, None, [None] * 3)
    pooled = cluster_interval(prompt_keys(o), o.best_spec_s, o.best_k0_s, transform=lambda r: r - 1.0)
    return SpecSlowdown(min=float(slow.min()), max=float(slow.max()), share_slower=float((slow > 0).mean()),
                        pooled=pooled)


def acceptance_table(runs: pd.DataFrame, tables: dict) -> pd.DataFrame:
    """Measured per-token acceptance per configuration of one proposer x dataset (every speculative run; CI over
    prompts), beside the cost model's break-even alpha for the same setting: a cold request of the dataset's mean
    prompt length, the study's new tokens, least over k (and at k = 4). `tables`: configuration -> CostTable."""
    from rakv.runtime.costmodel import RequestFeatures, break_even_alpha

    # a configuration of several proposers (its actions name theirs: `heads:r1k4`) is left out: its speculative runs
    # mix proposers, priced against one proposer's break-even; each proposer's acceptance on the same target is its
    # single-proposer configuration's row
    several = runs.action.fillna("").str.contains(":", regex=False).groupby(runs.configuration).transform("any")
    spec = runs[(runs.k > 0) & ~several]
    rows = []
    for (name, dataset), part in spec.groupby(["configuration", "dataset"]):
        value = cluster_interval(prompt_keys(part), part.accepted, part.accepted + part.rejections, scale="proportion")
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


@dataclass(frozen=True)
class MeasuredStatistics:
    """What a configuration's statistics read from its measurements alone: the same for every controller replayed
    over them (rakv.experiments.ablation computes it once per configuration)."""
    tables: ScenarioTables
    errors: pd.DataFrame  # mape_errors
    rhos: pd.DataFrame  # spearman_table
    best_fixed_action: str
    spec_slowdown: SpecSlowdown

    @classmethod
    def of(cls, meas: pd.DataFrame) -> MeasuredStatistics:
        return cls(tables=ScenarioTables.of(meas), errors=mape_errors(meas), rhos=spearman_table(meas),
                   best_fixed_action=best_fixed_action(meas), spec_slowdown=spec_slowdown(meas))


def configuration_statistics(runs: pd.DataFrame, meas: pd.DataFrame, lat: pd.DataFrame,
                             measured: MeasuredStatistics | None = None) -> ConfigurationStatistics:
    """Every statistic of one configuration's runs (the other arguments restricted to it; `measured`: the
    measurements' part when the caller already has it)."""
    measured = MeasuredStatistics.of(meas) if measured is None else measured
    choices = controller_choices(runs, tables=measured.tables)
    errors, rhos = measured.errors, measured.rhos
    worst = per_scenario(choices, "regret")
    return ConfigurationStatistics(
        latency_reduction=ByBaseline.of(lambda b: latency_reduction(lat, ADAPTIVE, b)),
        throughput_gain=ByBaseline.of(lambda b: throughput_gain(lat, ADAPTIVE, b)),
        best_fixed_action=measured.best_fixed_action,
        accuracy_action=scenario_mean(choices, "correct"),
        accuracy_within_noise=scenario_mean(choices, "within_noise"),
        accuracy_k=scenario_mean(choices, "correct_k"),
        accuracy_tie_set=scenario_mean(choices, "correct_tie_set") if "correct_tie_set" in choices else ABSENT,
        accuracy_chance=float((1.0 / choices.actions).mean()) if len(choices) else None,
        mean_regret=scenario_mean(choices, "regret", "linear"),
        worst_regret=float(worst.regret.max()) if len(worst) else None,
        random_regret=scenario_mean(choices, "random_regret", "linear"),
        mape=cluster_interval(prompt_keys(errors), errors.error, scale="lognormal"),
        mape_null=float(errors.null_error.mean()),
        mape_minus_null=cluster_interval(prompt_keys(errors), errors.error - errors.null_error, scale="linear"),
        spearman=cluster_interval(prompt_keys(rhos), rhos.rho, scale="linear", bounds=(-1.0, 1.0)),
        spearman_pooled=float(stats.spearmanr(errors.predicted_s, errors.measured_s).statistic),
        spec_slowdown=measured.spec_slowdown,
        scenarios=int(len(worst)), controller_runs=int(len(choices)),
    )


def model_crossover(crossover: pd.DataFrame) -> Crossover:
    """Cost-model crossover alpha per setting = min over k of the break-even alpha; range over settings."""
    per = crossover.groupby(["configuration", "scenario", "prompt_tokens"]).break_even_alpha.min()
    finite = per.dropna()
    return Crossover(min=float(finite.min()) if len(finite) else None, max=float(finite.max()) if len(finite) else None,
                     median=float(finite.median()) if len(finite) else None, settings=int(len(per)),
                     never=int(per.isna().sum()))


def first_crossing(alphas, speedups) -> float | None:
    """Smallest alpha at which a speedup curve exceeds 1, by linear interpolation between grid points."""
    for i, (alpha, speedup) in enumerate(zip(alphas, speedups)):
        if speedup > 1.0:
            if i == 0:
                return float(alpha)
            a0, s0 = alphas[i - 1], speedups[i - 1]
            return float(a0 + (1.0 - s0) * (alpha - a0) / (speedup - s0))
    return None


def measured_crossover(controlled: pd.DataFrame, column: str = "measured_speedup") -> dict[str, float | None]:
    """Per configuration and k, the smallest alpha at which speculation beats AR in the controlled-acceptance
    runs (`column="predicted_speedup"`: where the cost model says it does, for the same prompts)."""
    out = {}
    for (configuration, k), group in controlled.groupby(["configuration", "k"]):
        curve = group.groupby("alpha")[column].mean().sort_index()
        out[f"{configuration}/k{k}"] = first_crossing(curve.index.to_numpy(), curve.to_numpy())
    return out


# the sensitivity stage's ablation (rakv.experiments.sensitivity): joint-k4 with the draft's state kept out of the store
NO_DRAFT_REUSE = f"{JOINT_K4}-draft-reprefilled"


def joint_reuse_by_length(rows: pd.DataFrame) -> list[JointReuse]:
    """Whether speculating pays once the prefix is reused (the sensitivity stage's reuse_output_length part): per
    configuration, scenario and output length, 1 - mean latency(r = 1, k = 4) / mean latency(r = 1, k = 0) over the
    same prompts and repeats, with its CI over prompts; `verdict` pays (the CI above 0), costs (below),
    inconclusive (it includes 0) or no interval (fewer than two prompts), rakv.experiments.verdicts.payoff.
    `draft_hit_share`: the share of the reused positions whose draft state came from the store."""
    out = []
    for (name, scenario, n), part in rows.groupby(["configuration", "scenario", "new_tokens"], sort=True):
        wide = part.pivot_table(index=["dataset", "prompt_id", "repeat"], columns="strategy", values="latency_s")
        wide = wide.dropna(subset=[c for c in (JOINT_K4, KV_ONLY) if c in wide.columns]).reset_index()
        if wide.empty or not {JOINT_K4, KV_ONLY} <= set(wide.columns):
            continue
        ci = cluster_interval(prompt_keys(wide), wide[JOINT_K4], wide[KV_ONLY], transform=lambda r: 1.0 - r)
        joint = part[part.strategy == JOINT_K4]
        ablated = NO_DRAFT_REUSE in wide.columns and wide[NO_DRAFT_REUSE].notna().any()
        draft_gain = (cluster_interval(prompt_keys(wide), wide[JOINT_K4], wide[NO_DRAFT_REUSE],
                                       transform=lambda r: 1.0 - r)
                      if ablated else [float("nan")] * 3)
        out.append(JointReuse(
            configuration=name, scenario=scenario, new_tokens=int(n), pairs=len(wide),
            prompts=int(wide.prompt_id.nunique()), latency_reduction=ci,
            joint_s=float(wide[JOINT_K4].mean()), reuse_s=float(wide[KV_ONLY].mean()),
            reprefilled_s=float(wide[NO_DRAFT_REUSE].mean()) if ablated else None,
            draft_reuse_reduction=draft_gain, draft_prefill_s=float(joint.draft_prefill_s.mean()),
            draft_hit_share=float(joint.draft_hit_tokens.sum() / max(joint.hit_tokens.sum(), 1)),
            reuse_draft=bool(joint.reuse_draft.all()),
            verdict=payoff(ci)))
    return out
