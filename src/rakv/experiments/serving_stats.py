"""Statistics of the serving study (results/<name>/serving/, rakv.experiments.serving), as pure functions, and
`serving_summary`: everything summary.json's `serving` part holds.

Units and CIs: a run serves one trace once, and its requests share that run's machine state and each other's
iterations, so the unit is the run: every metric is computed per run (its goodput, p99 ITL, median TTFT, mean
concurrency, the mean error of its requests' predictions) and every CI is a Student-t interval over repeats (95 %;
rakv.experiments.intervals). A comparison of two policies in one cell is paired by repeat (the two ran back to back
on the repeat's trace, rakv.experiments.serving.run_order): a relative difference is the ratio of their means over
the repeats minus 1, its interval the delta method's on the log scale (never past -100 %); an absolute one the t
interval of the per-repeat differences (rakv.experiments.serving_cells).
With few repeats a percentile bootstrap over repeats covers far less than it says (3 repeats give 10 distinct
resamples: about 75 %); the t interval holds its level for normal differences at any count and close to it for
skewed ones (tests/test_serving_stats.py simulates both at the study's repeat count).

The parts, by job: rakv.experiments.serving_cells (cells, paired comparisons and their intervals),
rakv.experiments.serving_power (the plan fixed before the data: the goals the design names, each one's power from
the pilot), rakv.experiments.serving_goals (each goal judged, Holm within its family, one verdict each: met, missed,
inconclusive, underpowered or missing). That every served output is identical to batch-one greedy AR is a check of
the engine, reported beside the goals (`exact`), not one of them.

The design's goals and margins and the profile's loads are the repository's (`judged_by`, docs/serving.md, "Fixed
before the data").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from rakv.experiments.intervals import t_interval
from rakv.experiments.metadata import ServingMetadata, read_serving_metadata
from rakv.experiments.serving_cells import cell_table, paired_difference, rates_of, runs
from rakv.experiments.serving_goals import (
    acceptance_goals,
    chunking_goals,
    family_wise,
    latency_goals,
    speculation_goals,
)
from rakv.experiments.serving_power import family_margins, family_power, goal_power, pilot_path, planned_goals
from rakv.experiments.summary_serving import (
    ALL_ITERATIONS,
    AcceptanceErrors,
    BatchBreakEven,
    Cell,
    ChosenK,
    Comparison,
    Goal,
    GoalPair,
    GoalPower,
    IterationMape,
    LatencyMape,
    Margins,
    ServedExact,
    ServingSummary,
    Slos,
    SloSteps,
)
from rakv.runtime.actions import ADAPTIVE
from rakv.runtime.costmodel import read_cost_table, tokens_per_round
from rakv.runtime.json_records import CI
from rakv.runtime.paths import CONF_DIR, conf_file
from rakv.runtime.run_layout import RunLayout
from rakv.serving.batchcost import shape_class


def load(results: Path | RunLayout) -> dict[str, pd.DataFrame]:
    """The serving study's tables of a results folder: "requests", "cells" and "iterations"."""
    folder = RunLayout.of(results).serving
    return {"requests": pd.read_parquet(folder.requests), "cells": pd.read_parquet(folder.cells),
            "iterations": pd.read_parquet(folder.iterations)}


def available(results: Path | RunLayout) -> bool:
    return RunLayout.of(results).serving.cells.exists()


def iteration_mape(iterations: pd.DataFrame) -> dict[str, IterationMape]:
    """The batch cost model's held-out check: |predicted - measured| / measured per served iteration, the online-
    scaled prediction (`predicted_s`) and the table's alone (`model_s`), by family and by iteration shape; CIs over
    repeats of the per-repeat means."""
    known = iterations[iterations.predicted_s.notna() & (iterations.iteration_s > 0)].copy()
    out = {}
    if not len(known):
        return out
    known["scaled"] = (known.predicted_s - known.iteration_s).abs() / known.iteration_s
    has_model = "model_s" in known and known.model_s.notna().any()
    known["table"] = ((known.model_s - known.iteration_s).abs() / known.iteration_s) if has_model else np.nan
    known["shape"] = (known.prefill_context.map(lambda c: shape_class(None if pd.isna(c) else int(c)))
                      if "prefill_context" in known else "decode")
    groups = [(ALL_ITERATIONS, known), *known.groupby("family"),
              *[(f"shape: {s}", g) for s, g in known.groupby("shape")]]
    for name, part in groups:
        out[name] = IterationMape(scaled=t_interval(part.groupby("repeat").scaled.mean()),
                                  table=t_interval(part.groupby("repeat").table.mean()), iterations=int(len(part)))
    return out


def chosen_k(iterations: pd.DataFrame, policies=("smartspec", ADAPTIVE)) -> pd.DataFrame:
    """Mean candidates per decoding request by the number of decoding requests, per family and policy."""
    rows = []
    part = iterations[iterations.family.str.startswith("speculation") & iterations.policy.isin(policies)]
    for row in part.itertuples(index=False):
        ks = json.loads(row.k)
        if ks:
            rows.append({"family": row.family, "policy": row.policy, "rate": row.rate, "batch": len(ks),
                         "mean_k": float(np.mean(ks)), "speculating": float(np.mean([k > 0 for k in ks]))})
    frame = pd.DataFrame(rows)
    if not len(frame):
        return frame
    return frame.groupby(["family", "policy", "batch"], as_index=False).agg(
        mean_k=("mean_k", "mean"), speculating=("speculating", "mean"), iterations=("mean_k", "size"))


def break_even_by_batch(cost, k_values=(1, 2, 4), batches=(1, 2, 4, 8, 16), context: int = 256,
                        match: float = 1.0) -> pd.DataFrame:
    """From the batch cost table: per batch size b and k, the least acceptance (the same for every request) at
    which speculating with k gives more expected tokens per second than k = 0 (None: not even alpha = 1)."""
    rows = []
    for b in batches:
        base = b / cost.decode_s([(1, context)] * b, [0] * b)
        for k in k_values:
            time_k = cost.decode_s([(1 + k, context)] * b, [k] * b)

            def gain(alpha, b=b, k=k, time_k=time_k, base=base):
                return b * tokens_per_round(alpha, k, match) / time_k - base

            alpha = None
            if gain(1.0) > 0:
                low, high = 0.0, 1.0
                if gain(0.0) > 0:
                    high = 0.0
                while high - low > 1e-4:
                    mid = (low + high) / 2
                    low, high = (low, mid) if gain(mid) > 0 else (mid, high)
                alpha = high
            rows.append({"batch": b, "k": k, "break_even_alpha": alpha, "context": context})
    return pd.DataFrame(rows)


COMPARISONS = (  # (family, policy, against, metric): the paper's sentences, one per rate
    ("chunking", "cost-model-slo", "none", "p99_itl_ms"),
    ("chunking", "cost-model-slo", "none", "median_ttft_ms"),
    ("chunking", "fixed-32", "none", "p99_itl_ms"),
    ("speculation", ADAPTIVE, "k0", "goodput"),
    ("speculation", "k2", "k0", "goodput"),
    ("speculation", "smartspec", "k0", "goodput"),
    ("speculation-draft", ADAPTIVE, "k0", "goodput"),
    ("speculation-draft", "k2", "k0", "goodput"),
    ("speculation-draft", "smartspec", "k0", "goodput"),
)


def comparisons(data: dict) -> list[Comparison]:
    """Relative paired differences (policy over `against`, minus 1) per rate, with t intervals over repeats."""
    cells, rows = runs(data), []
    for family, a, b, metric in COMPARISONS:
        for rate in rates_of(data, family):
            present = set(cells[(cells.family == family) & (cells.rate == rate)].policy)
            if {a, b} <= present:
                ci = paired_difference(data, family, rate, a, b, metric)
                rows.append(Comparison(family=family, rate=float(rate), policy=a, against=b, metric=metric,
                                       ci=CI(*ci)))
    return rows


def _profile(name: str):
    """conf/profile/<name>.yaml as Hydra composes it (the profiles its `defaults` name beneath it, `_self_` last),
    None where conf/ has no such profile."""
    from omegaconf import OmegaConf

    if not (CONF_DIR / "profile" / f"{name}.yaml").exists():
        return None
    node = conf_file(f"profile/{name}.yaml")
    bases = [_profile(entry) for entry in node.get("defaults") or [] if isinstance(entry, str) and entry != "_self_"]
    own = OmegaConf.masked_copy(node, [k for k in node if k != "defaults"])
    return OmegaConf.merge(*[b for b in bases if b is not None], own)


def judged_by(meta: ServingMetadata) -> tuple[dict, dict]:
    """(the experiment, the profile's serving section) a run is judged by. The goals, margins and loads are fixed in
    the repository before any run (conf/experiment/serving.yaml; conf/profile/<the run's profile>.yaml's rates and
    pilot), so a run is judged by them as they stand, not by the copy in its metadata.json: a run measured under
    an earlier design (data/reference/offline's, whose margins were moved after a pilot) is judged by the present
    one, and a load of the design it lacks is reported missing. The run's own repeats, requests and configurations
    stay its own; the run's copy stands in where the repository has no such profile."""
    from omegaconf import OmegaConf

    experiment = {**meta.experiment, **OmegaConf.to_container(conf_file("experiment/serving.yaml"))}
    grid = meta.serving_grid
    profile = _profile(meta.profile_name)
    if profile is not None and profile.profile.get("serving") is not None:
        own = OmegaConf.to_container(profile.profile.serving)
        grid.update({k: own[k] for k in ("rates", "pilot") if k in own})
        if "pilot" not in own:
            grid.pop("pilot", None)
    return experiment, grid


def judged_goals(data: dict, table: pd.DataFrame, experiment: dict, grid: dict) -> tuple[
        list[Goal], list[GoalPair], dict[str, LatencyMape], dict[str, AcceptanceErrors], list[GoalPower]]:
    """(goals with their final verdicts, the per-load pairs, latency detail, acceptance detail, each goal's planned
    power) of a run judged by `experiment` and `grid` (judged_by)."""
    design, margins, rates = experiment["families"], experiment["margins"], grid.get("rates") or {}
    spec_goals, pairs = speculation_goals(data, design, margins, rates)
    goals = spec_goals + chunking_goals(data, table, design, margins, rates)
    latency_rows, latency = latency_goals(data["requests"], float(experiment["mape_goal"]))
    acceptance_rows, acceptance = acceptance_goals(data["requests"], design)
    planned = planned_goals(design, rates, margins)
    power = goal_power(planned, pilot_path(grid), int(runs(data).repeat.nunique()), grid.get("requests"))
    goals = family_wise(goals + latency_rows + acceptance_rows, planned, power)
    return goals, pairs, latency, acceptance, power


def serving_summary(results: Path, seed: int = 0) -> ServingSummary:
    """Everything the serving study's analysis reports (summary.json's `serving`, rakv.experiments.summary)."""
    from rakv.experiments.config import configuration
    from rakv.serving.batchcost import BatchCost

    layout = RunLayout.of(results)
    data = load(layout)
    meta = read_serving_metadata(layout)
    experiment, grid = judged_by(meta)
    design, margins = experiment["families"], experiment["margins"]
    table = cell_table(data)
    cells = runs(data)
    goals, pairs, latency, acceptance, power = judged_goals(data, table, experiment, grid)
    # exactness is a check of the engine (reported beside the goals, `exact`), not a goal of the policies
    equal, total = int(cells.outputs_equal_ar.sum()), int((cells.completed + cells.failed).sum())
    chosen = configuration(grid["configuration"])
    cost = BatchCost.from_json(json.loads(layout.serving.batch_cost(grid["configuration"]).read_text()))
    calibration = layout.calibration(chosen.pair, chosen.proposer, chosen.precision)
    alpha = read_cost_table(calibration).acceptance if calibration.exists() else None
    slos = (cells.groupby("configuration")[["slo_itl_ms", "slo_ttft_ms", "slo_tpot_ms"]].median()
            .to_dict("index"))
    return ServingSummary(
        configuration=grid["configuration"], configurations=sorted(cells.configuration.unique()),
        calibrated_acceptance=alpha, runs=int(len(cells)), requests=int(len(data["requests"])),
        repeats=int(cells.repeat.nunique()), commit=meta.git_commit,
        slo_steps=SloSteps(**meta.slo_steps),  # the run's: its SLOs were measured by them
        slos_ms={name: Slos(**v) for name, v in slos.items()},
        margins=Margins(**margins, by_family=family_margins(design)),
        mape_goal=float(experiment["mape_goal"]), itl_slo_ms=float(cells.slo_itl_ms.median()),
        exact=ServedExact(equal, total),
        cells=[Cell(**r) for r in table.to_dict("records")], pairs=pairs,
        iteration_mape=iteration_mape(data["iterations"]), latency=latency, acceptance=acceptance,
        chosen_k=[ChosenK(**r) for r in chosen_k(data["iterations"]).to_dict("records")],
        break_even_by_batch=[BatchBreakEven(**r) for r in break_even_by_batch(cost).to_dict("records")],
        goals=goals, comparisons=comparisons(data), power=family_power(cells, grid, design, margins),
        goal_power=power)


