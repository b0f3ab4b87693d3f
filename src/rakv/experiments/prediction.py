"""What a machine's calibration predicts for the study's headline comparisons before the study runs, and how the
measured ones compare (scripts/predict_headlines.py; `./reproduce.sh` prints it after calibrating and again at the
end; the paper's "Across runs and machines"; docs/outputs.md, "Predicted headlines").

The study's requests have the same shapes on every machine (the profile's prompts, scenarios and output length:
`request_shapes`, read from a run's runs.parquet, or the shipped reference run's before a study has run). For each
request the cost model prices every action (rakv.runtime.costmodel.estimate_latency) at the calibration's
acceptance and match rate; RAKV-ASD is the action of least estimate, as the controller's first choice, and the
four headline comparisons follow as the study computes them (ratios of sums over the requests):

- RAKV-ASD against fixed Joint-k4 and against KV-only: 1 - sum(chosen) / sum(baseline);
- against the best fixed action in hindsight: the same, against the single action of least sum;
- the regime: sum over requests of the best k > 0 / the best k = 0, minus 1.

The prediction is the median and 95 % interval of what the calibration's own uncertainty allows (`predict`,
seeded Monte Carlo): the controller decides on the calibrated costs while the costs it then meets differ from them
by a factor per measured curve, log-normal with the run-to-run standard deviation of a curve measured on one
machine class (`calibration_run_sd`, from the shipped pairs of same-commit, same-machine calibrations), and the
acceptance (and prompt lookup's match rate) is drawn from a beta of the calibration's rounds. What it leaves out,
and what a miss is then traced to (`PredictionRow.cause`): the study prompts' own acceptance, which the calibration
cannot know (re-predicted with the acceptance the study measured), and the cost model's own error (its MAPE in the
summary).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from rakv.runtime.actions import BEST_FIXED, JOINT_K4, KV_ONLY, Action
from rakv.runtime.costmodel import CostTable, RequestFeatures, estimate_latency, read_cost_table
from rakv.runtime.run_layout import RunLayout

COMPARISONS = {  # name -> the summary's measured statistic of the same definition (per configuration)
    "vs Joint-k4": f"latency_reduction.{JOINT_K4}",
    "vs KV-only": f"latency_reduction.{KV_ONLY}",
    "vs best fixed": f"latency_reduction.{BEST_FIXED}",
    "best k>0 vs k=0": "spec_slowdown.pooled",
}
SHAPE = ["prompt_tokens", "available_hit_tokens", "new_tokens", "exact_hit", "available_draft_tokens"]
DRAWS = 200


def request_shapes(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (configuration, dataset, prompt, scenario) with the request's shape (what the store offers, not
    what any action took)."""
    key = ["configuration", "dataset", "prompt_id", "scenario"]
    runs = runs.assign(available_draft_tokens=runs.get("available_draft_tokens",
                                                       pd.Series(0, index=runs.index)).fillna(0))
    return runs.drop_duplicates(key)[key + SHAPE].reset_index(drop=True)


def action_costs(table: CostTable, shapes: pd.DataFrame, actions: list[Action], alpha: float,
                 match: float) -> np.ndarray:
    """Estimated latency of every action (columns) for every request (rows)."""
    table = remembering(table)
    out = np.empty((len(shapes), len(actions)))
    for i, r in enumerate(shapes.itertuples(index=False)):
        features = RequestFeatures(int(r.prompt_tokens), int(r.available_hit_tokens), int(r.new_tokens),
                                   bool(r.exact_hit), int(r.available_draft_tokens))
        for j, a in enumerate(actions):
            out[i, j] = estimate_latency(table, features, a.reuse, a.k, alpha, 0.0, match)
    return out


def remembering(table: CostTable) -> CostTable:
    """The table with each curve remembering the values it gave: a request's actions read the same points of the
    same curves again and again (the prefill at two lengths, one step and one verify and propose per k), and the
    Monte Carlo prices every request a few hundred times. The same values, computed once each."""
    def remember(curve):
        return functools.cache(curve)

    return replace(table, target_prefill=remember(table.target_prefill), target_step=remember(table.target_step),
                   proposer_prefill=remember(table.proposer_prefill), kv_copy=remember(table.kv_copy),
                   verify={k: remember(c) for k, c in table.verify.items()},
                   propose={k: remember(c) for k, c in table.propose.items()})


def comparisons(chosen: np.ndarray, costs: np.ndarray, actions: list[Action]) -> dict[str, float]:
    """The four headline comparisons when the controller runs action `chosen[i]` on request i and every action
    costs `costs`."""
    index = {a.label: j for j, a in enumerate(actions)}
    rows = np.arange(len(costs))
    ours = costs[rows, chosen].sum()
    spec = [j for j, a in enumerate(actions) if a.k > 0]
    plain = [j for j, a in enumerate(actions) if a.k == 0]

    def against(strategy: str) -> float:  # NaN where the action set lacks the baseline's action
        label = Action.of_strategy(strategy).label
        return 1.0 - ours / costs[:, index[label]].sum() if label in index else math.nan

    regime = (costs[:, spec].min(axis=1).sum() / costs[:, plain].min(axis=1).sum() - 1.0) if spec and plain else \
        math.nan
    return {"vs Joint-k4": against(JOINT_K4), "vs KV-only": against(KV_ONLY),
            "vs best fixed": 1.0 - ours / costs.sum(axis=0).min(), "best k>0 vs k=0": regime}


def perturbed(table: CostTable, factors) -> CostTable:
    """The table with each measured curve's values scaled by the next of `factors` (an iterator): one factor per
    curve, since a calibration's run-to-run shift moves a curve as a whole (docs/outputs.md)."""
    def scaled(curve):
        factor = next(factors)
        return replace(curve, ys=[y * factor for y in curve.ys])

    return replace(table, target_prefill=scaled(table.target_prefill), target_step=scaled(table.target_step),
                   proposer_prefill=scaled(table.proposer_prefill), kv_copy=scaled(table.kv_copy),
                   verify={k: scaled(c) for k, c in table.verify.items()},
                   propose={k: scaled(c) for k, c in table.propose.items()})


def beta_draw(rng, mean: float, rounds: int) -> float:
    """A draw of a calibrated rate from its beta (Jeffreys' prior) over the calibration's rounds."""
    if rounds <= 0 or not 0 < mean < 1:
        return mean
    return float(rng.beta(mean * rounds + 0.5, (1 - mean) * rounds + 0.5))


def predict(table: CostTable, shapes: pd.DataFrame, actions: list[Action], run_sd: float, draws: int = DRAWS,
            seed: int = 0, alpha: float | None = None) -> dict[str, list[float]]:
    """Each comparison's prediction, [median, 2.5 %, 97.5 %] of what a run measures under the calibration's
    uncertainty (`alpha`: predict at this acceptance instead of the calibration's, e.g. the one the study measured).

    The point is the draws' median, not the comparison at the calibrated costs themselves: against the best fixed
    action in hindsight a run's measurement is biased low, since hindsight takes the fixed action the run's costs
    favoured while the controller decided on the calibrated ones, so the noise-free value can lie above every draw.
    Where no draw differs from the calibration (no run-to-run
    spread, no acceptance rounds) the median is that value."""
    alpha = table.acceptance if alpha is None else alpha
    base = action_costs(table, shapes, actions, alpha, table.match_rate)
    chosen = base.argmin(axis=1)
    point = comparisons(chosen, base, actions)
    rng = np.random.default_rng(seed)
    samples = {name: [] for name in point}
    for _ in range(draws):
        factors = iter(np.exp(rng.normal(0.0, run_sd, 64)))
        world = perturbed(table, factors)
        costs = action_costs(world, shapes, actions, beta_draw(rng, alpha, table.acceptance_rounds),
                             beta_draw(rng, table.match_rate, table.acceptance_rounds))
        for name, value in comparisons(chosen, costs, actions).items():
            samples[name].append(value)
    return {name: np.percentile(samples[name], [50.0, 2.5, 97.5]).tolist() for name in point}


def calibration_run_sd(pairs: list[tuple[RunLayout, RunLayout]]) -> float | None:
    """The run-to-run standard deviation of a calibrated curve's log level on one machine class: over every curve
    of every same-commit, same-machine pair of results folders' calibrations, sqrt(mean(d^2) / 2) with d the mean
    log ratio of the curve's points between the two runs (None without a pair)."""
    shifts = []
    for a, b in pairs:
        for path in a.calibrations():
            other = b.calibration_dir / path.name
            if not other.exists():
                continue
            x, y = read_cost_table(path), read_cost_table(other)
            for ca, cb in zip(curves(x), curves(y)):
                ratios = [math.log(v / u) for u, v in zip(ca.ys, cb.ys) if u > 0 and v > 0]
                if ratios:
                    shifts.append(float(np.mean(ratios)))
    return math.sqrt(float(np.mean(np.square(shifts))) / 2.0) if shifts else None


def curves(table: CostTable) -> list:
    return [table.target_prefill, table.target_step, table.proposer_prefill, table.kv_copy,
            *(table.verify[k] for k in sorted(table.verify)), *(table.propose[k] for k in sorted(table.propose))]


@dataclass(frozen=True)
class PredictionRow:
    """One machine's prediction of one headline comparison beside what its study measured: `inside` (the measured
    estimate is what the prediction allows, `inside()`) and, for a miss, `cause`: "acceptance" where predicting at
    the acceptance the study measured allows it, else "cost model"."""
    run: str
    configuration: str
    comparison: str
    predicted: list
    measured: list | None
    inside: bool | None
    at_measured_acceptance: list | None
    cause: str | None


def configuration_table(folder: Path, configuration: str) -> CostTable | None:
    """A results folder's calibration of one configuration (calibration/<pair>-<proposer>.json), None if absent."""
    from rakv.experiments.config import configuration as configured

    chosen = configured(configuration)
    path = RunLayout.of(folder).calibration(chosen.pair, chosen.proposer, chosen.precision)
    return read_cost_table(path) if path.exists() else None


def measured_acceptance(summary, configuration: str) -> float | None:
    """The acceptance the study measured on a configuration, over its datasets weighted by runs."""
    rows = [r for r in summary.acceptance if r.configuration == configuration and r.acceptance is not None]
    runs = sum(r.runs for r in rows)
    return sum(r.acceptance * r.runs for r in rows) / runs if runs else None


def measured_value(statistics, comparison: str) -> list | None:
    """The summary's measured statistic of the same definition as a predicted comparison."""
    if comparison == "best k>0 vs k=0":
        return statistics.spec_slowdown.pooled or None
    return statistics.latency_reduction.against(COMPARISONS[comparison].split(".")[1])


def inside(interval, value) -> bool | None:
    """Whether a measured comparison is what its prediction allows: its estimate within the predicted interval
    widened, side by side, by the measurement's own CI (the study's prompts and timing noise, which the calibration
    cannot foresee: the two errors independent, their half-widths added in quadrature). None: nothing measured."""
    if value is None or value[0] is None or not np.isfinite(value[0]) or not np.isfinite(interval[0]):
        return None
    point, low, high = interval
    m, m_low, m_high = (float("nan") if v is None else v for v in value)
    below = m - m_low if np.isfinite(m_low) else 0.0
    above = m_high - m if np.isfinite(m_high) else 0.0
    lowest = min(low, point - math.hypot(max(point - low, 0.0), above))
    highest = max(high, point + math.hypot(max(high - point, 0.0), below))
    return bool(lowest <= m <= highest)


def run_predictions(folder: Path, shapes: pd.DataFrame, run_sd: float, label: str | None = None,
                    draws: int = DRAWS) -> list[PredictionRow]:
    """Every configuration of a run (`folder`: its calibration/, and summary.json once analysed) predicted from its
    calibration alone and, where the study has been analysed, set beside its measured comparisons. Before the study
    the actions are every (r, k) the calibration priced, afterwards the study's grid."""
    from rakv.experiments.summary import read_summary

    summary = read_summary(folder) if RunLayout.of(folder).summary.exists() else None
    rows = []
    for name in (summary.configurations if summary else sorted(shapes.configuration.unique())):
        table = configuration_table(folder, name)
        part = shapes[shapes.configuration == name]
        if table is None or part.empty:
            continue
        labels = summary.grid.actions if summary else [Action(reuse, k).label for reuse in (False, True)
                                                     for k in (0, *sorted(table.verify))]
        actions = [Action.parse(a) for a in labels]
        predicted = predict(table, part, actions, run_sd, draws)
        alpha = measured_acceptance(summary, name) if summary else None
        again = predict(table, part, actions, run_sd, draws, alpha=alpha) if alpha is not None else None
        for comparison, interval in predicted.items():
            measured = measured_value(summary.per_configuration[name], comparison) if summary else None
            hit = inside(interval, measured)
            second = again[comparison] if again else None
            cause = None if hit in (True, None) else "acceptance" if second and inside(second, measured) else \
                "cost model"
            rows.append(PredictionRow(label or Path(folder).name, name, comparison, interval, measured, hit, second,
                                      cause))
    return rows


def same_machine_calibrations(reference: Path) -> list[tuple[RunLayout, RunLayout]]:
    """The shipped pairs of runs of one commit on one machine class whose calibrations are compared: a reference run
    and each of its reruns beside it (rakv.experiments.runcompare.sibling_runs)."""
    from rakv.experiments.runcompare import sibling_runs

    return [(RunLayout.of(reference), RunLayout.of(sibling)) for sibling in sibling_runs(Path(reference))]


def shapes_for(results: Path, reference: Path) -> pd.DataFrame | None:
    """The study's request shapes: the run's own runs.parquet once its study has run, else the shipped reference
    run's of the same profile (the same prompts, scenarios and lengths on every machine); None without either."""
    for folder in (results, reference):
        path = RunLayout.of(folder).study.runs
        if path.exists():
            return request_shapes(pd.read_parquet(path, columns=["configuration", "dataset", "prompt_id",
                                                                "scenario", *SHAPE]))
    return None


def prediction_lines(rows: list[PredictionRow]) -> list[str]:
    """The table scripts/predict_headlines.py prints: predicted [95 %], measured [CI], inside, cause."""
    def ci(t):
        return "--" if t is None or t[0] is None else f"{t[0]:+7.1%} [{t[1]:+7.1%}, {t[2]:+7.1%}]"

    lines = [f"{'configuration':<16} {'comparison':<16} {'predicted [95 %]':>28} {'measured [95 % CI]':>28}  inside"]
    for r in rows:
        verdict = "--" if r.inside is None else "yes" if r.inside else f"no ({r.cause})"
        lines.append(f"{r.configuration:<16} {r.comparison:<16} {ci(r.predicted):>28} {ci(r.measured):>28}  {verdict}")
    return lines
