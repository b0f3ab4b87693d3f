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

from rakv.runtime.actions import ADAPTIVE, Action
from rakv.runtime.controller import Controller
from rakv.runtime.costmodel import RequestFeatures
from rakv.runtime.engine import Engine, RequestResult
from rakv.runtime.errors import RakvError


def action_of(strategy: str) -> Action:
    """The fixed action of a strategy name (`spec-k4`) or of an action label (`r1k4`)."""
    return Action.parse(strategy) if Action.is_label(strategy) else Action.of_strategy(strategy)


def run_strategy(engine: Engine, strategy: str, token_ids: list[int], new_tokens: int, *,
                 controller: Controller | None = None, **run_kwargs) -> RequestResult:
    """Run one request; `run_kwargs` go to `Engine.run` (sampling, salt, ignore_eos, on_token, ...)."""
    if strategy == ADAPTIVE:
        if controller is None:
            raise RakvError("strategy rakv-asd needs a controller (and so a calibration)")
        start = time.perf_counter()
        hit = engine.peek(token_ids, run_kwargs.get("salt"))
        decision = controller.decide(len(token_ids), hit, new_tokens)
        decision.decision_s = time.perf_counter() - start
        depth = controller.round_depth(engine.proposer) if decision.action.k else None
        result = engine.run(token_ids, decision.action, new_tokens, depth=depth, **run_kwargs)
        # peek and decision are part of serving this request: in its time to first token and latency
        result.ttft_s += decision.decision_s
        result.latency_s += decision.decision_s
        result.tokens_per_s = result.new_tokens / result.latency_s
        controller.observe(result.round_log, result.empty_rounds, depth)
        decision.alpha_after, decision.tracker_after = controller.alpha, controller.tracker.state
        decision.by_match_after = controller.by_match_state
        result.decision, result.predicted_latency_s = decision, decision.predicted_latency_s
    else:
        hit = engine.peek(token_ids, run_kwargs.get("salt"))  # for the prediction and the record; not timed
        action = action_of(strategy)
        predicted = (controller.predict(RequestFeatures.from_hit(len(token_ids), hit, new_tokens), action)
                     if controller is not None else None)  # made before the run, like the controller's own
        result = engine.run(token_ids, action, new_tokens, **run_kwargs)
        result.predicted_latency_s = predicted
    result.strategy, result.available_hit_tokens = strategy, hit.reused_tokens
    return result
