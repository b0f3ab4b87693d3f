"""The CPU fast path (rakv.kernels): same numbers as stock within float tolerance, same K/V semantics, own identity."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicLayer

from rakv.errors import RakvError
from rakv.kernels import FastLinear, GrowingLayer, apply_kernels, effective_mode, kernels_of, new_kv_cache
from rakv.models import load_pair


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9, 70])
@pytest.mark.parametrize("bias", [False, True])
def test_fast_linear_matches_linear(rows, bias):
    torch.manual_seed(rows)
    linear = torch.nn.Linear(96, 200, bias=bias)
    x = torch.randn(1, rows, 96)
    fast = FastLinear(linear.weight, linear.bias)
    with torch.inference_mode():
        assert torch.allclose(fast(x), linear(x), atol=1e-5, rtol=1e-5)
        assert fast(x).shape == (1, rows, 200)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.integers(1, 40).map(lambda n: ("add", n)), st.integers(0, 30).map(lambda n: ("crop", n))),
                min_size=1, max_size=12))
def test_growing_layer_holds_what_a_dynamic_layer_holds(operations):
    growing, reference = GrowingLayer(), DynamicLayer()
    for op, n in operations:
        if op == "add":
            keys, values = torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4)
            out = growing.update(keys, values)
            expected = reference.update(keys, values)
            assert all(torch.equal(a, b) for a, b in zip(out, expected))
        else:
            n = min(n, reference.get_seq_length())
            growing.crop(-n)
            reference.crop(-n)
        assert growing.get_seq_length() == reference.get_seq_length()
        if reference.get_seq_length():
            assert torch.equal(growing.keys, reference.keys) and torch.equal(growing.values, reference.values)


def test_modes_have_their_own_identity_and_the_fast_path_only_runs_on_cpu(tiny_pair):
    assert tiny_pair.target.fingerprint.kernels == "fast" and kernels_of(tiny_pair.target.module) == "fast"
    stock = load_pair("tiny", threads=2, kernels="stock")
    assert stock.target.fingerprint.key() != tiny_pair.target.fingerprint.key()  # no shared store entries
    assert effective_mode("fast", torch.device("cuda")) == "stock"
    module = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert apply_kernels(module, "fast", torch.device("cuda")) == "stock" and type(module[0]) is torch.nn.Linear
    with pytest.raises(RakvError, match="unknown kernels mode"):
        effective_mode("turbo", torch.device("cpu"))


def test_fast_and_stock_tiny_pairs_give_the_same_logits(tiny_pair):
    stock = load_pair("tiny", threads=2, kernels="stock")
    ids = torch.arange(100, 140).unsqueeze(0)
    with torch.inference_mode():
        fast_cache, stock_cache = new_kv_cache(tiny_pair.target.module), new_kv_cache(stock.target.module)
        assert type(fast_cache.layers[0]) is GrowingLayer and type(stock_cache.layers[0]) is DynamicLayer
        for start, end in ((0, 30), (30, 31), (31, 36), (36, 37)):  # prefill, step, verify k=4, step
            a = tiny_pair.target.module(input_ids=ids[:, start:end], cache=fast_cache, use_cache=True).logits
            b = stock.target.module(input_ids=ids[:, start:end], cache=stock_cache, use_cache=True).logits
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
