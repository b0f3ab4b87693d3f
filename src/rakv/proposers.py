"""Proposers of speculative tokens, behind one small interface.

A proposer sees the confirmed context (prompt + confirmed output) and returns up to `k` candidate
tokens plus, for sampling, the distribution each was drawn from (`None` = deterministic choice,
i.e. a point mass, which the rejection sampler handles exactly). Nothing a proposer returns is
confirmed: the target's verification decides.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from transformers import DynamicCache

from rakv.decoding import Sampling, crop_cache, forward, probabilities
from rakv.depth import match_class
from rakv.kernels import new_kv_cache


class Proposer(Protocol):
    name: str

    def start(self, context: list[int]) -> None:
        """Begin a request whose confirmed context is `context` (a draft model prefills here)."""

    def propose(self, context: list[int], k: int, sampling: Sampling,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        """Up to k candidates following `context`, and their proposal distributions [n, vocab] or None."""

    def rollback(self, confirmed_length: int) -> None:
        """Withdraw any state beyond the first `confirmed_length` context tokens."""


@dataclass
class DraftModelProposer:
    """A smaller model drafting autoregressively with its own KV cache."""

    model: torch.nn.Module
    device: torch.device
    name: str = "draft"
    cache: DynamicCache | None = None
    fed: list[int] = field(default_factory=list)  # tokens whose K/V is in `cache`
    pending_logits: torch.Tensor | None = None  # draft logits after the last fed token

    def start(self, context: list[int]) -> None:
        self.cache = new_kv_cache(self.model)
        self.fed = []
        self.pending_logits = None
        self._catch_up(context)

    def _catch_up(self, context: list[int]) -> None:
        """Feed the context tokens the cache lacks, after cropping away anything that diverged."""
        n = 0
        limit = min(len(self.fed), len(context))
        while n < limit and self.fed[n] == context[n]:
            n += 1
        if n < len(self.fed):
            self.rollback(n)
        if n == len(context) and self.pending_logits is not None:
            return
        if n == len(context):  # logits of the last token were dropped by a rollback: recompute it
            self.rollback(n - 1)
            n -= 1
        new = context[n:]
        ids = torch.tensor([new], dtype=torch.long, device=self.device)
        self.pending_logits = forward(self.model, ids, self.cache, keep=1)[-1]
        self.fed.extend(new)

    def propose(self, context, k, sampling, generator):
        self._catch_up(context)
        tokens, dists = [], []
        for i in range(k):
            if sampling.greedy:
                token = int(self.pending_logits.argmax())
            else:
                dist = probabilities(self.pending_logits, sampling)
                token = int(torch.multinomial(dist, 1, generator=generator))
                dists.append(dist)
            tokens.append(token)
            if i < k - 1:  # the last candidate's K/V is only needed if it is accepted
                ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
                self.pending_logits = forward(self.model, ids, self.cache, keep=1)[-1]
                self.fed.append(token)
        return tokens, (torch.stack(dists) if dists else None)

    def rollback(self, confirmed_length: int) -> None:
        if confirmed_length < len(self.fed):
            crop_cache(self.cache, confirmed_length)
            del self.fed[confirmed_length:]
            self.pending_logits = None


@dataclass
class PromptLookupProposer:
    """Model-free drafting: copy what followed the latest earlier occurrence of the context's last n-gram."""

    max_ngram: int = 3
    min_ngram: int = 1
    name: str = "prompt-lookup"
    matched_ngram: int = 0  # length of the n-gram the last proposal continues (0: none found)

    def start(self, context):
        pass

    @property
    def match_class(self) -> str:
        """The last proposal's match class (rakv.depth: how far its acceptance can be trusted)."""
        return match_class(self.matched_ngram)

    def propose(self, context, k, sampling, generator):
        seq = np.asarray(context, dtype=np.int64)
        self.matched_ngram = 0
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
            starts = np.flatnonzero((windows == tail).all(axis=1))
            if starts.size:
                follow = int(starts[-1]) + n
                self.matched_ngram = n
                return seq[follow:follow + k].tolist(), None
        return [], None

    def rollback(self, confirmed_length):
        pass


@dataclass
class ControlledAcceptanceProposer:
    """Proposes the target's own greedy continuation with probability `alpha` per token, a wrong token otherwise.

    It runs a real draft model for every candidate so that a round costs what a draft-model round
    costs; only the proposed ids are replaced. Used to validate the cost model at chosen acceptance.
    `reference` is the full greedy AR token sequence (prompt + output) of the same request.
    """

    draft: DraftModelProposer
    reference: list[int]
    alpha: float
    vocab_size: int
    seed: int = 0
    name: str = "controlled"

    def __post_init__(self):
        self._rng = random.Random(self.seed)

    def start(self, context):
        self.draft.start(context)

    def propose(self, context, k, sampling, generator):
        drafted, _ = self.draft.propose(context, k, sampling, generator)
        tokens = []
        for i in range(len(drafted)):
            right = self.reference[len(context) + i]
            if self._rng.random() < self.alpha:
                tokens.append(right)
            else:
                tokens.append((right + 1 + self._rng.randrange(self.vocab_size - 1)) % self.vocab_size)
        return tokens, None

    def rollback(self, confirmed_length):
        self.draft.rollback(confirmed_length)
