"""Sensitivity analysis (paper/main.tex, "Setup").

Each part writes one Parquet table under results/<profile>/sensitivity/ (or feasibility/):
- alpha_model:    predicted latency of every (r, k) over an alpha grid, from the cost model alone;
- crossover:      break-even alpha per k, scenario class and prompt length (cost model);
- controlled:     measured speedup of spec-k over AR at chosen acceptance (controlled proposer) vs predicted;
- cache_budget:   hit rate, latency and evictions of a shared-prefix trace under several store budgets;
- output_length / prompt_length / reuse_rate: measured latency and TTFT as one factor varies;
- reuse_output_length: joint reuse of the proposer by output length: on an exact repeat and a 50 % partial hit of
  an earlier speculating request, r = 1 with k = 4 (the draft's state reused too, when the store holds it)
  against r = 1 with k = 0, per output length;
- beta_lambda:    the controller replayed over the main study's action sweep for several beta and lambda.
The stage writes complete.json when every part is done and is skipped while that file exists.

As jobs (docs/cluster.md: `study.num_shards`, `study.shard_index`, `study.merge_only`, the study's keys): a unit is one
measured panel of one configuration (`UNIT_PANELS`: controlled, cache_budget, the three factors together,
reuse_output_length), each independent of the others (its own store state; the factors' controller is the only one
that learns, within its panel, as in one process). A shard runs its units on the calibration job's tables (read
only) and writes each unit's rows under sensitivity/units/; the merge computes the cost-model tables and the
beta/lambda replay from the kept tables and the study's runs, and assembles the parts in one process's order, loading
no model.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import zip_longest

import numpy as np
import pandas as pd
from omegaconf import DictConfig
from tqdm import tqdm

from rakv.experiments.config import (
    configurations,
    controller_config,
    cost_table_for,
    engine_for,
    prompts_for,
    run_layout,
)
from rakv.experiments.oracle import measurements
from rakv.experiments.records import ShardUnit, read_units, units_dealt, write_atomic, write_parquet, write_unit
from rakv.experiments.schema import SensitivitySection, ShardOptions, section
from rakv.experiments.study import format_duration, reset_store
from rakv.experiments.study_stats import NO_DRAFT_REUSE
from rakv.runtime.actions import ADAPTIVE, AR, JOINT_K4, KV_ONLY, SPEC_K4, Action
from rakv.runtime.cache import Hit
from rakv.runtime.controller import Controller
from rakv.runtime.costmodel import RequestFeatures, break_even_alpha, estimate_latency
from rakv.runtime.errors import RakvError
from rakv.runtime.proposers import ControlledAcceptanceProposer, DraftModelProposer
from rakv.runtime.strategies import run_strategy
from rakv.runtime.workloads import build_scenario, scenario_features, scenario_for_rate


def alpha_model_tables(cfg, name, table) -> tuple[list[dict], list[dict]]:
    exp, lam = cfg.experiment, cfg.controller.memory_penalty_s_per_byte
    new_tokens = section(cfg.profile.sensitivity).new_tokens
    curve, crossover = [], []
    draft = bool(cfg.cache.reuse_draft) and table.proposer_kv_bytes_per_token > 0  # a draft model's state is stored
    for scenario in exp.scenario_classes:
        for length in exp.model_prompt_lengths:
            features = scenario_features(scenario, length, new_tokens, draft)
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


def controlled_rows(name: str, engine, table, prompts, *, new_tokens: int, repeats: int, alphas, ks,
                    tick=lambda n=1: None) -> list[dict]:
    """Measured speedup of spec-k over AR at chosen acceptance (controlled proposer) beside the cost model's."""
    rows = []
    for prompt in prompts:
        ids = list(prompt.token_ids)
        reference = engine.run(ids, Action(False, 0), new_tokens, ignore_eos=True)
        tick()
        features = RequestFeatures(len(ids), 0, new_tokens)
        for repeat in range(repeats):
            ar = engine.run(ids, Action(False, 0), new_tokens, ignore_eos=True).latency_s
            tick()
            for k in ks:
                for alpha in alphas:
                    proposer = ControlledAcceptanceProposer(
                        DraftModelProposer(engine.pair.draft.module, engine.pair.device), ids + reference.token_ids,
                        alpha, engine.pair.vocab_size, seed=repeat * 1000 + int(alpha * 100))
                    speculative = engine.run(ids, Action(False, k), new_tokens, ignore_eos=True, proposer=proposer)
                    tick()
                    measured_alpha = speculative.acceptance_rate

                    def predicted_speedup(a, features=features, k=k):
                        return (estimate_latency(table, features, False, 0, a)
                                / estimate_latency(table, features, False, k, a))

                    rows.append({"configuration": name, "prompt_id": prompt.id, "prompt_tokens": len(ids),
                                 "repeat": repeat, "k": k,
                                 "alpha": alpha, "measured_alpha": measured_alpha, "ar_latency_s": ar,
                                 "spec_latency_s": speculative.latency_s,
                                 "measured_speedup": ar / speculative.latency_s,
                                 "predicted_speedup": predicted_speedup(alpha),
                                 "predicted_speedup_at_measured_alpha": predicted_speedup(
                                     measured_alpha if measured_alpha is not None else alpha),
                                 "equal_to_ar": speculative.token_ids == reference.token_ids})
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


def budget_rows(sens: SensitivitySection, seed: int, name, engine, prompts, tick=lambda n=1: None) -> list[dict]:
    """The shared-prefix trace under each store budget; the engine's own budget (conf's cache.budget_mib) after."""
    rows, configured = [], engine.store.budget_bytes
    requests = trace(prompts, sens.trace_families, sens.trace_requests, seed)
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
    engine.store.budget_bytes = configured
    engine.store.clear()
    return rows


def _timed(engine, controller, ids, strategy, n, warmups=()):
    reset_store(engine, warmups)
    return run_strategy(engine, strategy, ids, n, controller=controller, ignore_eos=True)


def factor_rows(sens: SensitivitySection, name, engine, controller, prompts,
                tick=lambda n=1: None) -> dict[str, list[dict]]:
    """Output length, prompt length and reuse rate, each varied alone on the same prompts."""
    out = {"output_length": [], "prompt_length": [], "reuse_rate": []}
    longest = max(prompts[: max(sens.prompts, 1)], key=lambda p: len(p.token_ids))
    donor = prompts[0].token_ids if prompts[0] is not longest else prompts[-1].token_ids
    for repeat in range(sens.repeats):
        for prompt in prompts[: sens.prompts]:
            ids = list(prompt.token_ids)
            for n in sens.output_lengths:
                for strategy in (AR, SPEC_K4, ADAPTIVE):
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
                r = _timed(engine, controller, ids, KV_ONLY, sens.new_tokens, s.warmups)
                tick()
                out["prompt_length"].append({"configuration": name, "repeat": repeat, "prompt_tokens": length,
                                             "scenario": scenario, "hit_tokens": r.hit_tokens, "ttft_s": r.ttft_s,
                                             "latency_s": r.latency_s})
        ids = list(longest.token_ids)
        for rate in sens.reuse_rates:
            s = build_scenario(scenario_for_rate(rate), tuple(ids), tuple(donor))
            for strategy in (AR, KV_ONLY, ADAPTIVE):
                r = _timed(engine, controller, ids, strategy, sens.new_tokens, s.warmups)
                tick()
                out["reuse_rate"].append({"configuration": name, "repeat": repeat, "reuse_rate_target": rate,
                                          "strategy": strategy, "hit_tokens": r.hit_tokens,
                                          "prompt_tokens": r.prompt_tokens, "reuse": r.reuse, "k": r.k,
                                          "ttft_s": r.ttft_s, "latency_s": r.latency_s})
    return out


JOINT_SCENARIOS = ("exact", "partial-50")
JOINT_STRATEGIES = (KV_ONLY, JOINT_K4)


def mixed_prompts(prompts, count: int) -> list:
    """The first `count` prompts taking the datasets in turn (prompts come grouped by dataset)."""
    by_dataset: dict[str, list] = {}
    for prompt in prompts:
        by_dataset.setdefault(prompt.dataset, []).append(prompt)
    mixed = [p for group in zip_longest(*by_dataset.values()) for p in group if p is not None]
    return mixed[:count]


def reuse_length_rows(sens: SensitivitySection, name, engine, prompts, tick=lambda n=1: None) -> list[dict]:
    """r = 1 with k = 4 against r = 1 with k = 0 on the same store state, per output length (see the module's
    docstring); the two strategies alternate within each (prompt, scenario, length, repeat)."""
    chosen = mixed_prompts(prompts, sens.reuse_prompts)
    configured = engine.reuse_draft
    variants = [(s, configured) for s in JOINT_STRATEGIES]
    if engine.draft_key is not None:  # what reusing the draft's state buys: the same request with it kept out
        variants.append((NO_DRAFT_REUSE, False))
    rows = []
    try:
        for repeat in range(sens.reuse_repeats):
            for index, prompt in enumerate(chosen):
                donor = chosen[(index + 1) % len(chosen)].token_ids if len(chosen) > 1 else prompts[-1].token_ids
                for scenario_name in JOINT_SCENARIOS:
                    scenario = build_scenario(scenario_name, prompt.token_ids, donor)
                    for n in sens.reuse_output_lengths:
                        for label, reuse_draft in variants:
                            engine.reuse_draft = reuse_draft
                            strategy = JOINT_K4 if label == NO_DRAFT_REUSE else label
                            r = _timed(engine, None, list(prompt.token_ids), strategy, n, scenario.warmups)
                            tick()
                            rows.append({"configuration": name, "dataset": prompt.dataset,
                                         "prompt_id": prompt.id, "scenario": scenario_name, "new_tokens": n,
                                         "strategy": label, "repeat": repeat, "k": r.k, "latency_s": r.latency_s,
                                         "ttft_s": r.ttft_s, "hit_tokens": r.hit_tokens,
                                         "draft_hit_tokens": r.draft_hit_tokens,
                                         "draft_prefill_s": r.draft_prefill_s, "reuse_draft": r.reuse_draft,
                                         "accepted": r.accepted, "rounds": r.rounds})
    finally:
        engine.reuse_draft = configured
    return rows


def hit_from(prompt_tokens: int, reused: int, exact: bool, draft: int = 0) -> Hit:
    """The store hit a study scenario offered, rebuilt from the reused-token counts its runs recorded (`draft`: the
    positions for which the store also held the draft's state)."""
    if exact:
        return Hit(prompt_tokens, prompt_tokens, True, draft_tokens=draft)
    return Hit(prompt_tokens, reused + 1 if reused else 0, False, draft_tokens=draft)


def replay_rows(cfg, tables: dict) -> list[dict]:
    """Replay the controller over the main study's sweep for each beta and lambda: choice, regret, accuracy."""
    path = run_layout(cfg).study.runs
    if not path.exists():
        raise RakvError(f"{path} is missing: run the study stage first")
    runs = pd.read_parquet(path)
    # a study (or its resumed part) from before the draft's state was stored: none offered
    runs["available_draft_tokens"] = runs.get("available_draft_tokens", pd.Series(0, index=runs.index)).fillna(0)
    sweep = measurements(runs)  # an r = 0 action measured once per prompt stands in every scenario
    measured = sweep.groupby(["configuration", "dataset", "prompt_id", "scenario", "action"]).agg(
        latency_s=("latency_s", "mean"), accepted=("accepted", "sum"), rejections=("rejections", "sum"),
        rounds=("rounds", "sum"), prompt_tokens=("prompt_tokens", "first"),
        available=("available_hit_tokens", "max"), exact=("exact_hit", "max"), new_tokens=("new_tokens", "first"),
        available_draft=("available_draft_tokens", "max"))
    rows = []
    exp = cfg.experiment
    instances = measured.reset_index().groupby(["configuration", "dataset", "prompt_id", "scenario"], sort=False)
    for beta in exp.betas:
        for lam in exp.lambdas:
            for configuration, table in tables.items():
                config = controller_config(cfg)
                controller = Controller(table, replace(config, beta=beta, memory_penalty_s_per_byte=lam))
                regrets, hits_k, hits_action = [], 0, 0
                groups = [(key, g) for key, g in instances if key[0] == configuration]
                for _, group in groups:
                    first = group.iloc[0]
                    hit = hit_from(int(first.prompt_tokens), int(group.available.max()), bool(group.exact.max()),
                                   int(group.available_draft.max()))
                    decision = controller.decide(int(first.prompt_tokens), hit, int(first.new_tokens))
                    by_action = group.set_index("action")
                    oracle = by_action.latency_s.idxmin()
                    chosen = decision.action.label
                    if chosen not in by_action.index:
                        continue
                    regrets.append(by_action.latency_s[chosen] / by_action.latency_s[oracle] - 1)
                    hits_action += chosen == oracle
                    hits_k += decision.action.k == Action.parse(oracle).k
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
    sens, exp = section(cfg.profile.sensitivity), cfg.experiment
    chosen = prompts[: sens.prompts]
    length = int(np.mean([len(p.token_ids) for p in chosen])) if chosen else 64

    def cost(n, k=0):
        return estimate_latency(table, RequestFeatures(length, 0, n), False, k, table.acceptance)

    n = sens.new_tokens
    parts = {}
    if configuration.proposer_type.has_draft_model:
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
    variants = len(JOINT_STRATEGIES) + (configuration.proposer_type.has_draft_model and bool(cfg.cache.reuse_draft))
    count = len(JOINT_SCENARIOS) * variants * sens.reuse_prompts * sens.reuse_repeats
    parts["reuse_output_length"] = (count * len(sens.reuse_output_lengths),
                                    count * sum(cost(m) for m in sens.reuse_output_lengths))
    return parts


def run_sensitivity(cfg: DictConfig) -> None:
    layout = run_layout(cfg)
    out_dir = layout.sensitivity_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    sens: SensitivitySection = section(cfg.profile.sensitivity)
    marker = layout.sensitivity_complete
    if marker.exists():
        print(f"sensitivity: already complete ({marker}); delete that file to measure again", flush=True)
        return
    shards: ShardOptions = section(cfg.study)
    if shards.merge_only:
        merge_sensitivity(cfg)
        return
    if shards.num_shards > 1:
        run_sensitivity_shard(cfg, shards)
        return
    tables, parts = {}, {}
    for configuration in configurations(cfg):
        engine = engine_for(cfg, configuration)
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
        if configuration.proposer_type.has_draft_model:  # the controlled proposer pays a draft model's cost
            parts.setdefault("controlled", []).extend(controlled_rows(
                configuration.name, engine, table, prompts[: sens.prompts], new_tokens=sens.new_tokens,
                repeats=sens.repeats, alphas=sens.controlled_alphas, ks=cfg.experiment.controlled_k,
                tick=bar.update))
        parts.setdefault("cache_budget", []).extend(budget_rows(sens, cfg.seed, configuration.name, engine, prompts,
                                                                bar.update))
        for key, rows in factor_rows(sens, configuration.name, engine, controller, prompts, bar.update).items():
            parts.setdefault(key, []).extend(rows)
        parts.setdefault("reuse_output_length", []).extend(
            reuse_length_rows(sens, configuration.name, engine, prompts, bar.update))
        bar.close()
    parts["beta_lambda"] = replay_rows(cfg, tables)
    for part, rows in parts.items():
        if rows:
            write_parquet(rows, layout.sensitivity_table(part))
    write_atomic(marker, json.dumps({"parts": sorted(parts)}))
    print(f"sensitivity: wrote {', '.join(sorted(parts))} to {out_dir}", flush=True)


# the measured panels of one configuration, each a unit of the stage run as jobs, in one process's order
UNIT_PANELS = ("controlled", "cache_budget", "factors", "reuse_output_length")
FACTOR_PARTS = ("output_length", "prompt_length", "reuse_rate")


def sensitivity_units(cfg) -> list[str]:
    """The stage's units in one process's order: `<configuration>.<panel>` (controlled only with a draft model)."""
    return [f"{c.name}.{panel}" for c in configurations(cfg) for panel in UNIT_PANELS
            if panel != "controlled" or c.proposer_type.has_draft_model]


def measure_panel(cfg, panel: str, name: str, engine, table, prompts, tick) -> dict[str, list[dict]]:
    """One unit's rows by part, as run_sensitivity measures them (the factors' controller fresh from the table)."""
    sens: SensitivitySection = section(cfg.profile.sensitivity)
    if panel == "controlled":
        return {"controlled": controlled_rows(name, engine, table, prompts[: sens.prompts], new_tokens=sens.new_tokens,
                                              repeats=sens.repeats, alphas=sens.controlled_alphas,
                                              ks=cfg.experiment.controlled_k, tick=tick)}
    if panel == "cache_budget":
        return {"cache_budget": budget_rows(sens, cfg.seed, name, engine, prompts, tick)}
    if panel == "factors":
        return factor_rows(sens, name, engine, Controller(table, controller_config(cfg)), prompts, tick)
    return {"reuse_output_length": reuse_length_rows(sens, name, engine, prompts, tick)}


def run_sensitivity_shard(cfg, shards: ShardOptions) -> None:
    """This shard's units, on the calibration job's tables (never measured nor written here)."""
    from rakv.experiments.calibrations import host, shared_table, table_digest
    from rakv.experiments.config import configuration

    folder = run_layout(cfg).stage_units("sensitivity")
    mine = units_dealt(sensitivity_units(cfg), shards.num_shards, shards.shard_index)
    todo = [unit for unit in mine if not (folder / f"{unit}.json").exists()]
    print(f"sensitivity: shard {shards.shard_index} of {shards.num_shards}: {len(todo)} of {len(mine)} units to do "
          f"({', '.join(todo) or 'none'})", flush=True)
    opened = {}
    for unit in todo:
        name, panel = unit.split(".")
        if name not in opened:
            engine = engine_for(cfg, configuration(name))
            opened = {name: (engine, shared_table(cfg.results_dir, engine),
                             [p for d in cfg.datasets for p in prompts_for(cfg, engine.encode, d)])}
        engine, table, prompts = opened[name]
        with tqdm(desc=f"sensitivity {unit}", unit="request", dynamic_ncols=True, mininterval=2) as bar:
            parts = measure_panel(cfg, panel, name, engine, table, prompts, bar.update)
        write_unit(folder, ShardUnit("sensitivity", unit, shards.shard_index, shards.num_shards,
                                     {part: len(rows) for part, rows in parts.items()}, table_digest(table), host(),
                                     table.to_json()), parts)
    print(f"sensitivity: shard {shards.shard_index} of {shards.num_shards} done; merge with study.merge_only=true "
          "once every shard is", flush=True)


def merge_sensitivity(cfg) -> None:
    """study.merge_only: every unit's rows in one process's order, the cost-model tables and the beta/lambda replay
    from the tables the units ran under; loads no model."""
    from rakv.runtime.costmodel import CostTable

    layout = run_layout(cfg)
    units = read_units(layout.stage_units("sensitivity"), "sensitivity", sensitivity_units(cfg))
    tables, digests, parts = {}, {}, {}
    for unit, (record, rows_by_part) in units.items():
        name = unit.split(".")[0]
        if digests.setdefault(name, record.calibration_digest) != record.calibration_digest:
            raise RakvError(f"sensitivity: the units of {name} ran under different calibration tables; run the "
                            "calibration job once, then every shard on its tables")
        if name not in tables:
            tables[name] = CostTable.from_json(record.table)
            curve, crossover = alpha_model_tables(cfg, name, tables[name])
            parts.setdefault("alpha_model", []).extend(curve)
            parts.setdefault("crossover", []).extend(crossover)
        for part, rows in rows_by_part.items():
            parts.setdefault(part, []).extend(rows)
    parts["beta_lambda"] = replay_rows(cfg, tables)
    for part, rows in parts.items():
        if rows:
            write_parquet(rows, layout.sensitivity_table(part))
    write_atomic(layout.sensitivity_complete, json.dumps({"parts": sorted(parts)}))
    print(f"sensitivity: merged {len(units)} units; wrote {', '.join(sorted(parts))} to {layout.sensitivity_dir}",
          flush=True)
