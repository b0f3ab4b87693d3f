"""The action sweep as measurements, the strategies read from them, and the noise-aware oracle (definitions:
paper/main.tex, "Setup" and "Statistics"); pure functions over study/runs.parquet.

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
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from rakv.runtime.actions import ADAPTIVE, AR, BEST_FIXED, JOINT_K4, KV_ONLY, ORACLE, SPEC_K4, Action

INSTANCE = ["configuration", "dataset", "prompt_id", "scenario", "repeat"]
SCENARIO = ["configuration", "dataset", "prompt_id", "scenario"]
PROMPT = ["dataset", "prompt_id"]  # the bootstrap's cluster
FIXED = (AR, KV_ONLY, SPEC_K4, JOINT_K4)
NOISE_LEVEL = 0.05  # Welch's t-test: actions whose repeats differ at p >= this are ties


def measurements(runs: pd.DataFrame) -> pd.DataFrame:
    """The action sweep as one row per (configuration, dataset, prompt, scenario, action, repeat).

    An r = 0 action is measured once per prompt (scenario `cold`) and stands in every scenario of that
    prompt; a k = 0 action is measured under one configuration per pair and target precision and stands for all of
    them (a run without a `precision` column ran at fp32)."""
    if "precision" not in runs:
        runs = runs.assign(precision="fp32")
    sweep = runs[runs.kind == "sweep"]
    scenarios = (runs[(runs.kind == "strategy") | runs.reuse].groupby(PROMPT).scenario.unique()
                 .apply(lambda s: sorted(set(s) | {"cold"})))
    parts = []
    named = runs[["configuration", "proposer", "pair", "precision"]].drop_duplicates()
    for name, proposer, pair, precision in named.itertuples(index=False):
        own = sweep[(sweep.configuration == name)
                    | ((sweep.pair == pair) & (sweep.precision == precision) & (sweep.k == 0))]
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


def with_hit(meas: pd.DataFrame) -> pd.DataFrame:
    """The measurements with their scenario's `hit` (whether the store offers one there), for `fixed_action_latencies`
    (merged once, then read for every action)."""
    return meas.merge(offers_hit(meas).rename("hit").reset_index(), on=SCENARIO)


def fixed_action_latencies(meas: pd.DataFrame, action: Action, hit: pd.DataFrame | None = None) -> pd.DataFrame:
    """A fixed action's measured runs per instance, with r = 1 read as r = 0 where the scenario offers no hit
    (`hit`: `with_hit(meas)` when the caller already has it)."""
    m = with_hit(meas) if hit is None else hit
    wanted = np.where(m.hit & action.reuse, Action(True, action.k, action.proposer).label,
                      Action(False, action.k, action.proposer).label)
    return m[m.action == wanted][INSTANCE + ["latency_s", "tokens_per_s"]]


def best_fixed_action(meas: pd.DataFrame, hit: pd.DataFrame | None = None) -> str:
    """The one action with the lowest mean latency over every instance (in hindsight), as a label; with several
    proposers the best fixed (proposer, k) (`heads:r0k4`)."""
    hit = with_hit(meas) if hit is None else hit
    labels = sorted(meas.action.unique(), key=lambda a: Action.parse(a))
    means = {a: fixed_action_latencies(meas, Action.parse(a), hit).latency_s.mean() for a in labels}
    return min(means, key=means.get)


def strategy_latencies(runs: pd.DataFrame, meas: pd.DataFrame | None = None,
                       measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """Latency and throughput of every strategy per instance: rakv-asd's own runs, then the strategies read from the
    measurements (`measured_strategies`, or `measured` when the caller already has them)."""
    meas = measurements(runs) if meas is None and measured is None else meas
    own = runs[(runs.kind == "strategy")][INSTANCE + ["strategy", "latency_s", "tokens_per_s"]]
    return pd.concat([own, measured_strategies(meas) if measured is None else measured], ignore_index=True)


def measured_strategies(meas: pd.DataFrame) -> pd.DataFrame:
    """The strategies read from the measurements alone, per instance: the fixed ones and the best fixed action (per
    configuration), and the cross-fitted oracle (the same for every controller replayed over them)."""
    parts = []
    for _, part in meas.groupby("configuration"):
        hit = with_hit(part)
        for strategy in FIXED:
            action = Action.of_strategy(strategy).of_proposer(primary_proposer(part))
            parts.append(fixed_action_latencies(part, action, hit).assign(strategy=strategy))
        best = best_fixed_action(part, hit)
        parts.append(fixed_action_latencies(part, Action.parse(best), hit).assign(strategy=BEST_FIXED))
    oracle = held_out_oracle(meas)
    parts.append(oracle.rename(columns={"oracle_s": "latency_s", "oracle_tokens_per_s": "tokens_per_s"})
                 [INSTANCE + ["latency_s", "tokens_per_s"]].assign(strategy=ORACLE))
    return pd.concat(parts, ignore_index=True)


def primary_proposer(part: pd.DataFrame) -> str:
    """Whose actions one configuration's fixed strategies (spec-k4, joint-k4) read: "" (its one proposer's), or, in
    a configuration of several proposers (labels `heads:r0k4`), its first proposer's (the `proposer` column)."""
    qualified = part.action.str.contains(":", regex=False).any()
    return str(part.proposer.iloc[0]) if qualified else ""


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


@dataclass(frozen=True)
class ScenarioTables:
    """What judging a choice reads from the measurements, per scenario: the oracle, each action's latencies (the
    tie test's samples) and the action x repeat matrix (the cross-fitted oracle's)."""
    oracle: pd.DataFrame
    samples: dict
    matrices: dict

    @classmethod
    def of(cls, meas: pd.DataFrame) -> ScenarioTables:
        groups = list(meas.groupby(SCENARIO))
        return cls(oracle=oracle_table(meas)[SCENARIO + ["oracle_action", "oracle_k"]],
                   samples={key: group.groupby("action").latency_s.apply(np.asarray) for key, group in groups},
                   matrices={key: group.pivot_table(index="action", columns="repeat", values="latency_s")
                             for key, group in groups})


def controller_choices(runs: pd.DataFrame, meas: pd.DataFrame | None = None,
                       tables: ScenarioTables | None = None) -> pd.DataFrame:
    """Each rakv-asd run with its scenario's oracle, its cross-fitted regret, and whether it is a tie (`tables`: the
    measurements' ScenarioTables when the caller already has them)."""
    if tables is None:
        tables = ScenarioTables.of(measurements(runs) if meas is None else meas)
    samples, matrices = tables.samples, tables.matrices
    chosen = runs[adaptive_mask(runs)][INSTANCE + ["action", "k"] + (["tie_set"] if "tie_set" in runs else [])]
    out = chosen.merge(tables.oracle, on=SCENARIO, how="left")
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
    if "tie_set" in out:  # the oracle's action among the actions the cost model could not tell from the chosen one
        out["correct_tie_set"] = [isinstance(t, str) and o in json.loads(t) for t, o in zip(out.tie_set,
                                                                                             out.oracle_action)]
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
