"""Kernel modes (rakv.runtime.kernels, rakv.runtime.compact): compact computes what stock computes, keeps the K/V
semantics, runs several requests' rows in one pass exactly as one at a time, holds one copy of the weights, and
has its own identity."""

import pytest
import torch
from conftest import THREADS
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicLayer

from rakv.runtime import kernels
from rakv.runtime.actions import Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.compact import Linear, Segment
from rakv.runtime.decoding import crop_cache, forward, forward_rows
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import GrowingLayer, compact_of, effective_mode, kernels_of, mode_label, new_kv_cache
from rakv.runtime.models import load_pair


@pytest.fixture(scope="module")
def stock_tiny():
    return load_pair("tiny", threads=THREADS, kernels="stock")


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 9, 17, 70])
def test_the_gemm_computes_x_w_for_every_row_count(rows):
    """kernels.cpp's GEMM on packed panels against F.linear, with bias and residual, and an output count that is not a
    multiple of the panel (200 = 6 panels + 8)."""
    torch.manual_seed(rows)
    layer = torch.nn.Linear(96, 200)
    x, residual = torch.randn(rows, 96), torch.randn(rows, 200)
    projection = Linear.of(layer.weight, layer.bias)
    assert torch.equal(projection.dense(), layer.weight)
    with torch.inference_mode():
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias) + residual
        assert torch.allclose(projection(x, residual=residual), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 7, 33])
@pytest.mark.parametrize("shape", [(96, 200), (576, 576), (1538, 960)])  # in, out; 1538: K not a multiple of 4
def test_the_int8_gemm_is_exactly_its_integer_definition(rows, shape):
    """The draft's GEMM: each row of x quantised on its own (scale max|x| / 127, round half to even), integer products
    summed exactly, then (sum * row scale) * weight scale + bias: bit for bit what this plain torch computes."""
    torch.manual_seed(rows)
    inner, out = shape
    weight, bias, x = torch.randn(out, inner) * 0.05, torch.randn(out), torch.randn(rows, inner)
    projection = Linear.of(weight, bias).int8()
    quantised = kernels.unpack_int8(projection.weight, out, inner).long()
    top = x.abs().amax(dim=1, keepdim=True)
    x_q = torch.round(x * (127.0 / top)).long()
    expected = ((x_q @ quantised.T).float() * (top / 127.0)) * projection.scale[:out] + bias
    with torch.inference_mode():
        assert torch.equal(projection(x), expected)
    assert torch.allclose(projection.dense(), weight, atol=float(weight.abs().max()) / 127)  # quantised per row


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 80), st.integers(0, 79), st.sampled_from([(128, 384), (576, 960), (1536, 576), (64, 200)]),
       st.sampled_from(["fp32", "int8", "q4_1", "q8_0"]))
def test_a_gemm_row_has_the_same_bits_whatever_rows_are_computed_with_it(rows, offset, shape, precision):
    """Batch invariance of the GEMM itself (fp32, the int8 draft's and target's, the q4_1 target's Q4_1 and Q8_0
    blocks): any slice of rows gives each row the bits the whole gives it."""
    torch.manual_seed(shape[0])
    projection = Linear.of(torch.randn(shape[1], shape[0]) * 0.05)
    if precision == "int8":
        projection = projection.int8()
    elif precision != "fp32":
        projection = projection.in_blocks(precision)
    x = torch.randn(160, shape[0])
    with torch.inference_mode():
        whole = projection(x)
        assert torch.equal(projection(x[offset:offset + rows]), whole[offset:offset + rows])
        assert torch.equal(projection(x[offset:offset + 1]), whole[offset:offset + 1])


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
    # compact's identity names its kernels' source: K/V or calibrations of other kernels are never reused
    assert tiny_pair.target.fingerprint.kernels == mode_label("compact")
    assert mode_label("compact").startswith("compact:")
    assert kernels_of(tiny_pair.target.module) == "compact"
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


def test_compact_holds_one_copy_of_the_weights_and_its_module_refuses_a_forward_of_its_own():
    """The packed projections replace the transformers module's dense weights (a tied head serves as the embedding
    table): the model holds no more bytes than stock, but for the panels' padding; that module then says why it
    cannot run itself instead of failing on empty weights."""
    def held_bytes(module):
        tensors = list(module.state_dict().values())
        compact = compact_of(module)
        if compact is not None:
            tensors += compact.tensors()
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())

    stock = load_pair("tiny", threads=THREADS, kernels="stock").target.module
    compact = load_pair("tiny", threads=THREADS, kernels="compact").target.module
    assert held_bytes(stock) <= held_bytes(compact) <= held_bytes(stock) * 1.01
    assert compact.transformer.h[0].attn.c_attn.weight.numel() == 0
    with torch.inference_mode(), pytest.raises(RakvError, match="packed for kernels=compact"):
        compact(input_ids=torch.arange(50, 70).unsqueeze(0))


def _chunks(n: int, cuts: list[int]) -> list[tuple[int, int]]:
    """[0, n) cut at the given points (taken modulo n): the pieces a chunked prefill feeds."""
    points = sorted({0, n, *(c % n for c in cuts if n)})
    return list(zip(points, points[1:]))


def _batch_invariance(model, segments, cuts, seed):
    """Each request's logits computed alone (its context prefilled in chunks, its new rows in chunks, one forward
    per chunk) and in one batched forward beside the others (contexts prefilled whole): the same bits."""
    generator = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    with torch.inference_mode():
        batch, alone = [], []
        for context, new, keep in segments:
            ids = torch.randint(0, vocab, (context + new,), generator=generator)
            together_cache, alone_cache = new_kv_cache(model), new_kv_cache(model)
            if context:
                forward(model, ids[None, :context], together_cache, keep=1)
                for a, b in _chunks(context, cuts):
                    forward(model, ids[None, a:b], alone_cache, keep=1)
            batch.append(Segment(ids[context:], together_cache, keep))
            rows = torch.cat([forward(model, ids[None, context + a:context + b], alone_cache) for a, b in
                              _chunks(new, cuts)])
            alone.append(rows[-keep:] if keep else rows)
        together = forward_rows(model, batch)
    for got, expected, segment, (context, new, _) in zip(together, alone, batch, segments):
        assert got.shape == expected.shape
        assert torch.equal(got, expected), f"{(got - expected).abs().max()}"
        assert segment.cache.get_seq_length() == context + new  # each request's K/V grew by its own rows only


SEGMENTS = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 9), st.sampled_from([0, 1])), min_size=1, max_size=6)
CUTS = st.lists(st.integers(1, 200), max_size=4)


@settings(max_examples=25, deadline=None)
@given(SEGMENTS, CUTS, st.integers(0, 10_000))
def test_logits_are_bitwise_the_same_alone_chunked_verified_or_batched(tiny_pair, segments, cuts, seed):
    """Batch invariance by construction (kernels.cpp): a request's logits, target and draft, do not depend on the other
    requests in its forward, on how its prefill is chunked, or on how many rows it verifies at once."""
    for model in (tiny_pair.target.module, tiny_pair.draft.module):
        _batch_invariance(model, segments, cuts, seed)


@pytest.mark.heavy
@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(SEGMENTS, CUTS, st.integers(0, 10_000))
def test_smollm2_logits_are_bitwise_the_same_alone_chunked_verified_or_batched(smollm2_pair, segments, cuts, seed):
    """The same on SmolLM2 (grouped-query attention, RoPE, SiLU) and its int8 draft."""
    for model in (smollm2_pair.target.module, smollm2_pair.draft.module):
        _batch_invariance(model, segments, cuts, seed)


def test_stock_models_run_batched_rows_one_request_at_a_time(stock_tiny):
    model = stock_tiny.target.module
    ids = torch.arange(200, 230)
    with torch.inference_mode():
        rows = forward_rows(model, [Segment(ids[:12], new_kv_cache(model), 1), Segment(ids, new_kv_cache(model), 0)])
    assert rows[0].shape[0] == 1 and rows[1].shape[0] == 30


def test_the_forward_returns_the_last_hidden_states_when_asked(tiny_pair, stock_tiny):
    """For a proposer that drafts from the target's hidden states (rakv.runtime.decoding.Proposer.needs_target_hidden):
    the rows whose logits the forward returns, [rows, hidden], from which the output head gives those logits bit for
    bit; asking changes no logit."""
    model = tiny_pair.target.module
    ids = torch.arange(300, 330)

    def batch(m):
        return [Segment(ids[:12], new_kv_cache(m), 1), Segment(ids, new_kv_cache(m), 0)]

    with torch.inference_mode():
        plain = forward_rows(model, batch(model))
        logits, hidden = forward_rows(model, batch(model), return_hidden=True)
        assert [tuple(h.shape) for h in hidden] == [(1, model.config.hidden_size), (30, model.config.hidden_size)]
        for got, expected, rows in zip(logits, plain, hidden):
            assert torch.equal(got, expected)
            assert torch.equal(compact_of(model).lm_head(rows).float(), got)
        alone, alone_hidden = forward(model, ids[None], new_kv_cache(model), keep=0, return_hidden=True)
        assert torch.equal(alone, plain[1]) and torch.equal(alone_hidden, hidden[1])
        stock = stock_tiny.target.module  # transformers' forward: its last hidden state, what its head reads
        stock_logits, stock_hidden = forward_rows(stock, batch(stock), return_hidden=True)
        assert [h.shape for h in stock_hidden] == [h.shape for h in hidden]
        for got, rows, expected in zip(stock_logits, stock_hidden, logits):
            assert torch.equal(stock.get_output_embeddings()(rows).float(), got)
            assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_compact_refuses_positions_beyond_the_context(tiny_pair):
    model = tiny_pair.target.module
    with torch.inference_mode(), pytest.raises(AssertionError, match="beyond the model's context"):
        forward(model, torch.zeros(1, 1025, dtype=torch.long), new_kv_cache(model), keep=1)


def test_compact_greedy_output_is_transformers_generate(tiny_pair, stock_tiny):
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 26))
    ids = engine.encode("def fibonacci(n):\n    ")
    hf = stock_tiny.target.module.generate(torch.tensor([ids]),
                                           attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                           max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                           pad_token_id=0)[0, len(ids):].tolist()
    for strategy in ("ar", "spec-k4", "joint-k2"):
        assert engine.run(ids, Action.of_strategy(strategy), 24, ignore_eos=True).token_ids == hf, strategy


class _W8A8(torch.nn.Module):
    """The int8 draft's projection as its definition in plain torch: each input row quantised on its own to int8
    (scale max|x| / 127), integer products summed exactly, rescaled per row and per output (kernels.cpp: gemm_int8)."""

    def __init__(self, projection, start, rows):
        super().__init__()
        full = kernels.unpack_int8(projection.weight, projection.out_features, projection.in_features)
        self.quantised = full[start:start + rows].long()
        self.scale = projection.scale[start:start + rows]

    def forward(self, x):
        top = x.abs().amax(dim=-1, keepdim=True)
        x_q = torch.round(x * (127.0 / top)).long()
        return ((x_q @ self.quantised.T).float() * (top / 127.0)) * self.scale


def _w8a8_stock(stock_module, draft):
    """A transformers module whose projections compute what the compact int8 draft's compute, by that definition."""
    def swap(parent, names, projection):
        start = 0
        for name in names:
            rows = getattr(parent, name).weight.shape[0]
            setattr(parent, name, _W8A8(projection, start, rows))
            start += rows

    for layer, block in zip(stock_module.model.layers, draft.blocks):
        swap(layer.self_attn, ["q_proj", "k_proj", "v_proj"], block.qkv)
        swap(layer.self_attn, ["o_proj"], block.out)
        swap(layer.mlp, ["gate_proj", "up_proj"], block.up)
        swap(layer.mlp, ["down_proj"], block.down)
    head = torch.nn.Linear(*reversed(stock_module.lm_head.weight.shape), bias=False)  # untied: the embedding stays fp32
    stock_module.lm_head = head
    swap(stock_module, ["lm_head"], draft.lm_head)
    return stock_module


@pytest.mark.heavy
@pytest.mark.slow
def test_compact_smollm2_target_and_int8_draft_give_reference_logits(smollm2_pair):
    from rakv.runtime.workloads import load_humaneval

    stock = load_pair("smollm2", threads=THREADS, kernels="stock")
    ids = torch.tensor([smollm2_pair.tokenizer(load_humaneval()[0]["prompt"], add_special_tokens=False)["input_ids"]])
    assert ids.shape[1] >= 36
    draft = compact_of(smollm2_pair.draft.module)
    assert compact_of(smollm2_pair.target.module) is not None and draft is smollm2_pair.draft.module
    assert smollm2_pair.draft.fingerprint.quantisation == "int8-w8a8-per-row"
    assert draft.embedding is compact_of(smollm2_pair.target.module).embedding  # shared, not copied
    _same_steps(smollm2_pair.target.module, stock.target.module, ids, atol=1e-3)
    # The draft against its definition. Quantising activations makes that definition chaotic: a last-bit difference
    # in attention or a norm moves some row's integers by one quantum, compounded over 30 layers. So the draft is
    # held to the definition as closely as the definition holds to itself when its embeddings move by 1e-7: the
    # same envelope, measured in the test; a wrong layout, scale or offset lands far outside it.
    reference = _w8a8_stock(stock.target.module, draft)
    embedding = stock.target.module.model.embed_tokens
    with torch.inference_mode():
        ours = forward(smollm2_pair.draft.module, ids, new_kv_cache(smollm2_pair.draft.module))
        theirs = forward(reference, ids, new_kv_cache(reference))
        exact = embedding.weight.data.clone()
        noise = torch.randn(exact.shape, generator=torch.Generator().manual_seed(0))
        embedding.weight.data = exact * (1 + 1e-7 * noise)
        nudged = forward(reference, ids, new_kv_cache(reference))
        embedding.weight.data = exact
    for a, b in ((ours, theirs), (nudged, theirs)):
        assert torch.allclose(a[:2], b[:2], atol=1e-3, rtol=1e-4)  # one or two keys: nothing to compound yet
    envelope = (nudged - theirs).abs().mean()
    assert (ours - theirs).abs().mean() <= 2 * envelope, ((ours - theirs).abs().mean(), envelope)
    agree = (ours.argmax(-1) == theirs.argmax(-1)).float().mean()
    assert agree >= (nudged.argmax(-1) == theirs.argmax(-1)).float().mean() - 0.05


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compact_on_cuda_gives_stock_logits():
    compact = load_pair("tiny", device="cuda", kernels="compact")
    stock = load_pair("tiny", device="cuda", kernels="stock")
    _same_steps(compact.target.module, stock.target.module, torch.arange(100, 140, device="cuda").unsqueeze(0),
                atol=1e-3)


def test_a_lock_file_left_by_a_killed_build_does_not_stop_the_kernels_loading():
    """torch's build lock is a file: a process killed mid-compile leaves it, and torch's own `load` then waits for it
    forever (a CI run hung so). The kernels load past one within a bounded time (a fresh process; already built)."""
    import subprocess
    import sys

    kernels.native()  # built and cached before the leftover appears
    (kernels.build_directory() / "lock").touch()
    done = subprocess.run([sys.executable, "-c", "from rakv.runtime import kernels; print(kernels.int8_dot())"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == kernels.int8_dot(), done.stderr[-500:]
    assert not (kernels.build_directory() / "lock").exists()


_GEMM_PROBE = """
import sys, torch
from rakv.runtime.compact import Linear
torch.manual_seed(0)
out = {}
for inner, outputs in ((576, 960), (1536, 576), (96, 200)):
    projection = Linear.of(torch.randn(outputs, inner) * 0.05, torch.randn(outputs))
    x = torch.randn(40, inner)
    with torch.inference_mode():
        for rows in (1, 5, 6, 13, 16, 17, 40):
            out[inner, outputs, rows] = projection(x[:rows])
            if inner % 32 == 0:  # the q4_1 target's blocks (Q4_1 projections, Q8_0 head)
                for fmt in ("q4_1", "q8_0"):
                    out[inner, outputs, rows, fmt] = projection.in_blocks(fmt)(x[:rows])
torch.save(out, sys.argv[1])
"""


def test_the_build_is_keyed_by_the_instruction_set_the_compiler_targets(monkeypatch):
    """The build folder names the resolved -march and the vector extensions the compiler enables, so that an AVX2
    node never loads an AVX-512 build from a shared home; a build this CPU cannot run is refused with one line."""
    isa = kernels.target_isa()
    assert isa.replace("+", "_") in kernels.build_directory().name  # (the folder's name spells + as _)
    assert {"avx2", "fma", "f16c"} <= set(isa.partition("+")[2].split("."))
    assert kernels.missing_cpu_flags(isa) == []  # this machine runs its own build
    # positive control: an AVX2-only CPU's flags against an AVX-512 build, and this build against no flags at all
    assert kernels.missing_cpu_flags("x+avx2.avx512f.avx512vnni.fma", {"avx2", "fma"}) == ["avx512f", "avx512vnni"]
    assert "avx2" in kernels.missing_cpu_flags(isa, set())
    monkeypatch.setattr(kernels, "missing_cpu_flags", lambda *_: ["avx512f"])
    kernels.native.cache_clear()
    try:
        with pytest.raises(RakvError, match="does not list"):
            kernels.native()
    finally:
        monkeypatch.undo()
        kernels.native.cache_clear()


def _beyond_avx2() -> bool:
    """Whether this machine's build compiles vector code an x86-64-v3 build does not (AVX-512 tiles, VNNI dots)."""
    from rakv.runtime.calibration import instruction_set

    return any(flag in (instruction_set() or "").split("+") for flag in ("avx512f", "avx_vnni"))


@pytest.mark.slow
@pytest.mark.skipif(not _beyond_avx2(), reason="this machine's build already runs the AVX2 code (both builds "
                                               "compile the same vector code; the other tests check it)")
@pytest.mark.heavy
def test_an_avx2_build_gives_every_gemm_row_the_bits_of_this_machines_build(tmp_path):
    """The GEMM's bits do not depend on the vector width (kernels.cpp: eight-lane tiles on AVX2, sixteen-lane ones
    with AVX-512, two or more row counts per call): the same rows through a build for x86-64-v3 (AVX2 + FMA, compiled
    on first use, about a minute) and through this machine's build, in two fresh processes, are equal bit for bit."""
    import os
    import subprocess
    import sys

    results = {}
    for march in ("native", "x86-64-v3"):
        path = tmp_path / f"{march}.pt"
        env = {**os.environ, "RAKV_KERNELS_MARCH": march}
        done = subprocess.run([sys.executable, "-c", _GEMM_PROBE, str(path)], env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-1000:]
        results[march] = torch.load(path)
    assert results["native"].keys() == results["x86-64-v3"].keys()
    for key, value in results["native"].items():
        assert torch.equal(value, results["x86-64-v3"][key]), f"{key}: the two builds differ"


# SmolLM2's attention shapes: 9 query heads sharing 3 K/V heads of 64 (the grouped path, its shared values pass)
_H, _KV, _D = 9, 3, 64


def _attention_rows(requests, seed: int):
    """Random queries, keys and values for `requests` [(cached positions, new rows)]: per request its new rows'
    qkv [rows, (H + 2 KV) D] and K/V buffers [1, KV, capacity, D] holding its cached positions."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for cached, rows in requests:
        keys = torch.randn(1, _KV, cached + rows, _D, generator=generator)
        values = torch.randn(1, _KV, cached + rows, _D, generator=generator)
        out.append((cached, torch.randn(rows, (_H + 2 * _KV) * _D, generator=generator), keys, values))
    return out


def _attend(requests, pieces):
    """Each request's attention output rows, its new rows fed in `pieces` calls (prefill chunks / decode steps),
    every call holding the same piece of every request (one batched call per piece)."""
    outputs = [[] for _ in requests]
    buffers = [(k.clone(), v.clone()) for _, _, k, v in requests]
    for piece in range(pieces):
        cuts = [torch.linspace(0, qkv.shape[0], pieces + 1).long().tolist() for _, qkv, _, _ in requests]
        live = [i for i, c in enumerate(cuts) if c[piece + 1] > c[piece]]
        if not live:
            continue
        qkv = torch.cat([requests[i][1][cuts[i][piece]:cuts[i][piece + 1]] for i in live])
        out = kernels.native().attention(qkv, [buffers[i][0] for i in live], [buffers[i][1] for i in live],
                                         [requests[i][0] + cuts[i][piece] for i in live],
                                         [cuts[i][piece + 1] - cuts[i][piece] for i in live], _H, _KV, _D ** -0.5,
                                         None, None)
        first = 0
        for i in live:
            n = cuts[i][piece + 1] - cuts[i][piece]
            outputs[i].append(out[first:first + n])
            first += n
    return [torch.cat(o) for o in outputs]


def _reference_attention(cached, qkv, keys, values):
    """The same rows in float64 (softmax of the scaled scores over positions 0 .. own, grouped-query)."""
    keys, values = keys.double().clone(), values.double().clone()
    rows = qkv.shape[0]
    q = qkv.double()[:, :_H * _D].view(rows, _H, _D)
    keys[0, :, cached:] = qkv.double()[:, _H * _D:(_H + _KV) * _D].view(rows, _KV, _D).transpose(0, 1)
    values[0, :, cached:] = qkv.double()[:, (_H + _KV) * _D:].view(rows, _KV, _D).transpose(0, 1)
    out = torch.empty(rows, _H, _D, dtype=torch.float64)
    for i in range(rows):
        visible = cached + i + 1
        for h in range(_H):
            kv = h // (_H // _KV)
            p = torch.softmax(keys[0, kv, :visible] @ q[i, h] * _D ** -0.5, 0)
            out[i, h] = p @ values[0, kv, :visible]
    return out.view(rows, _H * _D)


@pytest.mark.parametrize("requests", [[(256, 1)] * 16, [(0, 70), (300, 1), (97, 5), (31, 33)]])
def test_attention_rows_are_the_same_bits_alone_batched_or_chunked_and_near_float64(requests):
    """The attention kernel on SmolLM2's shapes at positions well past 64 (many blocks of keys, whatever a kernel
    cuts them into): a request's rows computed alone in one call, in one call beside the other requests, and fed in
    three chunks are equal bit for bit, and within 1e-5 of a float64 softmax attention (relative to the output's
    largest magnitude)."""
    rows = _attention_rows(requests, seed=len(requests))
    together = _attend(rows, 1)
    chunked = _attend(rows, 3)
    for index, request in enumerate(rows):
        alone = _attend([request], 1)[0]
        assert torch.equal(alone, together[index]), f"request {index}: alone and batched differ"
        assert torch.equal(alone, chunked[index]), f"request {index}: whole and chunked differ"
        reference = _reference_attention(*request)
        assert ((alone.double() - reference).abs().max() / reference.abs().max()).item() < 1e-5


def test_the_attention_comparisons_see_a_change_in_one_cached_key():
    """The positive control of the check above: one element of one cached key moved by 0.1 % changes a decode row's
    output bits (so equal bits are evidence), and a wrong query-to-K/V-head mapping misses the float64 reference by
    far more than its tolerance."""
    cached, qkv, keys, values = _attention_rows([(256, 1)], seed=7)[0]
    moved = keys.clone()
    moved[0, 0, 100, 0] *= 1.001
    first = _attend([(cached, qkv, keys, values)], 1)[0]
    second = _attend([(cached, qkv, moved, values)], 1)[0]
    assert not torch.equal(first, second)
    swapped = torch.cat([values[:, 1:], values[:, :1]], 1)  # the K/V heads' values rotated: another head's values
    reference = _reference_attention(cached, qkv, keys, swapped)
    assert ((first.double() - reference).abs().max() / reference.abs().max()).item() > 1e-2
