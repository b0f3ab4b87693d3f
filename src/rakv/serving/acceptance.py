"""What serving knows about acceptance: a request's estimate at admission, and what finished requests teach.

Two sources (`--acceptance`): `ewma`, the running estimate across requests (rakv.runtime.controller.AcceptanceTracker:
the controller's own under rakv-asd, seeded from the calibration under the model policies, else a neutral prior);
`prefix`, the rounds recorded with the store entry a request's prompt extends (the EWMA as a prior of
PRIOR_ROUNDS rejections' weight). Both learn from the same rounds, in `Acceptance.learn`, called once per finished
request by Scheduler.update_from_output (rakv.serving.scheduler). With several proposers (rakv-asd over a
ProposerChoice) each proposer's controller keeps its own EWMA: a request is priced and learnt from by the one that
chose it; the `prefix` source, whose records do not say which proposer ran, is refused there.
"""

from __future__ import annotations

from dataclasses import dataclass

from rakv.runtime.cache import Hit
from rakv.runtime.controller import AcceptanceTracker, Controller, ProposerChoice, temperature_key
from rakv.runtime.errors import RakvError
from rakv.runtime.proposers import DraftModelProposer, Proposer, proposer_type
from rakv.serving.replay import lookup_rounds
from rakv.serving.request import ServedRequest

ACCEPTANCE_SOURCES = ("ewma", "prefix")
PRIOR_ALPHA = 0.5  # the EWMA's start when no controller (and so no calibrated acceptance) is given
PRIOR_ROUNDS = 4.0  # weight of the EWMA against a prefix's own recorded rounds


@dataclass
class Acceptance:
    source: str = "ewma"  # a request's acceptance at admission: the EWMA across requests, or `prefix`-keyed
    controller: Controller | ProposerChoice | None = None  # rakv-asd's: its tracker is the EWMA (the first's)
    tracker: AcceptanceTracker | None = None  # the EWMA to start from without a controller
    proposer: type[Proposer] = DraftModelProposer  # the engine's kind: do its greedy rounds replay unspeculated
    k_by_iteration: tuple[int, ...] = ()  # the load-aware policy's depths (the deepest replays a k = 0 request)

    def __post_init__(self):
        if self.source not in ACCEPTANCE_SOURCES:
            raise RakvError(f"--acceptance takes {' or '.join(ACCEPTANCE_SOURCES)}, got '{self.source}'")
        if isinstance(self.controller, ProposerChoice) and self.source == "prefix":
            raise RakvError("--acceptance prefix records a prefix's rounds whatever proposer ran them: it does not "
                            "apply to a choice among several proposers (use ewma)")
        if self.controller is not None:
            self.tracker = self._controller("").tracker
        elif self.tracker is None:
            self.tracker = AcceptanceTracker(PRIOR_ALPHA, 0.9)
        self.sampled: dict[float, AcceptanceTracker] = {}  # without a controller: the EWMA of each temperature > 0

    def _controller(self, proposer: str) -> Controller:
        """The controller that prices `proposer`'s rounds ("": the engine's own, the first)."""
        if isinstance(self.controller, ProposerChoice):
            return self.controller.controllers[proposer] if proposer else self.controller.first
        return self.controller

    def tracker_at(self, temperature: float, proposer: str = "") -> AcceptanceTracker:
        """The EWMA at a sampling temperature (acceptance moves with it), of `proposer` among several: the greedy one
        is `tracker`; another starts where the greedy one started and learns from that temperature's requests only."""
        if self.controller is not None:
            return self._controller(proposer).tracker_at(temperature)
        key = temperature_key(temperature)
        if key == 0.0:
            return self.tracker
        if key not in self.sampled:
            self.sampled[key] = AcceptanceTracker(self.tracker.alpha0, self.tracker.beta, self.tracker.match0)
        return self.sampled[key]

    def at_admission(self, hit: Hit, temperature: float = 0.0) -> float:
        """Acceptance at admission: with `prefix` and greedy decoding, the rounds recorded with the store entry it
        extends (greedy rounds only: `recorded`); otherwise, and without history, the EWMA across requests at the
        request's temperature."""
        alpha = self.tracker_at(temperature).alpha
        if self.source == "prefix" and hit.acceptance is not None and temperature_key(temperature) == 0.0:
            accepted, rejected = hit.acceptance
            return (accepted + PRIOR_ROUNDS * alpha) / (accepted + rejected + PRIOR_ROUNDS)
        return alpha

    def observed_rounds(self, request: ServedRequest) -> tuple[list[tuple[int, int]], int]:
        """What a finished request tells about acceptance: its speculative rounds; or, when it ran none, with prompt
        lookup under greedy decoding, the rounds speculation at the deepest k would have run over its output
        (rakv.serving.replay.lookup_rounds: greedy acceptance is fixed by the output, so it is observed without
        speculating, and a k = 0 decision does not starve the estimate)."""
        log, empty = request.state.round_log, request.state.empty_rounds
        kind = proposer_type(request.proposer) if request.proposer else self.proposer
        if log or empty or not request.sampling.greedy or not kind.replays_rounds:
            return log, empty
        depth = max(self.k_by_iteration or (self._controller("").config.k_set if self.controller else (4,)))
        return lookup_rounds(kind(), request.prompt, request.state.tokens, max(depth, 1))

    @staticmethod
    def recorded(request: ServedRequest, log) -> tuple[float, float] | None:
        """(accepted, rejections) to record with its store entries: its rounds, added to its prefix's; a sampled
        request's rounds are not recorded (a prefix's record is its greedy acceptance, which sampling does not
        measure), its prefix's record is passed on."""
        if not request.sampling.greedy:
            return request.prefix_acceptance
        accepted, rejected = float(sum(a for _, a in log)), float(sum(a < p for p, a in log))
        prior = request.prefix_acceptance
        if prior is not None:
            accepted, rejected = accepted + prior[0], rejected + prior[1]
        return (accepted, rejected) if accepted + rejected > 0 else None

    def learn(self, request: ServedRequest, log, empty: int) -> None:
        """The EWMA (the controller's, with its per-match-class depth; of several proposers, the one that chose the
        request) learns from a finished request's rounds; of several proposers, each other one whose greedy rounds
        replay from an output (prompt lookup) learns too, from the rounds it would have run over this request's."""
        temperature = request.sampling.temperature  # greedy at <= 0 (temperature_key)
        if self.controller is None:
            self.tracker_at(temperature).observe(log, empty)
        elif request.choice.decision is not None:
            self._controller(request.proposer).observe(log, empty, request.choice.depth, temperature)
            self._learn_replayed(request)

    def _learn_replayed(self, request: ServedRequest) -> None:
        """Why: a proposer that is not chosen runs no rounds, so its EWMA would stay at its calibrated start however
        well it would have done (the choice by service time under load never chose prompt lookup, whose server was
        measured fastest: data/reference/served-choice/). A greedy output fixes a model-free proposer's rounds
        (rakv.serving.replay.lookup_rounds), so they are learnt at no cost, at the deepest k that proposer may run."""
        if not isinstance(self.controller, ProposerChoice) or not request.sampling.greedy:
            return
        for name, controller in self.controller.controllers.items():
            kind = proposer_type(name)
            if name == request.proposer or not kind.replays_rounds:
                continue
            depth = self.controller.max_k.get(name, max(self.k_by_iteration or controller.config.k_set))
            controller.observe(*lookup_rounds(kind(), request.prompt, request.state.tokens, max(depth, 1)))
