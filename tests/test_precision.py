"""The target at `precision: int8 | q4_1` (rakv.runtime.models.PRECISIONS): the block-quantised GEMM computes its
definition bit for bit and is batch-invariant on every build, the GGUF's blocks are kept as shipped, and greedy output
at a precision is the same under AR and speculation."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import THREADS
from gguf import GGMLQuantizationType, dequantize

from rakv.runtime import kernels
from rakv.runtime.actions import FIXED_STRATEGIES, Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.compact import Linear
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import compact_of
from rakv.runtime.models import PRECISIONS, load_pair

GGUF_TYPES = {"q4_1": GGMLQuantizationType.Q4_1, "q8_0": GGMLQuantizationType.Q8_0}


def blocks_of(weight: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the GGUF blocks of `weight`, gguf's own de-quantisation of them: the values the kernels must compute with)"""
    raw = kernels.quantise_blocks(weight, fmt)
    reference = dequantize(raw.reshape(weight.shape[0], -1).numpy(), GGUF_TYPES[fmt])
    return raw, torch.from_numpy(np.array(reference, dtype=np.float32))


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("shape", [(64, 200), (576, 960), (1536, 33)])  # in, out: outputs past a panel's end
def test_packed_blocks_hold_the_ggufs_values_and_the_gemm_is_the_fp32_gemm_over_them(fmt, shape):
    """pack_blocks moves the file's values (gguf's dequantize of them is unpack_blocks' bitwise), and gemm_q gives
    every row the bits the fp32 GEMM gives it over those de-quantised weights, near plain torch's x W^T."""
    torch.manual_seed(shape[1])
    inner, out = shape
    weight, bias = torch.randn(out, inner) * 0.05, torch.randn(out)
    raw, reference = blocks_of(weight, fmt)
    packed = kernels.pack_blocks(raw, fmt)
    assert torch.equal(kernels.unpack_blocks(packed, fmt, out), reference)
    rows = torch.tensor([0, out - 1, out // 2])
    assert torch.equal(kernels.unpack_blocks(packed, fmt, out, rows), reference[rows])
    x, residual = torch.randn(9, inner), torch.randn(9, out)
    with torch.inference_mode():
        ours = kernels.linear_blocks(x, packed, fmt, out, bias, residual)
        assert torch.equal(ours, kernels.linear(x, kernels.pack(reference), out, bias, residual))
        assert torch.allclose(ours, x @ reference.T + bias + residual, atol=1e-4, rtol=1e-4)
        # positive control: one quant of the last panel's first output at the last k changed changes its output
        damaged = packed.clone()
        damaged[-1, -1, packed.shape[-1] - (16 if fmt == "q4_1" else 32)] ^= 0x11
        assert not torch.equal(kernels.linear_blocks(x, damaged, fmt, out, bias, residual), ours)


def test_quantised_values_are_near_the_weights_and_q4_1_is_coarser():
    torch.manual_seed(0)
    weight = torch.randn(64, 256) * 0.05
    errors = {fmt: float((blocks_of(weight, fmt)[1] - weight).abs().max()) for fmt in GGUF_TYPES}
    span = float(weight.abs().max())
    assert 0 < errors["q8_0"] < span / 127 < errors["q4_1"] < span / 7  # half a step of 8 and of 4 bits, about


def test_block_formats_refuse_an_input_width_that_is_not_whole_blocks():
    with pytest.raises(RakvError, match="multiple of 32"):
        Linear.of(torch.randn(40, 48)).in_blocks("q4_1")


@pytest.fixture(scope="module")
def tiny_at():
    return {precision: load_pair("tiny", threads=THREADS, precision=precision) for precision in PRECISIONS}


def test_each_precision_has_its_own_identity_and_weights(tiny_at):
    fingerprints = {p: pair.target.fingerprint for p, pair in tiny_at.items()}
    assert len({f.key() for f in fingerprints.values()}) == len(PRECISIONS)  # K/V never shared across precisions
    assert fingerprints["fp32"].quantisation == "none"
    target = {p: compact_of(pair.target.module) for p, pair in tiny_at.items()}
    assert target["q4_1"].blocks[0].qkv.blocks == "q4_1" and target["q4_1"].lm_head.blocks == "q8_0"
    assert target["int8"].blocks[0].qkv.scale is not None
    assert target["fp32"].blocks[0].qkv.blocks is None and target["fp32"].blocks[0].qkv.scale is None
    # the draft is the fp32 pair's at every precision
    assert all(pair.draft.fingerprint == tiny_at["fp32"].draft.fingerprint for pair in tiny_at.values())


@pytest.mark.parametrize("precision", ["q4_1", "int8"])
def test_greedy_output_at_a_precision_is_ar_at_that_precision(tiny_at, precision):
    """Speculation (every fixed strategy, reuse included) gives the tokens AR gives at the same precision; and the
    precision is not a no-op: its tokens or logits differ from fp32's."""
    prompt = np.random.default_rng(1).integers(100, 40000, size=40).tolist()
    engine = Engine(tiny_at[precision], PrefixKVStore(budget_bytes=1 << 30))
    reference = engine.run(prompt, Action.of_strategy("ar"), 24, ignore_eos=True).token_ids
    for strategy in FIXED_STRATEGIES:
        engine.store.clear()
        engine.run(prompt[:20], Action.of_strategy("ar"), 2, ignore_eos=True)
        assert engine.run(prompt, Action.of_strategy(strategy), 24, ignore_eos=True).token_ids == reference, strategy
    ids = torch.tensor(prompt)
    logits = {p: run_logits(tiny_at[p], ids) for p in ("fp32", precision)}
    error = float((logits[precision] - logits["fp32"]).norm() / logits["fp32"].norm())
    assert 0 < error < 0.5  # not a no-op, and near (4 bits of a random model's weights: ~0.3; int8 ~0.04)


def run_logits(pair, ids: torch.Tensor) -> torch.Tensor:
    model = compact_of(pair.target.module)
    with torch.inference_mode():
        return model(ids, kernels.new_kv_cache(pair.target.module), keep=0)


def test_a_prefill_at_q4_1_has_the_same_bits_in_any_chunking(tiny_at):
    pair = tiny_at["q4_1"]
    model, ids = compact_of(pair.target.module), torch.arange(100, 137)
    whole = run_logits(pair, ids)
    cache = kernels.new_kv_cache(pair.target.module)
    with torch.inference_mode():
        parts = [model(chunk, cache, keep=0) for chunk in (ids[:5], ids[5:6], ids[6:30], ids[30:])]
    assert torch.equal(torch.cat(parts), whole)


@pytest.mark.parametrize("options", [{"kernels": "stock"}, {"dtype": "bfloat16"}, {"precision": "q2"}])
def test_a_precision_the_engine_cannot_run_is_one_line(options):
    with pytest.raises(RakvError, match="precision"):
        load_pair("tiny", threads=THREADS, **{"precision": "q4_1", **options})


@pytest.mark.slow
def test_smollm2_at_q4_1_streams_the_ggufs_blocks_and_computes_the_fp32_targets_bits(smollm2_pair):
    """The GGUF's Q4_1 / Q8_0 blocks taken as shipped de-quantise bitwise to the fp32 target's weights (no
    requantisation), so the q4_1 target's logits are the fp32 target's, bit for bit, from a sixth of the bytes."""
    q4 = load_pair("smollm2", threads=THREADS, precision="q4_1")
    fp32, ours = compact_of(smollm2_pair.target.module), compact_of(q4.target.module)
    for a, b in zip(fp32.projections(), ours.projections()):
        assert b.blocks in ("q4_1", "q8_0") and torch.equal(a.dense(), b.dense())
    size = {name: sum(t.numel() * t.element_size() for t in model.projection_tensors())
            for name, model in (("fp32", fp32), ("q4_1", ours))}
    assert size["q4_1"] * 5 < size["fp32"]
    ids = torch.tensor([1, 504, 3250, 314, 260, 1345, 30])
    assert torch.equal(run_logits(q4, ids), run_logits(smollm2_pair, ids))


def test_the_precision_peer_table_reads_back_what_it_writes():
    from rakv.bench.engine_report import (
        PrecisionDraft,
        PrecisionFloor,
        PrecisionPeerTable,
        PrecisionRatio,
        PrecisionSide,
    )
    from rakv.runtime.json_records import load_record, to_json

    table = PrecisionPeerTable("smollm2", 16, 512, 3, 10.0, [PrecisionFloor("q4_1", 97, 9.7)],
                               [PrecisionSide("ours", "q4_1", 2, 12.0, 900.0, 1.24),
                                PrecisionSide("llama.cpp", "q4_1", 2, error="died with signal 4")],
                               [PrecisionRatio("q4_1", 2, 1.2, "missed", 0.9, "met")],
                               [PrecisionDraft("q4_1", 2, 10.0, 4.0, 0.4)])
    written = json.loads(json.dumps(to_json(table)))
    assert load_record(PrecisionPeerTable, written, "table") == table
    assert written["sides"][1] == {"who": "llama.cpp", "precision": "q4_1", "threads": 2, "error": "died with signal 4"}


@pytest.mark.parametrize("child, expected", [
    ("import json, sys; json.load(sys.stdin); print(json.dumps({'version': '9', 'ms_per_token': 2.0, "
     "'prefill_tokens_per_s': 5.0, 'prefill_tokens': 7, 'tokens': [1, 2]}))", None),
    ("import os, signal; os.kill(os.getpid(), signal.SIGILL)", "died with signal 4"),
    ("raise SystemExit('llama.cpp could not convert the GGUF to F32')", "could not convert"),
])
def test_the_peer_child_answers_in_json_and_a_crash_is_one_line(tmp_path, child, expected):
    """llama.cpp runs in its own venv's interpreter (rakv.bench.llama_cpp.run_child): its measure comes back as
    JSON; a child that dies (SIGILL, as llama.cpp's AMX kernels did) or fails is an error line, not a traceback."""
    import sys

    from rakv.bench.llama_cpp import run_child

    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"{child}\"\n")
    python.chmod(0o755)
    got = run_child(str(python), "q4_1", tmp_path / "m.gguf", tmp_path / "m.gguf", "a", "b", 4, 1, 1)
    if expected is None:
        assert got.error is None and got.ms_per_token == 2.0 and got.tokens == [1, 2]
    else:
        assert expected in got.error and got.ms_per_token == 0.0


def test_the_peer_module_imports_only_the_standard_library_at_its_top():
    """The peer's venv holds llama-cpp-python alone: the child (this module run as a script) must not need torch or
    rakv before it measures."""
    import ast
    import sys

    from rakv.bench import engine, llama_cpp

    def beyond_stdlib(module) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text())
        top = {alias.name.split(".")[0] for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
               for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
        return top - set(sys.stdlib_module_names) - {"__future__"}

    assert beyond_stdlib(llama_cpp) == set()
    assert {"torch", "rakv"} <= beyond_stdlib(engine)  # positive control: the check sees a module that does import


def test_every_configuration_states_a_precision_the_engine_runs_and_names_the_ones_not_fp32():
    """`precision` is a configuration field (conf/configuration/*.yaml, rakv.experiments.schema.ConfigurationEntry)
    that reaches the engine's options; a configuration at another precision than fp32 says so in its name
    (`<fp32 sibling>-<precision>`, e.g. smollm2-q4_1), so the fp32 ones keep every existing result."""
    from dataclasses import fields

    from rakv.experiments.config import configuration, configuration_names
    from rakv.runtime.engine_options import EngineOptions

    chosen = {name: configuration(name).precision for name in configuration_names()}
    assert set(chosen.values()) <= set(PRECISIONS) and "q4_1" in chosen.values()
    for name, precision in chosen.items():
        assert name.endswith(f"-{precision}") == (precision != "fp32"), name
        if precision != "fp32":  # its fp32 sibling exists: the study sets the two side by side
            assert chosen.get(name.removesuffix(f"-{precision}")) == "fp32", name
    assert next(f for f in fields(EngineOptions) if f.name == "precision").metadata["choices"] == PRECISIONS


FAKE_LLAMA_CPP = '''
__version__ = "fake"
class Llama:
    def __init__(self, **kwargs): pass
    def tokenize(self, text, add_bos=False): return list(range(len(text)))
    def reset(self): pass
    def generate(self, tokens, **kwargs):
        while True:
            yield 7
    def eval(self, tokens): pass
'''


def test_the_real_peer_child_imports_llama_cpp_not_itself(tmp_path):
    """The child is rakv/bench/llama_cpp.py run as a script: it must import the peer's llama_cpp package, not
    itself (its own folder first on the path did exactly that); here a stand-in llama_cpp on PYTHONPATH answers."""
    import sys

    from rakv.bench.llama_cpp import run_child

    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "llama_cpp.py").write_text(FAKE_LLAMA_CPP)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'fake'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    got = run_child(str(python), "q4_1", tmp_path / "m.gguf", tmp_path / "m.gguf", "abc", "abcdef", 4, 1, 1)
    assert got.error is None, got.error
    assert got.version == "fake" and got.tokens == [7, 7, 7, 7] and got.prefill_tokens == 6


# --- the precision benchmark as a shipped file (scripts/bench_engine.py --precision-peer --out) ----------------------

def synthetic_precision_record(decode_ms: float = 12.0):
    """A small made-up record (not a measurement): one precision, ours and a llama.cpp side that died."""
    from rakv.bench.engine_report import (
        PrecisionDraft,
        PrecisionFloor,
        PrecisionMachine,
        PrecisionPeerFile,
        PrecisionPeerTable,
        PrecisionRatio,
        PrecisionSide,
    )

    table = PrecisionPeerTable("smollm2", 16, 512, 3, 10.0, [PrecisionFloor("q4_1", 97_000_000, 9.7)],
                               [PrecisionSide("ours", "q4_1", 2, decode_ms, 900.0, decode_ms / 9.7),
                                PrecisionSide("llama.cpp", "q4_1", 2, error="died with signal 4")],
                               [PrecisionRatio("q4_1", 2, 1.2, "missed", 0.9, "met")],
                               [PrecisionDraft("q4_1", 2, 10.0, 4.0, 0.4)])
    machine = PrecisionMachine("Made-up CPU 9000", "made-up-cpu-9000", "znver4+avx2.avx512f", 2, "0123456789abcdef",
                               "2026-12-06", 0.5)
    return PrecisionPeerFile(machine, table)


def load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_precision_benchmark_writes_its_record_where_out_says(tmp_path, monkeypatch, capsys):
    """The script's --precision-peer path with the measurement stubbed by a synthetic record: the record lands at
    --out and reads back as written; a folder as --out is one line and exit 2."""
    from rakv.bench.engine_report import PrecisionPeerFile
    from rakv.runtime.json_records import read_record

    bench = load_script("bench_engine")
    record = synthetic_precision_record()
    monkeypatch.setattr(bench, "precision_peer_file", lambda options: record)
    out = tmp_path / "peer" / "precision-x.json"
    assert bench.main(["--precision-peer", "--no-peer", "--out", str(out)]) == 0
    assert read_record(PrecisionPeerFile, out) == record and f"wrote {out}" in capsys.readouterr().out
    assert bench.main(["--precision-peer", "--out", str(tmp_path)]) == 2  # positive control: a folder
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a folder" in err


def test_the_precision_tables_render_the_record_they_are_given():
    from rakv.bench.engine_report import precision_markdown

    text = precision_markdown(synthetic_precision_record(), "data/x.json")
    assert "| ours | q4_1 | 2 | 12.00 | 1.24 | 900 |" in text and "not measured: died with signal 4" in text
    assert "| q4_1 | 2 | 1.200x | missed | 0.900x | met |" in text and "| q4_1 | 2 | 10.00 | 4.00 | 0.40 |" in text
    assert "commit 0123456" in text and "Made-up CPU 9000" in text and "one-minute load 0.5" in text
    other = precision_markdown(synthetic_precision_record(decode_ms=13.5), "data/x.json")
    assert "| ours | q4_1 | 2 | 13.50 |" in other and other != text  # positive control: another record, other text


def test_docs_engine_precision_tables_are_the_shipped_files(tmp_path):
    """docs/engine.md's block is what scripts/write_precision_table.py renders from the shipped files; a block
    edited by hand, or rendered from another file, is caught; a doc without the markers is one error."""
    from rakv.runtime.json_records import write_record
    from rakv.runtime.run_layout import PeerLayout

    writer = load_script("write_precision_table")
    text, shipped = writer.DOC.read_text(), PeerLayout.shipped().precisions()
    assert writer.rendered(text, shipped) == text, "docs/engine.md is stale: run scripts/write_precision_table.py"
    edited = text.replace(writer.START + "\n", writer.START + "\nby hand\n")
    assert writer.rendered(edited, shipped) != edited  # positive control: a hand edit is stale
    extra = write_record(synthetic_precision_record(), PeerLayout(tmp_path).precision("made-up-cpu-9000"))
    assert "Made-up CPU 9000" in writer.rendered(text, [*shipped, extra]) != text
    with pytest.raises(RakvError, match="precision-table"):
        writer.rendered(text.replace(writer.END, ""), shipped)
