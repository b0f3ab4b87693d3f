"""The serving study (stage `serving`): traces served under each policy, at several rates, several times.

The design is conf/experiment/serving.yaml (families of policies, each a set of `rakv serve` options over a base,
the baselines each goal names, the equivalence margins, the SLOs in steps) and the profile's `serving` section (the
default configuration, trace sizes, rates per family, repeats):

- chunking: an interference trace (short requests, every Nth a ~1,000-token prompt) under no chunking, fixed token
  budgets and the batch cost model's per-iteration budget under the ITL SLO;
- speculation (prompt lookup) and speculation-draft (the draft model): a structured-output trace under k = 0, a
  fixed k, vLLM's disable-by-batch-size, SmartSpec's goodput rule and RAKV-ASD under load;
- acceptance: a multi-turn trace under rakv-asd (per-round depth off, so a request's k follows its acceptance at
  admission) with the global EWMA or the prefix-keyed acceptance.

SLOs are multiples of this machine's calibrated one-request decode step (the batch cost table's one-row pass at
`SLO_CONTEXT` positions), so the same design asks the same of a faster or slower machine; they, every goal the
design names and each goal's minimum detectable difference from a pilot run at the profile's repeats
(`profile.serving.pilot`, rakv.experiments.serving_power.goal_power: "underpowered" where it exceeds the goal's
margin, with the repeats that would power it) are written to plan.txt before the first run.

A cell is (family, rate, policy); every repeat draws its own trace per (family, rate) from the family's generator
(seeded by the repeat, `trace_seed`) and serves it under each policy: the (family, rate) groups of one repeat in a
seeded shuffled order, and within a group its policies back to back in a shuffled order (paired policies serve the
same trace minutes apart at most, so machine drift does not favour one), each run with an empty prefix store and a
fresh controller. The repeats' spread is thus the workload's as well as the clock's. A finished run is a folder
`cells/<family>/<rate>/<policy>/r<repeat>/` with
`complete.json` written last (atomically): a rerun skips those and redoes a run that was interrupted. At the end
`requests.parquet` (one row per served request, with whether its output equals the trace's batch-one greedy AR
output) and `cells.parquet` (one row per run: its summary.json) and `iterations.parquet` (every iteration's
features, measured and predicted time) are written. Traces are in `traces/`; the batch cost table used in
`batch_cost-<configuration>.json`.

As jobs (docs/cluster.md: `study.num_shards`, `study.shard_index`, `study.merge_only`, the study's keys): the
calibrate stage writes the cost and batch cost tables (`calibrate_serving`), each shard serves whole (repeat,
family, rate) groups (every policy of a trace on one machine, back to back, as in one process) on those tables,
never measuring or writing one, and the merge builds the tables from the finished runs and the kept tables alone.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from rakv.experiments.calibrations import shared_table
from rakv.experiments.config import configuration, cost_table_for, engine_for, noise_gate, run_layout
from rakv.experiments.metadata import serving_metadata, write_serving_metadata
from rakv.experiments.records import exclusive, write_atomic, write_parquet
from rakv.experiments.schema import ServingSection, ShardOptions, section
from rakv.experiments.serving_runs import StudyRunSummary, read_study_run
from rakv.runtime.actions import Action
from rakv.runtime.calibration import calibration_key, load_table, precision_of
from rakv.runtime.costmodel import RequestFeatures, acceptance_estimate, estimate_latency, read_cost_table
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import read_record, to_json
from rakv.runtime.proposers import Proposer
from rakv.runtime.run_layout import ServedRunLayout, ServingStudyLayout
from rakv.runtime.workloads import dataset_texts
from rakv.serving.batchcost import BatchCost, batch_cost_key, load_or_calibrate_batch, read_batch_cost
from rakv.serving.records import RequestRecord, read_iterations, read_records
from rakv.serving.replay import lookup_rounds, outputs_alone
from rakv.serving.server import CONF_FIELDS, ServeOptions, serve, serve_parts
from rakv.serving.trace import TRACE_FLAGS, generate_trace, read_trace, write_trace

OPTION_FIELDS = CONF_FIELDS  # the serve options a policy may set: conf/serving's
SLO = "slo"  # a policy's `itl_slo_ms: slo`: the study's ITL SLO on this machine (slo_steps.itl decode steps)
SLO_CONTEXT = 256  # positions of the one-request decode step the SLOs are multiples of


def family_configuration(cfg: DictConfig, family: str) -> str:
    """The configuration a family is served on: the profile's `family_configuration` entry, else its `configuration`."""
    grid: ServingSection = section(cfg.profile.serving)
    return grid.family_configuration.get(family) or grid.configuration


def cells(cfg: DictConfig) -> list[dict]:
    """Every (family, rate, policy) of the design with its serve options, in the design's order."""
    plan, grid = cfg.experiment, section(cfg.profile.serving)
    out = []
    for family, spec in plan.families.items():
        if family not in grid.rates:
            continue  # a profile may leave a family out
        base = {**{f: cfg.serving[f] for f in OPTION_FIELDS if f in cfg.serving},
                **OmegaConf.to_container(spec.base, resolve=True)}
        for rate in grid.rates[family]:
            for policy, overrides in spec.policies.items():
                options = {**base, **OmegaConf.to_container(overrides, resolve=True)}
                out.append({"family": family, "rate": float(rate), "policy": policy, "options": options,
                            "configuration": family_configuration(cfg, family)})
    return out


def slos_of(cfg: DictConfig, step_s: float) -> dict[str, float]:
    """The study's SLOs in ms on this machine: the design's multiples of the one-request decode step `step_s`."""
    steps = cfg.experiment.slo_steps
    return {name: float(steps[name]) * step_s * 1e3 for name in ("itl", "ttft", "tpot")}


def decode_step_s(batch_cost) -> float:
    """The calibrated one-request decode step (no speculation) at SLO_CONTEXT positions."""
    return float(batch_cost.decode_s([(1, SLO_CONTEXT)], [0]))


def family_controller(cfg: DictConfig, family: str):
    """The controller configuration for a family: conf's controller group with the family's `controller:` overrides."""
    from rakv.runtime.controller import ControllerConfig

    overrides = _plain(cfg.experiment.families[family].get("controller"))
    return ControllerConfig.from_conf({**_plain(cfg.controller), **overrides})


def validate_serving(cfg: DictConfig) -> None:
    """The design's options through ServeOptions' own checks, before any model work."""
    if cfg.profile.serving is None:  # the schema's default: a profile without the section
        raise RakvError(f"profile {cfg.profile.name} has no serving section")
    grid: ServingSection = section(cfg.profile.serving)
    for where, settings in [("trace", grid.trace), *((f"family_trace.{f}", s) for f, s in grid.family_trace.items())]:
        unknown = sorted(set(settings) - set(TRACE_FLAGS))  # generate_trace's keywords (rakv.serving.trace)
        if unknown:
            raise RakvError(f"profile.serving.{where}: unknown trace setting(s) {', '.join(unknown)}; the "
                            f"settings: {', '.join(TRACE_FLAGS)}")
    if grid.repeats < 1 or grid.requests < 1:
        raise RakvError("profile.serving: repeats and requests must be >= 1")
    unknown = sorted(set(grid.rates) - set(cfg.experiment.families))
    if unknown:
        raise RakvError(f"profile.serving.rates names families the design lacks: {', '.join(unknown)}")
    for family in grid.rates:
        configuration(family_configuration(cfg, family))  # a one-line error for an unknown name
        family_controller(cfg, family)
        for metric, value in (cfg.experiment.families[family].get("margins") or {}).items():
            if metric not in ("goodput", "ttft") or not 0 < float(value) < 1:
                raise RakvError(f"serving design: {family}.margins.{metric}: a relative margin of goodput or ttft "
                                f"in (0, 1), not {value}")
        named = cfg.experiment.families[family].get("goals") or {}
        policies = set(cfg.experiment.families[family].policies)
        for role, value in named.items():
            for name in ([value] if isinstance(value, str) else list(value)):
                if name not in policies:
                    raise RakvError(f"serving design: {family}.goals.{role} names '{name}', not one of its policies")
    for cell in cells(cfg):
        options = cell["options"]
        unknown = sorted(set(options) - set(OPTION_FIELDS))
        if unknown:
            raise RakvError(f"serving policy {cell['family']}/{cell['policy']}: unknown option(s) {', '.join(unknown)}")
        if cell["rate"] <= 0:
            raise RakvError(f"profile.serving.rates.{cell['family']}: rates must be positive")
        options_of(cfg, cell, slo_ms=1.0)  # ServeOptions' own checks


def options_of(cfg: DictConfig, cell: dict, slo_ms: float, **extra) -> ServeOptions:
    """A cell's options: conf/serving's, the family's base and the policy's overrides (cells), EOS ignored, the
    study's ITL SLO (`slo_ms`) where a policy asks for it."""
    options = dict(cell["options"])
    if options.get("itl_slo_ms") == SLO:
        options["itl_slo_ms"] = slo_ms
    chosen = configuration(cell["configuration"])
    if chosen.chooses_proposer:  # rakv-asd chooses the proposer per request among the configuration's
        options.setdefault("proposers", chosen.all_proposers)
    return ServeOptions.from_config(cfg.serving, **options, ignore_eos=True, **extra)


def cell_dir(out: ServingStudyLayout, cell: dict, repeat: int) -> ServedRunLayout:
    return out.served_run(cell["family"], cell["rate"], cell["policy"], repeat)


@dataclass(frozen=True)
class RunComplete:
    """A served cell's complete.json, written last: its repeat is not served again on resume."""
    wall_s: float


def read_complete(run: ServedRunLayout) -> RunComplete:
    return read_record(RunComplete, run.complete)


def trace_seed(seed: int, repeat: int) -> int:
    """The seed of a repeat's traces: each repeat draws its own trace from the family's generator, so the repeats'
    spread includes trace-to-trace variation (the policies of one repeat still serve the same trace: paired)."""
    return seed + 1000 * repeat


def trace_for(cfg: DictConfig, out: ServingStudyLayout, family: str, rate: float, repeat: int) -> Path:
    """The family's trace at `rate` for `repeat` (generated once, seeded by trace_seed; the same for every policy
    of the repeat)."""
    path = out.trace(family, rate, repeat)
    if path.exists():
        return path
    grid: ServingSection = section(cfg.profile.serving)
    spec = cfg.experiment.families[family]
    settings = {**_plain(cfg.serving.trace), **_plain(spec.trace),
                "requests": grid.requests, "max_new_tokens": grid.max_new_tokens, "prompt_words": grid.prompt_words,
                **grid.trace, **grid.family_trace.get(family, {}), "rate": rate, "seed": trace_seed(cfg.seed, repeat)}
    texts = dataset_texts(settings.pop("dataset"))
    trace = generate_trace(texts, **settings)
    write_trace(path, trace, {"generator": "rakv.experiments.serving", "family": family, **settings})
    return path


def _plain(node) -> dict:
    """A config node (or nothing) as a plain dict, interpolations resolved."""
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


def run_serving(cfg: DictConfig) -> Path:
    validate_serving(cfg)
    out = run_layout(cfg).serving
    out.root.mkdir(parents=True, exist_ok=True)
    shards: ShardOptions = section(cfg.study)
    with exclusive(out.lock if shards.num_shards <= 1 else out.shard_lock(shards.shard_index)):
        if shards.merge_only:
            return merge_serving(cfg, out)
        return _run(cfg, out, shards)


def serving_configurations(cfg: DictConfig) -> list[str]:
    """The configurations the profile's serving study serves on (its families' and the default)."""
    grid: ServingSection = section(cfg.profile.serving)
    return list(dict.fromkeys(family_configuration(cfg, family) for family, rates in grid.rates.items() if rates))


def calibrate_serving(cfg: DictConfig) -> None:
    """The calibration job's part for the serving study: each serving configuration's cost table (kept in the
    results folder's calibration/) and batch cost table (kept as serving/batch_cost-<configuration>.json), which
    sharded serving jobs read; nothing without a serving section."""
    if cfg.profile.get("serving") is None:
        return
    out = run_layout(cfg).serving
    out.root.mkdir(parents=True, exist_ok=True)
    for name in serving_configurations(cfg):
        chosen = configuration(name)
        engine = engine_for(cfg, chosen)
        for proposer in chosen.all_proposers:
            cost_table_for(cfg, engine.with_proposer(proposer))
        batch_cost = configuration_batch_cost(cfg, chosen, engine)
        write_atomic(out.batch_cost(name), json.dumps(batch_cost.to_json(), indent=1))
        print(f"calibration {name} (serving): batch cost table, one-request decode step "
              f"{decode_step_s(batch_cost) * 1e3:.1f} ms", flush=True)


def configuration_batch_cost(cfg: DictConfig, chosen, engine) -> BatchCost:
    """A configuration's batch cost table, measured or loaded: its engine's; of several proposers, pricing each one's
    proposals with its own step (rakv.serving.batchcost.BatchCost.with_proposers)."""
    def table(proposer):
        return load_or_calibrate_batch(engine.with_proposer(proposer), recalibrate=cfg.calibration.recalibrate,
                                       noise=noise_gate(cfg))

    batch_cost = table(engine.proposer)
    if chosen.chooses_proposer:
        batch_cost = batch_cost.with_proposers({p: table(p) for p in chosen.all_proposers[1:]})
    return batch_cost


def shared_batch_cost(out: ServingStudyLayout, name: str, engine) -> BatchCost:
    """The batch cost table the calibration job kept for configuration `name`, read only (a serving shard)."""
    path = out.batch_cost(name)
    if not path.exists():
        raise RakvError(f"{path} is missing: sharded serving jobs read the calibration tables and never write them; "
                        "run the calibration job first (scripts/run_stage.py calibrate with the same overrides)")
    table = read_batch_cost(path)
    key = batch_cost_key(engine)
    differs = [name for name in ("pair", "proposer", "method") if table.key.get(name) != key[name]]
    if differs:
        raise RakvError(f"{path} was measured for another {'/'.join(differs)}; rerun the calibration job")
    return table


def shard_of_runs(runs: list[tuple[int, dict]], shards: ShardOptions) -> list[tuple[int, dict]]:
    """This shard's runs: whole (repeat, family, rate) groups, dealt in the run order, so every policy of a trace
    is served on one machine back to back, as in one process."""
    if shards.num_shards <= 1:
        return runs
    groups = list(dict.fromkeys((repeat, cell["family"], cell["rate"]) for repeat, cell in runs))
    mine = {group for i, group in enumerate(groups) if i % shards.num_shards == shards.shard_index}
    return [(repeat, cell) for repeat, cell in runs if (repeat, cell["family"], cell["rate"]) in mine]


def merge_serving(cfg: DictConfig, out: ServingStudyLayout) -> Path:
    """study.merge_only: the tables from every finished run and the kept cost tables; loads no model."""
    grid: ServingSection = section(cfg.profile.serving)
    plan = cells(cfg)
    missing = [(r, c) for r, c in run_order(plan, grid.repeats, cfg.seed) if not cell_dir(out, c, r).complete.exists()]
    if missing:
        raise RakvError(f"{len(missing)} serving runs are not finished (other shards?); merge once every shard is "
                        "done")
    tables = {}
    for name in dict.fromkeys(c["configuration"] for c in plan):
        chosen = configuration(name)
        path = run_layout(cfg).calibration(chosen.pair, chosen.proposer, chosen.precision)
        if not path.exists():
            raise RakvError(f"{path} is missing: run the calibration job first")
        tables[name] = read_cost_table(path)
    return collect(cfg, out, tables, plan)


@dataclass
class Served:
    """What one configuration brings to the study: its engine, cost table, batch cost table and SLOs."""

    engine: object
    tables: dict  # each proposer's cost table (one, or a configuration of several proposers' in order)
    batch_cost: object
    slos_ms: dict

    @property
    def table(self):
        """The engine's own proposer's table (the first)."""
        return next(iter(self.tables.values()))


def _setup(cfg: DictConfig, out: ServingStudyLayout, name: str, shared: bool = False) -> Served:
    """One configuration's engine and tables: measured or loaded (one process), or the calibration job's (`shared`:
    a serving shard, which never writes a table)."""
    chosen = configuration(name)
    engine = engine_for(cfg, chosen)
    engines = [engine.with_proposer(p) for p in chosen.all_proposers]
    if shared:
        tables = {e.proposer: shared_table(cfg.results_dir, e) for e in engines}
        batch_cost = shared_batch_cost(out, name, engine)
        return Served(engine, tables, batch_cost, slos_of(cfg, decode_step_s(batch_cost)))
    tables = {e.proposer: _study_table(cfg, e) for e in engines}
    batch_cost = configuration_batch_cost(cfg, chosen, engine)
    write_atomic(out.batch_cost(name), json.dumps(batch_cost.to_json(), indent=1))
    return Served(engine, tables, batch_cost, slos_of(cfg, decode_step_s(batch_cost)))


def run_order(plan: list[dict], repeats: int, seed: int) -> list[tuple[int, dict]]:
    """(repeat, cell) in the order they are served: per repeat the (family, rate) groups shuffled, and within a group
    its policies back to back, shuffled (the same order whether or not earlier runs are done: resuming keeps it)."""
    rng = random.Random(seed)
    groups: dict[tuple, list[dict]] = {}
    for cell in plan:
        groups.setdefault((cell["family"], cell["rate"]), []).append(cell)
    order = []
    for repeat in range(repeats):
        keys = list(groups)
        rng.shuffle(keys)
        for key in keys:
            policies = list(groups[key])
            rng.shuffle(policies)
            order += [(repeat, cell) for cell in policies]
    return order


def _run(cfg: DictConfig, out: ServingStudyLayout, shards: ShardOptions) -> Path:
    grid: ServingSection = section(cfg.profile.serving)
    plan = cells(cfg)
    sharded = shards.num_shards > 1
    runs = shard_of_runs(run_order(plan, grid.repeats, cfg.seed), shards)
    served = {name: _setup(cfg, out, name, sharded) for name in dict.fromkeys(c["configuration"] for _, c in runs)}
    todo = [(r, c) for r, c in runs if not cell_dir(out, c, r).complete.exists()]
    if not sharded:  # a shard's plan would be its share: the merge's plan.txt is the one-process plan
        write_atomic(out.plan, _plan_text(cfg, plan, served, len(runs), len(todo)))
    print(f"serving: {len(plan)} cells x {grid.repeats} repeats = {len(runs)} runs on {', '.join(served)}, "
          f"{len(todo)} to go" + _eta(out, len(todo)), flush=True)
    references: dict = {}
    memo: dict = {}
    began, finished = time.perf_counter(), 0
    for repeat, cell in runs:
        target = cell_dir(out, cell, repeat)
        if target.complete.exists():
            continue
        shutil.rmtree(target.root, ignore_errors=True)  # an interrupted run starts over
        parts_of = served[cell["configuration"]]
        engine = parts_of.engine
        trace_path = trace_for(cfg, out, cell["family"], cell["rate"], repeat)
        trace = read_trace(trace_path)
        key = (cell["configuration"], trace_path)
        if key not in references:
            # the batch-one AR reference is the pair's (a proposer never changes a greedy output), so configurations
            # of one pair share it; a family's traces of one repeat share their prompts across rates
            pair = configuration(cell["configuration"]).pair
            references[key] = outputs_alone(engine, trace, None, ignore_eos=True, memo=memo.setdefault(pair, {}))
        started = time.perf_counter()
        engine.store.clear()
        slos = parts_of.slos_ms
        options = options_of(cfg, cell, slos["itl"], slos_ms={"ttft": slos["ttft"], "tpot": slos["tpot"]})
        parts = serve_parts(engine, options, lambda e, parts_of=parts_of: parts_of.tables[e.proposer],
                            family_controller(cfg, cell["family"]), cfg.calibration.recalibrate, progress=False,
                            batch_cost=parts_of.batch_cost)
        served_run = serve(engine, trace, target.root, options, parts, progress=False)
        reference = references[key]
        records = read_records(target.requests)
        equal = sum(r.ok and r.token_ids == reference.get(r.id) for r in records)
        run = StudyRunSummary(served_run, outputs_equal_ar=equal, family=cell["family"], rate=cell["rate"],
                              policy=cell["policy"], repeat=repeat, configuration=cell["configuration"],
                              trace=trace_path.name, wall_s=time.perf_counter() - started,
                              concurrency=mean_concurrency(records, served_run.statistics.duration_s),
                              slo_itl_ms=slos["itl"], slo_ttft_ms=slos["ttft"], slo_tpot_ms=slos["tpot"])
        write_atomic(target.served_summary, json.dumps(run.to_json(), indent=1))
        write_atomic(target.complete, json.dumps(to_json(RunComplete(run.wall_s))))
        finished += 1
        left = (len(todo) - finished) * (time.perf_counter() - began) / finished
        measured = served_run.statistics
        print(f"serving: r{repeat} {cell['family']:<17} rate {cell['rate']:<5g} {cell['policy']:<22} "
              f"{measured.output_throughput:6.1f} tok/s, p99 ITL {measured.p99_itl_ms or 0:7.1f} ms, "
              f"goodput {measured.goodput or 0:5.2f}/s, concurrency {run.concurrency:4.1f}, "
              f"equal to AR {equal}/{len(records)} "
              f"({run.wall_s:.0f} s; {finished}/{len(todo)}, about {left / 60:.0f} min left)", flush=True)
    if sharded:
        print(f"serving: shard {shards.shard_index} of {shards.num_shards} done; merge with study.merge_only=true "
              "once every shard is", flush=True)
        return out.root
    return collect(cfg, out, {name: s.table for name, s in served.items()}, plan)


def mean_concurrency(records: list[RequestRecord], duration_s: float) -> float:
    """Requests in the system on average (Little's law: their summed times from arrival to last token over the
    run's duration)."""
    spent = sum(r.e2el_s for r in records if r.e2el_s is not None)
    return spent / duration_s if duration_s > 0 else 0.0


def _study_table(cfg: DictConfig, engine):
    """The cost table the study of this results folder used (results/<name>/calibration/), when it was measured
    for this pair and machine: the serving stage's controller prices requests as the study's does; else the
    calibration of this machine (measured now if missing or stale)."""
    kept = run_layout(cfg).calibration(engine.pair.name, engine.proposer, precision_of(engine.pair))
    if kept.exists():
        try:
            return load_table(kept, calibration_key(engine.pair, engine.proposer))
        except RakvError:
            pass
    return cost_table_for(cfg, engine)


def _plan_text(cfg: DictConfig, plan: list[dict], served: dict, runs: int, todo: int) -> str:
    from rakv.experiments.serving_power import family_margins, pilot_path, power

    grid = cfg.profile.serving
    lines = [f"serving study: {len(plan)} cells x {grid.repeats} repeats = {runs} runs ({todo} to go)"]
    steps = _plain(cfg.experiment.slo_steps)
    for name, parts in served.items():
        slos = parts.slos_ms
        lines.append(f"SLOs on {name} (one-request decode step {decode_step_s(parts.batch_cost) * 1e3:.2f} ms x "
                     f"{steps}): ITL {slos['itl']:.0f} ms, TTFT {slos['ttft']:.0f} ms, TPOT {slos['tpot']:.0f} ms")
    own = family_margins(_plain(cfg.experiment.families))
    lines.append(f"margins (relative): {_plain(cfg.experiment.margins)}, the families' own {own}; goals' baselines "
                 "named before the run: "
                 + "; ".join(f"{family}: {json.dumps(_plain(spec.get('goals')))}"
                             for family, spec in cfg.experiment.families.items() if family in grid.rates))
    pilot = pilot_path(_plain(grid))
    if pilot:
        for row in power(pilot, grid.repeats, _plain(cfg.experiment.margins), _plain(cfg.experiment.families),
                         rates=_plain(grid.rates)):
            lines.append(f"power from the pilot {grid.pilot}: {row}")
    lines += planned_power_lines(cfg, pilot)
    lines += [f"  {c['family']:<18} rate {c['rate']:<6g} {c['policy']:<24} {c['configuration']:<16} "
              f"{json.dumps(c['options'])}" for c in plan]
    return "\n".join(lines) + "\n"


def planned_power_lines(cfg: DictConfig, pilot: ServingStudyLayout | None) -> list[str]:
    """plan.txt's goals, each with its minimum detectable difference from the pilot at the profile's repeats and
    whether that powers it (rakv.experiments.serving_power.goal_power), before any run; and the tally they start
    from: a goal the plan cannot power is reported underpowered whatever the run shows."""
    from rakv.experiments.serving_power import goal_power, goal_power_lines, planned_goals

    grid = cfg.profile.serving
    planned = planned_goals(_plain(cfg.experiment.families), _plain(grid.rates), _plain(cfg.experiment.margins))
    rows = goal_power(planned, pilot, int(grid.repeats), int(grid.requests))
    weak = sum(row.powered is False for row in rows)
    return [f"goals named before the run: {len(planned)}; {weak} underpowered at {grid.repeats} repeats by the "
            f"plan (reported so, whatever the run shows)", *goal_power_lines(rows)]


def _eta(out: ServingStudyLayout, todo: int) -> str:
    done = [read_complete(run).wall_s for run in out.completed_runs()]
    if not done or not todo:
        return ""
    return f"; about {todo * sum(done) / len(done) / 60:.0f} min left (the mean run so far)"


def expost_regret(table, record: RequestRecord, k_set: tuple[int, ...], replaying: type[Proposer]) -> float | None:
    """A prompt-lookup request's regret, judged after the fact: its output fixes, for every k, the rounds greedy
    speculation makes (rakv.serving.replay.lookup_rounds, with a fresh `replaying` proposer, one whose
    `replays_rounds`); the cost model with each k's own acceptance and match
    rate then prices every action, and the regret is the chosen action's estimate over the least one, minus 1."""
    prompt, output = record.prompt_ids, record.token_ids
    features = RequestFeatures(len(prompt), record.hit_tokens, len(output), record.hit_tokens == len(prompt))
    estimates = {}
    for k in k_set:
        alpha, match = 0.0, 1.0
        if k:
            log, empty = lookup_rounds(replaying(), prompt, output, k)
            alpha = acceptance_estimate(log) or 0.0
            match = len(log) / max(len(log) + empty, 1)
        for reuse in ((False, True) if record.hit_tokens else (False,)):
            estimates[Action(reuse, k)] = estimate_latency(table, features, reuse, k, alpha, match_rate=match)
    chosen = Action(bool(record.reuse), int(record.k))
    if chosen not in estimates:
        return None
    return estimates[chosen] / min(estimates.values()) - 1


def collect(cfg: DictConfig, out: ServingStudyLayout, tables: dict, plan: list[dict]) -> Path:
    """requests.parquet, cells.parquet, iterations.parquet from every finished run (`tables`: the cost table of
    each configuration, for the ex-post regret)."""
    requests, runs, iterations = [], [], []
    k_set = tuple(cfg.controller.k_set)
    for repeat in range(cfg.profile.serving.repeats):
        for cell in plan:
            target = cell_dir(out, cell, repeat)
            if not target.complete.exists():
                continue
            runs.append(read_study_run(target.served_summary))
            key = dict(family=cell["family"], rate=cell["rate"], policy=cell["policy"], repeat=repeat,
                       configuration=cell["configuration"])
            replaying = configuration(cell["configuration"]).proposer_type
            for record in read_records(target.requests):
                line = record.to_json()
                row = {**key, **{k: v for k, v in line.items() if k not in ("token_ids", "prompt_ids", "text")}}
                row["itl_s"] = json.dumps(record.itl_s)
                row["prefix_acceptance"] = json.dumps(record.prefix_acceptance)
                if replaying.replays_rounds and record.ok and cell["family"] == "acceptance":
                    row["expost_regret"] = expost_regret(tables[cell["configuration"]], record, k_set, replaying)
                requests.append(row)
            for iteration in read_iterations(target.iterations):
                line = iteration.to_json()
                line["k"] = json.dumps(iteration.k)
                iterations.append({**key, **line})
    write_parquet(requests, out.requests)
    write_parquet([run.row() for run in runs], out.cells)
    write_parquet(iterations, out.iterations)
    write_serving_metadata(serving_metadata(cfg, len(plan), len(runs)), out)
    equal = sum(run.outputs_equal_ar for run in runs)
    total = sum(run.run.statistics.completed + run.run.statistics.failed for run in runs)
    print(f"serving: {len(runs)} runs, {len(requests)} requests, outputs equal to batch-one AR: {equal}/{total}; "
          f"{out.requests}, {out.cells.name}, {out.iterations.name}", flush=True)
    frame = pd.DataFrame(iterations)
    if len(frame) and frame.predicted_s.notna().any():
        known = frame[frame.predicted_s.notna() & (frame.iteration_s > 0)]
        mape = float(((known.predicted_s - known.iteration_s).abs() / known.iteration_s).mean())
        table = float(((known.model_s - known.iteration_s).abs() / known.iteration_s).mean())
        print(f"serving: batch cost model, held-out check on {len(known)} served iterations: MAPE {mape:.1%} "
              f"with the online scale, {table:.1%} the table's alone", flush=True)
    return out.root
