"""Controller ablations replayed on a finished study: each variant decides again, the sweep says what it costs.

The study measures every feasible action of every scenario several times, so the latency of *any*
choice is known without running it again (full-information replay). A variant of the controller
(`ControllerConfig` with some options changed) re-decides the study's rakv-asd requests in their original
order; a decision's latency is the measurement of the chosen action in the same scenario and repeat, plus
the decision time the live controller recorded for that request, and its acceptance tracker learns from the
rounds of that measurement (per-round averages). A variant decides with the same work over the same actions, so
its own time differs by microseconds in seconds of latency; timing it anew would make the table of a finished
study change from one regeneration to the next, and the shipped reference run's must not. The variant is then
judged by exactly the statistics of rakv.experiments.study_stats.

    .venv/bin/python scripts/ablate_controller.py results/offline             # the standard variants
    .venv/bin/python scripts/ablate_controller.py results/offline tie_margin=0.1 explore_every=4

Replay is an approximation of a live rerun (`./reproduce.sh controller.<option>=...`): a live run would
also draw fresh timing noise and learn from its own rounds rather than the sweep's. A per-round depth
(`depth_per_round`, rakv.runtime.depth) cannot be replayed at all: the sweep measured fixed k only. Replayed
variants therefore decide k per request (depth_per_round off), and the table's first row per
configuration is the study's own live rakv-asd runs, judged by the same statistics.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd

from rakv.experiments import analysis
from rakv.experiments.calibrations import proposer_tables
from rakv.experiments.metadata import read_run_metadata
from rakv.experiments.oracle import adaptive_mask, measured_strategies, measurements, strategy_latencies
from rakv.experiments.proposer_choice import all_proposer_configurations
from rakv.experiments.study_stats import MeasuredStatistics, configuration_statistics
from rakv.experiments.summary import ConfigurationStatistics
from rakv.runtime.actions import Action
from rakv.runtime.cache import Hit
from rakv.runtime.controller import Controller, ControllerConfig, Decision, ProposerChoice
from rakv.runtime.costmodel import CostTable
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import RunLayout

# The ideas of the controller, each on and off against the configured default (conf/controller/default.yaml)
VARIANTS = {
    "tie-breaking 5 % (tie_margin=0.05)": {"tie_margin": 0.05},
    "tie-breaking 10 % (tie_margin=0.1)": {"tie_margin": 0.1},
    "exploration every 8th k=0 decision": {"explore_every": 8},
    "match-rate model (match_rate=true)": {"match_rate": True},
    "faster-forgetting acceptance (beta=0.9)": {"beta": 0.9},
    "slower-forgetting acceptance (beta=0.99)": {"beta": 0.99},
    "calibrated acceptance only (beta=0.999)": {"beta": 0.999},
    "no speculation (k_set=[0])": {"k_set": (0,)},
}


def parse_overrides(items: list[str]) -> dict[str, float | bool | tuple[int, ...]]:
    """`name=value` pairs of ControllerConfig fields (k_set as 0,2,4)."""
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in ControllerConfig.FIELDS or not value:
            raise RakvError(f"'{item}' is not name=value of a controller option ({', '.join(ControllerConfig.FIELDS)})")
        if name == "k_set":
            out[name] = tuple(int(v) for v in value.strip("[]").split(","))
        elif name in ("match_rate", "depth_per_round"):
            out[name] = value.lower() in ("1", "true", "yes", "on")
        else:
            out[name] = float(value)
    if "explore_every" in out:
        out["explore_every"] = int(out["explore_every"])
    return out


def empty_rounds(run) -> int:
    """Speculative rounds without a candidate: recorded, or (older studies) what the token count leaves over:
    every round confirms accepted + 1 tokens, the prefill one more."""
    recorded = getattr(run, "empty_rounds", None)
    if recorded is not None and recorded == recorded:
        return int(recorded)
    return max(int(run.new_tokens) - 1 - int(run.accepted) - int(run.rounds), 0)


def replay_controller(table, config: ControllerConfig, part: pd.DataFrame) -> Controller | ProposerChoice:
    """The controller a replay decides with: one proposer's from its table, or (`table` a dict: proposer -> table,
    a configuration of several proposers) their ProposerChoice, each proposer offered no deeper k than the study
    measured of it (the heads: one candidate per head; the study's plan asked the pair, this reads the plan)."""
    if not isinstance(table, dict):
        return Controller(table, config)
    actions = part.action.map(Action.parse)
    deepest = {name: int(max((a.k for a in actions if a.proposer == name), default=0)) for name in table}
    return ProposerChoice.of(table, config, {name: k for name, k in deepest.items() if k < max(config.k_set)})


def replayed_decision(controller: Controller | ProposerChoice, row, hit: Hit) -> tuple[Decision, str, Controller]:
    """(decision, the study's label of its action, the controller that learns from its rounds)."""
    if isinstance(controller, ProposerChoice):
        proposer, decision = controller.decide(row.prompt_tokens, hit, row.new_tokens)
        return decision, decision.action.of_proposer(proposer).label, controller.controllers[proposer]
    decision = controller.decide(row.prompt_tokens, hit, row.new_tokens)
    return decision, decision.action.label, controller


def replay(runs: pd.DataFrame, meas: pd.DataFrame, table, config: ControllerConfig, configuration: str) -> pd.DataFrame:
    """The configuration's rakv-asd runs as a controller with `config` would have made them (`table`: its
    calibration, or per proposer for a configuration of several: `replay_controller`)."""
    live = runs[adaptive_mask(runs, configuration)]
    part = meas[meas.configuration == configuration]
    repeats = part.repeat.nunique()
    lookup = part.set_index(["dataset", "prompt_id", "scenario", "action", "repeat"]).sort_index()
    controller = replay_controller(table, config, part)
    rows = []
    for row in live.sort_values("order").itertuples(index=False):
        exact = row.scenario == "exact"
        draft = getattr(row, "available_draft_tokens", 0)  # none offered in a study from before draft state was stored
        draft = int(draft) if draft == draft and draft is not None else 0
        hit = Hit(row.prompt_tokens, row.prompt_tokens if exact else row.available_hit_tokens + 1, exact,
                  draft_tokens=draft) if row.available_hit_tokens else Hit(row.prompt_tokens)
        decision, label, learner = replayed_decision(controller, row, hit)
        key = (row.dataset, row.prompt_id, row.scenario, label, row.repeat % repeats)
        if key not in lookup.index:
            raise RakvError(f"replay: no measurement of {'/'.join(map(str, key))} in the study")
        measured = lookup.loc[key]
        if measured.rounds:
            learner.tracker.observe_mean(measured.accepted / measured.rounds,
                                         measured.rejections / measured.rounds, int(measured.rounds))
        if measured.k:
            learner.tracker.observe_matches(int(measured.rounds), empty_rounds(measured))
        latency = float(measured.latency_s) + float(row.decision_s)  # the live decision's time (module docstring)
        rows.append({**row._asdict(), "action": label, "k": decision.action.k,
                     "reuse": decision.action.reuse, "latency_s": latency, "tokens_per_s": row.new_tokens / latency,
                     "predicted_latency_s": decision.predicted_latency_s})
    return pd.DataFrame(rows, columns=list(live.columns))


@dataclass(frozen=True)
class Measured:
    """One configuration's measurements and what its statistics read from them alone: replaying a controller
    changes its rakv-asd runs only (their scenarios and the sweep stay), so this is computed once per
    configuration, not once per variant."""
    meas: pd.DataFrame
    strategies: pd.DataFrame  # rakv.experiments.oracle.measured_strategies
    statistics: MeasuredStatistics

    @classmethod
    def of(cls, meas: pd.DataFrame, configuration: str) -> Measured:
        part = meas[meas.configuration == configuration]
        return cls(part, measured_strategies(part), MeasuredStatistics.of(part))


def variant_statistics(runs: pd.DataFrame, replayed: pd.DataFrame, configuration: str,
                       measured: Measured | None = None) -> ConfigurationStatistics:
    """rakv.experiments.study_stats' statistics of one configuration with its rakv-asd runs replaced by `replayed`
    (`measured`: the configuration's `Measured`, from all of `runs`' measurements)."""
    measured = Measured.of(measurements(runs), configuration) if measured is None else measured
    part = runs[(runs.configuration == configuration) & ~adaptive_mask(runs, configuration)]
    part = pd.concat([part, replayed], ignore_index=True)
    return configuration_statistics(part, measured.meas, strategy_latencies(part, measured=measured.strategies),
                                    measured.statistics)


LIVE = "live: the study's rakv-asd runs"


def replayable(config: ControllerConfig) -> ControllerConfig:
    """What replay can evaluate of a controller: its request-level decisions (rakv.runtime.depth is live only)."""
    return replace(config, depth_per_round=False)


def standard_variants(study: ControllerConfig, changes: dict | None = None) -> dict[str, ControllerConfig | None]:
    """The study's live runs (None: not replayed), the configured default and the controller the study ran (when
    it differs), each replayed, and each of `changes` (default: VARIANTS) applied to the configured default."""
    default = replayable(ControllerConfig.default())
    variants = {LIVE: None, "default (conf/controller), replayed": default}
    if replayable(study) != default:
        variants["as the study ran it, replayed"] = replayable(study)
    for name, change in (VARIANTS if changes is None else changes).items():
        variants[name] = replace(default, **change)
    return variants


def ablation_table(runs: pd.DataFrame, tables: dict, variants: dict[str, ControllerConfig | None],
                   study: ControllerConfig | None = None) -> pd.DataFrame:
    """One row per (configuration, variant): regret, accuracy, ranking, error, and latency against the best
    fixed action, with CIs. A variant None is the study's live runs (`study`: the controller they ran)."""
    meas = measurements(runs)
    default = ControllerConfig.default()
    rows = []
    for configuration in sorted(runs.configuration.unique()):
        table = tables.get(configuration)
        if table is None or (isinstance(table, dict) and None in table.values()):
            raise RakvError(f"no calibration kept for configuration {configuration}")
        measured = Measured.of(meas, configuration)
        for name, config in variants.items():
            if config is None:
                config = study or default
                replayed = runs[adaptive_mask(runs, configuration)]
            else:
                replayed = replay(runs, meas, table, config, configuration)
            s = variant_statistics(runs, replayed, configuration, measured)
            changed = {k: v for k, v in asdict(config).items() if v != getattr(default, k)}
            # each CI as the list [value, low, high]: the form ablation.csv has always had
            rows.append({"configuration": configuration, "variant": name,
                         "options": ", ".join(f"{k}={v}" for k, v in changed.items()) or "-",
                         "mean_regret": list(s.mean_regret), "worst_regret": s.worst_regret,
                         "accuracy_action": list(s.accuracy_action),
                         "accuracy_within_noise": list(s.accuracy_within_noise), "spearman": list(s.spearman),
                         "mape": list(s.mape), "vs_best_fixed": list(s.latency_reduction.best_fixed),
                         "best_fixed_action": s.best_fixed_action,
                         "speculative_share": float((replayed.k > 0).mean())})
    return pd.DataFrame(rows)


def study_ablations(results: Path, changes: dict | None = None) -> pd.DataFrame:
    """The ablation table of a finished study folder: its live runs, then the standard variants (or `changes`)."""
    layout = RunLayout.of(results)
    runs = pd.read_parquet(layout.study.runs)
    study = ControllerConfig.from_conf(read_run_metadata(layout).controller)
    return ablation_table(runs, replay_tables(runs, results), standard_variants(study, changes), study)


def replay_tables(runs: pd.DataFrame, results: Path) -> dict[str, CostTable | dict[str, CostTable | None] | None]:
    """Configuration -> its kept calibration; for a configuration of several proposers, proposer -> calibration
    (its rakv-asd priced each proposer by that proposer's table)."""
    tables = analysis.tables_by_configuration(runs, results)
    for name in all_proposer_configurations(runs):
        tables[name] = proposer_tables(runs, results, name)
    return tables


def format_table(frame: pd.DataFrame) -> str:
    """Markdown: each [value, low, high] as `value [low, high]` in per cent (Spearman as a number)."""
    def cell(value, percent=True):
        if isinstance(value, (list, tuple)):  # a CI (rakv.experiments.intervals)
            value, low, high = value
            f = (lambda v: f"{100 * v:.1f}") if percent else (lambda v: f"{v:.2f}")
            return f"{f(value)} [{f(low)}, {f(high)}]" if low == low else f(value)
        if isinstance(value, float):
            return f"{100 * value:.1f}" if percent else f"{value:.2f}"
        return str(value)

    columns = ["configuration", "variant", "mean_regret", "worst_regret", "accuracy_action", "accuracy_within_noise",
               "spearman", "mape", "vs_best_fixed", "speculative_share"]
    header = ("| configuration | variant | mean regret % | worst regret % | accuracy strict % "
              "| accuracy within noise % "
              "| Spearman (per scenario) | MAPE % | latency reduction vs best fixed % | speculative share % |")
    lines = [header, "|" + "---|" * len(columns)]
    for row in frame.to_dict("records"):
        lines.append("| " + " | ".join(cell(row[c], c != "spearman") for c in columns) + " |")
    return "\n".join(lines)
