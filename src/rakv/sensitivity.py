"""Sensitivity analysis and the feasibility study (paper/main.tex, "Setup").

Each part writes one Parquet table under results/<profile>/sensitivity/ (or feasibility/):
- alpha_model:    predicted latency of every (r, k) over an alpha grid, from the cost model alone;
- crossover:      break-even alpha per k, scenario class and prompt length (cost model);
- controlled:     measured speedup of spec-k over AR at chosen acceptance (controlled proposer) vs predicted;
- cache_budget:   hit rate, latency and evictions of a shared-prefix trace under several store budgets;
- output_length / prompt_length / reuse_rate: measured latency and TTFT as one factor varies;
- beta_lambda:    the controller replayed over the main study's action sweep for several beta and lambda.
The stage writes complete.json when every part is done and is skipped while that file exists.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rakv.cache import Hit
from rakv.controller import Controller, run_rakv_asd
from rakv.costmodel import RequestFeatures, acceptance_estimate, break_even_alpha, estimate_latency
from rakv.engine import Action, parse_strategy
from rakv.errors import RakvError, WeightsUnavailable
from rakv.proposers import ControlledAcceptanceProposer, DraftModelProposer
from rakv.study import (configurations, controller_config, cost_table_for, format_duration, open_engine, prompts_for,
                        reset_store, results_dir, run_main_study, write_atomic, write_parquet)
from rakv.workloads import build_scenario, parse_scenario


def _scenario_features(name: str, length: int, new_tokens: int) -> RequestFeatures:
    kind, rate = parse_scenario(name)
    if kind == "cold":
        return RequestFeatures(length, 0, new_tokens)
    if kind == "exact":
        return RequestFeatures(length, length, new_tokens, exact_hit=True)
    return RequestFeatures(length, max(int(rate * length), 1), new_tokens)


def alpha_model_tables(cfg, name, table) -> tuple[list[dict], list[dict]]:
    exp, lam = cfg.experiment, cfg.controller.memory_penalty_s_per_byte
    new_tokens = cfg.profile.sensitivity.new_tokens
    curve, crossover = [], []
    for scenario in exp.scenario_classes:
        for length in exp.model_prompt_lengths:
            features = _scenario_features(scenario, length, new_tokens)
            reuse = features.hit_tokens > 0
            for k in cfg.controller.k_set:
                for alpha in exp.alpha_grid:
                    curve.append({"configuration": name, "scenario": scenario, "prompt_tokens": length, "k": k,
                                  "alpha": alpha, "reuse": reuse,
                                  "predicted_latency_s": estimate_latency(table, features, reuse, k, alpha, lam)})
                if k:
                    crossover.append({"configuration": name, "scenario": scenario, "prompt_tokens": length, "k": k,
                                      "break_even_alpha": break_even_alpha(table, features, reuse, k, lam)})
    return curve, crossover


def controlled_rows(cfg, name, engine, controller, prompts, tick=lambda n=1: None) -> list[dict]:
    sens, rows = cfg.profile.sensitivity, []
    n = sens.new_tokens
    for prompt in prompts[: sens.prompts]:
        ids = list(prompt.token_ids)
        reference = engine.run(ids, Action(False, 0), n, ignore_eos=True)
        tick()
        for repeat in range(sens.repeats):
            ar = engine.run(ids, Action(False, 0), n, ignore_eos=True).latency_s
            tick()
            for k in cfg.experiment.controlled_k:
                for alpha in sens.controlled_alphas:
                    proposer = ControlledAcceptanceProposer(
                        DraftModelProposer(engine.pair.draft.module, engine.pair.device), ids + reference.token_ids,
                        alpha, engine.pair.vocab_size, seed=repeat * 1000 + int(alpha * 100))
                    spec = engine.run(ids, Action(False, k), n, ignore_eos=True, proposer=proposer)
                    tick()
                    measured_alpha = acceptance_estimate(spec.round_log)
                    features = RequestFeatures(len(ids), 0, n)
                    predicted = {a: estimate_latency(controller.table, features, False, k, a)
                                 / estimate_latency(controller.table, features, False, 0, a)
                                 for a in (alpha, measured_alpha if measured_alpha is not None else alpha)}
                    rows.append({"configuration": name, "prompt_id": prompt.id, "prompt_tokens": len(ids),
                                 "repeat": repeat, "k": k,
                                 "alpha": alpha, "measured_alpha": measured_alpha, "ar_latency_s": ar,
                                 "spec_latency_s": spec.latency_s, "measured_speedup": ar / spec.latency_s,
                                 "predicted_speedup": 1 / predicted[alpha],
                                 "predicted_speedup_at_measured_alpha": 1 / list(predicted.values())[-1],
                                 "equal_to_ar": spec.token_ids == reference.token_ids})
    return rows


def trace(prompts, families: int, requests: int, seed: int) -> list[list[int]]:
    """A shared-prefix workload: requests drawn from a few prompt families, each a prefix + its own tail."""
    rng = np.random.default_rng(seed)
    bases = [list(p.token_ids) for p in prompts[:families]]
    if not bases:
        raise RakvError("no prompts for the cache-budget trace")
    out = []
    for _ in range(requests):
        base = bases[int(rng.integers(len(bases)))]
        cut = int(rng.integers(len(base) // 2, len(base) + 1))
        tail = bases[int(rng.integers(len(bases)))][: int(rng.integers(0, 16))]
        out.append(base[:cut] + tail)
    return out


def budget_rows(cfg, name, engine, prompts, tick=lambda n=1: None) -> list[dict]:
    sens, rows = cfg.profile.sensitivity, []
    requests = trace(prompts, sens.trace_families, sens.trace_requests, cfg.seed)
    for budget in sens.budgets_mib:
        engine.store.budget_bytes = int(budget * (1 << 20))
        engine.store.clear()
        latencies, ttfts = [], []
        for ids in requests:
            result = engine.run(ids, Action(True, 0), sens.new_tokens, ignore_eos=True)
            tick()
            latencies.append(result.latency_s)
            ttfts.append(result.ttft_s)
        stats = engine.store.stats
        rows.append({"configuration": name, "budget_mib": budget, "requests": len(requests),
                     "hit_rate": stats.hits / max(stats.lookups, 1), "hit_tokens": stats.hit_tokens,
                     "evictions": stats.evictions, "rejected_oversize": stats.rejected_oversize,
                     "mean_latency_s": float(np.mean(latencies)), "mean_ttft_s": float(np.mean(ttfts))})
    engine.store.budget_bytes = int(cfg.cache.budget_mib * (1 << 20))
    engine.store.clear()
    return rows


def _timed(engine, controller, ids, strategy, n, warmups=()):
    reset_store(engine, warmups)
    if strategy == "rakv-asd":
        return run_rakv_asd(engine, controller, ids, n, ignore_eos=True)
    return engine.run(ids, parse_strategy(strategy), n, ignore_eos=True)


def factor_rows(cfg, name, engine, controller, prompts, tick=lambda n=1: None) -> dict[str, list[dict]]:
    """Output length, prompt length and reuse rate, each varied alone on the same prompts."""
    sens = cfg.profile.sensitivity
    out = {"output_length": [], "prompt_length": [], "reuse_rate": []}
    longest = max(prompts[: max(sens.prompts, 1)], key=lambda p: len(p.token_ids))
    donor = prompts[0].token_ids if prompts[0] is not longest else prompts[-1].token_ids
    for repeat in range(sens.repeats):
        for prompt in prompts[: sens.prompts]:
            ids = list(prompt.token_ids)
            for n in sens.output_lengths:
                for strategy in ("ar", "spec-k4", "rakv-asd"):
                    r = _timed(engine, controller, ids, strategy, n)
                    tick()
                    out["output_length"].append({"configuration": name, "prompt_id": prompt.id, "repeat": repeat,
                                                 "new_tokens": n, "strategy": strategy, "k": r.k,
                                                 "latency_s": r.latency_s, "tokens_per_s": r.tokens_per_s})
        base = (list(longest.token_ids) + list(donor)) * 4
        for length in sens.prompt_lengths:
            ids = base[:length]
            for scenario in ("cold", "partial-50", "exact"):
                s = build_scenario(scenario, tuple(ids), tuple(donor))
                r = _timed(engine, controller, ids, "kv-only", sens.new_tokens, s.warmups)
                tick()
                out["prompt_length"].append({"configuration": name, "repeat": repeat, "prompt_tokens": length,
                                             "scenario": scenario, "hit_tokens": r.hit_tokens, "ttft_s": r.ttft_s,
                                             "latency_s": r.latency_s})
        ids = list(longest.token_ids)
        for rate in sens.reuse_rates:
            scenario = "cold" if rate == 0 else f"partial-{int(round(rate * 100))}"
            s = build_scenario(scenario, tuple(ids), tuple(donor))
            for strategy in ("ar", "kv-only", "rakv-asd"):
                r = _timed(engine, controller, ids, strategy, sens.new_tokens, s.warmups)
                tick()
                out["reuse_rate"].append({"configuration": name, "repeat": repeat, "reuse_rate_target": rate,
                                          "strategy": strategy, "hit_tokens": r.hit_tokens,
                                          "prompt_tokens": r.prompt_tokens, "reuse": r.reuse, "k": r.k,
                                          "ttft_s": r.ttft_s, "latency_s": r.latency_s})
    return out


def hit_from(prompt_tokens: int, reused: int, exact: bool) -> Hit:
    """The store hit a study scenario offered, rebuilt from the reused-token count its runs recorded."""
    if exact:
        return Hit(prompt_tokens, prompt_tokens, True)
    return Hit(prompt_tokens, reused + 1 if reused else 0, False)


def replay_rows(cfg, tables: dict) -> list[dict]:
    """Replay the controller over the main study's sweep for each beta and lambda: choice, regret, accuracy."""
    path = results_dir(cfg) / "study" / "runs.parquet"
    if not path.exists():
        raise RakvError(f"{path} is missing: run the study stage first")
    runs = pd.read_parquet(path)
    sweep = runs[runs.kind == "sweep"]
    measured = sweep.groupby(["configuration", "dataset", "prompt_id", "scenario", "action"]).agg(
        latency_s=("latency_s", "mean"), accepted=("accepted", "sum"), rejections=("rejections", "sum"),
        rounds=("rounds", "sum"), prompt_tokens=("prompt_tokens", "first"),
        available=("available_hit_tokens", "max"), exact=("exact_hit", "max"), new_tokens=("new_tokens", "first"))
    rows = []
    exp = cfg.experiment
    instances = measured.reset_index().groupby(["configuration", "dataset", "prompt_id", "scenario"], sort=False)
    for beta in exp.betas:
        for lam in exp.lambdas:
            for configuration, table in tables.items():
                config = controller_config(cfg)
                controller = Controller(table, type(config)(**{**config.__dict__, "beta": beta,
                                                               "memory_penalty_s_per_byte": lam}))
                regrets, hits_k, hits_action = [], 0, 0
                groups = [(key, g) for key, g in instances if key[0] == configuration]
                for (_, dataset, prompt_id, scenario), group in groups:
                    first = group.iloc[0]
                    hit = hit_from(int(first.prompt_tokens), int(group.available.max()), bool(group.exact.max()))
                    decision = controller.decide(int(first.prompt_tokens), hit, int(first.new_tokens))
                    by_action = group.set_index("action")
                    oracle = by_action.latency_s.idxmin()
                    chosen = decision.action.label
                    if chosen not in by_action.index:
                        continue
                    regrets.append(by_action.latency_s[chosen] / by_action.latency_s[oracle] - 1)
                    hits_action += chosen == oracle
                    hits_k += int(chosen[3:]) == int(oracle[3:])
                    row = by_action.loc[chosen]
                    if row.rounds:  # learn from the acceptance that action showed, one update per round it ran
                        controller.tracker.observe_mean(row.accepted / row.rounds, row.rejections / row.rounds,
                                                        int(row.rounds))
                rows.append({"configuration": configuration, "beta": beta, "lambda": lam, "scenarios": len(regrets),
                             "mean_regret": float(np.mean(regrets)) if regrets else None,
                             "accuracy_action": hits_action / max(len(regrets), 1),
                             "accuracy_k": hits_k / max(len(regrets), 1)})
    return rows


def planned_requests(cfg, configuration, table, prompts) -> dict[str, tuple[int, float]]:
    """Per measured part: (timed requests, predicted seconds), from the profile's grid and the cost table.

    Requests are priced as cold ones of the prompts' mean length (k = 4 where the part speculates), so the
    estimate is an upper-side guide, not a promise."""
    sens, exp = cfg.profile.sensitivity, cfg.experiment
    chosen = prompts[: sens.prompts]
    length = int(np.mean([len(p.token_ids) for p in chosen])) if chosen else 64

    def cost(n, k=0):
        return estimate_latency(table, RequestFeatures(length, 0, n), False, k, table.acceptance)

    n = sens.new_tokens
    parts = {}
    if configuration.proposer == "draft":
        count = len(chosen) * (1 + sens.repeats * (1 + len(exp.controlled_k) * len(sens.controlled_alphas)))
        parts["controlled"] = (count, count * cost(n, 4))
    count = len(sens.budgets_mib) * sens.trace_requests
    parts["cache_budget"] = (count, count * cost(n))
    outputs = sum(3 * cost(m, 4) for m in sens.output_lengths) * len(chosen) * sens.repeats
    parts["output_length"] = (3 * len(sens.output_lengths) * len(chosen) * sens.repeats, outputs)
    count = 3 * len(sens.prompt_lengths) * sens.repeats
    parts["prompt_length"] = (count, count * cost(n))
    count = 3 * len(sens.reuse_rates) * sens.repeats
    parts["reuse_rate"] = (count, count * cost(n))
    return parts


def run_sensitivity(cfg: DictConfig) -> None:
    out_dir = results_dir(cfg) / "sensitivity"
    out_dir.mkdir(parents=True, exist_ok=True)
    marker = out_dir / "complete.json"
    if marker.exists():
        print(f"sensitivity: already complete ({marker}); delete that file to measure again", flush=True)
        return
    tables, parts = {}, {}
    for configuration in configurations(cfg):
        engine = open_engine(cfg, configuration)
        table = cost_table_for(cfg, engine)
        tables[configuration.name] = table
        controller = Controller(table, controller_config(cfg))
        curve, crossover = alpha_model_tables(cfg, configuration.name, table)
        parts.setdefault("alpha_model", []).extend(curve)
        parts.setdefault("crossover", []).extend(crossover)
        prompts = [p for d in cfg.datasets for p in prompts_for(cfg, engine.encode, d)]
        planned = planned_requests(cfg, configuration, table, prompts)
        print(f"sensitivity {configuration.name}: plan " + ", ".join(f"{part} {count}" for part, (count, _)
                                                                      in planned.items())
              + f" timed requests; expected wall time {format_duration(sum(s for _, s in planned.values()))} "
              "(predicted from the cost table)", flush=True)
        bar = tqdm(total=sum(c for c, _ in planned.values()), desc=f"sensitivity {configuration.name}",
                   unit="request", dynamic_ncols=True, mininterval=2)
        if configuration.proposer == "draft":  # the controlled proposer pays a draft model's cost
            parts.setdefault("controlled", []).extend(controlled_rows(cfg, configuration.name, engine, controller,
                                                                      prompts, bar.update))
        parts.setdefault("cache_budget", []).extend(budget_rows(cfg, configuration.name, engine, prompts,
                                                                bar.update))
        for key, rows in factor_rows(cfg, configuration.name, engine, controller, prompts, bar.update).items():
            parts.setdefault(key, []).extend(rows)
        bar.close()
    parts["beta_lambda"] = replay_rows(cfg, tables)
    for part, rows in parts.items():
        if rows:
            write_parquet(rows, out_dir / f"{part}.parquet")
    write_atomic(marker, json.dumps({"parts": sorted(parts)}))
    print(f"sensitivity: wrote {', '.join(sorted(parts))} to {out_dir}", flush=True)


def run_feasibility(cfg: DictConfig) -> None:
    """The main-study machinery on the feasibility pair (action sweep only); skipped when weights are missing."""
    out_dir = results_dir(cfg) / "feasibility"
    out_dir.mkdir(parents=True, exist_ok=True)
    feas = cfg.profile.feasibility
    base = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))  # a plain, non-struct copy
    sub = OmegaConf.merge(base, {
        "configurations": [feas.configuration], "results_dir": str(out_dir),
        "experiment": {"strategies": [], "scenarios": list(cfg.experiment.scenarios)},
        "profile": {"study": {"length_bins": feas.length_bins, "prompts_per_bin": feas.prompts_per_bin,
                              "repeats": 0, "sweep_repeats": feas.repeats, "new_tokens": feas.new_tokens}}})
    try:
        path = run_main_study(sub)
    except WeightsUnavailable as exc:
        summary = {"status": "skipped: weights unavailable", "configuration": feas.configuration, "reason": str(exc)}
        write_atomic(out_dir / "summary.json", json.dumps(summary, indent=1))
        print(f"feasibility: skipped: weights unavailable ({exc})", flush=True)
        return
    runs = pd.read_parquet(path)
    per_scenario = []
    for (dataset, prompt_id, scenario), group in runs.groupby(["dataset", "prompt_id", "scenario"]):
        by_action = group.groupby("action").latency_s.mean()
        k0 = by_action[[a for a in by_action.index if a.endswith("k0")]].min()
        spec = by_action[[a for a in by_action.index if not a.endswith("k0")]]
        per_scenario.append({"dataset": dataset, "prompt_id": prompt_id, "scenario": scenario,
                             "best_k0_s": float(k0), "best_spec_s": float(spec.min()), "best_spec_action": spec.idxmin(),
                             "gap": float(spec.min() / k0 - 1)})
    table = pd.DataFrame(per_scenario)
    write_parquet(per_scenario, out_dir / "gap.parquet")
    calibration = json.loads(next((out_dir / "calibration").glob("*.json")).read_text())
    summary = {"status": "ran", "configuration": feas.configuration, "scenarios": len(table),
               "gap_min": float(table.gap.min()), "gap_max": float(table.gap.max()),
               "gap_mean": float(table.gap.mean()), "crossed": bool((table.gap < 0).any()),
               "calibrated_alpha": calibration["acceptance"]}
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=1))
    print(f"feasibility: best k != 0 vs k = 0 gap {summary['gap_min']:+.1%} to {summary['gap_max']:+.1%} "
          f"over {len(table)} scenarios; crossed: {summary['crossed']}", flush=True)
