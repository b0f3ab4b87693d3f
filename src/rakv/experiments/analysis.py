"""The analysis of a results folder: its tables read, every statistic computed, the summary assembled
(rakv.experiments.summary declares it; summary.json is its on-disk form). The entry point the analysis notebooks
call is `summarize`. The jobs it composes live one per module: rakv.experiments.oracle (measurements, strategies,
the cross-fitted oracle), intervals (the CIs), study_stats (the statistics), claims (the reference's
claims and their verdicts), sentences (the feasibility verdict's wording), serving_stats (the serving study).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from rakv.experiments.calibrations import (
    calibration_tables,
    configuration_stem,
    tables_by_configuration,
    with_tie_sets,
)
from rakv.experiments.claims import claims
from rakv.experiments.metadata import read_about, read_run_metadata
from rakv.experiments.oracle import measurements, strategy_latencies
from rakv.experiments.prose import feasibility_verdict
from rakv.experiments.study_stats import (
    acceptance_mape,
    acceptance_table,
    configuration_statistics,
    joint_reuse_by_length,
    latency_reduction,
    measured_crossover,
    model_crossover,
    peak_memory_table,
    throughput_gain,
)
from rakv.experiments.summary import (
    AcceptanceRow,
    BreakEven,
    ByBaseline,
    Crossover,
    Exact,
    Grid,
    PeakKv,
    Pooled,
    Summary,
    read_feasibility,
)
from rakv.runtime.actions import ADAPTIVE
from rakv.runtime.json_records import ABSENT
from rakv.runtime.paths import shown
from rakv.runtime.run_layout import OTHER_MACHINES_DIR, RunLayout


def cost_request(results: Path) -> tuple[int, int]:
    """The request every price of a results folder is quoted at (break-even alphas, the draft's and the verify's cost
    ratios): a cold one of the feasibility cost side's prompt length and the study's new tokens; its prices are
    read at its mean context, prompt + new / 2 positions (rakv.runtime.costmodel.break_even_rows)."""
    meta = read_run_metadata(RunLayout.of(results))
    return meta.cost_side_prompt_tokens, meta.new_tokens


def price_context(results: Path) -> float:
    """The context (positions) at which `cost_request`'s prices are read."""
    prompt_tokens, new_tokens = cost_request(results)
    return prompt_tokens + new_tokens / 2


def break_even_table(results: Path) -> pd.DataFrame:
    """Break-even alpha per k for every calibration in results/<name>/calibration/ (`cost_request`), with the
    draft/target step-cost ratio."""
    from rakv.runtime.costmodel import break_even_rows

    prompt_tokens, new_tokens = cost_request(results)
    rows = []
    for name, table in calibration_tables(results).items():
        rows.extend(break_even_rows(name, table, prompt_tokens, new_tokens))
    return pd.DataFrame(rows)


def twin_break_even(results: Path) -> list[BreakEven]:
    """The break-even rows of the architecture twins calibrated in `results` (none without a calibration)."""
    if not RunLayout.of(results).calibration_dir.is_dir():
        return []
    table = break_even_table(results)
    if table.empty:
        return []
    twins = table[table.pair.str.contains("-twin")].astype(object)
    return [BreakEven(**r) for r in twins.where(twins.notna(), None).to_dict("records")]  # never pays: None


OTHER_MACHINES = OTHER_MACHINES_DIR  # shipped runs of other machines (about.json each)


def regime_folders(results: Path, others: Path = OTHER_MACHINES) -> dict[str, Path]:
    """The regime map's runs: `results` (labelled by its instruction set) and each shipped run of another machine
    (labelled by its about.json: label and commit)."""
    layout = RunLayout.of(results)
    isa = read_run_metadata(layout).hardware.isa
    folders = {f"this run ({isa})" if isa else "this run": Path(results)}
    for run in RunLayout.other_machines(others):
        if run.root != layout.root:
            about = read_about(run)
            folders[f"{about.label} ({about.commit})"] = run.root
    return folders


def regime_points(folders: dict[str, Path]) -> pd.DataFrame:
    """The regime map's points: per results folder (`folders`: machine label -> folder, this run's and the shipped
    runs of other machines) and calibrated pair, the draft step's and the verify of k + 1 = 5 tokens' prices in
    target steps, the pair's crossover (least break-even alpha over k, the full cost model at `cost_request`) and
    the acceptance the study measured for it (mean over datasets; none for the twins, whose weights are random), and
    in how many of its scenarios the study measured the best k>0 faster than the best k=0 (faster_scenarios of
    scenarios; none for the twins)."""
    from rakv.experiments.summary import read_summary

    rows = []
    for machine, folder in folders.items():
        context = price_context(folder)
        summary = read_summary(folder)
        measured: dict[str, list[float]] = {}
        faster: dict[str, tuple[int, int]] = {}  # pair -> (scenarios where the best k>0 beat the best k=0, scenarios)
        for name, stats in summary.per_configuration.items():
            share = stats.spec_slowdown.share_slower
            if share is not None and stats.scenarios:
                faster[configuration_stem(name)] = (round((1 - share) * stats.scenarios), stats.scenarios)
        for row in summary.acceptance:
            if row.acceptance is not None:
                measured.setdefault(configuration_stem(row.configuration), []).append(row.acceptance)
        tables = calibration_tables(folder)
        for pair, part in break_even_table(folder).groupby("pair", sort=False):
            step = tables[pair].target_step(context)
            paying = part.dropna(subset=["break_even_alpha"])
            least = paying.loc[paying.break_even_alpha.idxmin()] if len(paying) else None
            alphas = measured.get(pair)
            rows.append({"machine": machine, "pair": pair, "context": context,
                         "draft_ratio": float(part.draft_target_cost_ratio.iloc[0]),
                         "verify4_ratio": float(tables[pair].verify[4](context) / step) if 4 in tables[pair].verify
                         else float("nan"),
                         "crossover": float("nan") if least is None else float(least.break_even_alpha),
                         "crossover_k": None if least is None else int(least.k),
                         "measured_alpha": float(sum(alphas) / len(alphas)) if alphas else float("nan"),
                         "faster_scenarios": faster.get(pair, (None, None))[0],
                         "scenarios": faster.get(pair, (None, None))[1]})
    return pd.DataFrame(rows)


def grid_of(runs: pd.DataFrame) -> Grid:
    """What the study measured: prompts per dataset and length bin, repeats, new tokens."""
    sweep = runs[runs.kind == "sweep"]
    counts = sweep.groupby(["configuration", "dataset", "prompt_id", "scenario", "action"]).size()
    return Grid(prompts={d: int(p.prompt_id.nunique()) for d, p in runs.groupby("dataset")},
                length_bins=sorted(runs.length_bin.unique().tolist()),
                scenarios=sorted(runs.scenario.unique().tolist()),
                measurements_per_action_min=int(counts.min()) if len(counts) else 0,
                controller_repeats=int(runs[runs.kind == "strategy"].repeat.nunique()),
                new_tokens=int(runs.new_tokens.max()), actions=sorted(sweep.action.unique().tolist()))


def sensitivity_statistics(layout: RunLayout) -> dict:
    """The summary's fields from the sensitivity stage (results/<name>/sensitivity/), as Summary's keyword
    arguments: the cost model's crossovers, the controlled runs' measured ones, speculation on top of reuse."""
    out: dict = {"crossover_model": Crossover(None, None), "crossover_model_per_configuration": ABSENT}
    if layout.sensitivity_table("crossover").exists():
        crossover = pd.read_parquet(layout.sensitivity_table("crossover"))
        out["crossover_model"] = model_crossover(crossover)
        out["crossover_model_per_configuration"] = {name: model_crossover(part)
                                                    for name, part in crossover.groupby("configuration")}
    controlled_path = layout.sensitivity_table("controlled")
    controlled = pd.read_parquet(controlled_path) if controlled_path.exists() else None
    out["crossover_measured"] = measured_crossover(controlled) if controlled is not None else {}
    out["crossover_predicted_controlled"] = (measured_crossover(controlled, "predicted_speedup")
                                             if controlled is not None else {})
    joint = layout.sensitivity_table("reuse_output_length")
    out["joint_reuse"] = (joint_reuse_by_length(pd.read_parquet(joint))
                          if joint.exists() else [])
    return out


def summarize(results: Path, seed: int = 0) -> Summary:
    """Every statistic of the study, sensitivity, feasibility and serving results under `results` (its tables read
    here; summary.json written by rakv.experiments.summary.write_summary)."""
    results = Path(results)
    layout = RunLayout.of(results)
    runs = pd.read_parquet(layout.study.runs)
    tables = tables_by_configuration(runs, results)
    runs = with_tie_sets(runs, tables)
    meas = measurements(runs)
    lat = strategy_latencies(runs, meas)
    names = sorted(runs.configuration.unique().tolist())
    per_configuration = {
        name: configuration_statistics(runs[runs.configuration == name], meas[meas.configuration == name],
                                       lat[lat.configuration == name])
        for name in names}
    sensitivity = sensitivity_statistics(layout)
    feasibility = read_feasibility(results)
    verdict = feasibility_verdict(feasibility)
    from rakv.experiments import serving_stats
    from rakv.experiments.sampling_stats import sampling_summary

    sampling = sampling_summary(results, tables, seed=seed)
    summary = Summary(
        # the folder as typed from the repository root, so that a summary does not depend on where the checkout is
        results=shown(results), runs=len(runs), strategy_runs=int((runs.kind == "strategy").sum()),
        sweep_runs=int((runs.kind == "sweep").sum()), configurations=names, grid=grid_of(runs),
        exact=Exact(equal=int(runs.equal_to_ar.sum()), total=len(runs),
                    share=float(runs.equal_to_ar.mean()) if len(runs) else None),
        per_configuration=per_configuration,
        pooled=Pooled(latency_reduction=ByBaseline.of(lambda b: latency_reduction(lat, ADAPTIVE, b)),
                      throughput_gain=ByBaseline.of(lambda b: throughput_gain(lat, ADAPTIVE, b))),
        # a column with a None in it comes back from pandas as floats: the depth is an int again here
        acceptance=[AcceptanceRow(**{**r, "break_even_k": None if pd.isna(r["break_even_k"])
                                     else int(r["break_even_k"])})
                    for r in acceptance_table(runs, tables).to_dict("records")],
        peak_kv=[PeakKv(**r) for r in peak_memory_table(meas, runs).to_dict("records")],
        acceptance_mape=acceptance_mape(meas, tables),
        **sensitivity,
        feasibility=feasibility, feasibility_verdict=verdict,
        claims=claims(per_configuration, sensitivity["crossover_model_per_configuration"] or {}, feasibility, verdict,
                      twin_break_even(results)),
        # the serving study (stage `serving`): its own statistics and goals
        serving=serving_stats.serving_summary(results, seed) if serving_stats.available(results) else ABSENT,
        # sampling and workloads (stage `sampling`)
        sampling=sampling if sampling is not None else ABSENT)
    # the other shipped runs of this commit and machine class beside this one (<results>-rerun*): pooled claims
    from rakv.experiments.runcompare import replication_summary

    replication = replication_summary(results, summary)
    return summary if replication is None else replace(summary, replication=replication)
