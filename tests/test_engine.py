"""Engine on the tiny pair: exactness across strategies and reuse cases, rollback, streaming, EOS."""

import numpy as np
import pytest
import torch
from conftest import THREADS

from rakv.runtime.actions import FIXED_STRATEGIES, Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.decoding import Sampling
from rakv.runtime.engine import Engine
from rakv.runtime.models import load_pair
from rakv.runtime.proposers import ControlledAcceptanceProposer, DraftModelProposer, PromptLookupProposer

N = 24
rng = np.random.default_rng(0)
BASE = rng.integers(100, 40000, size=48).tolist()


def variants():
    """(name, warm-up prompt or None, prompt) covering every reuse case of the store."""
    def diverge_at(i):
        p = list(BASE)
        p[i:] = rng.integers(100, 40000, size=len(BASE) - i).tolist()
        return p

    return [
        ("cold", None, BASE),
        ("partial-q16", BASE, diverge_at(16)),  # first block equal, token 16 differs
        ("partial-q17", BASE, diverge_at(17)),
        ("partial-q15-miss", BASE, diverge_at(15)),
        ("exact-repeat", BASE, BASE),
        ("prompt-is-prefix", BASE, BASE[:30]),
        ("prompt-extends-entry", BASE[:30], BASE),
    ]


@pytest.fixture(scope="module")
def engine(tiny_pair):
    return Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))


@pytest.mark.parametrize("case", variants(), ids=lambda c: c[0])
def test_greedy_output_identical_across_strategies(engine, case):
    name, warm, prompt = case
    engine.store.clear()
    reference = engine.run(prompt, Action.of_strategy("ar"), N, ignore_eos=True).token_ids
    for strategy in FIXED_STRATEGIES:
        engine.store.clear()
        if warm is not None:
            engine.run(warm, Action.of_strategy("ar"), 2, ignore_eos=True)
        result = engine.run(prompt, Action.of_strategy(strategy), N, ignore_eos=True)
        assert result.token_ids == reference, f"{name}/{strategy}"
        expected_hit = {"cold": 0, "partial-q16": 15, "partial-q17": 16, "partial-q15-miss": 0,
                        "exact-repeat": len(prompt), "prompt-is-prefix": 29, "prompt-extends-entry": 29}[name]
        assert result.hit_tokens == (expected_hit if Action.of_strategy(strategy).reuse else 0), f"{name}/{strategy}"


def test_ar_matches_transformers_generate(engine):
    ids = torch.tensor([BASE])
    stock = load_pair("tiny", threads=THREADS, kernels="stock").target.module  # transformers as shipped
    hf = stock.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, min_new_tokens=N, do_sample=False,
                        pad_token_id=0)
    ours = engine.run(BASE, Action.of_strategy("joint-k4"), N, ignore_eos=True).token_ids
    assert ours == hf[0, len(BASE):].tolist()


def test_reused_entry_is_bitwise_unchanged(engine):
    engine.store.clear()
    engine.run(BASE, Action.of_strategy("ar"), 4, ignore_eos=True)
    (key, entry), = engine.store._lru.values()
    snapshot = [(k.clone(), v.clone()) for k, v in entry.kv], entry.next_logits.clone()
    for strategy in ("kv-only", "joint-k4", "joint-k8"):
        engine.run(BASE, Action.of_strategy(strategy), N, ignore_eos=True)
        engine.run(BASE[:30], Action.of_strategy(strategy), N, ignore_eos=True)
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(entry.kv, snapshot[0]))
    assert torch.equal(entry.next_logits, snapshot[1])


class CheckingProposer(DraftModelProposer):
    """A draft proposer that checks, at every rollback, both caches against the confirmed length."""

    checks: int = 0

    def rollback(self, confirmed_length):
        super().rollback(confirmed_length)
        assert self.cache.get_seq_length() <= confirmed_length
        assert len(self.fed) == self.cache.get_seq_length()
        self.checks += 1


def test_rollback_leaves_caches_at_confirmed_length(tiny_pair, engine, monkeypatch):
    import rakv.runtime.decoding as decoding

    lengths = []
    real_crop = decoding.crop_cache

    def recording_crop(cache, length):
        real_crop(cache, length)
        lengths.append((cache.get_seq_length(), length))

    monkeypatch.setattr(decoding, "crop_cache", recording_crop)
    proposer = CheckingProposer(tiny_pair.draft.module, tiny_pair.device)
    result = engine.run(BASE, Action.of_strategy("spec-k4"), N, ignore_eos=True, proposer=proposer)
    assert proposer.checks >= result.rounds > 0
    assert lengths and all(have == want for have, want in lengths)
    assert 0 < result.accepted < result.proposed  # both accepting and rejecting rounds ran


def test_stream_sees_only_confirmed_tokens(tiny_pair, engine):
    reference = engine.run(BASE, Action.of_strategy("ar"), N, ignore_eos=True).token_ids
    for alpha in (0.0, 0.5, 0.9):
        streamed = []
        proposer = ControlledAcceptanceProposer(DraftModelProposer(tiny_pair.draft.module, tiny_pair.device),
                                                reference=BASE + reference, alpha=alpha,
                                                vocab_size=tiny_pair.vocab_size, seed=1)
        result = engine.run(BASE, Action.of_strategy("spec-k4"), N, ignore_eos=True, on_token=streamed.append,
                            proposer=proposer)
        assert streamed == result.token_ids == reference


def test_controlled_acceptance_tracks_alpha(tiny_pair, engine):
    reference = engine.run(BASE, Action.of_strategy("ar"), 200, ignore_eos=True).token_ids
    for alpha in (0.2, 0.8):
        proposer = ControlledAcceptanceProposer(DraftModelProposer(tiny_pair.draft.module, tiny_pair.device),
                                                reference=BASE + reference, alpha=alpha,
                                                vocab_size=tiny_pair.vocab_size, seed=2)
        result = engine.run(BASE, Action.of_strategy("spec-k1"), 200, ignore_eos=True, proposer=proposer)
        assert abs(result.accepted / result.proposed - alpha) < 0.12


def test_prompt_lookup_proposer_copies_repeated_ngrams():
    proposer = PromptLookupProposer(max_ngram=2)
    context = [5, 6, 7, 8, 9, 1, 5, 6]
    assert proposer.propose(context, 3, Sampling(), None) == ([7, 8, 9], None)
    assert proposer.propose([1, 2, 3], 3, Sampling(), None) == ([], None)


def test_prompt_lookup_greedy_output_identical(tiny_pair):
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), proposer="prompt-lookup")
    prompt = BASE[:20] * 2
    reference = engine.run(prompt, Action.of_strategy("ar"), N, ignore_eos=True).token_ids
    result = engine.run(prompt, Action.of_strategy("spec-k4"), N, ignore_eos=True)
    assert result.token_ids == reference and result.proposed > 0


def test_generation_stops_at_eos_identically(tiny_pair, engine, monkeypatch):
    free_run = engine.run(BASE, Action.of_strategy("ar"), N, ignore_eos=True).token_ids
    eos = free_run[7]
    monkeypatch.setattr(type(tiny_pair), "eos_token_id", property(lambda self: eos))
    expected = free_run[:free_run.index(eos) + 1]
    for strategy in FIXED_STRATEGIES:
        assert engine.run(BASE, Action.of_strategy(strategy), N).token_ids == expected, strategy
        assert engine.run(BASE, Action.of_strategy(strategy), N, ignore_eos=True).token_ids == free_run, strategy


def test_sampled_runs_are_reproducible_and_differ_from_greedy(engine):
    sampling = Sampling(temperature=1.0, top_p=0.9, seed=7)
    a = engine.run(BASE, Action.of_strategy("spec-k4"), N, sampling=sampling, ignore_eos=True).token_ids
    b = engine.run(BASE, Action.of_strategy("spec-k4"), N, sampling=sampling, ignore_eos=True).token_ids
    greedy = engine.run(BASE, Action.of_strategy("ar"), N, ignore_eos=True).token_ids
    assert a == b and a != greedy


def test_peak_kv_bytes_counts_the_drafts_cache_and_rejected_positions(engine):
    engine.store.clear()
    ar = engine.run(BASE, Action(False, 0), N, ignore_eos=True)
    spec = engine.run(BASE, Action(False, 4), N, ignore_eos=True)
    lookup = Engine(engine.pair, PrefixKVStore(budget_bytes=1 << 30), proposer="prompt-lookup").run(
        BASE, Action(False, 4), N, ignore_eos=True)
    target = engine.pair.target.module.config
    per_token = 2 * target.n_layer * target.n_embd * 4  # K and V, every layer, float32
    assert ar.peak_kv_bytes == per_token * (len(BASE) + N - 1)  # the last token's K/V is never computed
    assert spec.peak_kv_bytes > ar.peak_kv_bytes + per_token * len(BASE) / 4  # + the draft's cache
    assert lookup.peak_kv_bytes >= ar.peak_kv_bytes  # no draft cache, but candidates beyond the output


@pytest.mark.parametrize("prior", [0.0, 0.5, 1.0])
def test_per_round_depth_keeps_greedy_output_and_accounts_every_round(tiny_pair, prior):
    from types import SimpleNamespace

    from rakv.runtime.depth import RoundDepth

    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), proposer="prompt-lookup")
    prompt = BASE[:20] * 2 + BASE[:7]
    reference = engine.run(prompt, Action(False, 0), N, ignore_eos=True)
    costs = SimpleNamespace(target_step=lambda c: 0.020, verify={k: (lambda c: 0.024) for k in (1, 2, 4, 8)})
    depth = RoundDepth(costs, (0, 1, 2, 4, 8), {"unigram": prior, "ngram": prior}, 4.0)
    result = engine.run(prompt, Action(False, 4), N, ignore_eos=True, depth=depth)
    assert result.token_ids == reference.token_ids
    assert len(depth.log) == result.rounds + result.plain_rounds  # every round with candidates, logged once
    assert sum(p for _, p, _ in depth.log) == result.proposed + result.plain_rounds  # a shadow round: its first
    assert 1 + result.rounds + result.accepted + result.plain_rounds + result.empty_rounds == N
    if prior == 0.0:
        assert result.rounds == 0 and result.plain_rounds > 0  # nothing is worth verifying at alpha 0
    if prior == 1.0:
        assert result.plain_rounds == 0 and max(p for _, p, _ in depth.log) > 4  # deeper than the request's k


def test_per_round_depth_refuses_a_proposer_without_match_classes(engine):
    from types import SimpleNamespace

    from rakv.runtime.depth import RoundDepth
    from rakv.runtime.errors import RakvError

    costs = SimpleNamespace(target_step=lambda c: 0.020, verify={4: lambda c: 0.024})
    with pytest.raises(RakvError, match="needs a proposer with match classes"):
        engine.run(BASE, Action(False, 4), N, depth=RoundDepth(costs, (0, 4), {"unigram": 0.5, "ngram": 0.5}, 4.0))


# --- the draft's state in the store (joint reuse of the proposer) ---

@pytest.mark.parametrize("case", variants(), ids=lambda c: c[0])
def test_a_hit_reuses_the_drafts_positions_too_and_changes_no_round(tiny_pair, case):
    """A speculating warm-up stores the draft's K/V beside the target's; a joint-k2 request then takes the draft's
    first positions from the store (as many as the target's) and prefills only the rest, and its rounds — the draft's
    candidates, so the draft's logits — are the same as without draft reuse, under every reuse case."""
    name, warm, prompt = case
    results = {}
    for reuse_draft in (False, True):
        engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), reuse_draft=reuse_draft)
        if warm is not None:
            engine.run(warm, Action(False, 1), 1, ignore_eos=True)  # the draft prefills the warm-up, nothing verified
        results[reuse_draft] = engine.run(prompt, Action(True, 2), N, ignore_eos=True)
    off, on = results[False], results[True]
    assert on.token_ids == off.token_ids and on.round_log == off.round_log, name
    assert off.draft_hit_tokens == 0 and not off.reuse_draft and on.reuse_draft
    assert on.draft_hit_tokens == on.hit_tokens, name  # the draft reuses exactly the target's positions


def test_the_draft_part_belongs_to_the_drafts_identity(tiny_pair):
    """Another draft (here: another identity key) finds the target's positions but not the draft's; the entry then
    takes this draft's state; draft reuse off never asks for it."""
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    engine.run(BASE, Action(False, 1), 1, ignore_eos=True)
    assert engine.peek(BASE).draft_tokens == len(BASE)
    other = engine.store.peek(engine.namespace(None), np.asarray(BASE), "another-draft")
    assert other.exact and other.draft_tokens == 0
    assert Engine(tiny_pair, engine.store, reuse_draft=False).peek(BASE).draft_tokens == 0
    assert Engine(tiny_pair, engine.store, proposer="prompt-lookup").peek(BASE).draft_tokens == 0
    cold = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    cold.run(BASE, Action(False, 0), 1, ignore_eos=True)  # an AR request stores no draft state
    assert cold.peek(BASE).exact and cold.peek(BASE).draft_tokens == 0
    result = cold.run(BASE, Action(True, 2), N, ignore_eos=True)  # an exact repeat speculating: it adds its draft's
    assert result.draft_hit_tokens == 0 and cold.peek(BASE).draft_tokens == len(BASE)
    assert cold.run(BASE, Action(True, 2), N, ignore_eos=True).draft_hit_tokens == len(BASE)


@pytest.mark.parametrize("change", [{"weights": "another-revision"}, {"dtype": "float16"}, {"quantisation": "int4"}])
def test_another_drafts_revision_dtype_or_quantisation_misses_the_draft_part_only(tiny_pair, change):
    from dataclasses import replace

    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    engine.run(BASE, Action(False, 1), 1, ignore_eos=True)
    other_draft = replace(tiny_pair.draft, fingerprint=replace(tiny_pair.draft.fingerprint, **change))
    other = Engine(replace(tiny_pair, draft=other_draft), engine.store)
    hit = other.peek(BASE)
    assert hit.exact and hit.draft_tokens == 0 and engine.peek(BASE).draft_tokens == len(BASE)
    result = other.run(BASE, Action(True, 2), N, ignore_eos=True)  # target reused, the draft prefills
    assert result.hit_tokens == len(BASE) and result.draft_hit_tokens == 0
