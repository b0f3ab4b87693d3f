"""Kernel modes (rakv.runtime.kernels, rakv.runtime.compact): compact computes what stock computes, keeps the K/V
semantics, runs several requests' rows in one pass exactly as one at a time, holds one copy of the weights, and
has its own identity."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicLayer

from rakv.runtime.actions import Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.compact import Segment
from rakv.runtime.decoding import crop_cache, forward, forward_rows
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import GrowingLayer, compact_of, effective_mode, kernels_of, linear, new_kv_cache
from rakv.runtime.models import load_pair


@pytest.fixture(scope="module")
def stock_tiny():
    return load_pair("tiny", threads=2, kernels="stock")


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9, 17, 70])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_f_linear_for_every_row_count(rows, bias):
    torch.manual_seed(rows)
    layer = torch.nn.Linear(96, 200, bias=bias)
    x = torch.randn(rows, 96)
    with torch.inference_mode():
        assert torch.allclose(linear(x, layer.weight, layer.bias), layer(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(128, 384), (576, 960), (1536, 576)])  # tiny's QKV; SmolLM2's QKV and down
def test_a_gemm_row_has_the_same_bits_whatever_rows_are_computed_with_it(shape):
    """What a chunked prefill relies on (rakv.runtime.decoding.forward_rows): the large path's rows are the bits a
    whole prefill gives them, for every chunk size; small chunks padded by `gemm`, checked on this machine's MKL."""
    from rakv.runtime.kernels import gemm

    torch.manual_seed(0)
    weight, x = torch.randn(shape[1], shape[0]), torch.randn(300, shape[0])
    whole = gemm(x, weight)
    for rows in [*range(1, 40), 64, 100, 257]:
        assert torch.equal(gemm(x[5:5 + rows], weight), whole[5:5 + rows]), rows
        assert torch.equal(linear(x[5:5 + rows], weight, small=False), whole[5:5 + rows]), rows


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


def test_modes_have_their_own_identity(tiny_pair, stock_tiny):
    assert tiny_pair.target.fingerprint.kernels == "compact" and kernels_of(tiny_pair.target.module) == "compact"
    assert stock_tiny.target.fingerprint.kernels == "stock" and compact_of(stock_tiny.target.module) is None
    assert stock_tiny.target.fingerprint.key() != tiny_pair.target.fingerprint.key()  # no shared store entries
    assert effective_mode("compact", torch.device("cuda")) == "compact"  # plain torch: the same code on CUDA
    with pytest.raises(RakvError, match="unknown kernels mode"):
        effective_mode("turbo", torch.device("cpu"))


def _same_steps(compact, stock, ids, atol):
    """Prefill, one step, a verify of 5, a crop of 3 (rollback), a step: compact's logits equal stock's."""
    with torch.inference_mode():
        a_cache, b_cache = new_kv_cache(compact), new_kv_cache(stock)
        assert type(a_cache.layers[0]) is GrowingLayer and type(b_cache.layers[0]) is DynamicLayer
        for start, end, crop in ((0, 30, None), (30, 31, None), (31, 36, 33), (33, 34, None)):
            a = forward(compact, ids[:, start:end], a_cache)
            b = forward(stock, ids[:, start:end], b_cache)
            assert a.shape == b.shape == (end - start, b.shape[-1])
            assert torch.allclose(a, b, atol=atol, rtol=1e-4), f"tokens {start}:{end}: {(a - b).abs().max()}"
            if crop is not None:
                crop_cache(a_cache, crop)
                crop_cache(b_cache, crop)
                assert a_cache.get_seq_length() == b_cache.get_seq_length() == crop


def test_compact_gives_stock_logits_on_gpt2_through_steps_verifies_and_rollback(tiny_pair, stock_tiny):
    ids = torch.arange(100, 140).unsqueeze(0)
    for which in ("target", "draft"):
        _same_steps(getattr(tiny_pair, which).module, getattr(stock_tiny, which).module, ids, atol=1e-4)


def test_compact_holds_one_copy_of_the_weights():
    """The fused projections are the model's parameters: the transformers module's tensors are views of them."""
    def storage_bytes(module):
        seen = {}
        for tensor in module.state_dict().values():
            seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return sum(seen.values())

    stock = load_pair("tiny", threads=2, kernels="stock").target.module
    compact = load_pair("tiny", threads=2, kernels="compact").target.module
    assert storage_bytes(compact) == storage_bytes(stock)
    fused = compact_of(compact).blocks[0].qkv.weight
    assert compact.transformer.h[0].attn.c_attn.weight.untyped_storage().data_ptr() == \
        fused.untyped_storage().data_ptr()


def test_stock_forward_of_a_compact_module_is_unchanged(tiny_pair, stock_tiny):
    """The rebound parameters keep the transformers module itself computing the same function."""
    ids = torch.arange(50, 70).unsqueeze(0)
    with torch.inference_mode():
        a = tiny_pair.target.module(input_ids=ids).logits
        b = stock_tiny.target.module(input_ids=ids).logits
    assert torch.equal(a, b)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 9), st.sampled_from([0, 1])), min_size=1, max_size=6),
       st.integers(0, 10_000))
def test_batched_rows_equal_single_rows(tiny_pair, segments, seed):
    """Requests with their own contexts (lengths, new tokens, logits kept) in one pass equal each run alone."""
    model = tiny_pair.target.module
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        batch, alone = [], []
        for context, new, keep in segments:
            ids = torch.randint(0, 49_000, (context + new,), generator=generator)
            caches = [new_kv_cache(model), new_kv_cache(model)]
            if context:
                for cache in caches:
                    forward(model, ids[None, :context], cache, keep=1)
            batch.append(Segment(ids[context:], caches[0], keep))
            alone.append(forward(model, ids[None, context:], caches[1], keep))
        together = forward_rows(model, batch)
    for got, expected, segment, (context, new, _) in zip(together, alone, batch, segments):
        assert got.shape == expected.shape
        assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
        assert segment.cache.get_seq_length() == context + new  # each request's K/V grew by its own rows only


def test_stock_models_run_batched_rows_one_request_at_a_time(stock_tiny):
    model = stock_tiny.target.module
    ids = torch.arange(200, 230)
    with torch.inference_mode():
        rows = forward_rows(model, [Segment(ids[:12], new_kv_cache(model), 1), Segment(ids, new_kv_cache(model), 0)])
    assert rows[0].shape[0] == 1 and rows[1].shape[0] == 30


def test_compact_refuses_positions_beyond_the_context(tiny_pair):
    model = tiny_pair.target.module
    with torch.inference_mode(), pytest.raises(AssertionError, match="beyond the model's context"):
        forward(model, torch.zeros(1, 1025, dtype=torch.long), new_kv_cache(model), keep=1)


def test_compact_greedy_output_is_transformers_generate(tiny_pair, stock_tiny):
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 26))
    ids = engine.encode("def fibonacci(n):\n    ")
    hf = stock_tiny.target.module.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                           max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                           pad_token_id=0)[0, len(ids):].tolist()
    for strategy in ("ar", "spec-k4", "joint-k2"):
        assert engine.run(ids, Action.of_strategy(strategy), 24, ignore_eos=True).token_ids == hf, strategy


def _dequantised_stock(stock_module, draft):
    """A transformers module whose projections hold the compact int8 draft's weights, dequantised (weight * scale):
    what the draft computes, by the reference code."""
    def set_rows(modules, projection):
        weight = projection.weight.float() * projection.scale[:, None]
        start = 0
        for module in modules:
            rows = module.weight.shape[0]
            module.weight = torch.nn.Parameter(weight[start:start + rows].clone(), requires_grad=False)
            start += rows

    for layer, block in zip(stock_module.model.layers, draft.blocks):
        attn, mlp = layer.self_attn, layer.mlp
        set_rows([attn.q_proj, attn.k_proj, attn.v_proj], block.qkv)
        set_rows([attn.o_proj], block.out)
        set_rows([mlp.gate_proj, mlp.up_proj], block.up)
        set_rows([mlp.down_proj], block.down)
    head = torch.nn.Linear(*reversed(stock_module.lm_head.weight.shape), bias=False)  # untied: the embedding stays fp32
    set_rows([head], draft.lm_head)
    stock_module.lm_head = head
    return stock_module


@pytest.mark.slow
def test_compact_smollm2_target_and_int8_draft_give_reference_logits(smollm2_pair):
    from rakv.runtime.workloads import load_humaneval

    stock = load_pair("smollm2", threads=2, kernels="stock")
    ids = torch.tensor([smollm2_pair.tokenizer(load_humaneval()[0]["prompt"], add_special_tokens=False)["input_ids"]])
    assert ids.shape[1] >= 36
    draft = compact_of(smollm2_pair.draft.module)
    assert compact_of(smollm2_pair.target.module) is not None and draft is smollm2_pair.draft.module
    assert smollm2_pair.draft.fingerprint.quantisation == "int8-weight-per-row"
    assert draft.embed is compact_of(smollm2_pair.target.module).embed  # shared, not copied
    _same_steps(smollm2_pair.target.module, stock.target.module, ids, atol=1e-3)
    _same_steps(smollm2_pair.draft.module, _dequantised_stock(stock.target.module, draft), ids, atol=1e-3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compact_on_cuda_gives_stock_logits():
    compact = load_pair("tiny", device="cuda", kernels="compact")
    stock = load_pair("tiny", device="cuda", kernels="stock")
    _same_steps(compact.target.module, stock.target.module, torch.arange(100, 140, device="cuda").unsqueeze(0),
                atol=1e-3)
