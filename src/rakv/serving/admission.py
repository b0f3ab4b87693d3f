"""Admission: a served request's action, chosen once, at its first admission attempt, with the store's answer then.

The choice itself is rakv.runtime.strategies.choose_action, the function `rakv generate` uses: a fixed strategy's
action, or the controller's decision (rakv-asd) for the hit the K/V manager reports (rakv.serving.kv.KVManager.hit,
a query). What serving adds: the request's acceptance estimate at admission (rakv.serving.acceptance), and under the
load-aware speculation policy the depth a speculating request may reach in any iteration (the largest of the set).
Called by Scheduler.schedule (rakv.serving.scheduler) before it sizes the request, so the K/V the request needs
(its draft's included when it speculates) is known when it is admitted or refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from rakv.runtime.actions import ADAPTIVE
from rakv.runtime.cache import Hit
from rakv.runtime.strategies import check_strategy, choose_action
from rakv.serving.acceptance import Acceptance
from rakv.serving.request import ServedRequest


@dataclass
class Admission:
    strategy: str
    acceptance: Acceptance
    proposer: str = "draft"  # the engine's proposer (a per-round depth exists for prompt lookup only)
    controller: object | None = None  # rakv.runtime.controller.Controller, for rakv-asd
    k_by_iteration: tuple[int, ...] = ()  # the load-aware policy's depths: k per iteration from these

    def __post_init__(self):
        check_strategy(self.strategy)

    def decide(self, request: ServedRequest, hit: Hit) -> None:
        """Choose the request's action for what the store offers it now (`hit`), and assign it."""
        alpha = self.acceptance.at_admission(hit)
        choice = choose_action(self.strategy, hit, len(request.prompt), request.state.max_new_tokens, self.proposer,
                               self.controller, alpha=alpha if self.strategy == ADAPTIVE else None)
        max_k = choice.depth.max_k if choice.depth else choice.action.k
        if self.k_by_iteration and (self.strategy == ADAPTIVE or choice.action.k):
            max_k = max(self.k_by_iteration)
        request.assign(choice, max_k, alpha, hit.acceptance if hit.is_hit else None)
