"""The feasibility study: the main study's machinery on a bigger pair (conf/feasibility.yaml), action sweep only,
reporting how far the best k != 0 action is from the best k = 0 one per scenario.

When the pair's weights cannot be had, the *cost side* is still answered on architecture twins (same shapes,
seeded random weights; rakv.runtime.models.ARCHITECTURES): each twin pair is calibrated on this machine, and the cost
model gives, per k, the break-even acceptance alpha above which speculation would pay ("never" when not even
alpha = 1 does). The feasibility pair's twin is validated with the controlled-acceptance proposer: measured
speedup over AR at chosen alphas against the model's. Acceptance itself needs the real weights.

As jobs (docs/cluster.md: `study.num_shards`, `study.shard_index`, `study.merge_only`): with the weights, the sweep is
the main study's machinery, so it shards as the study does (whole prompt blocks, on the table the calibration job
kept: `calibrate_feasibility`, run by the calibrate stage when it runs for jobs), and the merge builds runs.parquet,
the gap table and the summary from the journals and the kept table; on the cost side, a unit is one twin pair
(its calibration, break-even rows and, for the feasibility pair's twin, the controlled runs), and the merge assembles
the tables and the summary from the units' files. Neither merge loads a model.
"""

from __future__ import annotations

import pandas as pd
from omegaconf import DictConfig

from rakv.experiments.config import Configuration, configuration, engine_for, keep_calibration, prompts_for, run_layout
from rakv.experiments.oracle import measurements
from rakv.experiments.records import ShardUnit, read_units, units_dealt, write_parquet, write_unit
from rakv.experiments.schema import FeasibilitySection, ShardOptions, section
from rakv.experiments.sensitivity import controlled_rows
from rakv.experiments.study import run_main_study
from rakv.experiments.summary import BreakEven, ControlledRun, Feasibility, write_feasibility
from rakv.runtime.actions import Action
from rakv.runtime.calibration import CalibrationPlan, load_or_calibrate
from rakv.runtime.costmodel import break_even_rows, read_cost_table
from rakv.runtime.errors import RakvError, WeightsUnavailable
from rakv.runtime.models import twin_of
from rakv.runtime.run_layout import RunLayout


def run_feasibility(cfg: DictConfig) -> None:
    """The main-study machinery on the feasibility pair (action sweep only); skipped when weights are missing."""
    layout = run_layout(cfg)
    layout.feasibility_dir.mkdir(parents=True, exist_ok=True)
    feas: FeasibilitySection = section(cfg.profile.feasibility)
    shards: ShardOptions = section(cfg.study)
    if shards.merge_only:
        merge_feasibility(cfg, feas, layout)
        return
    try:
        path = run_main_study(cfg, layout.feasibility_study)
    except WeightsUnavailable as exc:
        if shards.num_shards > 1:
            cost_side_shard(cfg, feas, layout, str(exc), shards)
        else:
            run_cost_side(cfg, feas, layout, str(exc))
        return
    if shards.num_shards > 1:  # the gap and the summary are the merge's
        print(f"feasibility: shard {shards.shard_index} of {shards.num_shards} done; merge with "
              "study.merge_only=true once every shard is", flush=True)
        return
    write_gap(feas, layout, path)


def write_gap(feas: FeasibilitySection, layout: RunLayout, path) -> None:
    """The gap table and the summary from the sweep's runs and the kept table (no model)."""
    runs = pd.read_parquet(path)
    per_scenario = []  # over the measurements: an r = 0 action measured once per prompt stands in every scenario
    for (dataset, prompt_id, scenario), group in measurements(runs).groupby(["dataset", "prompt_id", "scenario"]):
        by_action = group.groupby("action").latency_s.mean()
        speculative = [Action.parse(label).k > 0 for label in by_action.index]
        k0 = by_action[[not s for s in speculative]].min()
        spec = by_action[speculative]
        per_scenario.append({"dataset": dataset, "prompt_id": prompt_id, "scenario": scenario,
                             "best_k0_s": float(k0), "best_spec_s": float(spec.min()),
                             "best_spec_action": spec.idxmin(),
                             "gap": float(spec.min() / k0 - 1)})
    table = pd.DataFrame(per_scenario)
    write_parquet(per_scenario, layout.feasibility_table("gap"))
    pair = configuration(feas.configuration)
    calibration = read_cost_table(layout.calibration(pair.pair, pair.proposer, pair.precision))
    summary = Feasibility("ran", configuration=feas.configuration, scenarios=len(table),
                          gap_min=float(table.gap.min()), gap_max=float(table.gap.max()),
                          gap_mean=float(table.gap.mean()), crossed=bool((table.gap < 0).any()),
                          calibrated_alpha=calibration.acceptance)
    write_feasibility(summary, layout)
    print(f"feasibility: best k != 0 vs k = 0 gap {summary.gap_min:+.1%} to {summary.gap_max:+.1%} "
          f"over {len(table)} scenarios; crossed: {summary.crossed}", flush=True)


COST_SIDE = "cost side only: weights unavailable"


def run_cost_side(cfg: DictConfig, feas: FeasibilitySection, layout: RunLayout, reason: str) -> None:
    """Calibrate the twins of the configured reference pairs; break-even alpha per k; controlled validation."""
    side = feas.cost_side
    main_pair = configuration(feas.configuration).pair
    if main_pair not in side.pairs:
        raise RakvError(f"profile.feasibility.cost_side.pairs must include the feasibility pair {main_pair}")
    print(f"feasibility: weights of {main_pair} unavailable ({reason}); measuring the cost side on architecture "
          f"twins of {', '.join(side.pairs)}", flush=True)
    rows, controlled = [], []
    for pair in side.pairs:
        pair_rows, pair_controlled, _ = twin_unit(cfg, feas, pair, main_pair)
        rows.extend(pair_rows)
        controlled = pair_controlled or controlled
    write_cost_side(feas, layout, reason, rows, controlled)


def twin_plan(cfg: DictConfig, side) -> CalibrationPlan:
    return CalibrationPlan(prefill_lengths=tuple(side.calibration.prefill_lengths),
                           contexts=tuple(side.calibration.contexts), repeats=side.calibration.repeats,
                           acceptance_prompts=0,  # random weights: their acceptance means nothing
                           **({} if cfg.calibration.refuse_spread is None
                              else {"refuse_spread": cfg.calibration.refuse_spread}))


def twin_unit(cfg: DictConfig, feas: FeasibilitySection, pair: str, main_pair: str):
    """One twin pair: its calibration (kept), its break-even rows, and for the feasibility pair's twin the
    controlled runs; returns (break-even rows, controlled rows, table)."""
    side = feas.cost_side
    twin = Configuration(twin_of(pair), twin_of(pair), "draft")
    engine = engine_for(cfg, twin)
    table = keep_calibration(cfg, engine, load_or_calibrate(engine, [], plan=twin_plan(cfg, side),
                                                            recalibrate=cfg.calibration.recalibrate))
    rows = break_even_rows(twin.pair, table, side.prompt_tokens, feas.new_tokens)
    controlled = []
    if pair == main_pair:
        prompts = prompts_for(cfg, engine.encode, cfg.datasets[0])[:1]
        controlled = controlled_rows(twin.pair, engine, table, prompts, new_tokens=feas.new_tokens, repeats=1,
                                     alphas=side.controlled_alphas, ks=side.controlled_k)
    del engine  # the next twin pair may be large
    return rows, controlled, table


def write_cost_side(feas: FeasibilitySection, layout: RunLayout, reason: str, rows: list[dict],
                    controlled: list[dict]) -> None:
    """The cost side's tables and summary from its rows (no model)."""
    main_pair = configuration(feas.configuration).pair
    write_parquet(rows, layout.feasibility_table("break_even"))
    if controlled:
        write_parquet(controlled, layout.feasibility_table("controlled"))
    errors = [abs(r["measured_speedup"] / r["predicted_speedup_at_measured_alpha"] - 1) for r in controlled]
    summary = Feasibility(COST_SIDE, configuration=feas.configuration, reason=reason,
                          note="cost side only; acceptance needs the real weights",
                          twin=twin_of(main_pair), twins=[twin_of(p) for p in feas.cost_side.pairs],
                          break_even=[BreakEven(**r) for r in rows],
                          controlled=[ControlledRun(**r) for r in controlled],
                          controlled_speedup_error_mean=sum(errors) / len(errors) if errors else None,
                          controlled_speedup_error_max=max(errors) if errors else None)
    write_feasibility(summary, layout)
    for pair in summary.twins:
        values = ", ".join(f"k={r['k']}: " + (f"{r['break_even_alpha']:.3f}" if r["break_even_alpha"] is not None
                                               else "never") for r in rows if r["pair"] == pair)
        print(f"feasibility (cost side) {pair}: break-even alpha {values}", flush=True)
    if errors:
        print(f"feasibility (cost side): controlled-acceptance speedup vs the model's, mean |error| "
              f"{summary.controlled_speedup_error_mean:.1%}, max {summary.controlled_speedup_error_max:.1%} "
              f"over {len(errors)} runs", flush=True)


def calibrate_feasibility(cfg: DictConfig) -> None:
    """The calibration job's part for the feasibility stage run as jobs: the feasibility pair's cost table, kept in
    the results folder for its shards to read; nothing when the profile has no feasibility pair or its weights
    cannot be had (the shards then measure the cost side on twins, each twin its own unit)."""
    if cfg.profile.get("feasibility") is None:
        return
    feas: FeasibilitySection = section(cfg.profile.feasibility)
    try:
        engine = engine_for(cfg, configuration(feas.configuration))
    except WeightsUnavailable as exc:
        print(f"calibration feasibility: weights of {feas.configuration} unavailable ({exc}); its shards measure the "
              "cost side on twins", flush=True)
        return
    from rakv.experiments.config import cost_table_for

    table = cost_table_for(cfg, engine)
    print(f"calibration feasibility {feas.configuration}: alpha = {table.acceptance:.3f}", flush=True)


def twin_units(feas: FeasibilitySection) -> list[str]:
    return [twin_of(pair) for pair in feas.cost_side.pairs]


def cost_side_shard(cfg: DictConfig, feas: FeasibilitySection, layout: RunLayout, reason: str,
                    shards: ShardOptions) -> None:
    """This shard's twin pairs: each one's calibration (kept) and rows, written as a unit."""
    from rakv.experiments.calibrations import host, table_digest

    side, main_pair = feas.cost_side, configuration(feas.configuration).pair
    if main_pair not in side.pairs:
        raise RakvError(f"profile.feasibility.cost_side.pairs must include the feasibility pair {main_pair}")
    folder = layout.stage_units("feasibility")
    mine = [pair for pair in units_dealt(list(side.pairs), shards.num_shards, shards.shard_index)
            if not (folder / f"{twin_of(pair)}.json").exists()]
    print(f"feasibility: weights of {main_pair} unavailable ({reason}); shard {shards.shard_index} of "
          f"{shards.num_shards} measures the cost side on the twins of {', '.join(mine) or 'none'}", flush=True)
    for pair in mine:
        rows, controlled, table = twin_unit(cfg, feas, pair, main_pair)
        write_unit(folder, ShardUnit("feasibility", twin_of(pair), shards.shard_index, shards.num_shards,
                                     {"break_even": len(rows), "controlled": len(controlled)}, table_digest(table),
                                     host(), table.to_json(), reason), {"break_even": rows, "controlled": controlled})


def merge_feasibility(cfg: DictConfig, feas: FeasibilitySection, layout: RunLayout) -> None:
    """study.merge_only: the sweep's journals (with the weights) or the twins' units (cost side) into the stage's
    tables and summary; loads no model."""
    folder = layout.stage_units("feasibility")
    if any(folder.glob("*.json")):
        units = read_units(folder, "feasibility", twin_units(feas))
        rows = [row for _, parts in units.values() for row in parts["break_even"]]
        controlled = [row for _, parts in units.values() for row in parts["controlled"]]
        reason = next(iter(units.values()))[0].note
        print(f"feasibility: weights of {configuration(feas.configuration).pair} unavailable ({reason}); merged the "
              f"cost side of {len(units)} twin pairs", flush=True)
        write_cost_side(feas, layout, reason, rows, controlled)
        return
    if not layout.feasibility_study.plan_record.exists():
        raise RakvError(f"{layout.feasibility_study.plan_record} is missing: run the feasibility shards first")
    path = run_main_study(cfg, layout.feasibility_study)
    if not path.exists():
        raise RakvError("feasibility: runs are missing (see above); merge once every shard is done")
    write_gap(feas, layout, path)
