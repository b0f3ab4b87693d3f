"""Proposers of speculative tokens, behind one small interface, and the registry of the configurable ones.

A proposer sees the confirmed context (prompt + confirmed output) and returns up to `k` candidate
tokens plus, for sampling, the distribution each was drawn from (`None` = deterministic choice,
i.e. a point mass, which the rejection sampler handles exactly). Nothing a proposer returns is
confirmed: the target's verification decides.

`PROPOSERS` maps a configuration's proposer name (conf/configuration: `proposer`, `--proposer`) to its class, and
`proposer_type(name)` is the one way from a name to that class. The name stays the proposer's identity wherever it
is data (calibration keys and file names, results' columns); what a kind of proposer implies for the rest of the
system (a draft model's K/V and costs, the match rate, a per-round depth, the batch cost's proposer term) is class
data of the `Proposer` protocol (declared in rakv.runtime.decoding, beside the loops that call it), read by the other
layers instead of comparing names (tests/test_layout.py checks that no name is compared outside this module). A
proposer that drafts from the target's last hidden states (EAGLE- or Medusa-style heads) sets `needs_target_hidden`
and is given them after every verify forward (`observe_target_hidden`; rakv.runtime.decoding.verify_forward and the
serving executor).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from transformers import DynamicCache

from rakv.runtime.compact import Segment
from rakv.runtime.decoding import Proposer, Sampling, crop_cache, forward_rows, probabilities
from rakv.runtime.depth import match_class
from rakv.runtime.errors import RakvError
from rakv.runtime.heads import HeadsProposer
from rakv.runtime.kernels import new_kv_cache


@dataclass
class DraftModelProposer(Proposer):
    """A smaller model drafting autoregressively with its own KV cache."""

    name: ClassVar[str] = "draft"
    has_draft_model: ClassVar[bool] = True
    pays_per_candidate: ClassVar[bool] = True
    reuses_stored_state: ClassVar[bool] = True

    model: torch.nn.Module
    device: torch.device
    cache: DynamicCache | None = None
    fed: list[int] = field(default_factory=list)  # tokens whose K/V is in `cache`
    pending_logits: torch.Tensor | None = None  # draft logits after the last fed token

    @classmethod
    def for_pair(cls, pair) -> DraftModelProposer:
        return cls(pair.draft.module, pair.device)

    def start(self, context: list[int], kv=None) -> None:
        self.resume(context, kv)
        catch_up([self], [context])

    def resume(self, context: list[int], kv=None) -> None:
        """An empty cache, or one holding `kv` (per layer (keys, values), copied in) for the context's first
        positions; the next proposal (or `start`) feeds what is missing."""
        self.reset()
        if kv:
            self.cache = new_kv_cache(self.model, kv)
            self.fed = list(context[:self.cache.get_seq_length()])

    def reset(self) -> None:
        """An empty cache: the next proposal feeds the whole context first."""
        self.cache = new_kv_cache(self.model)
        self.fed = []
        self.pending_logits = None

    def missing(self, context: list[int]) -> list[int]:
        """The context tokens the cache lacks, after cropping away anything that diverged (none: up to date)."""
        n = 0
        limit = min(len(self.fed), len(context))
        while n < limit and self.fed[n] == context[n]:
            n += 1
        if n < len(self.fed):
            self.rollback(n)
        if n == len(context) and self.pending_logits is not None:
            return []
        if n == len(context):  # logits of the last token were dropped by a rollback: recompute it
            self.rollback(n - 1)
            n -= 1
        return context[n:]

    def fed_tokens(self, tokens: list[int], logits: torch.Tensor) -> None:
        """`tokens` went through the draft (their K/V is in the cache); `logits` are those after the last one."""
        self.fed.extend(tokens)
        self.pending_logits = logits

    def propose(self, context, k, sampling, generator):
        tokens, proposals = propose_batch([self], [context], [k], [sampling], [generator])
        return tokens[0], proposals[0]

    def state_for(self, token_ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        if self.cache is None or self.fed[:len(token_ids)] != list(token_ids):
            return None
        return [(layer.keys, layer.values) for layer in self.cache.layers]

    def rollback(self, confirmed_length: int) -> None:
        if confirmed_length < len(self.fed):
            crop_cache(self.cache, confirmed_length)
            del self.fed[confirmed_length:]
            self.pending_logits = None


def catch_up(drafts: list[DraftModelProposer], contexts: list[list[int]]) -> None:
    """Feed each draft the context tokens it lacks, all in one batched forward (rakv.runtime.decoding.forward_rows)."""
    feeds = [(d, d.missing(c)) for d, c in zip(drafts, contexts)]
    feeds = [(d, tokens) for d, tokens in feeds if tokens]
    if not feeds:
        return
    segments = [Segment(torch.tensor(tokens, dtype=torch.long, device=d.device), d.cache, 1) for d, tokens in feeds]
    for (draft, tokens), logits in zip(feeds, forward_rows(feeds[0][0].model, segments)):
        draft.fed_tokens(tokens, logits[-1])


def propose_batch(proposers: list[Proposer], contexts: list[list[int]], ks: list[int], samplings: list[Sampling],
                  generators: list) -> tuple[list[list[int]], list[torch.Tensor | None]]:
    """Each proposer's up-to-k candidates for its context, drawn with its request's sampling; the draft models'
    steps batched across requests.

    The drafts of one batch share a model: every draft step is one forward over one row per request still
    drafting, and each request draws from its own generator in the order it would alone, so each request's
    candidates are those its proposer gives alone."""
    tokens: list[list[int]] = [[] for _ in proposers]
    proposals: list[torch.Tensor | None] = [None] * len(proposers)
    drafts = [i for i, p in enumerate(proposers) if isinstance(p, DraftModelProposer) and ks[i] > 0]
    for i, p in enumerate(proposers):
        if i not in drafts:
            tokens[i], proposals[i] = (p.propose(contexts[i], ks[i], samplings[i], generators[i]) if ks[i]
                                        else ([], None))
    if not drafts:
        return tokens, proposals
    catch_up([proposers[i] for i in drafts], [contexts[i] for i in drafts])
    dists: dict[int, list[torch.Tensor]] = {i: [] for i in drafts}
    for step in range(max(ks[i] for i in drafts)):
        for i in drafts:
            if step < ks[i]:
                logits = proposers[i].pending_logits
                if samplings[i].greedy:
                    tokens[i].append(int(logits.argmax()))
                else:
                    dist = probabilities(logits, samplings[i])
                    tokens[i].append(int(torch.multinomial(dist, 1, generator=generators[i])))
                    dists[i].append(dist)
        # the last candidate's K/V is only needed if it is accepted
        stepping = [i for i in drafts if step < ks[i] - 1]
        if stepping:
            model, device = proposers[stepping[0]].model, proposers[stepping[0]].device
            segments = [Segment(torch.tensor(tokens[i][-1:], dtype=torch.long, device=device), proposers[i].cache, 1)
                        for i in stepping]
            for i, logits in zip(stepping, forward_rows(model, segments)):
                proposers[i].fed_tokens(tokens[i][-1:], logits[-1])
    for i in drafts:
        proposals[i] = torch.stack(dists[i]) if dists[i] else None
    return tokens, proposals


@dataclass
class PromptLookupProposer(Proposer):
    """Model-free drafting: copy what followed the latest earlier occurrence of the context's last n-gram."""

    name: ClassVar[str] = "prompt-lookup"
    may_offer_none: ClassVar[bool] = True
    has_match_classes: ClassVar[bool] = True
    replays_rounds: ClassVar[bool] = True

    max_ngram: int = 3
    min_ngram: int = 1
    matched_ngram: int = 0  # length of the n-gram the last proposal continues (0: none found)

    def start(self, context, kv=None):
        pass

    @property
    def match_class(self) -> str:
        """The last proposal's match class (rakv.runtime.depth: how far its acceptance can be trusted)."""
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
class ControlledAcceptanceProposer(Proposer):
    """Proposes the target's own greedy continuation with probability `alpha` per token, a wrong token otherwise.

    It runs a real draft model for every candidate so that a round costs what a draft-model round
    costs; only the proposed ids are replaced. Used to validate the cost model at chosen acceptance.
    `reference` is the full greedy AR token sequence (prompt + output) of the same request.
    """

    name: ClassVar[str] = "controlled"  # not a configuration's proposer: the sensitivity stage passes it to Engine.run
    has_draft_model: ClassVar[bool] = True
    pays_per_candidate: ClassVar[bool] = True

    draft: DraftModelProposer
    reference: list[int]
    alpha: float
    vocab_size: int
    seed: int = 0

    def __post_init__(self):
        self._rng = random.Random(self.seed)

    def start(self, context, kv=None):
        self.draft.start(context, kv)

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


# A configuration's proposer name -> its class: the one place a name means a kind of proposer.
PROPOSERS: dict[str, type[Proposer]] = {cls.name: cls for cls in (DraftModelProposer, PromptLookupProposer,
                                                                   HeadsProposer)}


def proposer_type(name: str) -> type[Proposer]:
    """The class of a configuration's proposer; an unknown name fails with the known ones."""
    try:
        return PROPOSERS[name]
    except KeyError:
        raise RakvError(f"unknown proposer '{name}'; choose one of: {', '.join(PROPOSERS)}") from None


def parse_proposers(value) -> tuple[str, ...]:
    """Several proposers' names, each once: `draft,prompt-lookup,heads` (a flag's text) or a list (a config's); ""
    or None: none given."""
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else list(value or ())
    names = [n for n in names if n]
    for name in names:
        proposer_type(name)
    if len(set(names)) != len(names):
        raise RakvError(f"proposers must name each proposer once, got {','.join(names)}")
    return tuple(names)
