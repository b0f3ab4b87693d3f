"""RAKV-ASD controller (paper/main.tex, Method: "Cost model and controller"): per request, the feasible action of
least estimated latency.

Feasible actions are r in {0, 1} (1 only when the store holds a hit) x k in the configured set,
minus those whose K/V would exceed the memory budget. k = 0 is an ordinary action. Acceptance is
tracked online from the rounds actually run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rakv.runtime.actions import Action, parse_k_set
from rakv.runtime.cache import Hit
from rakv.runtime.costmodel import (
    CostTable,
    RequestFeatures,
    action_kv_bytes,
    estimate_latency,
    prediction_noise,
    tie_set,
)
from rakv.runtime.depth import MATCH_CLASSES, RoundDepth
from rakv.runtime.errors import RakvError
from rakv.runtime.paths import conf_file
from rakv.runtime.proposers import Proposer, proposer_type


def k_set_from_text(text: str) -> list[int]:
    """--k-set's comma-separated depths (ControllerConfig checks them)."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise RakvError(f"--k-set must be comma-separated integers, got '{text}'") from None


@dataclass(frozen=True)
class ControllerConfig:
    """The controller's settings. Defaults live in conf/controller/default.yaml (`ControllerConfig.default()`);
    every way of building one (Hydra config, CLI flags) goes through the same checks here. The fields with a `help`
    are also rakv generate's and rakv serve's flags (rakv.runtime.flags)."""

    k_set: tuple[int, ...] = field(metadata={"parse": k_set_from_text,
                                             "help": "rakv-asd: speculation depths it may choose"})
    beta: float = field(metadata={"help": "rakv-asd: EWMA weight of past acceptance"})  # the past's, per round
    memory_penalty_s_per_byte: float = field(metadata={  # lambda
        "flag": "--memory-penalty", "metavar": "LAMBDA",
        "help": "rakv-asd: seconds charged per byte of K/V an action holds"})
    memory_budget_mib: float = field(metadata={"help": "rakv-asd: actions above it are dropped"})
    tie_margin: float = 0.0  # estimates within this share of the best are ties, broken toward less speculation
    explore_every: int = 0  # every n-th decision that picks k = 0 runs the best k > 0 action instead (0: never)
    match_rate: bool = False  # model the share of rounds in which the proposer offers candidates (EWMA)
    depth_per_round: bool = False  # revise k every round from prompt lookup's match (rakv.runtime.depth)
    depth_prior_rounds: float = 4.0  # weight, in rounds, of the acceptance across requests against the request's own

    FIELDS = ("k_set", "beta", "memory_penalty_s_per_byte", "memory_budget_mib", "tie_margin", "explore_every",
              "match_rate", "depth_per_round", "depth_prior_rounds")

    def __post_init__(self):
        object.__setattr__(self, "k_set", parse_k_set(self.k_set))
        if not 0 <= self.tie_margin < 1:
            raise RakvError(f"controller tie_margin must be in [0, 1), got {self.tie_margin}")
        if self.explore_every < 0 or int(self.explore_every) != self.explore_every:
            raise RakvError(f"controller explore_every must be a whole number >= 0, got {self.explore_every}")
        if not 0 <= self.beta < 1:
            raise RakvError(f"controller beta must be in [0, 1), got {self.beta}")
        if self.memory_penalty_s_per_byte < 0:
            raise RakvError(f"controller memory_penalty_s_per_byte must be >= 0, got {self.memory_penalty_s_per_byte}")
        if self.memory_budget_mib <= 0:
            raise RakvError(f"controller memory_budget_mib must be positive, got {self.memory_budget_mib}")
        if not self.depth_prior_rounds > 0:
            raise RakvError(f"controller depth_prior_rounds must be positive, got {self.depth_prior_rounds}")

    @classmethod
    def from_conf(cls, conf) -> ControllerConfig:
        """From the `controller` group of a composed config (or any mapping with its keys)."""
        return cls(**{f: conf[f] for f in cls.FIELDS if f in conf})

    @classmethod
    def default(cls) -> ControllerConfig:
        return cls.from_conf(conf_file("controller/default.yaml"))


@dataclass
class Decision:
    action: Action
    predicted_latency_s: float
    predictions: dict[str, float]  # every feasible action's estimate, by label (r1k4, ...)
    alpha_before: float
    decision_s: float  # store peek + decision (rakv.runtime.strategies adds it to the request's latency)
    explored: bool = False  # an exploration probe: the best k > 0 action run instead of the chosen k = 0
    alpha_after: float | None = None  # set once the chosen action's rounds have been observed
    tracker_after: tuple[float, ...] | None = None  # the EWMA state then (accepted, rejected, matched): exact resume
    by_match_after: dict[str, tuple[float, ...]] | None = None  # the per-match-class EWMAs then (rakv.runtime.depth)
    tie_set: list[str] | None = None  # the actions within the cost model's noise of the best (costmodel.tie_set)


@dataclass
class AcceptanceTracker:
    """EWMA of per-round acceptance, kept as EWMAs of accepted candidates and of rejections per round.

    alpha = A / (A + F) with A, F the averages of accepted count and rejection indicator, which is
    the per-token acceptance estimate of `costmodel.acceptance_estimate` over a decaying window.
    """

    alpha0: float
    beta: float
    match0: float = 1.0
    positions: int = 0  # also per candidate position 1..positions (a proposer whose acceptance falls with it)
    accepted: float = field(init=False)
    rejected: float = field(init=False)
    matched: float = field(init=False)  # EWMA of "this round had candidates"
    by_position: list[list[float]] = field(init=False)  # per position: [accepted, rejected] EWMAs of the rounds
    # that reached it (its candidate offered, the ones before it accepted)

    def __post_init__(self):
        self.accepted, self.rejected, self.matched = self.alpha0, 1.0 - self.alpha0, self.match0
        self.by_position = [[self.alpha0, 1.0 - self.alpha0] for _ in range(self.positions)]

    @property
    def position_alphas(self) -> list[float]:
        """Per candidate position, the acceptance of the rounds that reached it (empty: not tracked)."""
        return [a / (a + r) if a + r > 0 else self.alpha0 for a, r in self.by_position]

    @property
    def alpha(self) -> float:
        total = self.accepted + self.rejected
        return self.accepted / total if total > 0 else self.alpha0

    def observe(self, round_log: list[tuple[int, int]], empty_rounds: int = 0) -> None:
        for proposed, accepted in round_log:
            self.observe_mean(accepted, float(accepted < proposed), 1)
            for i, ewma in enumerate(self.by_position[:min(proposed, accepted + 1)]):
                passed = float(i < accepted)
                ewma[0] = self.beta * ewma[0] + (1 - self.beta) * passed
                ewma[1] = self.beta * ewma[1] + (1 - self.beta) * (1.0 - passed)
        self.observe_matches(len(round_log), empty_rounds)

    def observe_matches(self, matched_rounds: int, empty_rounds: int) -> None:
        """The rounds' match indicator, in an order-free summary: its mean applied once per round."""
        total = matched_rounds + empty_rounds
        for _ in range(total):
            self.matched = self.beta * self.matched + (1 - self.beta) * matched_rounds / total

    @property
    def match_rate(self) -> float:
        return self.matched

    @property
    def state(self) -> tuple[float, ...]:
        """(accepted, rejected, matched), then each tracked position's (accepted, rejected)."""
        return (self.accepted, self.rejected, self.matched, *(v for ewma in self.by_position for v in ewma))

    def restore(self, state) -> None:
        """Continue from a recorded `state` (a resumed study makes the decisions an uninterrupted one makes)."""
        values = [float(x) for x in state if x is not None]
        self.accepted, self.rejected = values[:2]
        if len(values) > 2:
            self.matched = values[2]
        rest = values[3:]
        for i, ewma in enumerate(self.by_position[:len(rest) // 2]):
            ewma[:] = rest[2 * i:2 * i + 2]

    def observe_mean(self, accepted: float, rejected: float, rounds: int) -> None:
        """`rounds` updates with the given per-round averages (replaying runs summarised by their totals)."""
        for _ in range(rounds):
            self.accepted = self.beta * self.accepted + (1 - self.beta) * accepted
            self.rejected = self.beta * self.rejected + (1 - self.beta) * rejected


def choose(predictions: dict[Action, float], tie_margin: float = 0.0) -> Action:
    """The action of least estimate; estimates within `tie_margin` of it are ties, which go to the action with
    the least speculation, then the one that reuses (the cost model's error is a few per cent: a smaller
    predicted gain than that is noise, and speculating costs more when acceptance disappoints)."""
    least = min(predictions.values())
    tied = [a for a, v in predictions.items() if v <= least * (1 + tie_margin)]
    return min(tied, key=lambda a: (a.k, not a.reuse, predictions[a]))


def temperature_key(temperature: float | None) -> float:
    """The key of a sampling temperature's acceptance: 0.0 for greedy (any temperature <= 0), else the temperature
    to 4 decimals (two requests at 0.7 share what they learn)."""
    return 0.0 if not temperature or temperature <= 0 else round(float(temperature), 4)


@dataclass
class Learned:
    """What the controller learns about acceptance at one sampling temperature: the EWMA over rounds (with the match
    rate) and one per prompt-lookup match class (rakv.runtime.depth)."""

    tracker: AcceptanceTracker
    by_match: dict[str, AcceptanceTracker]
    decisions: int = 0  # at this temperature, for the exploration schedule (which keeps its estimate learning)

    @classmethod
    def starting_at(cls, alpha: float, beta: float, match_rate: float, positions: int = 0) -> Learned:
        return cls(AcceptanceTracker(alpha, beta, match_rate, positions),
                   {c: AcceptanceTracker(alpha, beta) for c in MATCH_CLASSES})


@dataclass
class Controller:
    """Per request, the feasible action of least estimated latency at the acceptance learnt so far at the request's
    sampling temperature. Acceptance under rejection sampling is E[sum_x min(p(x), q(x))], which moves with the
    temperature, so each temperature keeps its own estimate: greedy starts from the calibration's acceptance, another
    temperature from `start(temperature, alpha)` when one was measured there (else from the greedy calibration's, a
    prior its own rounds correct). Every method takes the request's `temperature` (default greedy)."""

    table: CostTable
    config: ControllerConfig = field(default_factory=ControllerConfig.default)
    per_position: bool = False  # price each candidate position's own acceptance (the heads'; docs/heads.md)

    def __post_init__(self):
        self.learned: dict[float, Learned] = {}
        self.noise = prediction_noise(self.table)  # the relative error of a calibrated cost: ties (tie_set)

    def start(self, temperature: float, alpha: float) -> None:
        """Where the estimate at `temperature` starts (the acceptance measured there); before any of its requests."""
        key = temperature_key(temperature)
        if key in self.learned:
            raise RakvError(f"the controller's acceptance at temperature {key:g} has already started")
        self.learned[key] = Learned.starting_at(alpha, self.config.beta, self.table.match_rate, self._positions)

    def learned_at(self, temperature: float = 0.0) -> Learned:
        key = temperature_key(temperature)
        if key not in self.learned:
            self.learned[key] = Learned.starting_at(self.table.acceptance, self.config.beta, self.table.match_rate,
                                                    self._positions)
        return self.learned[key]

    @property
    def _positions(self) -> int:
        return max(self.config.k_set) if self.per_position else 0

    def tracker_at(self, temperature: float = 0.0) -> AcceptanceTracker:
        return self.learned_at(temperature).tracker

    @property
    def tracker(self) -> AcceptanceTracker:
        """The greedy estimate (the study's, a replay's)."""
        return self.tracker_at(0.0)

    @property
    def alpha(self) -> float:
        return self.tracker.alpha

    @property
    def decisions(self) -> int:
        """Greedy decisions so far (journaled with the greedy tracker's state)."""
        return self.learned_at(0.0).decisions

    def predict(self, features: RequestFeatures, action: Action, alpha: float | None = None,
                temperature: float = 0.0) -> float:
        tracker = self.tracker_at(temperature)
        return estimate_latency(self.table, features, action.reuse, action.k, tracker.alpha if alpha is None else alpha,
                                self.config.memory_penalty_s_per_byte,
                                tracker.match_rate if self.config.match_rate else 1.0,
                                tracker.position_alphas if alpha is None and self.per_position else None)

    def feasible_actions(self, features: RequestFeatures, hit: Hit) -> list[Action]:
        """r = 1 only with a hit; actions whose K/V exceeds the memory budget are dropped."""
        budget = self.config.memory_budget_mib * (1 << 20)
        candidates = [Action(reuse, k) for reuse in ((False, True) if hit.is_hit else (False,))
                      for k in self.config.k_set]
        feasible = [a for a in candidates if action_kv_bytes(self.table, features, a.k) <= budget]
        if not feasible:
            raise RakvError(f"no action fits the memory budget of {budget / 2**20:.0f} MiB for a request of "
                            f"{features.prompt_tokens} + {features.new_tokens} tokens")
        return feasible

    def decide(self, prompt_tokens: int, hit: Hit, new_tokens: int, alpha: float | None = None,
               temperature: float = 0.0) -> Decision:
        """`alpha`: this request's acceptance when known otherwise (a served request's prefix-keyed acceptance,
        rakv.serving.acceptance); None: the EWMA at the request's `temperature`."""
        start = time.perf_counter()
        features = RequestFeatures.from_hit(prompt_tokens, hit, new_tokens)
        feasible = self.feasible_actions(features, hit)
        predictions = {action: self.predict(features, action, alpha, temperature) for action in feasible}
        best = choose(predictions, self.config.tie_margin)
        learned = self.learned_at(temperature)
        learned.decisions += 1
        explored = False
        every = self.config.explore_every
        if every and best.k == 0 and learned.decisions % every == 0:
            speculative = {a: v for a, v in predictions.items() if a.k > 0 and a.reuse == best.reuse}
            if speculative:  # a probe keeps the acceptance estimate learning once k = 0 wins
                best, explored = min(speculative, key=speculative.get), True
        return Decision(action=best, predicted_latency_s=predictions[best],
                        predictions={a.label: v for a, v in predictions.items()},
                        alpha_before=self.tracker_at(temperature).alpha if alpha is None else alpha,
                        decision_s=time.perf_counter() - start, explored=explored,
                        tie_set=tie_set({a.label: v for a, v in predictions.items()}, self.noise))

    def round_depth(self, proposer: type[Proposer], temperature: float = 0.0) -> RoundDepth | None:
        """A per-round depth for one request with this kind of proposer (None: the option is off, or the proposer
        has no match classes: it pays per candidate)."""
        if not self.config.depth_per_round or not proposer.has_match_classes:
            return None
        by_match = self.learned_at(temperature).by_match
        return RoundDepth(self.table, self.config.k_set, {c: t.alpha for c, t in by_match.items()},
                          self.config.depth_prior_rounds)

    def observe(self, round_log: list[tuple[int, int]], empty_rounds: int = 0, depth: RoundDepth | None = None,
                temperature: float = 0.0) -> None:
        """Update alpha (and the match rate) at `temperature` only from speculative rounds that actually ran; a
        per-round depth's rounds (its shadow rounds included) update their match class's acceptance."""
        learned = self.learned_at(temperature)
        learned.tracker.observe(round_log, empty_rounds)
        for match, proposed, accepted in depth.log if depth is not None else ():
            learned.by_match[match].observe_mean(accepted, float(accepted < proposed), 1)

    def by_match_state_at(self, temperature: float = 0.0) -> dict[str, tuple[float, ...]]:
        return {c: t.state for c, t in self.learned_at(temperature).by_match.items()}

    @property
    def by_match_state(self) -> dict[str, tuple[float, ...]]:
        return self.by_match_state_at(0.0)

    def restore(self, tracker_state, by_match_state: dict | None, decisions: int) -> None:
        """Continue from a journaled greedy state (a resumed study makes the decisions an uninterrupted one makes)."""
        learned = self.learned_at(0.0)
        learned.tracker.restore(tracker_state)
        for c, state in (by_match_state or {}).items():
            learned.by_match[c].restore(state)
        learned.decisions = decisions


@dataclass
class ProposerChoice:
    """RAKV-ASD over several proposers of one target (docs/heads.md): per request, the (reuse, proposer, k) of least
    estimated latency. Each proposer keeps its own controller (its own calibration and learnt acceptance); every
    controller prices the request's feasible actions and the least estimate wins, k = 0 included (the target's own
    costs; a tie goes to the first proposer listed). With one proposer it decides exactly as that proposer's
    controller does. `max_k`: a proposer that offers at most so many candidates a round (the heads) is offered no
    deeper k."""

    controllers: dict[str, Controller]
    max_k: dict[str, int] = field(default_factory=dict)

    def __post_init__(self):
        if not self.controllers:
            raise RakvError("a per-request proposer choice needs at least one proposer's controller")

    @classmethod
    def of(cls, tables: dict[str, CostTable], config: ControllerConfig, max_k: dict[str, int] | None = None,
           ) -> ProposerChoice:
        """One controller per proposer from its calibration; a proposer whose acceptance falls with the candidate's
        position (`acceptance_by_position`, the heads) is priced per position."""
        return cls({name: Controller(table, config, getattr(proposer_type(name), "acceptance_by_position", False))
                    for name, table in tables.items()}, dict(max_k or {}))

    @classmethod
    def for_pair(cls, tables: dict[str, CostTable], config: ControllerConfig, pair) -> ProposerChoice:
        """`of`, with each proposer's candidate limit read from its kind on `pair` (the heads: one per head)."""
        kinds = {name: proposer_type(name) for name in tables}
        return cls.of(tables, config, {name: kind.max_candidates(pair) for name, kind in kinds.items()
                                       if hasattr(kind, "max_candidates")})

    @property
    def first(self) -> Controller:
        """The first proposer's controller (the engine's own; every controller shares its configuration)."""
        return next(iter(self.controllers.values()))

    @property
    def config(self) -> ControllerConfig:
        return self.first.config

    def decide(self, prompt_tokens: int, hit: Hit, new_tokens: int,
               temperature: float = 0.0) -> tuple[str, Decision]:
        """The proposer and its controller's decision, restricted to the k it can offer; with several proposers the
        decision's predictions and tie set name every action as the study labels it (`proposer:r1k4`; k = 0, which
        runs no proposer, as `r1k0` at the first proposer's estimate)."""
        start = time.perf_counter()
        best: tuple[str, Decision] | None = None
        everything: dict[str, float] = {}
        for name, controller in self.controllers.items():
            limit = self.max_k.get(name)
            decision = (controller.decide(prompt_tokens, hit, new_tokens, temperature=temperature) if limit is None
                        else self._decide_within(controller, limit, prompt_tokens, hit, new_tokens, temperature))
            for label, v in decision.predictions.items():
                everything.setdefault(Action.parse(label).of_proposer(name).label, v)
            if best is None or decision.predicted_latency_s < best[1].predicted_latency_s:
                best = (name, decision)
        name, decision = best
        if len(self.controllers) > 1:
            decision.predictions = everything
            decision.tie_set = tie_set(everything, max(c.noise for c in self.controllers.values()))
            decision.decision_s = time.perf_counter() - start
        return name, decision

    @property
    def state(self) -> dict[str, dict]:
        """Every proposer's greedy learnt state (tracker, per match class, decisions): what a resumed study restores
        (`restore`), so it decides as an uninterrupted one."""
        return {name: {"tracker": list(c.tracker.state), "by_match": {m: list(v) for m, v in c.by_match_state.items()},
                       "decisions": c.decisions} for name, c in self.controllers.items()}

    def restore(self, state: dict[str, dict]) -> None:
        for name, learned in state.items():
            if name not in self.controllers:
                raise RakvError(f"a journaled proposer choice names '{name}', which this configuration does not hold")
            self.controllers[name].restore(learned["tracker"], learned["by_match"], learned["decisions"])

    @staticmethod
    def _decide_within(controller: Controller, limit: int, prompt_tokens, hit, new_tokens, temperature) -> Decision:
        config = controller.config
        within = tuple(k for k in config.k_set if k <= limit) or (0,)
        if within == config.k_set:
            return controller.decide(prompt_tokens, hit, new_tokens, temperature=temperature)
        narrowed = Controller(controller.table, ControllerConfig(**{**{f: getattr(config, f) for f in config.FIELDS},
                                                                    "k_set": within}), controller.per_position)
        narrowed.learned, narrowed.noise = controller.learned, controller.noise  # the same learnt acceptance
        return narrowed.decide(prompt_tokens, hit, new_tokens, temperature=temperature)

    def observe(self, proposer: str, round_log: list[tuple[int, int]], empty_rounds: int = 0,
                depth: RoundDepth | None = None, temperature: float = 0.0) -> None:
        """The rounds of a request that ran with `proposer` teach that proposer's acceptance only."""
        self.controllers[proposer].observe(round_log, empty_rounds, depth, temperature)
