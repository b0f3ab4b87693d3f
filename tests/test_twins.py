"""Architecture twins: the reference models' exact shapes with seeded random weights, never mistaken for them."""

import pytest
import torch
from conftest import THREADS

from rakv.runtime.errors import RakvError
from rakv.runtime.models import ARCHITECTURES, GPT2_CONTEXT, GPT2_VOCAB, TWIN_PAIRS, load_pair, twin_of

PUBLISHED = {"gpt2": (12, 768, 12), "distilgpt2": (6, 768, 12), "gpt2-medium": (24, 1024, 16),
             "gpt2-large": (36, 1280, 20)}  # layers, width, heads of the hub models' configs


def test_twin_architectures_are_the_published_ones():
    assert ARCHITECTURES == PUBLISHED and (GPT2_VOCAB, GPT2_CONTEXT) == (50257, 1024)
    assert set(TWIN_PAIRS) == {"gpt2-distilgpt2-twin", "gpt2medium-gpt2-twin", "gpt2large-gpt2medium-twin"}
    assert twin_of("gpt2large-gpt2medium") == "gpt2large-gpt2medium-twin"
    with pytest.raises(RakvError, match="has no architecture twin"):
        twin_of("smollm2")


@pytest.fixture(scope="module")
def twins():
    return load_pair("gpt2-distilgpt2-twin", threads=THREADS)


def test_a_twin_pair_has_the_shapes_a_twin_fingerprint_and_seeded_weights(twins):
    for loaded, name in ((twins.target, "gpt2"), (twins.draft, "distilgpt2")):
        config = loaded.module.config
        assert (config.n_layer, config.n_embd, config.n_head) == PUBLISHED[name]
        assert config.vocab_size == GPT2_VOCAB and loaded.max_context == GPT2_CONTEXT
        assert "twin" in loaded.fingerprint.name and loaded.fingerprint.weights.startswith("twin:seed=")
    assert len(twins.tokenizer) <= GPT2_VOCAB  # every id the tokenizer makes is inside the vocabulary
    again = load_pair("gpt2-distilgpt2-twin", threads=THREADS)
    assert again.target.fingerprint == twins.target.fingerprint
    assert torch.equal(again.target.module.transformer.wte.weight, twins.target.module.transformer.wte.weight)


def test_a_twin_generates_and_speculates_exactly(twins):
    from rakv.runtime.actions import Action
    from rakv.runtime.cache import PrefixKVStore
    from rakv.runtime.engine import Engine

    engine = Engine(twins, PrefixKVStore(budget_bytes=1 << 30))
    ids = engine.encode("def add(a, b):\n    return a + b\n")
    ar = engine.run(ids, Action(False, 0), 8, ignore_eos=True).token_ids
    assert engine.run(ids, Action(True, 4), 8, ignore_eos=True).token_ids == ar
    assert max(ar) < GPT2_VOCAB
