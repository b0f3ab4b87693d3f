"""Statistics of the study, as pure functions over the results tables (definitions: paper/main.tex, "Setup" and "Results").

Runs are paired by *instance* = (configuration, dataset, prompt, scenario, repeat). The oracle of
a scenario is its best action measured in the action sweep (mean over sweep repeats). Regret and
controller accuracy compare the controller's choices with that oracle on the sweep's
measurements, so a choice is judged by what its action costs, not by one noisy run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

INSTANCE = ["configuration", "dataset", "prompt_id", "scenario", "repeat"]
SCENARIO = ["configuration", "dataset", "prompt_id", "scenario"]
BASELINES = ("joint-k4", "kv-only", "ar", "spec-k4")

# Reference figures of the reproduced study (paper/main.tex, "Claims"), and the test each reproduced value must pass for the
# reference's qualitative conclusion to hold here.
REFERENCE = {
    "latency_reduction_vs_joint_k4": 0.640,
    "throughput_gain_vs_joint_k4": 1.708,
    "latency_reduction_vs_kv_only": 0.0045,
    "throughput_gain_vs_kv_only": 0.0081,
    "exact_share": 1.0,
    "accuracy_k": 1.0,
    "accuracy_action": 0.833,
    "mape": 0.321,
    "spearman_pooled": 0.780,
    "mean_regret": 0.0032,
    "spec_slowdown_min": 0.14,
    "spec_slowdown_max": 2.35,
    "crossover_alpha_min": 0.894,
    "crossover_alpha_max": 0.973,
}


def strategy_runs(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs.kind == "strategy"]


def sweep_runs(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs.kind == "sweep"]


def strategy_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean latency, TTFT and throughput per strategy (and configuration)."""
    s = strategy_runs(runs)
    return (s.groupby(["configuration", "strategy"])
            .agg(runs=("latency_s", "size"), latency_s=("latency_s", "mean"), ttft_s=("ttft_s", "mean"),
                 tokens_per_s=("tokens_per_s", "mean"))
            .reset_index())


def paired(runs: pd.DataFrame, a: str, b: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """`metric` of strategies a and b on the same instances, aligned."""
    s = strategy_runs(runs)
    wide = s[s.strategy.isin([a, b])].pivot_table(index=INSTANCE, columns="strategy", values=metric)
    wide = wide.dropna()
    return wide[a].to_numpy(), wide[b].to_numpy()


def _ci(statistic, a, b, seed: int, resamples: int) -> tuple[float, float, float]:
    value = float(statistic(a, b))
    if len(a) < 2:
        return value, float("nan"), float("nan")
    result = stats.bootstrap((a, b), statistic, paired=True, vectorized=False, n_resamples=resamples,
                             confidence_level=0.95, method="percentile", random_state=seed)
    return value, float(result.confidence_interval.low), float(result.confidence_interval.high)


def latency_reduction(runs, a="rakv-asd", b="joint-k4", seed=0, resamples=2000):
    """1 - mean latency(a) / mean latency(b), with a paired bootstrap 95 % CI over instances."""
    x, y = paired(runs, a, b, "latency_s")
    return _ci(lambda p, q: 1.0 - np.mean(p) / np.mean(q), x, y, seed, resamples)


def throughput_gain(runs, a="rakv-asd", b="joint-k4", seed=0, resamples=2000):
    """mean throughput(a) / mean throughput(b) - 1, with a paired bootstrap 95 % CI over instances."""
    x, y = paired(runs, a, b, "tokens_per_s")
    return _ci(lambda p, q: np.mean(p) / np.mean(q) - 1.0, x, y, seed, resamples)


def exactness(runs: pd.DataFrame) -> tuple[int, int]:
    """(strategy runs whose output equals AR, strategy runs)."""
    s = strategy_runs(runs)
    return int(s.equal_to_ar.sum()), len(s)


def sweep_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per scenario and action: mean measured and predicted latency over the sweep's repeats."""
    return (sweep_runs(runs).groupby(SCENARIO + ["action"])
            .agg(measured_s=("latency_s", "mean"), predicted_s=("predicted_latency_s", "mean"),
                 k=("k", "first"), reuse=("reuse", "first"))
            .reset_index())


def oracle_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The best measured action of every scenario, and the best with k = 0 and with k != 0."""
    sweep = sweep_table(runs)
    rows = []
    for key, group in sweep.groupby(SCENARIO):
        best = group.loc[group.measured_s.idxmin()]
        k0, spec = group[group.k == 0], group[group.k != 0]
        rows.append({**dict(zip(SCENARIO, key)), "oracle_action": best.action, "oracle_k": int(best.k),
                     "oracle_s": best.measured_s, "best_k0_s": k0.measured_s.min() if len(k0) else np.nan,
                     "best_spec_s": spec.measured_s.min() if len(spec) else np.nan})
    return pd.DataFrame(rows)


def controller_choices(runs: pd.DataFrame) -> pd.DataFrame:
    """Each rakv-asd run with its scenario's oracle and the sweep's measurement of the chosen action."""
    s = strategy_runs(runs)
    chosen = s[s.strategy == "rakv-asd"][INSTANCE + ["action", "k", "latency_s"]]
    sweep = sweep_table(runs)[SCENARIO + ["action", "measured_s"]].rename(columns={"measured_s": "chosen_sweep_s"})
    out = chosen.merge(oracle_table(runs), on=SCENARIO).merge(sweep, on=SCENARIO + ["action"], how="left")
    out["regret"] = out.chosen_sweep_s / out.oracle_s - 1.0
    return out


def controller_accuracy(runs: pd.DataFrame) -> tuple[float, float]:
    """(share of rakv-asd decisions whose k equals the oracle's, share whose full action (r, k) does)."""
    c = controller_choices(runs)
    return float((c.k == c.oracle_k).mean()), float((c.action == c.oracle_action).mean())


def regret(runs: pd.DataFrame) -> tuple[float, float]:
    """(mean, worst) regret of the controller vs the oracle."""
    c = controller_choices(runs)
    return float(c.regret.mean()), float(c.regret.max())


def mape(runs: pd.DataFrame) -> float:
    """Mean over (scenario, action) of |predicted - measured| / measured."""
    sweep = sweep_table(runs)
    return float((np.abs(sweep.predicted_s - sweep.measured_s) / sweep.measured_s).mean())


def spearman(runs: pd.DataFrame) -> tuple[float, float]:
    """(pooled Spearman rho over every (scenario, action), mean of the per-scenario rho)."""
    sweep = sweep_table(runs)
    pooled = stats.spearmanr(sweep.predicted_s, sweep.measured_s).statistic
    per = [stats.spearmanr(g.predicted_s, g.measured_s).statistic for _, g in sweep.groupby(SCENARIO) if len(g) > 2]
    per = [r for r in per if np.isfinite(r)]
    return float(pooled), float(np.mean(per)) if per else float("nan")


def spec_slowdown(runs: pd.DataFrame) -> tuple[float, float, float]:
    """How much slower the best k != 0 action is than the best k = 0 one: (min, max, share of scenarios > 0)."""
    o = oracle_table(runs)
    slow = (o.best_spec_s / o.best_k0_s - 1.0).dropna()
    return float(slow.min()), float(slow.max()), float((slow > 0).mean())


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


def claims(summary: dict) -> list[dict]:
    """The reference figures beside the reproduced ones, and whether each qualitative conclusion holds."""
    s = summary

    def row(claim, reference, reproduced, holds, unit="%"):
        fmt = (lambda v: None if v is None else round(100 * v, 2)) if unit == "%" else (
            lambda v: None if v is None else round(v, 3))
        difference = None if reproduced is None or reference is None else reproduced - reference
        return {"claim": claim, "reference": fmt(reference), "reproduced": fmt(reproduced),
                "difference": fmt(difference), "unit": unit, "holds": bool(holds)}

    lat_j, thr_j = s["latency_reduction"]["joint-k4"][0], s["throughput_gain"]["joint-k4"][0]
    lat_kv, thr_kv = s["latency_reduction"]["kv-only"][0], s["throughput_gain"]["kv-only"][0]
    cross = s.get("crossover_model_draft") or s["crossover_model"]  # the reference's proposers were draft models
    feas = s["feasibility"]
    rows = [
        row("RAKV-ASD vs Joint-k4: latency reduction", REFERENCE["latency_reduction_vs_joint_k4"], lat_j, lat_j > 0),
        row("RAKV-ASD vs Joint-k4: throughput gain", REFERENCE["throughput_gain_vs_joint_k4"], thr_j, thr_j > 0),
        row("RAKV-ASD vs KV-only: latency reduction (within)", REFERENCE["latency_reduction_vs_kv_only"], lat_kv,
            lat_kv > -0.05),
        row("RAKV-ASD vs KV-only: throughput gain (within)", REFERENCE["throughput_gain_vs_kv_only"], thr_kv,
            thr_kv > -0.05),
        row("outputs identical to AR", REFERENCE["exact_share"], s["exact"]["share"], s["exact"]["share"] == 1.0),
        row("controller: optimal k chosen", REFERENCE["accuracy_k"], s["accuracy_k"], s["accuracy_k"] >= 0.9),
        row("controller: optimal action chosen", REFERENCE["accuracy_action"], s["accuracy_action"],
            s["accuracy_action"] >= 0.5),
        row("latency prediction MAPE", REFERENCE["mape"], s["mape"], s["mape"] < 0.5),
        row("Spearman rho, predicted vs measured (pooled)", REFERENCE["spearman_pooled"], s["spearman_pooled"],
            s["spearman_pooled"] >= 0.7, unit=""),
        row("mean regret vs oracle", REFERENCE["mean_regret"], s["mean_regret"], s["mean_regret"] < 0.05),
        row("best k != 0 vs k = 0: slowdown, min", REFERENCE["spec_slowdown_min"], s["spec_slowdown"]["min"],
            s["spec_slowdown"]["min"] > 0),
        row("best k != 0 vs k = 0: slowdown, max", REFERENCE["spec_slowdown_max"], s["spec_slowdown"]["max"],
            s["spec_slowdown"]["max"] > 0),
        row("acceptance crossover alpha (cost model, draft-model proposers), min", REFERENCE["crossover_alpha_min"],
            cross["min"], cross["min"] is not None and cross["min"] >= 0.8, unit=""),
        row("acceptance crossover alpha (cost model, draft-model proposers), max", REFERENCE["crossover_alpha_max"],
            cross["max"], cross["max"] is not None and cross["max"] >= 0.8, unit=""),
    ]
    label = f"feasibility ({feas.get('configuration', '?')}): k != 0 never beats k = 0"
    if feas.get("break_even"):
        rows.append({"claim": label, "reference": "does not cross", "reproduced": cost_side_sentence(feas),
                     "difference": None, "unit": "", "holds": None})
    elif feas.get("status") == "ran":
        rows.append({"claim": label, "reference": "does not cross",
                     "reproduced": "crosses" if feas["crossed"] else "does not cross", "difference": None,
                     "unit": "", "holds": not feas["crossed"]})
    else:
        rows.append({"claim": label, "reference": "does not cross", "reproduced": feas.get("status", "missing"),
                     "difference": None, "unit": "", "holds": False})
    return rows


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


def break_even_table(results: Path) -> pd.DataFrame:
    """Break-even alpha per k for every calibration in results/<name>/calibration/ (a cold request of the
    feasibility cost side's prompt length and the study's new tokens), with the draft/target step-cost ratio."""
    from rakv.costmodel import CostTable, break_even_rows

    meta = json.loads((results / "study" / "metadata.json").read_text())
    profile = meta["config"]["profile"]
    prompt_tokens, new_tokens = profile["feasibility"]["cost_side"]["prompt_tokens"], profile["study"]["new_tokens"]
    rows = []
    for path in sorted((results / "calibration").glob("*.json")):
        table = CostTable.from_json(json.loads(path.read_text()))
        rows.extend(break_even_rows(path.stem, table, prompt_tokens, new_tokens))
    return pd.DataFrame(rows)


def measured_acceptance(runs: pd.DataFrame) -> dict[str, float]:
    """Per pair/proposer (the calibration files' names): accepted / (accepted + rejecting rounds) over its
    speculative runs."""
    spec = runs[runs.k > 0]
    out = {}
    for (pair, proposer), part in spec.groupby(["pair", "proposer"]):
        total = part.accepted.sum() + part.rejections.sum()
        if total:
            out[f"{pair}-{proposer}"] = float(part.accepted.sum() / total)
    return out


def summarize(results: Path, seed: int = 0, resamples: int = 2000) -> dict:
    """Every statistic of the study, sensitivity and feasibility results under `results`."""
    results = Path(results)
    runs = pd.read_parquet(results / "study" / "runs.parquet")
    summary: dict = {"results": str(results), "runs": len(runs),
                     "strategy_runs": int((runs.kind == "strategy").sum()),
                     "sweep_runs": int((runs.kind == "sweep").sum()),
                     "configurations": sorted(runs.configuration.unique().tolist())}
    summary["latency_reduction"] = {b: latency_reduction(runs, "rakv-asd", b, seed, resamples) for b in BASELINES}
    summary["throughput_gain"] = {b: throughput_gain(runs, "rakv-asd", b, seed, resamples) for b in BASELINES}
    equal, total = exactness(runs)
    summary["exact"] = {"equal": equal, "total": total, "share": equal / total if total else None,
                        "sweep_equal": int(sweep_runs(runs).equal_to_ar.sum()), "sweep_total": len(sweep_runs(runs))}
    summary["accuracy_k"], summary["accuracy_action"] = controller_accuracy(runs)
    summary["mape"] = mape(runs)
    summary["spearman_pooled"], summary["spearman_per_scenario"] = spearman(runs)
    summary["mean_regret"], summary["worst_regret"] = regret(runs)
    low, high, share = spec_slowdown(runs)
    summary["spec_slowdown"] = {"min": low, "max": high, "share_slower": share}
    summary["per_configuration"] = {}
    for name, part in runs.groupby("configuration"):
        summary["per_configuration"][name] = {
            "latency_reduction_vs_joint_k4": latency_reduction(part, "rakv-asd", "joint-k4", seed, resamples),
            "latency_reduction_vs_kv_only": latency_reduction(part, "rakv-asd", "kv-only", seed, resamples),
            "accuracy_k": controller_accuracy(part)[0], "accuracy_action": controller_accuracy(part)[1],
            "mape": mape(part), "spearman_pooled": spearman(part)[0], "mean_regret": regret(part)[0],
            "spec_slowdown": dict(zip(("min", "max", "share_slower"), spec_slowdown(part)))}
    sens = results / "sensitivity"
    if (sens / "crossover.parquet").exists():
        crossover = pd.read_parquet(sens / "crossover.parquet")
        summary["crossover_model"] = model_crossover(crossover)
        summary["crossover_model_per_configuration"] = {name: model_crossover(part)
                                                        for name, part in crossover.groupby("configuration")}
        drafted = set(runs[runs.proposer == "draft"].configuration) if "proposer" in runs else set()
        if drafted:
            summary["crossover_model_draft"] = model_crossover(crossover[crossover.configuration.isin(drafted)])
    else:
        summary["crossover_model"] = {"min": None, "max": None}
    controlled = pd.read_parquet(sens / "controlled.parquet") if (sens / "controlled.parquet").exists() else None
    summary["crossover_measured"] = measured_crossover(controlled) if controlled is not None else {}
    summary["crossover_predicted_controlled"] = (measured_crossover(controlled, "predicted_speedup")
                                                 if controlled is not None else {})
    feas = results / "feasibility" / "summary.json"
    summary["feasibility"] = json.loads(feas.read_text()) if feas.exists() else {"status": "missing"}
    summary["claims"] = claims(summary)
    return summary


def write_summary(summary: dict, results: Path) -> Path:
    """results/<name>/summary.json, written atomically."""
    from rakv.records import write_atomic

    path = Path(results) / "summary.json"
    write_atomic(path, json.dumps(summary, indent=1))
    return path
