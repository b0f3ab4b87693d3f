"""Speculation policies under load: how many candidates each decoding request may propose this iteration.

Sibling policies with one interface, so that the field's rules and ours are compared like with like
(docs/serving.md). Each caps a request's own depth (`ServedRequest.max_k`: its strategy's k, or a per-round
depth's largest), never raises it, so a request that does not speculate never gets a proposer:

- `per-request`: the request's own k whatever the load (the batch-one behaviour; the default);
- `disable-by-batch-size:B`: vLLM's `speculative_config.disable_by_batch_size`: no speculation once B or more
  requests are decoding;
- `k-by-batch:1=4,4=2,8=0`: a hand-set table of k by the number of decoding requests (the largest entry whose
  batch size is <= the current one applies), as vLLM's dynamic speculation tables;
- `smartspec`: SmartSpec's goodput rule: one k for the batch, the one that maximises
  `sum_i E_k(alpha) / T(batch, k)` with T from the batch cost model (rakv.serving.batchcost) and one acceptance
  for every request (the running EWMA);
- `load-aware` (RAKV-ASD under load): a k per request, chosen by coordinate ascent on the same objective with
  each request's own acceptance (`ServedRequest.alpha`: prefix-keyed when its prefix has history, else the EWMA;
  rakv.serving.acceptance) and the current batch, so a request whose candidates are rarely accepted stops
  speculating while its neighbours go on.

Both model rules count prompt lookup's empty rounds: a round confirms m E_k(alpha) + (1 - m) tokens, m the match
rate (rakv.runtime.costmodel.estimate_latency). The scheduler then trims the k it is given to the token budget and
the K/V room. `SloBudget` is the chunking side: the prefill rows of each iteration chosen so that its predicted
time stays under an inter-token-latency SLO.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rakv.runtime.controller import AcceptanceTracker
from rakv.runtime.costmodel import tokens_per_round
from rakv.runtime.errors import RakvError
from rakv.serving.batchcost import BatchCost, ScaledCost, pass_features
from rakv.serving.request import ServedRequest


@dataclass(frozen=True)
class PerRequest:
    name: str = "per-request"

    def depths(self, decoding: list[ServedRequest]) -> list[int]:
        return [r.max_k for r in decoding]


@dataclass(frozen=True)
class DisableByBatchSize:
    batch_size: int
    name: str = "disable-by-batch-size"

    def depths(self, decoding: list[ServedRequest]) -> list[int]:
        return [0 if len(decoding) >= self.batch_size else r.max_k for r in decoding]


@dataclass(frozen=True)
class KByBatch:
    table: tuple[tuple[int, int], ...]  # (batch size from which it applies, k), sorted by batch size
    name: str = "k-by-batch"

    def depths(self, decoding: list[ServedRequest]) -> list[int]:
        k = next((k for size, k in reversed(self.table) if size <= len(decoding)), self.table[0][1])
        return [min(k, r.max_k) for r in decoding]


def most_goodput(k_set, rate: Callable[[int], float]) -> int:
    """SmartSpec's rule: the k of `k_set` of most expected tokens per second `rate(k)`, a deeper k only when it
    gains more than rounding (shared with scripts/tune_vllm.py's schedule for vLLM, rakv.bench.peers)."""
    best, best_rate = 0, -1.0
    for k in sorted(set(k_set)):
        value = rate(k)
        if value > best_rate * (1 + 1e-9):
            best, best_rate = k, value
    return best


@dataclass(frozen=True)
class Goodput:
    """SmartSpec: the batch's one k of most expected tokens per second (candidates `k_set`)."""

    cost: BatchCost | ScaledCost
    tracker: AcceptanceTracker  # the acceptance and match rate across requests
    k_set: tuple[int, ...]
    name: str = "smartspec"

    def depths(self, decoding: list[ServedRequest]) -> list[int]:
        if not decoding:
            return []
        alpha, match = self.tracker.alpha, self.tracker.match_rate

        kinds = [r.proposer for r in decoding]

        def rate(k):
            ks = [min(k, r.max_k) for r in decoding]
            tokens = sum(tokens_per_round(alpha, kk, match) for kk in ks)
            return tokens / max(self.cost.decode_s([(1 + kk, len(r.tokens)) for r, kk in zip(decoding, ks)], ks,
                                                   kinds), 1e-9)

        best = most_goodput(self.k_set, rate)
        return [min(best, r.max_k) for r in decoding]


@dataclass(frozen=True)
class LoadAware:
    """RAKV-ASD under load: each request's k (from `k_set`, at most its own) maximising the batch's expected tokens
    per second, with each request's own acceptance; two passes of coordinate ascent from all k = 0."""

    cost: BatchCost | ScaledCost
    tracker: AcceptanceTracker  # the match rate across requests (prompt lookup's empty rounds)
    k_set: tuple[int, ...]
    name: str = "load-aware"

    def depths(self, decoding: list[ServedRequest]) -> list[int]:
        if not decoding:
            return []
        alphas = [self.tracker.alpha if r.alpha is None else r.alpha for r in decoding]
        # each request's own proposer's match rate when admission gave it one (several proposers), else the EWMA's
        matches = [self.tracker.match_rate if r.match_rate is None else r.match_rate for r in decoding]
        contexts, kinds = [len(r.tokens) for r in decoding], [r.proposer for r in decoding]
        ks = [0] * len(decoding)

        def rate(ks):
            tokens = sum(tokens_per_round(a, k, m) for a, k, m in zip(alphas, ks, matches))
            return tokens / max(self.cost.decode_s([(1 + k, c) for k, c in zip(ks, contexts)], ks, kinds), 1e-9)

        current = rate(ks)
        order = sorted(range(len(decoding)), key=lambda i: -alphas[i])
        for _ in range(2):
            for i in order:
                for k in sorted(set(self.k_set)):
                    if k == ks[i] or k > decoding[i].max_k:
                        continue
                    trial = ks[:i] + [k] + ks[i + 1:]
                    value = rate(trial)
                    # a deeper k must gain more than noise in the model: ties go to less speculation
                    if value > current * (1 + 1e-6) or (k < ks[i] and value >= current * (1 - 1e-6)):
                        ks, current = trial, value
        return ks


@dataclass(frozen=True)
class SloBudget:
    """The prefill rows of an iteration chosen so that its predicted time (the batch cost model, with this
    iteration's decodes) stays under `slo_s` less a `headroom` share, at least `floor` rows so that prefills always
    progress. The headroom is for the SLO being a tail (p99 ITL): an iteration predicted exactly at the SLO exceeds
    it about half the time, and the mixed iterations of a long prompt, close to their prediction on average, run
    well above it in their tail (each served iteration's `predicted_s` beside its `iteration_s`, `mixed` marking
    those with a prefill chunk: the serving stage's iterations.parquet, data/reference/offline/serving/ for the
    shipped run). With no decode in the iteration no request is waiting for its next token, so the chunk is the
    token budget's."""

    cost: BatchCost | ScaledCost
    slo_s: float
    floor: int = 16
    headroom: float = 0.3

    def prefill_rows(self, decodes: list, context: int, limit: int) -> int:
        """`decodes`: this iteration's decode work (rakv.serving.scheduler.Work); `context`: the positions before
        the next prefill chunk; `limit`: the rows the token budget leaves."""
        if not decodes:
            return max(limit, 0)
        shape = [(w.rows, w.request.computed) for w in decodes]
        ks, kinds = [w.k for w in decodes], [w.request.proposer for w in decodes]
        target = self.slo_s * (1 - self.headroom)
        low, high = 0, max(limit, 0)
        while low < high:  # the largest chunk whose iteration fits (the pass's cost grows with the chunk)
            mid = (low + high + 1) // 2
            if self.cost.iteration_s(pass_features(shape + [(mid, context)]), ks, context, kinds) <= target:
                low = mid
            else:
                high = mid - 1
        return min(max(low, self.floor), max(limit, 0))


MODEL_POLICIES = ("smartspec", "load-aware")  # need the batch cost model


def speculation_policy(text: str, cost=None, tracker=None, k_set: tuple[int, ...] = ()):
    """`per-request`, `disable-by-batch-size:B`, `k-by-batch:SIZE=K,...`, `smartspec` or `load-aware` (these two
    with the batch cost model `cost`, the acceptance `tracker` and the candidate depths `k_set`); a one-line error
    otherwise."""
    name, _, arg = text.partition(":")
    if name in MODEL_POLICIES and not arg:
        if cost is None or tracker is None or not k_set:
            raise RakvError(f"--speculation {name} needs the batch cost model and the controller's k set")
        return (Goodput if name == "smartspec" else LoadAware)(cost, tracker, tuple(k_set))
    try:
        if name == "per-request" and not arg:
            return PerRequest()
        if name == "disable-by-batch-size":
            size = int(arg)
            if size >= 1:
                return DisableByBatchSize(size)
        if name == "k-by-batch":
            table = tuple(sorted((int(a), int(b)) for a, b in (item.split("=") for item in arg.split(","))))
            if table and all(size >= 1 and k >= 0 for size, k in table):
                return KByBatch(table)
    except ValueError:
        pass
    raise RakvError(f"--speculation takes per-request, disable-by-batch-size:B (B >= 1), k-by-batch:SIZE=K,... "
                    f"(e.g. k-by-batch:1=4,4=2,8=0), smartspec or load-aware, got '{text}'")
