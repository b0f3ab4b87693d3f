"""RAKV-ASD controller (paper/main.tex, Method: "Cost model and controller"): per request, the feasible action of least estimated latency.

Feasible actions are r in {0, 1} (1 only when the store holds a hit) x k in the configured set,
minus those whose K/V would exceed the memory budget. k = 0 is an ordinary action. Acceptance is
tracked online from the rounds actually run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rakv.cache import Hit
from rakv.costmodel import (CostTable, RequestFeatures, acceptance_estimate, action_kv_bytes,
                            estimate_latency)
from rakv.engine import Action


@dataclass(frozen=True)
class ControllerConfig:
    k_set: tuple[int, ...] = (0, 1, 2, 4, 6, 8)
    beta: float = 0.9  # EWMA weight of the past
    memory_penalty_s_per_byte: float = 1e-11  # lambda
    memory_budget_mib: float = 512.0


@dataclass
class Decision:
    action: Action
    predicted_latency_s: float
    predictions: dict[str, float]  # every feasible action's estimate, by label (r1k4, ...)
    alpha_before: float
    decision_s: float
    infeasible: list[str] = field(default_factory=list)


@dataclass
class AcceptanceTracker:
    """EWMA of per-round acceptance, kept as EWMAs of accepted candidates and of rejections per round.

    alpha = A / (A + F) with A, F the averages of accepted count and rejection indicator, which is
    the per-token acceptance estimate of `costmodel.acceptance_estimate` over a decaying window.
    """

    alpha0: float
    beta: float
    accepted: float = field(init=False)
    rejected: float = field(init=False)

    def __post_init__(self):
        self.accepted, self.rejected = self.alpha0, 1.0 - self.alpha0

    @property
    def alpha(self) -> float:
        total = self.accepted + self.rejected
        return self.accepted / total if total > 0 else self.alpha0

    def observe(self, round_log: list[tuple[int, int]]) -> None:
        for proposed, accepted in round_log:
            self.observe_mean(accepted, float(accepted < proposed), 1)

    def observe_mean(self, accepted: float, rejected: float, rounds: int) -> None:
        """`rounds` updates with the given per-round averages (replaying runs summarised by their totals)."""
        for _ in range(rounds):
            self.accepted = self.beta * self.accepted + (1 - self.beta) * accepted
            self.rejected = self.beta * self.rejected + (1 - self.beta) * rejected


@dataclass
class Controller:
    table: CostTable
    config: ControllerConfig = ControllerConfig()

    def __post_init__(self):
        self.tracker = AcceptanceTracker(self.table.acceptance, self.config.beta)

    @property
    def alpha(self) -> float:
        return self.tracker.alpha

    def features(self, prompt_tokens: int, hit: Hit, new_tokens: int) -> RequestFeatures:
        return RequestFeatures(prompt_tokens, hit.reused_tokens, new_tokens, hit.exact)

    def predict(self, features: RequestFeatures, action: Action) -> float:
        return estimate_latency(self.table, features, action.reuse, action.k, self.alpha,
                                self.config.memory_penalty_s_per_byte)

    def feasible_actions(self, features: RequestFeatures, hit: Hit) -> tuple[list[Action], list[Action]]:
        """(feasible, dropped): r = 1 only with a hit; actions whose K/V exceeds the memory budget are dropped."""
        budget = self.config.memory_budget_mib * (1 << 20)
        candidates = [Action(reuse, k) for reuse in ((False, True) if hit.is_hit else (False,))
                      for k in self.config.k_set]
        feasible = [a for a in candidates if action_kv_bytes(self.table, features, a.k) <= budget]
        if not feasible:
            raise_budget_error(features, budget)
        return feasible, [a for a in candidates if a not in feasible]

    def decide(self, prompt_tokens: int, hit: Hit, new_tokens: int) -> Decision:
        start = time.perf_counter()
        features = self.features(prompt_tokens, hit, new_tokens)
        feasible, dropped = self.feasible_actions(features, hit)
        predictions = {action: self.predict(features, action) for action in feasible}
        best = min(predictions, key=lambda a: (predictions[a], a.k, not a.reuse))  # ties: less speculation, reuse
        return Decision(action=best, predicted_latency_s=predictions[best],
                        predictions={a.label: v for a, v in predictions.items()}, alpha_before=self.alpha,
                        decision_s=time.perf_counter() - start, infeasible=[a.label for a in dropped])

    def observe(self, round_log: list[tuple[int, int]]) -> None:
        """Update alpha only from speculative rounds that actually ran."""
        self.tracker.observe(round_log)


def raise_budget_error(features: RequestFeatures, budget: float):
    from rakv.errors import RakvError

    raise RakvError(f"no action fits the memory budget of {budget / 2**20:.0f} MiB for a request of "
                    f"{features.prompt_tokens} + {features.new_tokens} tokens")


def run_rakv_asd(engine, controller: Controller, token_ids: list[int], max_new_tokens: int, **run_kwargs):
    """Peek the store, decide, run the chosen action, learn from its rounds; telemetry in `result.extra`."""
    hit = engine.peek(token_ids, run_kwargs.get("salt"))
    decision = controller.decide(len(token_ids), hit, max_new_tokens)
    result = engine.run(token_ids, decision.action, max_new_tokens, **run_kwargs)
    controller.observe(result.round_log)
    result.extra.update(strategy="rakv-asd", available_hit_tokens=hit.reused_tokens,
                        predicted_latency_s=decision.predicted_latency_s,
                        predictions=decision.predictions, alpha_before=decision.alpha_before,
                        alpha_after=controller.alpha, decision_s=decision.decision_s,
                        infeasible_actions=decision.infeasible, acceptance_rate=acceptance_estimate(result.round_log))
    return result


def predict_fixed(controller: Controller, prompt_tokens: int, hit: Hit, max_new_tokens: int, action: Action) -> float:
    """The model's prediction for a fixed strategy's action, made before the run like the controller's own."""
    return controller.predict(controller.features(prompt_tokens, hit, max_new_tokens), action)
