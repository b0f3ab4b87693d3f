"""The one typed path for running a request under a strategy, used by the CLI, the study and every stage.

    result = run_strategy(engine, "joint-k4", token_ids, new_tokens, controller=controller)

A fixed strategy (or a sweep's action label such as `r1k4`) runs its action; `rakv-asd` peeks the
store, lets the controller decide, runs the decision and feeds the rounds back to the controller; the
peek and the decision count in its time to first token and latency, as they would when serving.
Either way the result carries what the store offered and, when a controller (and so a calibration)
is at hand, the cost model's prediction for the action that ran.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rakv.runtime.actions import ADAPTIVE, Action
from rakv.runtime.cache import Hit
from rakv.runtime.controller import Controller, Decision, ProposerChoice
from rakv.runtime.costmodel import RequestFeatures
from rakv.runtime.engine import Engine, RequestResult
from rakv.runtime.errors import RakvError
from rakv.runtime.proposers import Proposer, proposer_type

if TYPE_CHECKING:
    from rakv.runtime.depth import RoundDepth


def action_of(strategy: str) -> Action:
    """The fixed action of a strategy name (`spec-k4`) or of an action label (`r1k4`)."""
    return Action.parse(strategy) if Action.is_label(strategy) else Action.of_strategy(strategy)


def check_strategy(strategy: str) -> None:
    """An unknown strategy fails here, before any model work."""
    if strategy != ADAPTIVE:
        action_of(strategy)


@dataclass(frozen=True)
class Choice:
    """A request's action and what comes with it: `depth` revises k every round (rakv.runtime.depth, rakv-asd
    with prompt lookup), `decision` is the controller's (rakv-asd) with its predictions."""

    action: Action
    depth: RoundDepth | None = None
    decision: Decision | None = None
    # of several proposers, the one whose controller chose it (its rounds teach that one; k = 0 too) or that a fixed
    # `heads:r0k4` names; "": the engine's own
    proposer: str = ""


def choose_action(strategy: str, hit: Hit, prompt_tokens: int, new_tokens: int, proposer: type[Proposer],
                  controller: Controller | ProposerChoice | None = None, alpha: float | None = None,
                  temperature: float = 0.0) -> Choice:
    """The one place a request's action is chosen, for `rakv generate` (run_strategy) and `rakv serve` (admission,
    rakv.serving.admission): a fixed strategy's action, or the controller's decision for what the store's lookup
    (`hit`) offers; `alpha`: the request's own acceptance estimate when it has one (else the controller's EWMA at
    the request's sampling `temperature`). With several proposers (`controller` a ProposerChoice) the choice is
    (reuse, proposer, k), its action names the proposer (`heads:r1k4`), and each controller's own EWMA prices its
    proposer (`alpha` does not apply)."""
    if strategy != ADAPTIVE:
        action = action_of(strategy)
        return Choice(action, proposer=action.proposer)
    if controller is None:
        raise RakvError("strategy rakv-asd needs a controller (and so a calibration)")
    if isinstance(controller, ProposerChoice):
        name, decision = controller.decide(prompt_tokens, hit, new_tokens, temperature)
        action = decision.action.of_proposer(name) if len(controller.controllers) > 1 else decision.action
        depth = controller.controllers[name].round_depth(proposer_type(name), temperature) if action.k else None
        return Choice(action, depth, decision, name if len(controller.controllers) > 1 else "")
    decision = controller.decide(prompt_tokens, hit, new_tokens, alpha=alpha, temperature=temperature)
    depth = controller.round_depth(proposer, temperature) if decision.action.k else None
    return Choice(decision.action, depth, decision)


def run_strategy(engine: Engine, strategy: str, token_ids: list[int], new_tokens: int, *,
                 controller: Controller | None = None, **run_kwargs) -> RequestResult:
    """Run one request; `run_kwargs` go to `Engine.run` (sampling, salt, ignore_eos, on_token, ...)."""
    start = time.perf_counter()
    hit = engine.peek(token_ids, run_kwargs.get("salt"))
    sampling = run_kwargs.get("sampling")
    temperature = sampling.temperature if sampling is not None else 0.0  # greedy at <= 0 (temperature_key)
    choice = choose_action(strategy, hit, len(token_ids), new_tokens, engine.proposer_type, controller,
                           temperature=temperature)
    decision = choice.decision
    if decision is not None:
        decision.decision_s = time.perf_counter() - start
        result = engine.run(token_ids, choice.action, new_tokens, depth=choice.depth, **run_kwargs)
        # peek and decision are part of serving this request: in its time to first token and latency
        result.ttft_s += decision.decision_s
        result.latency_s += decision.decision_s
        result.tokens_per_s = result.new_tokens / result.latency_s
        controller.observe(result.round_log, result.empty_rounds, choice.depth, temperature)
        tracker = controller.tracker_at(temperature)
        decision.alpha_after, decision.tracker_after = tracker.alpha, tracker.state
        decision.by_match_after = controller.by_match_state_at(temperature)
        result.decision, result.predicted_latency_s = decision, decision.predicted_latency_s
    else:  # the peek is for the prediction and the record; not timed
        if choice.action.proposer and run_kwargs.get("proposer") is None:  # `heads:r0k4`: that proposer speculates
            run_kwargs["proposer"] = proposer_type(choice.action.proposer).for_pair(engine.pair)
        predicted = (controller.predict(RequestFeatures.from_hit(len(token_ids), hit, new_tokens), choice.action,
                                        temperature=temperature)
                     if controller is not None else None)  # made before the run, like the controller's own
        result = engine.run(token_ids, choice.action, new_tokens, **run_kwargs)
        result.predicted_latency_s = predicted
    result.strategy, result.available_hit_tokens = strategy, hit.reused_tokens
    result.available_draft_tokens = hit.draft_tokens
    return result


def run_choosing_proposer(engine: Engine, choice: ProposerChoice, token_ids: list[int], new_tokens: int,
                          **run_kwargs) -> RequestResult:
    """rakv-asd over several proposers of one target (rakv.runtime.controller.ProposerChoice): peek, choose
    (reuse, proposer, k), run with a fresh proposer of the chosen kind on `engine`'s pair, and teach the chosen
    proposer's controller its rounds; the result's `proposer` names the kind that ran ("none" for k = 0)."""
    start = time.perf_counter()
    hit = engine.peek(token_ids, run_kwargs.get("salt"))
    sampling = run_kwargs.get("sampling")
    temperature = sampling.temperature if sampling is not None else 0.0
    name, decision = choice.decide(len(token_ids), hit, new_tokens, temperature)
    decision.decision_s = time.perf_counter() - start
    controller, kind = choice.controllers[name], proposer_type(name)
    depth = controller.round_depth(kind, temperature) if decision.action.k else None
    proposer = kind.for_pair(engine.pair) if decision.action.k else None
    result = engine.run(token_ids, decision.action, new_tokens, depth=depth, proposer=proposer, **run_kwargs)
    result.ttft_s += decision.decision_s
    result.latency_s += decision.decision_s
    result.tokens_per_s = result.new_tokens / result.latency_s
    choice.observe(name, result.round_log, result.empty_rounds, depth, temperature)
    tracker = controller.tracker_at(temperature)
    decision.alpha_after, decision.tracker_after = tracker.alpha, tracker.state
    decision.by_match_after = controller.by_match_state_at(temperature)
    result.decision, result.predicted_latency_s = decision, decision.predicted_latency_s
    result.strategy, result.available_hit_tokens = ADAPTIVE, hit.reused_tokens
    result.available_draft_tokens = hit.draft_tokens
    return result
