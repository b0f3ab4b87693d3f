"""Speculation depth revised every round from the proposer's match (controller option `depth_per_round`).

A request-level k assumes one acceptance for the whole request, yet prompt lookup's acceptance swings
from round to round with the quality of the match it copies from: a candidate that continues a
one-token match is accepted far less often than one that continues a longer n-gram. With this option
on, a request whose controller chose to speculate proposes up to max(k_set) candidates each round (a
lookup costs the same whatever k) and keeps the first k of them, the k of least expected seconds per
confirmed token under the cost model (rakv.runtime.costmodel) at the acceptance of this round's match class:

    k* = argmin_k  verify_k(context) / E_k(alpha_class)          k = 0: one plain target step

alpha_class blends the class's EWMA across requests (the controller's, learnt from earlier requests)
with this request's own rounds of that class, weighted `prior_rounds` rounds to the prior's side.
A round that keeps no candidate still learns: the target's token says whether the first candidate
would have passed (free for a model-free proposer). Greedy or sampled, the output is the target's
own (rakv.runtime.decoding's acceptance rules do not depend on k).

Only proposers that offer candidates before the choice at no cost (prompt lookup: `match_class`)
take part; a draft model pays for every candidate it drafts, so it keeps the request-level k.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rakv.runtime.costmodel import CostTable, expected_tokens_per_round

# Prompt lookup's match classes, by the length of the n-gram its candidates continue (rakv.runtime.proposers)
MATCH_CLASSES = ("unigram", "ngram")


def match_class(ngram: int) -> str:
    return "unigram" if ngram <= 1 else "ngram"


@dataclass
class RoundDepth:
    """One request's per-round depth choice. `prior`: the acceptance of each match class across requests."""

    table: CostTable
    k_set: tuple[int, ...]
    prior: dict[str, float]
    prior_rounds: float
    accepted: Counter = field(default_factory=Counter)  # this request's own evidence, per class
    rejected: Counter = field(default_factory=Counter)
    log: list[tuple[str, int, int]] = field(default_factory=list)  # (class, proposed, accepted), shadows included
    plain_rounds: int = 0  # rounds that had candidates and kept none

    def __post_init__(self):
        assert all(c in self.prior for c in MATCH_CLASSES), f"a prior acceptance per class {MATCH_CLASSES} is needed"
        self.depths = sorted(k for k in self.k_set if k > 0 and k in self.table.verify)

    @property
    def max_k(self) -> int:
        return self.depths[-1] if self.depths else 0

    def alpha(self, match: str) -> float:
        accepted, rejected = self.accepted[match], self.rejected[match]
        return (accepted + self.prior_rounds * self.prior[match]) / (accepted + rejected + self.prior_rounds)

    def choose(self, context_length: int, available: int, match: str) -> int:
        """The k (<= the `available` candidates) of least expected seconds per confirmed token."""
        alpha = self.alpha(match)
        best_k, best = 0, self.table.target_step(context_length)
        for k in self.depths:
            if k > available:
                break
            per_token = self.table.verify[k](context_length) / expected_tokens_per_round(alpha, k)
            if per_token < best:
                best_k, best = k, per_token
        return best_k

    def observe(self, match: str, proposed: int, accepted: int) -> None:
        """A round's outcome (a shadow round: proposed 1, accepted whether the target's token was the candidate)."""
        self.accepted[match] += accepted
        self.rejected[match] += accepted < proposed
        self.log.append((match, proposed, accepted))
