"""The main study (paper/main.tex, "Setup"): plan, timed runs, and a crash-safe, resumable results journal.

A *configuration* is a pair with a proposer (`conf/configuration/<name>.yaml`). For every configuration,
dataset, prompt and scenario the plan holds `sweep_repeats` *measurements* of every feasible action
(r, k) -- the oracle's data, and also the data of every fixed strategy, which is just an action
(`ar` = r0k0, `joint-k4` = r1k4) -- and `repeats` runs of the adaptive strategy (rakv-asd), whose
decisions depend on the controller's state and so are timed themselves. Nothing is timed twice under
two names:

- an action that does not reuse (r = 0) never reads the store, so it is measured once per prompt
  (under the scenario name `cold`) and stands for that action in every scenario;
- an action with k = 0 never calls the proposer, so configurations sharing a target pair measure it
  once (under the first such configuration) and share it;
- the AR reference every output is checked against is the r0k0 measurement itself.

A configuration of several proposers for one target (`proposers:` in its yaml, conf/configuration/*-all.yaml;
docs/heads.md) sweeps every (reuse, proposer, k) action, labelled `heads:r0k4`, each proposer within the k it can
offer, and k = 0 once (it runs no proposer); its rakv-asd runs choose (reuse, proposer, k) per request
(rakv.runtime.strategies.run_choosing_proposer, one controller per proposer, each from its own calibration), and
every such row journals all the proposers' learnt state (`choice_state`), so a resumed study decides as before.

Runs execute in a shuffled order (seed recorded). Each starts from a defined store state: the
scenario's warm-up prompts are prefilled once, the store is snapshotted, and every run of that
(prompt, scenario) restores the snapshot (no warm-up prefill is replayed per run). Each finished run
is appended to a JSONL journal and fsynced, so a run killed at any moment loses at most the run in
flight; rerunning skips what is done and resumes the controller's exact state. The Parquet table is
written from the journal atomically (temp file + rename). rakv.experiments.oracle expands the measurements back
to one row per (configuration, scenario, action, repeat).

On a cluster (docs/cluster.md) the study is a set of independent jobs: the calibration job writes the cost tables,
each shard reads them (never writes) and records the table's digest and its host in every row, and with
`study.learning=per_block` the controller's state is learned per block of prompts from that block's runs alone, in
the order the seed fixes, so shards (whole blocks) decide exactly as one process does. Every shard writes the whole
plan (plan.json); the merge reads the plan and the journals only, and loads no model.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from tqdm import tqdm

from rakv.experiments.calibrations import host, shared_table, table_digest
from rakv.experiments.config import (
    Configuration,
    configurations,
    controller_config,
    cost_table_for,
    engine_for,
    prompts_for,
    run_layout,
)
from rakv.experiments.metadata import CalibrationKey, MachineLoad, study_metadata, write_run_metadata
from rakv.experiments.records import Journal, exclusive, write_atomic, write_parquet
from rakv.experiments.schema import ShardOptions, StudySection, section
from rakv.runtime.actions import ADAPTIVE, Action
from rakv.runtime.cache import DraftPart, PrefixKVStore
from rakv.runtime.calibration import calibration_key
from rakv.runtime.controller import Controller, ProposerChoice
from rakv.runtime.costmodel import RequestFeatures
from rakv.runtime.engine import Engine, RequestResult
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import read_record, to_json, write_record
from rakv.runtime.run_layout import StudyLayout
from rakv.runtime.strategies import action_of, run_choosing_proposer, run_strategy
from rakv.runtime.workloads import Prompt, build_scenario

COLD = "cold"  # the scenario name under which actions that never read the store are measured

# ---------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class PlannedRun:
    configuration: str
    dataset: str
    prompt_id: str
    scenario: str
    kind: str  # "strategy" (rakv-asd) or "sweep" (one measurement of an action)
    strategy: str  # rakv-asd; for a sweep run the action label (r1k4)
    repeat: int

    @property
    def run_id(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=10).hexdigest()


def sweep_actions(controller: Controller, prompt_tokens: int, hit, new_tokens: int) -> list[Action]:
    return controller.feasible_actions(RequestFeatures.from_hit(prompt_tokens, hit, new_tokens), hit)


def offered_actions(controller: Controller, choice: ProposerChoice | None, prompt_tokens: int, hit, new_tokens: int,
                    fixed: list[Action]) -> list[Action]:
    """The actions a scenario's sweep measures: the controller's feasible ones and the fixed strategies' (r = 1 read
    as r = 0 without a hit); with several proposers (`choice`) each proposer's, qualified with its name (`heads:r0k4`)
    and within the k it can offer, k = 0 unqualified (it runs no proposer: measured once)."""
    here = [Action(a.reuse and hit.is_hit, a.k) for a in fixed]
    if choice is None:
        return sweep_actions(controller, prompt_tokens, hit, new_tokens) + here
    offered = []
    for name, own in choice.controllers.items():
        limit = choice.max_k.get(name)
        offered += [a.of_proposer(name) for a in sweep_actions(own, prompt_tokens, hit, new_tokens) + here
                    if limit is None or a.k <= limit]
    return offered


def measured_as(action: Action, scenario: str) -> str:
    """The scenario under which an action's measurement is taken: its own if it reads the store, else cold."""
    return scenario if action.reuse else COLD


def donor_of(chosen: list[Prompt], index: int) -> tuple[int, ...]:
    """The prompt whose tokens extend or diverge from prompt `index` in its scenarios: the next one drawn."""
    return chosen[(index + 1) % len(chosen)].token_ids


def plan_runs(grid: StudySection, design, configuration: Configuration, prompts: dict[str, list[Prompt]],
              controller: Controller, engine: Engine, measure_k0: bool = True,
              choice: ProposerChoice | None = None) -> list[PlannedRun]:
    """Every run of one configuration. The sweep's actions: the controller's feasible ones (its own rule),
    the fixed strategies' actions, and r0k0 (the AR reference). `design`: the experiment's strategies and scenarios
    (conf/experiment/main_study.yaml). `measure_k0=False` when an earlier configuration with the same pair
    measures the k = 0 actions; `choice`: a configuration's several proposers (offered_actions)."""
    runs = []
    strategies = list(design.strategies)
    fixed = [action_of(s) for s in strategies if s != ADAPTIVE]
    for dataset, chosen in prompts.items():
        for index, prompt in enumerate(chosen):
            donor = donor_of(chosen, index)
            measured = {(COLD, Action(False, 0))}
            for scenario_name in design.scenarios:
                scenario = build_scenario(scenario_name, prompt.token_ids, donor)
                hit = hit_after_warmups(engine, scenario, prompt)
                for repeat in range(grid.repeats):
                    if ADAPTIVE in strategies:
                        runs.append(PlannedRun(configuration.name, dataset, prompt.id, scenario_name, "strategy",
                                               ADAPTIVE, repeat))
                offered = offered_actions(controller, choice, len(prompt.token_ids), hit, grid.new_tokens, fixed)
                measured |= {(measured_as(a, scenario_name), a) for a in offered}
            for scenario_name, action in sorted(measured, key=lambda m: (m[0], m[1])):
                if action.k == 0 and not measure_k0:
                    continue
                for repeat in range(grid.sweep_repeats):
                    runs.append(PlannedRun(configuration.name, dataset, prompt.id, scenario_name, "sweep",
                                           action.label, repeat))
    return runs


def hit_after_warmups(engine: Engine, scenario, prompt: Prompt):
    """What the store would offer the prompt in this scenario: computed on token ids alone, without a model."""
    store = PrefixKVStore(budget_bytes=engine.store.budget_bytes)
    ns, draft = engine.namespace(None), engine.draft_key
    for warm in scenario.warmups:  # placeholder tensors: only the token ids matter for matching
        placeholder = [(torch.zeros(1, 1, len(warm), 1),) * 2]
        store.insert(ns, np.asarray(warm), placeholder, torch.zeros(1),
                     draft=DraftPart(draft, placeholder) if draft is not None else None)
    return store.peek(ns, np.asarray(prompt.token_ids), draft)


def predicted_seconds(controller: Controller, engine: Engine, planned: PlannedRun, prompt: Prompt, scenario,
                      new_tokens: int, choice: ProposerChoice | None = None) -> float:
    """Wall time of one planned run's request from the cost tables (rakv-asd as the action it would choose now;
    with several proposers the least estimate of their actions, without deciding: no controller state moves)."""
    hit = hit_after_warmups(engine, scenario, prompt)
    features = RequestFeatures.from_hit(len(prompt.token_ids), hit, new_tokens)
    if choice is not None:
        if planned.strategy == ADAPTIVE:
            return min(choice_controller(choice, a, controller).predict(features, a)
                       for a in offered_actions(controller, choice, len(prompt.token_ids), hit, new_tokens, []))
        action = action_of(planned.strategy)
        return choice_controller(choice, action, controller).predict(features, action)
    if planned.strategy == ADAPTIVE:
        return controller.decide(len(prompt.token_ids), hit, new_tokens).predicted_latency_s
    return controller.predict(features, action_of(planned.strategy))


def choice_controller(choice: ProposerChoice, action: Action, default: Controller) -> Controller:
    """The controller that prices `action`: its proposer's (k = 0: the configuration's own)."""
    return choice.controllers[action.proposer] if action.proposer else default


def predicted_setup_seconds(controller: Controller, scenarios) -> float:
    """The one-time warm-up prefills that build the store snapshots of `scenarios`."""
    table = controller.table
    return sum(table.target_prefill(len(w)) + table.target_step(len(w)) for s in scenarios for w in s.warmups)


def format_duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def describe_plan(runs: list[PlannedRun]) -> str:
    lines = [f"plan: {len(runs)} timed runs "
             f"({sum(s.kind == 'strategy' for s in runs)} rakv-asd runs + {sum(s.kind == 'sweep' for s in runs)} "
             "action measurements; fixed strategies are read from the measurements of their actions)"]
    for factor in ("configuration", "dataset", "scenario", "kind", "strategy", "repeat"):
        counts = Counter(getattr(s, factor) for s in runs)
        lines.append(f"  {factor:<13} " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=str)))
    lines.append(f"  prompts       {len({(s.dataset, s.prompt_id) for s in runs})}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Running


def output_hash(tokens: list[int]) -> str:
    return hashlib.blake2b(json.dumps(tokens).encode(), digest_size=8).hexdigest()


def reset_store(engine: Engine, warmups) -> None:
    """A defined store state before a timed request: empty, then the scenario's warm-ups replayed (untimed); with a
    draft model the warm-ups run it too (k = 1 and one new token: the draft prefills, nothing is verified), so with
    draft reuse their entries carry the draft's state as a speculating earlier request's would, and without it the
    draft is as recently used as with it."""
    engine.store.clear()
    warm_action = Action(False, 1 if engine.proposer_type.has_draft_model else 0)
    for warm in warmups:
        engine.run(list(warm), warm_action, 1, ignore_eos=True)


def timed_run(engine: Engine, controller: Controller | ProposerChoice, planned: PlannedRun, prompt: Prompt,
              snapshot, new_tokens: int) -> RequestResult:
    """One timed request from a defined store state: the scenario's snapshot restored (no model work). With several
    proposers (`controller` a ProposerChoice) rakv-asd chooses the proposer too, and a sweep's `heads:r0k4` runs that
    proposer, priced by its controller."""
    engine.store.restore(snapshot)
    ids = list(prompt.token_ids)
    if isinstance(controller, ProposerChoice):
        if planned.strategy == ADAPTIVE:
            return run_choosing_proposer(engine, controller, ids, new_tokens, ignore_eos=True)
        action = action_of(planned.strategy)
        own = controller.controllers[action.proposer or engine.proposer]
        return run_strategy(engine, planned.strategy, ids, new_tokens, controller=own, ignore_eos=True)
    return run_strategy(engine, planned.strategy, ids, new_tokens, controller=controller, ignore_eos=True)


def result_row(planned: PlannedRun, configuration: Configuration, prompt: Prompt, scenario, result: RequestResult,
               order: int, seed: int, calibration_digest: str | None = None) -> dict:
    """One journal row; `calibration_digest`: the digest of the cost table the run was decided under. With several
    proposers its `action` names the proposer that ran (`heads:r0k4`; k = 0 as `r0k0`)."""
    row = {"run_id": planned.run_id, **asdict(planned), "pair": configuration.pair, "proposer": configuration.proposer,
            "precision": configuration.precision,  # the target's: k = 0 actions and AR are shared within one precision
            "length_bin": prompt.length_bin, "reuse_rate_target": scenario.reuse_rate_target,
            "reuse_rate": result.hit_tokens / result.prompt_tokens if result.reuse else 0.0,
            **{k: v for k, v in result.to_row().items() if k != "strategy"},
            "output_hash": output_hash(result.token_ids), "order": order, "seed": seed,
            "calibration_digest": calibration_digest, "host": host()}
    if configuration.chooses_proposer:
        row["action"] = Action(result.reuse, result.k, result.proposer if result.k else "").label
    return row


PER_CONFIGURATION, PER_BLOCK = "per_configuration", "per_block"  # study.learning (rakv.experiments.schema)


@dataclass
class PreparedConfiguration:
    """One configuration ready to run: its engine, controller, prompts, whole plan and this shard's share.

    `controller` plans and, with study.learning=per_configuration, decides every rakv-asd run; with per_block each
    block of `block_prompts` prompts of a dataset has its own controller (`controller_for`), started from the same
    table and learning only from its block's runs."""

    configuration: Configuration
    engine: Engine
    controller: Controller
    prompts: dict[str, list[Prompt]]
    runs: list[PlannedRun]
    mine: list[PlannedRun]  # this shard's runs, in the shuffled execution order
    snapshots: dict = field(default_factory=dict)  # (dataset, prompt id, scenario) -> store snapshot
    shuffled: list[PlannedRun] = field(default_factory=list)  # every run, in the seeded execution order
    learning: str = PER_CONFIGURATION
    block_prompts: int = 1
    digest: str | None = None  # the cost table's (rakv.experiments.calibrations.table_digest)
    controllers: dict = field(default_factory=dict)  # block -> its controller (per_block)
    choice: ProposerChoice | None = None  # several proposers: one controller each (`controller` is the first's)

    def block_of(self, dataset: str, prompt_id: str) -> tuple | None:
        """The learning block of a prompt: (configuration, dataset, its index // block_prompts); None when one
        controller learns across the configuration (per_configuration)."""
        if self.learning != PER_BLOCK:
            return None
        index = next(i for i, p in enumerate(self.prompts[dataset]) if p.id == prompt_id)
        return self.configuration.name, dataset, index // self.block_prompts

    def blocks(self) -> dict[tuple, int]:
        """Every block of the plan with its number of runs, in the plan's order."""
        return dict(Counter(self.block_of(r.dataset, r.prompt_id) for r in self.runs))

    def controller_for(self, planned: PlannedRun, rows: list[dict]) -> Controller | ProposerChoice:
        """The controller that decides `planned` (with several proposers, their ProposerChoice): the
        configuration's, or its block's, which starts from the table(s) and resumes from the block's last journaled
        state among `rows` (a resumed shard decides as an uninterrupted one)."""
        block = self.block_of(planned.dataset, planned.prompt_id)
        if block is None:
            return self.choice or self.controller
        if block not in self.controllers:
            mine = [r for r in rows if r["configuration"] == self.configuration.name
                    and self.block_of(r["dataset"], r["prompt_id"]) == block]
            if self.choice is not None:
                fresh = ProposerChoice.of({n: c.table for n, c in self.choice.controllers.items()},
                                          self.controller.config, self.choice.max_k)
                resume_choice(fresh, mine)
                self.controllers[block] = fresh
            else:
                controller = Controller(self.controller.table, self.controller.config)
                resume(controller, mine)
                self.controllers[block] = controller
        return self.controllers[block]

    def prompt_and_donor(self, planned: PlannedRun) -> tuple[Prompt, tuple[int, ...]]:
        chosen = self.prompts[planned.dataset]
        index = next(i for i, p in enumerate(chosen) if p.id == planned.prompt_id)
        return chosen[index], donor_of(chosen, index)


    def snapshot(self, planned: PlannedRun, scenario) -> list:
        """The store state of this (prompt, scenario): its warm-ups prefilled once (untimed), then reused."""
        key = (planned.dataset, planned.prompt_id, planned.scenario)
        if key not in self.snapshots:
            reset_store(self.engine, scenario.warmups)
            self.snapshots[key] = self.engine.store.snapshot()
        return self.snapshots[key]


def prepare(cfg: DictConfig, configuration: Configuration, measure_k0: bool = True) -> PreparedConfiguration:
    """One configuration's engine, controller and plan. A sharded study reads the calibration job's table (never
    measures or writes one); one process calibrates when the table is missing or stale, as the calibrate stage
    does. `mine` is every run here; `assign_blocks` narrows it to a shard's blocks."""
    engine = engine_for(cfg, configuration)
    shards: ShardOptions = section(cfg.study)
    tables = {name: (shared_table(cfg.results_dir, engine.with_proposer(name)) if shards.num_shards > 1
                     else cost_table_for(cfg, engine.with_proposer(name)))
              for name in configuration.all_proposers}
    table = tables[configuration.proposer]
    controller, choice = Controller(table, controller_config(cfg)), None
    if configuration.chooses_proposer:
        choice = ProposerChoice.for_pair(tables, controller_config(cfg), engine.pair)
        controller = choice.controllers[configuration.proposer]
    prompts = {d: prompts_for(cfg, engine.encode, d) for d in cfg.datasets}
    runs = plan_runs(section(cfg.profile.study), cfg.experiment, configuration, prompts, controller, engine,
                     measure_k0, choice)
    order = list(range(len(runs)))
    random.Random(cfg.seed).shuffle(order)  # recorded: the seed is in every row and in metadata
    shuffled = [runs[i] for i in order]
    return PreparedConfiguration(configuration, engine, controller, prompts, runs, list(shuffled), shuffled=shuffled,
                                 learning=shards.learning, block_prompts=shards.block_prompts,
                                 digest=tables_digest(tables), choice=choice)


def tables_digest(tables: dict) -> str:
    """The digest of a configuration's cost table; of several proposers', one digest of their digests in order."""
    digests = [table_digest(t) for t in tables.values()]
    if len(digests) == 1:
        return digests[0]
    return hashlib.blake2b(json.dumps(dict(zip(tables, digests))).encode(), digest_size=8).hexdigest()


def assign_blocks(prepared: list[PreparedConfiguration], num_shards: int) -> list[dict[tuple, int]]:
    """Each configuration's blocks dealt to shards: largest first, each to the shard with the fewest runs so far
    (ties to the lower index), so the shards are about equal in runs; a function of the plan alone, so every shard
    computes the same deal."""
    blocks = [(b, n, i) for i, p in enumerate(prepared) for b, n in p.blocks().items()]
    load, deal = [0] * num_shards, [{} for _ in prepared]
    for _, (block, runs, which) in sorted(enumerate(blocks), key=lambda e: (-e[1][1], e[0])):
        shard = min(range(num_shards), key=lambda s: (load[s], s))
        load[shard] += runs
        deal[which][block] = shard
    return deal


def narrow_to_shard(prepared: list[PreparedConfiguration], shards: ShardOptions) -> None:
    """Keep in each configuration's `mine` the runs of this shard's blocks, in the seeded order."""
    if shards.num_shards <= 1:
        return
    for p, deal in zip(prepared, assign_blocks(prepared, shards.num_shards)):
        p.mine = [r for r in p.shuffled if deal[p.block_of(r.dataset, r.prompt_id)] == shards.shard_index]


@dataclass(frozen=True)
class StudyPlan:
    """study/plan.json: the whole plan, written by every shard (identically) before it runs, so the merge needs
    neither models nor calibration: the planned runs, the calibration each configuration was decided under (its key
    and its digest) and the learning design."""

    runs: list[PlannedRun]
    calibration_keys: dict[str, CalibrationKey]
    calibration_digests: dict[str, str]
    learning: str
    block_prompts: int
    seed: int


def run_main_study(cfg: DictConfig, study: StudyLayout | None = None) -> Path:
    """Plan every configuration, print the plan, then execute (or resume) the runs; returns the Parquet path.

    study: where the journal, plan and tables go (default results/<name>/study)."""
    study = study or run_layout(cfg).study
    study.root.mkdir(parents=True, exist_ok=True)
    shards: ShardOptions = section(cfg.study)
    with exclusive(study.lock(shards.shard_index)):
        return _run_locked(cfg, study, shards)


def merge_study(cfg: DictConfig, study: StudyLayout, load_before) -> Path:
    """study.merge_only: the shards' journals into runs.parquet from plan.json and the journals alone (no model is
    loaded, nothing is calibrated)."""
    plan: StudyPlan = read_record(StudyPlan, study.plan_record, "run the study's shards first")
    write_atomic(study.plan, describe_plan(plan.runs) + "\n")
    load = MachineLoad(list(load_before), list(os.getloadavg()), os.cpu_count())
    return finalize(cfg, study, plan.runs, {name: to_json(key) for name, key in plan.calibration_keys.items()}, load)


def _run_locked(cfg: DictConfig, study: StudyLayout, shards: ShardOptions) -> Path:
    load_before = os.getloadavg()
    if shards.merge_only:
        return merge_study(cfg, study, load_before)
    shard, count = shards.shard_index, shards.num_shards
    grid: StudySection = section(cfg.profile.study)
    journal = Journal(study.shard_journal(shard, count))
    chosen = configurations(cfg)
    # k = 0 actions: measured by the first configuration per pair and target precision (another precision's are
    # other prices)
    first_of_pair = {(c.pair, c.precision): c.name for c in reversed(chosen)}
    prepared = [prepare(cfg, c, measure_k0=first_of_pair[(c.pair, c.precision)] == c.name) for c in chosen]
    narrow_to_shard(prepared, shards)
    all_runs = [planned for p in prepared for planned in p.runs]
    calibrations = {p.configuration.name: (p.controller.table.key if count > 1 else  # the shared table's key
                                           calibration_key(p.engine.pair, p.engine.proposer)) for p in prepared}
    write_record(StudyPlan(all_runs, {n: CalibrationKey.of(k) for n, k in calibrations.items()},
                           {p.configuration.name: p.digest for p in prepared}, shards.learning,
                           shards.block_prompts, cfg.seed), study.plan_record)
    plan = describe_plan(all_runs)
    planned_ids = {s.run_id for s in all_runs}
    stray = [r for r in journal.rows if r["run_id"] not in planned_ids]
    if stray:
        raise RakvError(f"{journal.path} holds {len(stray)} runs of a different plan; "
                        "use another results_dir or remove the old results")
    todo = {p.configuration.name: [s for s in p.mine if s.run_id not in journal.done] for p in prepared}
    expected = sum(predicted_wall_seconds(p, todo[p.configuration.name], grid.new_tokens) for p in prepared)
    plan += (f"\n  this shard: {sum(map(len, todo.values()))} runs to do; expected wall time "
             f"{format_duration(expected)} (predicted from the cost tables)")
    print(plan, flush=True)
    write_atomic(study.plan, plan + "\n")
    for p in prepared:
        name = p.configuration.name
        print(f"{name}: {len(p.mine)} runs planned here, {len(p.mine) - len(todo[name])} already done", flush=True)
        if todo[name]:
            _execute(grid, max(cfg.controller.k_set), cfg.seed, p, todo[name], journal)
    load = MachineLoad(list(load_before), list(os.getloadavg()), os.cpu_count())
    return finalize(cfg, study, all_runs, calibrations, load)


def scenario_of(p: PreparedConfiguration, planned: PlannedRun):
    prompt, donor = p.prompt_and_donor(planned)
    return prompt, build_scenario(planned.scenario, prompt.token_ids, donor)


def predicted_wall_seconds(p: PreparedConfiguration, runs: list[PlannedRun], new_tokens: int) -> float:
    """The runs' requests plus the one-time warm-ups that build their store snapshots, from the cost tables."""
    total, scenarios = 0.0, {}
    for planned in runs:
        prompt, scenario = scenario_of(p, planned)
        scenarios[planned.dataset, planned.prompt_id, planned.scenario] = scenario
        total += predicted_seconds(p.controller, p.engine, planned, prompt, scenario, new_tokens, p.choice)
    return total + predicted_setup_seconds(p.controller, scenarios.values())


def _execute(grid: StudySection, k_max: int, seed: int, p: PreparedConfiguration, todo: list[PlannedRun],
             journal: Journal) -> None:
    """The runs of one configuration still to do, after `grid.model_warmup_requests` untimed requests at r = 1 and
    the controller's largest k (`k_max`); `seed`: the run's, recorded in every row."""
    engine, controller = p.engine, p.controller
    first = next(iter(p.prompts.values()))[0]
    for _ in range(grid.model_warmup_requests):  # warm kernels and allocator before timing
        engine.run(list(first.token_ids), Action(True, k_max), grid.new_tokens, ignore_eos=True)
    if p.learning != PER_BLOCK:
        rows = [r for r in journal.rows if r["configuration"] == p.configuration.name]
        if p.choice is not None:
            resume_choice(p.choice, rows)
        else:
            resume(controller, rows)
    position = {s.run_id: i for i, s in enumerate(p.mine)}
    for planned in tqdm(todo, desc=f"study {p.configuration.name}", unit="run", dynamic_ncols=True, mininterval=2):
        prompt, scenario = scenario_of(p, planned)
        deciding = p.controller_for(planned, journal.rows)
        result = timed_run(engine, deciding, planned, prompt, p.snapshot(planned, scenario), grid.new_tokens)
        row = result_row(planned, p.configuration, prompt, scenario, result, position[planned.run_id], seed, p.digest)
        if isinstance(deciding, ProposerChoice) and planned.strategy == ADAPTIVE:
            row["choice_state"] = json.dumps(deciding.state)
        journal.append(row)


def resume(controller: Controller, rows: list[dict]) -> None:
    """Continue `controller` exactly where the journaled `rows` it decided (in their `order`) left it."""
    states = [r for r in sorted(rows, key=lambda r: r["order"]) if r.get("ewma_accepted") is not None]
    if states:
        last = states[-1]
        by_match = last.get("ewma_by_match")
        controller.restore((last["ewma_accepted"], last["ewma_rejected"], last.get("ewma_matched")),
                           json.loads(by_match) if by_match else None, len(states))


def resume_choice(choice: ProposerChoice, rows: list[dict]) -> None:
    """Continue a choice among several proposers where the journaled `rows` it decided left every proposer's
    controller (each row of rakv-asd holds all of their states: `choice_state`)."""
    states = [r for r in sorted(rows, key=lambda r: r["order"]) if r.get("choice_state")]
    if states:
        choice.restore(json.loads(states[-1]["choice_state"]))


def mark_equal_to_ar(rows: list[dict]) -> None:
    """Set `equal_to_ar` on every row: its output against its pair's r0k0 measurement of the same prompt at the
    same target precision (the AR reference, computed once as a measurement); the r0k0 repeats must agree with each
    other."""
    reference: dict[tuple, set] = {}

    def pair_of(row: dict) -> str:
        precision = row.get("precision", "fp32")
        return row["pair"] if precision == "fp32" else f"{row['pair']}@{precision}"

    for row in rows:
        if row["kind"] == "sweep" and row["strategy"] == Action(False, 0).label:
            reference.setdefault((pair_of(row), row["dataset"], row["prompt_id"]), set()).add(row["output_hash"])
    for key, hashes in reference.items():
        if len(hashes) > 1:
            raise RakvError(f"the AR (r0k0) runs of {'/'.join(key)} disagree with each other: "
                            "greedy decoding is not deterministic here")
    for row in rows:
        key = (pair_of(row), row["dataset"], row["prompt_id"])
        if key not in reference:
            raise RakvError(f"no r0k0 (AR) measurement of {'/'.join(key)} to check outputs against")
        row["equal_to_ar"] = row["output_hash"] in reference[key]


def finalize(cfg, study: StudyLayout, runs: list[PlannedRun], calibrations: dict, load: MachineLoad) -> Path:
    """Merge every shard's journal into runs.parquet once all planned runs are present."""
    rows, seen = [], set()
    for path in study.journals():
        for row in Journal(path).rows:
            if row["run_id"] not in seen:
                seen.add(row["run_id"])
                rows.append(row)
    planned_ids = {s.run_id for s in runs}
    missing = planned_ids - seen
    if missing:
        print(f"study: {len(missing)} of {len(planned_ids)} planned runs still missing (other shards?); "
              "rerun to complete or merge later", flush=True)
        return study.runs
    rows = [r for r in rows if r["run_id"] in planned_ids]
    tables = {}
    for row in rows:  # rows of older journals have no digest
        if row.get("calibration_digest") is not None:
            tables.setdefault(row["configuration"], set()).add(row["calibration_digest"])
    mixed = sorted(name for name, digests in tables.items() if len(digests) > 1)
    if mixed:
        raise RakvError(f"the runs of {', '.join(mixed)} were decided under different calibration tables "
                        "(calibration_digest): run the calibration job once, then every shard on its tables")
    mark_equal_to_ar(rows)
    path = study.runs
    frame = write_parquet(rows, path)
    write_run_metadata(study_metadata(cfg, calibrations, len(frame), describe_plan(runs), load), study)
    strategy_rows = frame[frame.kind == "strategy"]
    unequal = int((~frame.equal_to_ar).sum())
    print(f"study: {len(frame)} runs in {path}; strategy runs equal to AR: "
          f"{int(strategy_rows.equal_to_ar.sum())}/{len(strategy_rows)}; all runs equal to AR: "
          f"{len(frame) - unequal}/{len(frame)}", flush=True)
    if unequal:
        raise RakvError(f"{unequal} runs produced output different from AR greedy decoding (equal_to_ar = false)")
    return path
