"""Prefix KV store: exact matching, copying, isolation, budget and LRU."""

from dataclasses import replace

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rakv.runtime.cache import BUCKET_TOKENS, PrefixKVStore, kv_nbytes, namespace


def fake_kv(length, layers=2, heads=2, dim=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, heads, length, dim, generator=g), torch.randn(1, heads, length, dim, generator=g))
            for _ in range(layers)]


def ids(*values):
    return np.asarray(values, dtype=np.int64)


BASE = np.arange(100, 140, dtype=np.int64)  # 40 tokens
NS = namespace("model-a", None)


def filled_store(budget=1 << 30):
    store = PrefixKVStore(budget_bytes=budget)
    store.insert(NS, BASE, fake_kv(len(BASE)), torch.randn(10))
    return store


def test_exact_repeat_reuses_everything_and_logits():
    store = filled_store()
    hit, kv, logits, _ = store.lookup(NS, BASE.copy())
    assert hit.exact and hit.reused_tokens == 40 and kv[0][0].shape[2] == 40 and logits is not None


def test_partial_hit_reuses_q_minus_one():
    store = filled_store()
    prompt = np.concatenate([BASE[:25], [7, 8, 9]])
    hit, kv, logits, _ = store.lookup(NS, prompt)
    assert hit.prefix_length == 25 and hit.reused_tokens == 24 and not hit.exact
    assert kv[0][0].shape[2] == 24 and logits is None


def test_prompt_that_is_strict_prefix_of_entry_is_a_partial_hit():
    store = filled_store()
    hit = store.peek(NS, BASE[:30])
    assert hit.prefix_length == 30 and hit.reused_tokens == 29 and not hit.exact


def test_divergence_inside_the_first_block_is_a_miss():
    store = filled_store()
    prompt = BASE.copy()
    prompt[BUCKET_TOKENS - 1] = 0  # q = 15: another bucket
    assert store.peek(NS, prompt).reused_tokens == 0
    prompt = BASE.copy()
    prompt[BUCKET_TOKENS] = 0  # first block intact: q = 16
    assert store.peek(NS, prompt).reused_tokens == BUCKET_TOKENS - 1


def test_no_hit_across_identities_or_salts():
    store = filled_store()
    assert not store.peek(namespace("model-b", None), BASE).is_hit
    assert not store.peek(namespace("model-a", "tenant-2"), BASE).is_hit
    store.insert(namespace("model-a", "tenant-2"), BASE, fake_kv(40, seed=1), torch.randn(10))
    assert store.peek(namespace("model-a", "tenant-2"), BASE).exact


def test_stored_tensors_are_copied_in_and_out():
    kv = fake_kv(40)
    store = PrefixKVStore(budget_bytes=1 << 30)
    store.insert(NS, BASE, kv, torch.zeros(10))
    kv[0][0].fill_(7.0)  # the caller's tensors change; the entry must not
    _, out, logits, _ = store.lookup(NS, BASE)
    assert not torch.equal(out[0][0], kv[0][0])
    out[0][0].fill_(9.0)
    logits.fill_(3.0)
    _, again, logits_again, _ = store.lookup(NS, BASE)
    assert not torch.equal(again[0][0], out[0][0]) and torch.equal(logits_again, torch.zeros(10))


def test_oversize_entry_is_not_stored():
    store = PrefixKVStore(budget_bytes=1000)
    assert not store.insert(NS, BASE, fake_kv(40), torch.zeros(10))
    assert store.stats.rejected_oversize == 1 and store.stats.bytes == 0


def test_peek_does_not_count_or_touch():
    store = filled_store()
    store.peek(NS, BASE)
    assert store.stats.lookups == 0 and store.stats.hits == 0


# Model-based check: random inserts and lookups against a plain-Python reference LRU.
prompts = st.lists(st.integers(0, 3), min_size=1, max_size=3).map(
    lambda tail: tuple(range(BUCKET_TOKENS)) + tuple(tail))
operations = st.lists(st.tuples(st.sampled_from(["insert", "lookup"]), prompts), max_size=40)


@settings(max_examples=60, deadline=None)
@given(operations, st.integers(2, 6))
def test_budget_and_lru_order_under_random_operations(ops, capacity_entries):
    def entry_bytes(n):  # 2 layers x (k, v) x [1, 1, n, 1] fp32, plus one fp32 logit
        return 2 * 2 * n * 4 + 4

    budget = capacity_entries * entry_bytes(BUCKET_TOKENS + 2)
    store = PrefixKVStore(budget_bytes=budget)
    model: list[tuple] = []  # reference LRU, oldest first
    for op, prompt in ops:
        arr = np.asarray(prompt, dtype=np.int64)
        if op == "insert":
            kv = fake_kv(len(prompt), layers=2, heads=1, dim=1)
            store.insert(NS, arr, kv, torch.zeros(1))
            if prompt in model:
                model.remove(prompt)
            model.append(prompt)
            while sum(entry_bytes(len(p)) for p in model) > budget:
                model.pop(0)
        else:
            hit, _, _, _ = store.lookup(NS, arr)
            # the best entry is the one with the longest common prefix (exact preferred); it becomes newest
            if hit.is_hit:
                best = max(model, key=lambda p: (len(prompt) if p == prompt else _lcp(p, prompt) - 1,
                                                 p == prompt, model.index(p)))
                model.remove(best)
                model.append(best)
        assert store.stats.bytes <= budget
        assert store.stats.bytes == sum(entry_bytes(len(p)) for p in model)
        assert store.lru_order() == model


def _lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_snapshot_restores_entries_order_and_hits_without_copying_kv():
    store = filled_store()
    other = np.arange(300, 340, dtype=np.int64)
    store.insert(NS, other, fake_kv(len(other), seed=1), torch.randn(10))
    snapshot = store.snapshot()
    order, hit = store.lru_order(), store.peek(NS, BASE[:30])
    _, kv, _, _ = store.lookup(NS, BASE)
    kv[0][0].zero_()  # a request's copy may be written; the snapshot's tensors must not change
    store.insert(NS, np.arange(500, 540, dtype=np.int64), fake_kv(40, seed=2), torch.randn(10))
    store.restore(snapshot)
    assert store.lru_order() == order and store.peek(NS, BASE[:30]) == hit
    assert store.stats.entries == 2 and store.stats.bytes == sum(entry.nbytes for _, entry in snapshot)
    _, again, _, _ = store.lookup(NS, BASE)
    assert torch.equal(again[0][0], fake_kv(len(BASE))[0][0])
    store.restore([])
    assert store.lru_order() == [] and store.stats.bytes == 0


def test_restore_keeps_the_requests_counters_and_counts_no_eviction_of_its_own():
    """A restore serves no request: lookups, hits and evictions carry on across it (the long-context workload counts
    a request's evictions as a difference), while bytes and entries are the snapshot's."""
    store = filled_store()
    snapshot = store.snapshot()
    store.lookup(NS, BASE)
    store.budget_bytes = store.stats.bytes  # full: the next insert evicts
    store.insert(NS, np.arange(500, 500 + len(BASE), dtype=np.int64), fake_kv(len(BASE), seed=2), torch.randn(10))
    counted = replace(store.stats)
    assert counted.evictions >= 1 and counted.lookups == 1
    store.budget_bytes = 1 << 30
    store.restore(snapshot)
    assert (store.stats.lookups, store.stats.hits, store.stats.inserts, store.stats.evictions) == (
        counted.lookups, counted.hits, counted.inserts, counted.evictions)
    assert store.stats.entries == len(snapshot) and store.stats.bytes == sum(e.nbytes for _, e in snapshot)


def test_the_draft_part_is_found_under_its_own_identity_counted_copied_and_evicted_with_its_entry():
    from rakv.runtime.cache import DraftPart

    store = PrefixKVStore(budget_bytes=1 << 30)
    target, draft = fake_kv(40), fake_kv(40, seed=3)
    store.insert(NS, BASE, target, torch.zeros(10), draft=DraftPart("draft-a", draft))
    with_draft = store.stats.bytes
    assert with_draft == kv_nbytes(target) + kv_nbytes(draft) + 10 * 4
    assert store.peek(NS, BASE, "draft-a").draft_tokens == 40 and store.peek(NS, BASE).draft_tokens == 0
    assert store.peek(NS, BASE, "draft-b").exact and store.peek(NS, BASE, "draft-b").draft_tokens == 0
    partial = BASE.copy()
    partial[30:] += 1000
    hit, kv, _, dkv = store.lookup(NS, partial, "draft-a")
    assert hit.reused_tokens == hit.draft_tokens == 29 and dkv[0][0].shape[2] == 29
    assert torch.equal(dkv[0][0], draft[0][0][:, :, :29])
    dkv[0][0].fill_(5.0)  # copied out: the entry is unchanged
    draft[1][0].fill_(7.0)  # copied in: the caller's tensors changing leave it unchanged
    again = store.lookup(NS, BASE, "draft-b")
    assert again.draft_kv is None and again.kv is not None
    fresh = store.lookup(NS, BASE, "draft-a").draft_kv
    assert not torch.equal(fresh[0][0], dkv[0][0]) and not torch.equal(fresh[1][0], draft[1][0])
    store.insert(NS, BASE, target, torch.zeros(10), draft=DraftPart("draft-b", fake_kv(40, seed=4)))  # replaced
    assert store.peek(NS, BASE, "draft-b").draft_tokens == 40 and store.peek(NS, BASE, "draft-a").draft_tokens == 0
    assert store.stats.bytes == with_draft and store.stats.entries == 1
    small = PrefixKVStore(budget_bytes=with_draft + 10)
    small.insert(NS, BASE, target, torch.zeros(10), draft=DraftPart("draft-a", draft))
    small.insert(NS, np.arange(500, 540, dtype=np.int64), fake_kv(40), torch.zeros(10))  # evicts the first, whole
    assert not small.peek(NS, BASE, "draft-a").is_hit and small.stats.bytes <= small.budget_bytes


def test_an_entry_whose_draft_part_does_not_fit_is_stored_without_it():
    from rakv.runtime.cache import DraftPart

    target = fake_kv(40)
    store = PrefixKVStore(budget_bytes=kv_nbytes(target) + 40 + 100)
    assert store.insert(NS, BASE, target, torch.zeros(10), draft=DraftPart("draft-a", fake_kv(40, seed=3)))
    hit = store.peek(NS, BASE, "draft-a")
    assert hit.exact and hit.draft_tokens == 0 and store.stats.rejected_oversize == 0
