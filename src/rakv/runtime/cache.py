"""Cross-request prefix KV store with exact prefix matching (paper/main.tex, Method: "Prefix KV store").

Layout follows vLLM's prefix cache in miniature: a namespace (model identity + isolation salt)
and a BLAKE2b digest of the first `BUCKET_TOKENS` token ids pick a bucket; the bucket's entries
are validated by exact longest-common-prefix over token ids. Nothing approximate ever authorises
reuse. Entries live in an LRU queue under a byte budget.

An entry may also carry the proposer's state for the same token ids (`DraftPart`: a draft model's K/V), under the
draft's own identity: a request whose draft has another identity (revision, dtype, quantisation, kernels) reuses
the target's positions and misses the draft's. The draft part counts in the entry's bytes and is evicted with it;
like the target's K/V it is copied in and out, never aliased.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import torch

BUCKET_TOKENS = 16

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [1, heads, length, head_dim]


def namespace(identity_key: str, salt: str | None) -> str:
    """Entries are only visible to requests of the same target identity and the same salt (tenant)."""
    return f"{identity_key}|salt={salt or ''}"


def bucket_digest(token_ids: np.ndarray) -> bytes:
    head = np.ascontiguousarray(token_ids[:BUCKET_TOKENS], dtype=np.int64)
    return hashlib.blake2b(head.tobytes(), digest_size=12).digest()


@dataclass(frozen=True)
class DraftPart:
    """A draft model's K/V for an entry's token ids, and that draft's identity (its fingerprint key)."""

    key: str
    kv: KV


@dataclass
class CacheEntry:
    token_ids: np.ndarray
    kv: KV
    next_logits: torch.Tensor  # logits after the last prompt token, [vocab]
    nbytes: int  # the target's K/V, the logits and the draft part's K/V
    draft: DraftPart | None = None
    last_use: int = 0  # store clock at the last insert or lookup; breaks ties between equal matches
    # (accepted candidates, rejections) of the speculative rounds run while generating from this prefix, when a
    # server recorded them (rakv.serving: prefix-keyed acceptance); evicted with the entry, under its namespace
    acceptance: tuple[float, float] | None = None


@dataclass(frozen=True)
class Hit:
    """Result of matching a prompt against the store.

    `prefix_length` is q, the longest common prefix with the best entry. `reused_tokens` is how
    many prompt positions' K/V are taken from the store: all of them on an exact repeat, q-1 on a
    partial hit (the boundary token is recomputed so its logits come from the model), 0 on a miss.
    """

    prompt_length: int
    prefix_length: int = 0
    exact: bool = False
    acceptance: tuple[float, float] | None = None  # the matched entry's recorded acceptance (CacheEntry)
    draft_tokens: int = 0  # positions of the asked-for draft's K/V the entry gives (reused_tokens, or 0: no draft part)

    @property
    def reused_tokens(self) -> int:
        if self.exact:
            return self.prompt_length
        return max(self.prefix_length - 1, 0)

    @property
    def is_hit(self) -> bool:
        return self.reused_tokens > 0


@dataclass
class StoreStats:
    lookups: int = 0
    hits: int = 0
    exact_hits: int = 0
    hit_tokens: int = 0
    inserts: int = 0
    evictions: int = 0
    rejected_oversize: int = 0
    bytes: int = 0
    entries: int = 0


def kv_nbytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


class Lookup(NamedTuple):
    hit: Hit
    kv: KV | None  # the target's reused positions, copied out (None on a miss)
    logits: torch.Tensor | None  # the next-token logits, on an exact repeat only
    draft_kv: KV | None = None  # the asked-for draft's K/V for the same positions, when the entry carries it


def _cropped(kv: KV, length: int) -> KV:
    return [(k[:, :, :length].clone(), v[:, :, :length].clone()) for k, v in kv]


@dataclass
class PrefixKVStore:
    budget_bytes: int  # conf/cache/default.yaml: budget_mib
    stats: StoreStats = field(default_factory=StoreStats)

    def __post_init__(self):
        self._lru: OrderedDict[int, tuple[tuple[str, bytes], CacheEntry]] = OrderedDict()  # oldest first
        self._buckets: dict[tuple[str, bytes], dict[int, CacheEntry]] = {}
        self._matrices: dict[tuple[str, bytes], tuple] = {}  # per-bucket token matrix, dropped on change
        self._next_id = 0
        self._clock = 0

    def _bucket_matrix(self, key) -> tuple[list[int], np.ndarray, np.ndarray]:
        """The bucket's token ids as one padded matrix (-1 never equals a token), rebuilt after a change.

        One vectorised comparison then gives every entry's common prefix with a prompt, so a lookup
        costs about the same with 300 entries in a bucket as with 3.
        """
        cached = self._matrices.get(key)
        if cached is None:
            entries = self._buckets[key]
            ids = list(entries)
            lengths = np.array([len(entries[i].token_ids) for i in ids])
            matrix = np.full((len(ids), int(lengths.max())), -1, dtype=np.int64)
            for row, i in enumerate(ids):
                matrix[row, : lengths[row]] = entries[i].token_ids
            cached = self._matrices[key] = (ids, matrix, lengths)
        return cached

    def _match(self, ns: str, token_ids: np.ndarray, draft: str | None = None) -> tuple[Hit, int | None]:
        no_hit = Hit(prompt_length=len(token_ids))
        key = (ns, bucket_digest(token_ids))
        if key not in self._buckets:
            return no_hit, None
        ids, matrix, lengths = self._bucket_matrix(key)
        n = len(token_ids)
        width = min(n, matrix.shape[1])
        mismatch = matrix[:, :width] != token_ids[:width]
        prefix = np.where(mismatch.any(axis=1), mismatch.argmax(axis=1), width)
        exact = (prefix == n) & (lengths == n)
        reused = np.where(exact, n, np.maximum(prefix - 1, 0))
        if reused.max() == 0:
            return no_hit, None
        entries = self._buckets[key]
        last_use = np.array([entries[i].last_use for i in ids])
        with_draft = np.array([draft is not None and entries[i].draft is not None and entries[i].draft.key == draft
                               for i in ids])
        # the most positions; then an exact repeat, then the asked-for draft's state, then the most recently used
        best = max(range(len(ids)), key=lambda r: (reused[r], exact[r], with_draft[r], last_use[r]))
        return (Hit(prompt_length=n, prefix_length=int(prefix[best]), exact=bool(exact[best]),
                    acceptance=entries[ids[best]].acceptance,
                    draft_tokens=int(reused[best]) if with_draft[best] else 0), ids[best])

    def _touch(self, entry_id: int) -> CacheEntry:
        self._clock += 1
        self._lru.move_to_end(entry_id)
        entry = self._lru[entry_id][1]
        entry.last_use = self._clock
        return entry

    def peek(self, ns: str, token_ids: np.ndarray, draft: str | None = None) -> Hit:
        """What a lookup would reuse, without copying, counting or touching the LRU order; `draft`: the identity of
        the draft whose state is asked for too (Hit.draft_tokens)."""
        return self._match(ns, token_ids, draft)[0]

    def lookup(self, ns: str, token_ids: np.ndarray, draft: str | None = None) -> Lookup:
        """Match and copy out the reusable K/V (and the next-token logits on an exact repeat; and the `draft`'s
        K/V for the same positions when the entry carries that draft's)."""
        self.stats.lookups += 1
        hit, entry_id = self._match(ns, token_ids, draft)
        if not hit.is_hit:
            return Lookup(hit, None, None)
        entry = self._touch(entry_id)
        n = hit.reused_tokens
        logits = entry.next_logits.clone() if hit.exact else None
        self.stats.hits += 1
        self.stats.exact_hits += int(hit.exact)
        self.stats.hit_tokens += n
        return Lookup(hit, _cropped(entry.kv, n), logits, _cropped(entry.draft.kv, n) if hit.draft_tokens else None)

    def insert(self, ns: str, token_ids: np.ndarray, kv: KV, next_logits: torch.Tensor,
               acceptance: tuple[float, float] | None = None, draft: DraftPart | None = None) -> bool:
        """Store a copy of a prompt's K/V (cropped to the prompt), with the acceptance observed while generating
        from it when given (an exact repeat's entry takes the newer one) and the draft's K/V (`draft`, cropped the
        same way; an exact repeat's entry without that draft's state gets it). Returns whether it is stored."""
        length = len(token_ids)
        hit, entry_id = self._match(ns, token_ids, draft.key if draft is not None else None)
        draft = DraftPart(draft.key, _cropped(draft.kv, length)) if draft is not None else None
        if hit.exact:
            entry = self._touch(entry_id)
            if acceptance is not None:
                entry.acceptance = acceptance
            if draft is not None and not hit.draft_tokens:
                self._attach(entry_id, entry, draft)
            return True
        kv = _cropped(kv, length)
        next_logits = next_logits.detach().reshape(-1).clone()
        nbytes = kv_nbytes(kv) + next_logits.numel() * next_logits.element_size()
        if draft is not None and nbytes + kv_nbytes(draft.kv) > self.budget_bytes:
            draft = None  # the target's part alone fits: stored without the draft's
        nbytes += kv_nbytes(draft.kv) if draft is not None else 0
        if nbytes > self.budget_bytes:
            self.stats.rejected_oversize += 1
            return False
        while self.stats.bytes + nbytes > self.budget_bytes:
            self._evict_oldest()
        key = (ns, bucket_digest(token_ids))
        entry = CacheEntry(token_ids=np.array(token_ids, dtype=np.int64), kv=kv,
                           next_logits=next_logits, nbytes=nbytes, acceptance=acceptance, draft=draft)
        self._add(key, entry)
        self.stats.inserts += 1
        return True

    def _attach(self, entry_id: int, entry: CacheEntry, draft: DraftPart) -> None:
        """Give an entry (just touched: the newest) a draft part, replacing another draft's, within the budget."""
        old = kv_nbytes(entry.draft.kv) if entry.draft is not None else 0
        extra = kv_nbytes(draft.kv) - old
        if entry.nbytes + extra > self.budget_bytes:
            return  # the entry stays as it is
        while self.stats.bytes + extra > self.budget_bytes and next(iter(self._lru)) != entry_id:
            self._evict_oldest()
        if self.stats.bytes + extra > self.budget_bytes:
            return
        entry.draft, entry.nbytes = draft, entry.nbytes + extra
        self.stats.bytes += extra

    def _add(self, key: tuple[str, bytes], entry: CacheEntry) -> None:
        self._lru[self._next_id] = (key, entry)
        self._buckets.setdefault(key, {})[self._next_id] = entry
        self._matrices.pop(key, None)
        self._touch(self._next_id)
        self._next_id += 1
        self.stats.bytes += entry.nbytes
        self.stats.entries += 1

    def _evict_oldest(self) -> None:
        entry_id, (key, entry) = self._lru.popitem(last=False)
        bucket = self._buckets[key]
        self._matrices.pop(key, None)
        del bucket[entry_id]
        if not bucket:
            del self._buckets[key]
        self.stats.bytes -= entry.nbytes
        self.stats.entries -= 1
        self.stats.evictions += 1

    def snapshot(self) -> list[tuple[tuple[str, bytes], CacheEntry]]:
        """The stored entries, oldest first, for `restore`: the K/V tensors are shared, never mutated by the store."""
        return [(key, replace(entry)) for key, entry in self._lru.values()]

    def restore(self, snapshot: list[tuple[tuple[str, bytes], CacheEntry]]) -> None:
        """Empty the store and put back a snapshot's entries in their LRU order (no K/V copied or recomputed). The
        requests' counters (lookups, hits, inserts, evictions, ...) carry on: a restore serves no request, and the
        entries it drops are not evictions, so a caller counts a request's evictions as a plain difference."""
        served = replace(self.stats)  # (clear evicts through the same counters before it resets them)
        self.clear()
        for key, entry in snapshot:
            assert self.stats.bytes + entry.nbytes <= self.budget_bytes, "snapshot larger than the store's budget"
            self._add(key, replace(entry))
        self.stats = replace(served, bytes=self.stats.bytes, entries=self.stats.entries)

    def clear(self) -> None:
        while self._lru:
            self._evict_oldest()
        self.stats = StoreStats()

    def lru_order(self) -> list[tuple[int, ...]]:
        """Token ids of the stored entries, least recently used first (for tests and inspection)."""
        return [tuple(entry.token_ids.tolist()) for _, entry in self._lru.values()]
