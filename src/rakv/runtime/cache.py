"""Cross-request prefix KV store with exact prefix matching (paper/main.tex, Method: "Prefix KV store").

Layout follows vLLM's prefix cache in miniature: a namespace (model identity + isolation salt)
and a BLAKE2b digest of the first `BUCKET_TOKENS` token ids pick a bucket; the bucket's entries
are validated by exact longest-common-prefix over token ids. Nothing approximate ever authorises
reuse. Entries live in an LRU queue under a byte budget.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field, replace

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


@dataclass
class CacheEntry:
    token_ids: np.ndarray
    kv: KV
    next_logits: torch.Tensor  # logits after the last prompt token, [vocab]
    nbytes: int
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

    def _match(self, ns: str, token_ids: np.ndarray) -> tuple[Hit, int | None]:
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
        best = max(range(len(ids)), key=lambda r: (reused[r], exact[r], last_use[r]))
        return (Hit(prompt_length=n, prefix_length=int(prefix[best]), exact=bool(exact[best]),
                    acceptance=entries[ids[best]].acceptance), ids[best])

    def _touch(self, entry_id: int) -> CacheEntry:
        self._clock += 1
        self._lru.move_to_end(entry_id)
        entry = self._lru[entry_id][1]
        entry.last_use = self._clock
        return entry

    def peek(self, ns: str, token_ids: np.ndarray) -> Hit:
        """What a lookup would reuse, without copying, counting or touching the LRU order."""
        return self._match(ns, token_ids)[0]

    def lookup(self, ns: str, token_ids: np.ndarray) -> tuple[Hit, KV | None, torch.Tensor | None]:
        """Match and copy out the reusable K/V (and the next-token logits on an exact repeat)."""
        self.stats.lookups += 1
        hit, entry_id = self._match(ns, token_ids)
        if not hit.is_hit:
            return hit, None, None
        entry = self._touch(entry_id)
        n = hit.reused_tokens
        kv = [(k[:, :, :n].clone(), v[:, :, :n].clone()) for k, v in entry.kv]
        logits = entry.next_logits.clone() if hit.exact else None
        self.stats.hits += 1
        self.stats.exact_hits += int(hit.exact)
        self.stats.hit_tokens += n
        return hit, kv, logits

    def insert(self, ns: str, token_ids: np.ndarray, kv: KV, next_logits: torch.Tensor,
               acceptance: tuple[float, float] | None = None) -> bool:
        """Store a copy of a prompt's K/V (cropped to the prompt), with the acceptance observed while generating
        from it when given (an exact repeat's entry takes the newer one). Returns whether it is stored."""
        length = len(token_ids)
        hit, entry_id = self._match(ns, token_ids)
        if hit.exact:
            entry = self._touch(entry_id)
            if acceptance is not None:
                entry.acceptance = acceptance
            return True
        kv = [(k[:, :, :length].clone(), v[:, :, :length].clone()) for k, v in kv]
        next_logits = next_logits.detach().reshape(-1).clone()
        nbytes = kv_nbytes(kv) + next_logits.numel() * next_logits.element_size()
        if nbytes > self.budget_bytes:
            self.stats.rejected_oversize += 1
            return False
        while self.stats.bytes + nbytes > self.budget_bytes:
            self._evict_oldest()
        key = (ns, bucket_digest(token_ids))
        entry = CacheEntry(token_ids=np.array(token_ids, dtype=np.int64), kv=kv,
                           next_logits=next_logits, nbytes=nbytes, acceptance=acceptance)
        self._add(key, entry)
        self.stats.inserts += 1
        return True

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
        """Empty the store and put back a snapshot's entries in their LRU order (no K/V copied or recomputed)."""
        self.clear()
        for key, entry in snapshot:
            assert self.stats.bytes + entry.nbytes <= self.budget_bytes, "snapshot larger than the store's budget"
            self._add(key, replace(entry))

    def clear(self) -> None:
        while self._lru:
            self._evict_oldest()
        self.stats = StoreStats()

    def lru_order(self) -> list[tuple[int, ...]]:
        """Token ids of the stored entries, least recently used first (for tests and inspection)."""
        return [tuple(entry.token_ids.tolist()) for _, entry in self._lru.values()]
