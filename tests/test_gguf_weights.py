"""Weights read straight from the GGUF into the packed layout, and the packed file that later processes map
(rakv.runtime.gguf_weights, docs/engine.md "Memory and start-up"): bitwise the weights the transformers path packs,
so logits, greedy outputs and fingerprints do not move; the file named by what its bytes depend on; a damaged file
rebuilt with one line."""

import pytest
import torch

from rakv.runtime import gguf_weights
from rakv.runtime.compact import CompactLM
from rakv.runtime.decoding import forward
from rakv.runtime.kernels import compact_of, new_kv_cache


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return forward(model, ids, new_kv_cache(model))


def _same_state(a: dict, b: dict) -> list[str]:
    """The entries of two states that differ in name, dtype, shape or any bit."""
    differ = sorted(set(a) ^ set(b))
    return differ + [k for k in sorted(set(a) & set(b))
                     if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]


IDS = torch.arange(40, 72).unsqueeze(0)


def test_a_compact_model_rebuilt_from_its_state_computes_the_same_bits(tiny_pair):
    target = compact_of(tiny_pair.target.module)
    rebuilt = CompactLM.from_state(target.config, target.state())
    assert _same_state(rebuilt.state(), target.state()) == []
    assert rebuilt.embedding is rebuilt.lm_head  # a tied head stays one Linear
    assert torch.equal(_logits(rebuilt, IDS), _logits(target, IDS))
    draft = target.int8_draft()
    kept = rebuilt.int8_draft(draft.state())  # int8 projections taken as kept, not quantised again
    assert kept.embedding is rebuilt.embedding and kept.lm_head.scale is not None
    assert torch.equal(_logits(kept, IDS), _logits(draft, IDS))


def test_the_packed_file_is_named_by_the_gguf_the_layout_and_the_dtype(monkeypatch):
    name = gguf_weights.cache_name("abc", torch.float32)
    assert name.startswith("abc-") and name.endswith("-float32.pt")
    assert gguf_weights.cache_name("abd", torch.float32) != name
    assert gguf_weights.cache_name("abc", torch.bfloat16) != name
    monkeypatch.setattr(gguf_weights.kernels, "PANEL", 64)
    assert gguf_weights.cache_name("abc", torch.float32) != name


@pytest.fixture
def tiny_gguf(monkeypatch, tiny_pair):
    """compact_pair over the tiny pair's weights in place of a GGUF's (the reading of a real GGUF: the slow test)."""
    target = compact_of(tiny_pair.target.module)
    built = []
    monkeypatch.setattr(gguf_weights, "gguf_config", lambda path: target.config)
    monkeypatch.setattr(gguf_weights, "packed_state",
                        lambda path, config, dtype: built.append(path) or target.state())
    return target, built


def test_the_packed_file_is_mapped_by_the_next_process_and_a_damaged_one_rebuilt(tmp_path, tiny_gguf, capsys):
    target, built = tiny_gguf
    cache = tmp_path / "packed" / "pair.pt"
    first, first_draft = gguf_weights.compact_pair(tmp_path / "model.gguf", cache, torch.float32)
    assert len(built) == 1 and cache.exists() and list(cache.parent.iterdir()) == [cache]  # no temporary left
    again, again_draft = gguf_weights.compact_pair(tmp_path / "model.gguf", cache, torch.float32)
    assert len(built) == 1  # read, not built
    assert _same_state(again.state(), target.state()) == [] and again.embedding is again.lm_head
    assert again_draft.embedding is again.embedding
    assert torch.equal(_logits(again, IDS), _logits(target, IDS))
    assert torch.equal(_logits(again_draft, IDS), _logits(first_draft, IDS))
    capsys.readouterr()
    whole = cache.read_bytes()
    for damaged in (whole[: len(whole) // 2], whole[:100] + bytes(len(whole) - 100)):  # partial, overwritten
        cache.write_bytes(damaged)
        rebuilt, _ = gguf_weights.compact_pair(tmp_path / "model.gguf", cache, torch.float32)
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert captured.out == ""  # stdout may carry a command's JSON
        assert len(lines) == 1 and "unreadable" in lines[0] and "rebuilding" in lines[0], lines
        assert torch.equal(_logits(rebuilt, IDS), _logits(target, IDS))
        assert cache.read_bytes() != damaged
    assert len(built) == 3


def test_a_packed_file_of_another_layout_is_rebuilt(tmp_path, tiny_gguf, monkeypatch, capsys):
    _, built = tiny_gguf
    cache = tmp_path / "pair.pt"
    gguf_weights.compact_pair(tmp_path / "model.gguf", cache, torch.float32)
    monkeypatch.setattr(gguf_weights, "LAYOUT_VERSION", gguf_weights.LAYOUT_VERSION + 1)
    gguf_weights.compact_pair(tmp_path / "model.gguf", cache, torch.float32)
    assert len(built) == 2 and "another layout" in capsys.readouterr().err


@pytest.mark.heavy
@pytest.mark.slow
def test_smollm2_packed_straight_from_the_gguf_is_bitwise_the_transformers_path(tmp_path):
    """Every packed tensor of the target and of its int8 draft, and the logits of a few prompts: the same bits as
    when transformers de-quantises the GGUF into a module that CompactLM then packs (what every pair loaded before);
    the same again when mapped from the packed file."""
    from rakv.runtime.models import smollm2_gguf_path, smollm2_tokenizer, smollm2_transformers

    gguf = smollm2_gguf_path()
    with torch.no_grad():
        reference = CompactLM(smollm2_transformers(gguf, torch.float32))
        reference_draft = reference.int8_draft()
    built, built_draft = gguf_weights.compact_pair(gguf, tmp_path / "pair.pt", torch.float32)
    mapped, mapped_draft = gguf_weights.compact_pair(gguf, tmp_path / "pair.pt", torch.float32)
    tokenizer = smollm2_tokenizer()
    for target, draft in ((built, built_draft), (mapped, mapped_draft)):
        assert _same_state(target.state(), reference.state()) == []
        assert _same_state(draft.state(), reference_draft.state()) == []
        for prompt in ("def fibonacci(n):", "The capital of France is"):
            ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
            assert torch.equal(_logits(target, ids), _logits(reference, ids))
            assert torch.equal(_logits(draft, ids), _logits(reference_draft, ids))


def test_the_ggufs_blocks_are_kept_mapped_and_a_damaged_file_rebuilt(tmp_path, tiny_pair, monkeypatch, capsys):
    """kept_block_linears (a q4_1 target's blocks, rakv.runtime.models.load_pair): read once, then mapped by the
    next call with the same bytes; a damaged file is rebuilt with one line."""
    target = compact_of(tiny_pair.target.module)
    made = {"blocks.0.qkv": target.blocks[0].qkv.in_blocks("q4_1"), "lm_head": target.lm_head.in_blocks("q8_0")}
    built = []
    monkeypatch.setattr(gguf_weights, "block_linears", lambda path, config: built.append(path) or made)
    cache = tmp_path / "blocks.pt"
    first = gguf_weights.kept_block_linears(tmp_path / "m.gguf", target.config, cache)
    again = gguf_weights.kept_block_linears(tmp_path / "m.gguf", target.config, cache)
    assert len(built) == 1 and list(tmp_path.iterdir()) == [cache]
    for name, linear in made.items():
        assert again[name].blocks == linear.blocks and torch.equal(again[name].weight, linear.weight)
        assert (again[name].out_features, again[name].in_features) == (linear.out_features, linear.in_features)
        assert first[name] is linear
    cache.write_bytes(cache.read_bytes()[:200])
    capsys.readouterr()
    gguf_weights.kept_block_linears(tmp_path / "m.gguf", target.config, cache)
    assert len(built) == 2 and "unreadable" in capsys.readouterr().err
