"""Admission: a served request's action, chosen once, at its first admission attempt, with the store's answer then.

The choice itself is rakv.runtime.strategies.choose_action, the function `rakv generate` uses: a fixed strategy's
action, or the controller's decision (rakv-asd) for the hit the K/V manager reports (rakv.serving.kv.KVManager.hit,
a query). What serving adds: the request's acceptance estimate at admission (rakv.serving.acceptance), and under the
load-aware speculation policy the depth a speculating request may reach in any iteration (the largest of the set).
Called by Scheduler.schedule (rakv.serving.scheduler) before it sizes the request, so the K/V the request needs
(its draft's included when it speculates) is known when it is admitted or refused.

With the batch cost model, admission also predicts the request's service time (admission to last token) under the
load it sees (`service_prediction`): the controller's own prediction (`predicted_s`) prices every step at batch one,
which under load compares a batch-one latency with a batched service time; this one prices its prefill chunks and
its decode iterations with the requests running beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rakv.runtime.actions import ADAPTIVE, Action
from rakv.runtime.cache import Hit
from rakv.runtime.controller import Controller, ProposerChoice
from rakv.runtime.costmodel import tokens_per_round
from rakv.runtime.proposers import DraftModelProposer, Proposer, proposer_type
from rakv.runtime.strategies import Choice, check_strategy, choose_action
from rakv.serving.acceptance import Acceptance
from rakv.serving.batchcost import ScaledCost, pass_features
from rakv.serving.request import ServedRequest, Status


@dataclass
class Admission:
    strategy: str
    acceptance: Acceptance
    proposer: type[Proposer] = DraftModelProposer  # the engine's kind of proposer (rakv.runtime.proposers)
    controller: Controller | ProposerChoice | None = None  # for rakv-asd (of several proposers: their choice)
    k_by_iteration: tuple[int, ...] = ()  # the load-aware policy's depths: k per iteration from these
    cost: ScaledCost | None = None  # for the service prediction under load
    token_budget: int = 1 << 30  # rows per iteration (its prefill's chunks)
    proposer_at_load: bool = False  # of several proposers, choose by the predicted service time under load

    def __post_init__(self):
        check_strategy(self.strategy)

    def decide(self, request: ServedRequest, hit: Hit, company: list[ServedRequest] = (), load=None) -> None:
        """Choose the request's action for what the store offers it now (`hit`), and assign it with its predicted
        service time beside its `company` (the running and waiting requests) under the `load` recent iterations
        ran (rakv.serving.scheduler.Load)."""
        temperature = request.sampling.temperature  # greedy at <= 0 (rakv.runtime.controller.temperature_key)
        alpha = self.acceptance.at_admission(hit, temperature)
        choice = choose_action(self.strategy, hit, len(request.prompt), request.state.max_new_tokens, self.proposer,
                               self.controller, alpha=alpha if self.strategy == ADAPTIVE else None,
                               temperature=temperature)
        beside = self._company(request, choice, company, load) if self.cost is not None else None
        if self.proposer_at_load and beside is not None and isinstance(self.controller, ProposerChoice):
            choice = self._proposer_at_load(request, hit, choice, beside, temperature)
        kind = proposer_type(choice.proposer) if choice.proposer else self.proposer
        tracker = self.acceptance.tracker_at(temperature, choice.proposer)
        if choice.proposer:  # one of several proposers: priced at its own EWMA
            alpha = tracker.alpha
        match = tracker.match_rate if kind.may_offer_none else 1.0
        max_k = choice.depth.max_k if choice.depth else choice.action.k
        if self.k_by_iteration and (self.strategy == ADAPTIVE or choice.action.k):
            max_k = max(self.k_by_iteration)
        predicted, concurrency = None, len(company) + 1
        if beside is not None:
            predicted = self._service_s(request, hit, choice.action.reuse, choice.action.k, alpha, match,
                                        choice.proposer, beside)
            concurrency = len(beside.others) + 1
        request.assign(choice, max_k, alpha, hit.acceptance if hit.is_hit else None, predicted, concurrency,
                       match if choice.proposer else None)

    def _company(self, request: ServedRequest, choice, company: list[ServedRequest], load) -> Company:
        """The requests a new one will be served beside, as the batch cost model prices them (`service_prediction`)."""
        running = load.running if load is not None else 0.0
        others = [(len(r.tokens), r.action.k, r.proposer) for r in company]
        typical = others[0] if others else (len(request.prompt), choice.action.k, choice.proposer)
        others += [typical] * max(int(round(running)) - 1 - len(others), 0)  # a burst's load, kept up
        decoding = [(len(r.tokens), r.action.k, r.proposer) for r in company
                    if r.status == Status.RUNNING and r.decoding]
        ahead = sum(r.needed for r in company if r.status == Status.RUNNING and not r.decoding)
        return Company(others, decoding, ahead)

    def _service_s(self, request, hit: Hit, reuse: bool, k: int, alpha: float, match: float, proposer: str,
                   beside: Company) -> float:
        reused = hit.reused_tokens if reuse else 0
        return service_prediction(self.cost, len(request.prompt) - reused, len(request.prompt),
                                  request.state.max_new_tokens, k, alpha, match, beside.others, self.token_budget,
                                  beside.ahead, beside.decoding, proposer)

    def _proposer_at_load(self, request, hit: Hit, choice, beside: Company, temperature: float):
        """`--proposer-choice service`: of several proposers, the one (with its k) of least predicted service time
        beside the request's company (the batch cost model prices each kind's proposals and the batched verify),
        instead of the least batch-one latency (`choose_action`); reuse as the batch-one choice took it. Its
        decision is the chosen proposer's controller's, whose rounds it then teaches."""
        choices: ProposerChoice = self.controller
        best, best_s = None, None
        for name, controller in choices.controllers.items():
            tracker = controller.tracker_at(temperature)
            match = tracker.match_rate if proposer_type(name).may_offer_none else 1.0
            limit = choices.max_k.get(name, max(controller.config.k_set))
            for k in (k for k in controller.config.k_set if k <= limit):
                seconds = self._service_s(request, hit, choice.action.reuse, k, tracker.alpha, match, name, beside)
                if best_s is None or seconds < best_s * (1 - 1e-9):  # ties: the first proposer, the lesser k
                    best, best_s = (name, k), seconds
        name, k = best
        controller = choices.controllers[name]
        decision = controller.decide(len(request.prompt), hit, request.state.max_new_tokens, temperature=temperature)
        action = Action(choice.action.reuse, k).of_proposer(name)
        depth = controller.round_depth(proposer_type(name), temperature) if k else None
        return Choice(action, depth, decision, name)


@dataclass(frozen=True)
class Company:
    """Who a new request will be served beside: (tokens, k, proposer) of its company (kept up to the recent load),
    of those decoding now, and the prefill rows admitted before it."""

    others: list[tuple[int, int, str]]
    decoding: list[tuple[int, int, str]]
    ahead: int


def service_prediction(cost, prefill: int, prompt: int, new_tokens: int, k: int, alpha: float, match: float,
                       others: list[tuple[int, int, str]], token_budget: int, ahead: int = 0,
                       decoding: list[tuple[int, int, str]] | None = None, proposer: str = "") -> float:
    """Seconds from admission to a request's last token, priced by the batch cost model: its `prefill` rows, after
    the `ahead` rows of prompts admitted before it, in chunks of what the token budget leaves beside the decode rows
    of the requests decoding now (`decoding`, each (tokens, k, proposer); default `others`); then `new_tokens - 1`
    tokens at the expected tokens per round (`match` the share of rounds with candidates), every round an iteration
    with `others` (its company, assumed to decode throughout), each request's proposals priced by its proposer's
    kind ("": the engine's). Prompts that arrive later are not priced: an average of
    recent prefill rows added to every decode iteration over-priced requests at most loads (compare a run's
    `served_predicted_s` with its measured times in requests.jsonl)."""
    now = others if decoding is None else decoding
    beside_now, ks_now = [(1 + kk, n) for n, kk, _ in now], [kk for _, kk, _ in now]
    left = max(token_budget - sum(rows for rows, _ in beside_now), 1)
    seconds, done = 0.0, prompt - prefill - ahead
    while done < prompt:
        chunk = min(left, prompt - done)
        seconds += cost.iteration_s(pass_features(beside_now + [(chunk, max(done, 0))]), ks_now, max(done, 0),
                                    [p for *_, p in now])
        done += chunk
    beside, ks = [(1 + kk, n) for n, kk, _ in others], [kk for _, kk, _ in others]
    tokens = tokens_per_round(alpha, k, match)
    middle = new_tokens // 2  # contexts half-way through its output
    step = cost.decode_s([(1 + k, prompt + middle)] + [(rows, n + middle) for rows, n in beside], [k] + ks,
                         [proposer] + [p for *_, p in others])
    return seconds + max(new_tokens - 1, 0) / tokens * step
