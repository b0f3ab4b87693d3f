"""The real pretrained pair: our speculative decoding reproduces transformers' greedy `generate`."""

import pytest
import torch
from conftest import THREADS

from rakv.runtime.actions import Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.engine import Engine
from rakv.runtime.models import load_pair
from rakv.runtime.workloads import load_humaneval

pytestmark = pytest.mark.slow


def test_joint_k4_equals_transformers_greedy_generate(smollm2_pair):
    prompt = load_humaneval()[2]["prompt"]
    engine = Engine(smollm2_pair, PrefixKVStore(budget_bytes=1 << 30))
    ids = engine.encode(prompt)
    n = 40
    stock = load_pair("smollm2", threads=THREADS, kernels="stock").target.module  # transformers as shipped
    hf = stock.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                        max_new_tokens=n, do_sample=False)
    expected = hf[0, len(ids):].tolist()
    cold = engine.run(ids, Action.of_strategy("joint-k4"), n)
    repeat = engine.run(ids, Action.of_strategy("joint-k4"), n)  # exact repeat: K/V and logits from the store
    assert cold.token_ids == expected and repeat.token_ids == expected
    assert repeat.hit_tokens == len(ids) and cold.accepted > 0
    assert smollm2_pair.draft.fingerprint.quantisation == "int8-w8a8-per-row"
    assert smollm2_pair.draft.fingerprint.key() != smollm2_pair.target.fingerprint.key()
