"""The per-request choice of (reuse, proposer, k) against fixed choices, per workload (docs/heads.md, "Choosing the
proposer per request"), from the study of a configuration of several proposers (conf/configuration/*-all.yaml):

- regret: rakv-asd's mean latency over that of the best fixed (proposer, k) of each workload (a dataset) and of the
  pooled workloads, minus one (positive: rakv-asd slower), on the same instances, with its 95 % CI over prompts.
  The best fixed action is picked in hindsight on the same measurements, which favours it. Goal: <= 5 %.
- rakv-asd against the rakv-asd of each single-proposer configuration of the same pair and precision that the same
  study ran (on the same instances): the same ratio. Goal: rakv-asd faster than every one. Beside them, for
  reference, against each proposer's best fixed (reuse, k) in hindsight (k = 0 included in each).
- the proposers against each other, per workload: each proposer's best fixed (reuse, k) against the first proposer's
  (the int8 self-draft in smollm2-all), on the same instances (for reference: whether the heads are faster than the
  self-draft on some workload);
- which proposer rakv-asd ran, per workload (k = 0: "none");
- each proposer's prices from its calibration (`prices`): the proposal of k = 4 candidates and a verify of five
  tokens over one target step at the price context, and the calibrated acceptance (goal for the heads' proposal:
  <= 0.05 of a step).

Each goal's verdict is judged on the CI (`rakv.experiments.verdicts.below`): met where the whole interval is on the
goal's side, missed where it is wholly on the other, inconclusive where it straddles, missing without one. The goals
and margins are those set with the heads (docs/heads.md, "Goals"), before any all-proposer study ran.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from rakv.experiments.intervals import CI, cluster_interval, prompt_keys
from rakv.experiments.oracle import INSTANCE, best_fixed_action, fixed_action_latencies, measurements, with_hit
from rakv.experiments.verdicts import below
from rakv.runtime.actions import ADAPTIVE, Action

REGRET_GOAL = 0.05  # rakv-asd at most 5 % slower than the best fixed (proposer, k) of each workload
POOLED = "pooled"


@dataclass(frozen=True)
class ChoiceRow:
    """rakv-asd (or one proposer's best fixed action) against a baseline on one workload."""

    configuration: str
    workload: str  # a dataset, or "pooled"
    baseline: str  # "best fixed", "rakv-asd of <configuration>", "best fixed <proposer>", "<p> vs <first>"
    action: str  # the baseline's action label (`heads:r0k4`; k = 0 unqualified)
    instances: int
    regret: CI  # mean latency(subject) / mean latency(baseline) - 1 over the same instances; CI over prompts
    goal: str  # the goal this row is judged against
    verdict: str  # met | missed | inconclusive | missing (rakv.experiments.verdicts.Verdict); -: no goal


@dataclass(frozen=True)
class ChoiceShare:
    configuration: str
    workload: str
    proposer: str  # the kind rakv-asd ran ("none": k = 0)
    share: float  # of rakv-asd's runs on the workload


def regret_of(own: pd.DataFrame, other: pd.DataFrame, on: list[str]) -> tuple[int, CI]:
    """Latency rows `own` against `other` on the instances both have (`on`): (instances, mean ratio - 1 with its CI
    over prompts)."""
    both = own[on + ["latency_s"]].merge(other[on + ["latency_s"]], on=on, suffixes=("_own", "_other")).dropna()
    return len(both), cluster_interval(prompt_keys(both), both.latency_s_own, both.latency_s_other,
                                       transform=lambda r: r - 1.0)


def regret_against(runs: pd.DataFrame, meas: pd.DataFrame, label: str) -> tuple[int, CI]:
    """rakv-asd's runs against a fixed action on the instances both have."""
    fixed = fixed_action_latencies(meas, Action.parse(label), with_hit(meas))
    return regret_of(runs[runs.strategy == ADAPTIVE], fixed, INSTANCE)


def proposer_actions(meas: pd.DataFrame, proposer: str) -> pd.DataFrame:
    """One proposer's actions and the k = 0 ones (unqualified labels): what a configuration of it alone measures."""
    parsed = meas.action.map(Action.parse)
    return meas[parsed.map(lambda a: a.k == 0 or a.proposer == proposer)]


def single_proposer_configurations(runs: pd.DataFrame, configuration: str) -> list[str]:
    """The study's other configurations of the same pair and precision with one proposer among this one's: their
    rakv-asd runs are the single-proposer choices on the same instances."""
    frame = runs if "precision" in runs else runs.assign(precision="fp32")
    mine = frame[frame.configuration == configuration]
    pair, precision = mine.pair.iloc[0], mine.precision.iloc[0]
    mine_proposers = {Action.parse(a).proposer for a in mine.action.dropna()} - {""}
    others = frame[(frame.pair == pair) & (frame.precision == precision) & (frame.configuration != configuration)
                   & frame.proposer.isin(mine_proposers)]
    single = [name for name, part in others.groupby("configuration")
              if not part.action.fillna("").str.contains(":", regex=False).any()]
    return sorted(single)


def choice_rows(runs: pd.DataFrame, configuration: str) -> tuple[list[ChoiceRow], list[ChoiceShare]]:
    """The regret rows and the proposer shares of one configuration of several proposers (`runs`: the whole
    study, so that single-proposer configurations of the same pair are compared on the same instances)."""
    study, runs = runs, runs[runs.configuration == configuration]
    if runs.empty:
        raise ValueError(f"no study runs of configuration {configuration!r}")
    meas = measurements(runs)
    if not meas.action.str.contains(":", regex=False).any():
        raise ValueError(f"configuration {configuration!r} holds one proposer: there is no choice of proposer")
    rows, shares = [], []
    workloads = [(str(d), runs[runs.dataset == d], meas[meas.dataset == d]) for d in sorted(runs.dataset.unique())]
    for workload, part, measured in [*workloads, (POOLED, runs, meas)]:
        best = best_fixed_action(measured)
        n, ci = regret_against(part, measured, best)
        rows.append(ChoiceRow(configuration, workload, "best fixed", best, n, ci,
                              f"regret <= {REGRET_GOAL:.0%}", str(below(ci, REGRET_GOAL))))
        own = part[part.strategy == ADAPTIVE].action.map(Action.parse)
        kinds = own.map(lambda a: a.proposer if a.k else "none").value_counts(normalize=True)
        shares += [ChoiceShare(configuration, workload, str(kind), float(share)) for kind, share in kinds.items()]
    own = runs[runs.strategy == ADAPTIVE]
    for name in single_proposer_configurations(study, configuration):
        theirs = study[(study.configuration == name) & (study.strategy == ADAPTIVE)]
        n, ci = regret_of(own, theirs, [c for c in INSTANCE if c != "configuration"])
        rows.append(ChoiceRow(configuration, POOLED, f"rakv-asd of {name}", ADAPTIVE, n, ci, "faster (regret < 0)",
                              str(below(ci, 0.0))))
    for proposer in sorted({Action.parse(a).proposer for a in meas.action} - {""}):
        alone = proposer_actions(meas, proposer)
        best = best_fixed_action(alone)
        n, ci = regret_against(runs, alone, best)
        rows.append(ChoiceRow(configuration, POOLED, f"best fixed {proposer}", best, n, ci, "none (reference)", "-"))
    first = str(runs.proposer.iloc[0])
    for workload, _, measured in [*workloads, (POOLED, runs, meas)]:
        hit = with_hit(measured)
        best = {p: best_fixed_action(proposer_actions(measured, p), proposer_actions(hit, p))
                for p in sorted({Action.parse(a).proposer for a in measured.action} - {""})}
        for proposer in (p for p in best if p != first and first in best):
            mine, theirs = (fixed_action_latencies(measured, Action.parse(best[q]), hit) for q in (proposer, first))
            n, ci = regret_of(mine, theirs, INSTANCE)
            label = f"{best[proposer]} / {best[first]}"
            rows.append(ChoiceRow(configuration, workload, f"{proposer} vs {first}", label, n, ci, "none (reference)",
                                  "-"))
    return rows, shares


PROPOSAL_GOAL = 0.05  # the heads' proposal of k = 4 candidates over one target step


@dataclass(frozen=True)
class ProposerPrice:
    """One proposer's prices from its calibration, at `context` tokens of context."""

    calibration: str  # <pair>-<proposer> (its file's stem)
    context: int
    step_ms: float  # one target decode step
    propose_4: float  # proposing four candidates / one target step
    verify_5: float  # verifying five tokens / one target step
    alpha: float  # the calibration's acceptance per candidate


def prices(tables: dict, context: int) -> list[ProposerPrice]:
    """`tables` (rakv.experiments.calibrations.calibration_tables) as prices at `context`."""
    out = []
    for stem, table in sorted(tables.items()):
        step = table.target_step(context)
        out.append(ProposerPrice(stem, context, 1e3 * step, table.propose[4](context) / step,
                                 table.verify[4](context) / step, float(table.acceptance)))
    return out


def render_prices(rows: list[ProposerPrice]) -> str:
    lines = [f"{'calibration':<24} {'context':>7} {'step ms':>8} {'propose(4)/step':>16} {'verify(5)/step':>15} "
             f"{'alpha':>6}"]
    lines += [f"{r.calibration:<24} {r.context:>7} {r.step_ms:>8.2f} {r.propose_4:>16.4f} {r.verify_5:>15.3f} "
              f"{r.alpha:>6.3f}" for r in rows]
    return "\n".join(lines)


def all_proposer_configurations(runs: pd.DataFrame) -> list[str]:
    """The study's configurations whose actions name their proposer (configurations of several proposers)."""
    qualified = runs[runs.action.fillna("").str.contains(":", regex=False)]
    return sorted(qualified.configuration.unique())


def render(rows: list[ChoiceRow], shares: list[ChoiceShare]) -> str:
    """The rows as a plain-text table (scripts/proposer_choice.py prints it)."""
    lines = [f"{'configuration':<14} {'workload':<10} {'against':<26} {'action':<34} {'n':>4}  "
             f"{'latency ratio - 1 [95 % CI]':<30} {'goal':<20} verdict",
             "(the ratio: rakv-asd's mean latency over the baseline's on the same instances; in rows '<p> vs <q>', "
             "p's best fixed action's over q's)"]
    for r in rows:
        interval = f"{r.regret.value:+.1%} [{r.regret.low:+.1%}, {r.regret.high:+.1%}]"
        lines.append(f"{r.configuration:<14} {r.workload:<10} {r.baseline:<26} {r.action:<34} {r.instances:>4}  "
                     f"{interval:<30} {r.goal:<20} {r.verdict}")
    by = {}
    for s in shares:
        by.setdefault((s.configuration, s.workload), []).append(f"{s.proposer} {s.share:.0%}")
    lines += [f"rakv-asd ran, {c} {w}: " + ", ".join(v) for (c, w), v in by.items()]
    return "\n".join(lines)
