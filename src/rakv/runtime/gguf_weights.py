"""A GGUF's compact weights read straight into the packed layout, and kept packed on disk (docs/engine.md, "Memory
and start-up").

transformers loads a GGUF by de-quantising all of it into a full fp32 module, which the compact kernels then pack
(rakv.runtime.compact): twice the weights at the peak, and every process converting 272 tensors again. Here each
tensor is de-quantised as transformers does it (gguf's `dequantize`, then transformers' own per-architecture
processing and name map, over a module skeleton on the meta device that holds no weights), a projection is packed
into its panels as soon as its parts are read (q, k, v fused; gate and up fused) and its dense parts dropped. The
packed target and its int8 draft (`CompactLM.state`) then go to one file named by the GGUF's hash, the packing
layout and the dtype; a later process memory-maps that file (torch.load(mmap=True)): no de-quantising, no packing,
no copy (the OS shares the pages between processes). The weights are bitwise those of the transformers path
(tests/test_gguf_weights.py), so every logit, greedy output and fingerprint stays as it was.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import os
import pickle
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch

from rakv.runtime import kernels
from rakv.runtime.compact import CompactLM, Linear, Rotary, _state_linear
from rakv.runtime.errors import RakvError

LAYOUT_VERSION = 1  # bump when the file's contents change in a way the digested sources below do not show
# the parts of a Llama layer's fused projections, in the order their outputs are concatenated (as CompactLM fuses)
LLAMA_PROJECTIONS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                     "out": ("self_attn.o_proj",), "up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}
LLAMA_NORMS = {"norm_in": "input_layernorm", "norm_mlp": "post_attention_layernorm"}


def layout_digest() -> str:
    """What the packed bytes depend on besides the GGUF and the dtype: the panel width, the packing and quantising
    code (its source, so that an edit re-packs), the readers' versions."""
    sources = [inspect.getsource(f) for f in (kernels.pack, kernels.pack_int8, Linear.of, Linear.int8, Rotary.of,
                                              CompactLM.state, CompactLM.int8_draft, packed_state, _take_layer_parts,
                                              _tensors)]
    versions = [importlib.metadata.version(name) for name in ("gguf", "transformers", "torch")]
    blob = json.dumps([LAYOUT_VERSION, kernels.PANEL, sources, versions]).encode()
    return hashlib.blake2b(blob, digest_size=6).hexdigest()


def cache_name(gguf_digest: str, dtype: torch.dtype) -> str:
    """The packed file of a GGUF (by the hash of its bytes) in `dtype` under today's layout."""
    return f"{gguf_digest}-{layout_digest()}-{str(dtype).removeprefix('torch.')}.pt"


def gguf_config(path: Path):
    """The transformers config of a GGUF, parsed by transformers from the file's metadata (no weights read)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)


def _tensors(path: Path, config, dtype: torch.dtype):
    """(transformers parameter name, de-quantised tensor in `dtype`) for each tensor of the GGUF, one at a time,
    computed exactly as transformers' GGUF loader computes them (modeling_gguf_pytorch_utils.load_gguf_checkpoint)."""
    from gguf import GGUFReader, dequantize
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    reader = GGUFReader(path)
    architecture = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    names = get_gguf_hf_weights_map(skeleton, processor)
    for tensor in reader.tensors:
        result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                                   tensor_key_mapping=names, parsed_parameters={})
        if result.name in names:
            weights = result.weights  # a view of the read-only file map (F32 tensors) is copied, as transformers does
            owned = weights.flags.writeable and weights.flags.c_contiguous
            yield names[result.name], torch.from_numpy(weights if owned else np.copy(weights)).to(dtype)


def _rotary(config, dtype: torch.dtype) -> Rotary:
    """The rotary table CompactLM builds from the module's rotary embedding, whose inv_freq comes from the config."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return Rotary.of(LlamaRotaryEmbedding(config=config).inv_freq, config.max_position_embeddings, dtype)


def packed_state(path: Path, config, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The `CompactLM.state` of a Llama-family GGUF, each projection packed once its parts are read (the dense
    weights of one layer at most are held at a time), as CompactLM(module) packs the transformers module's."""
    if config.model_type != "llama":
        raise RakvError(f"packed GGUF loading supports llama models, not {config.model_type}; use kernels=stock")
    state, dense = {}, {}
    for name, tensor in _tensors(path, config, dtype):
        dense[name] = tensor
        if name.startswith("model.layers."):
            _take_layer_parts(state, dense, int(name.split(".")[2]))
    state["norm_out.weight"] = dense.pop("model.norm.weight")
    embedding = dense.pop("model.embed_tokens.weight")
    if config.tie_word_embeddings:  # the head's panels are the embedding table
        _put_linear(state, "lm_head", embedding)
        state |= {key.replace("lm_head.", "embedding.", 1): t for key, t in state.items() if key.startswith("lm_head.")}
    else:
        _put_linear(state, "lm_head", dense.pop("lm_head.weight"))
        state["embed_table"] = embedding
    if dense:
        raise RakvError(f"GGUF {path.name}: tensors the compact model has no place for: {', '.join(sorted(dense))}")
    rotary = _rotary(config, dtype)
    return state | {"rotary.cos": rotary.cos, "rotary.sin_signed": rotary.sin_signed}


def _take_layer_parts(state: dict, dense: dict, layer: int) -> None:
    """Move what of layer `layer` is complete in `dense` into `state`: a projection once all its parts are read
    (concatenated and packed as CompactLM's `_linear` does), a norm as it is."""
    prefix = f"model.layers.{layer}."
    for fused, parts in LLAMA_PROJECTIONS.items():
        if all(f"{prefix}{part}.weight" in dense for part in parts):
            weights = [dense.pop(f"{prefix}{part}.weight") for part in parts]
            _put_linear(state, f"blocks.{layer}.{fused}", torch.cat(weights) if len(weights) > 1 else weights[0])
    for short, long in LLAMA_NORMS.items():
        if f"{prefix}{long}.weight" in dense:
            state[f"blocks.{layer}.{short}.weight"] = dense.pop(f"{prefix}{long}.weight")


def _put_linear(state: dict, name: str, weight: torch.Tensor) -> None:
    linear = Linear.of(weight)
    state[f"{name}.weight"] = linear.weight
    state[f"{name}.shape"] = torch.tensor([linear.out_features, linear.in_features])


def block_linears(path: Path, config) -> dict[str, Linear]:
    """The GGUF's quantised projections as they are in the file, for a target at `precision: q4_1`
    (CompactLM.at_precision): each tensor's blocks (Q4_1, and the Q8_0 of SmolLM2's tied output head) permuted by
    transformers' own processor exactly as its de-quantised weights are (the query and key rows of a Llama), fused
    as `packed_state` fuses them, and packed (rakv.runtime.kernels.pack_blocks): no value is requantised, so they
    de-quantise bitwise to the fp32 target's weights (tests/test_gguf_weights.py). Keyed by CompactLM.state's
    names; a tensor in any other type is left out (at_precision quantises that one itself)."""
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    if config.model_type != "llama":
        raise RakvError(f"GGUF blocks are read for llama models, not {config.model_type}")
    reader = GGUFReader(path)
    architecture = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    names = get_gguf_hf_weights_map(skeleton, processor)
    raw = {}
    for tensor in reader.tensors:
        fmt = tensor.tensor_type.name.lower()
        if fmt not in kernels.BLOCK_FORMATS:
            continue
        rows = np.asarray(tensor.data).reshape(tensor.data.shape[0], -1, kernels.BLOCK_FORMATS[fmt][1])
        result = processor.process(weights=rows, name=tensor.name, tensor_key_mapping=names, parsed_parameters={})
        if result.name in names:
            raw[names[result.name]] = (fmt, torch.from_numpy(np.array(result.weights)))  # a copy: the map is read-only
    out = {}
    for layer in range(config.num_hidden_layers):
        for fused, parts in LLAMA_PROJECTIONS.items():
            got = [raw.get(f"model.layers.{layer}.{part}.weight") for part in parts]
            if all(g is not None for g in got) and len({fmt for fmt, _ in got}) == 1:
                weights = torch.cat([t for _, t in got])
                out[f"blocks.{layer}.{fused}"] = Linear(kernels.pack_blocks(weights, got[0][0]), weights.shape[0],
                                                        weights.shape[1] * kernels.QBLOCK, blocks=got[0][0])
    head = raw.get("model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight")
    if head is not None:
        fmt, weights = head
        out["lm_head"] = Linear(kernels.pack_blocks(weights, fmt), weights.shape[0],
                                weights.shape[1] * kernels.QBLOCK, blocks=fmt)
    return out


def blocks_digest() -> str:
    """What a kept file of `block_linears` depends on besides the GGUF: the reading and packing code, the readers'
    versions."""
    sources = [inspect.getsource(f) for f in (block_linears, kernels.pack_blocks, _blocks_state)]
    versions = [importlib.metadata.version(name) for name in ("gguf", "transformers", "torch")]
    blob = json.dumps([LAYOUT_VERSION, kernels.PANEL, kernels.BLOCK_FORMATS, sources, versions]).encode()
    return hashlib.blake2b(blob, digest_size=6).hexdigest()


def _blocks_state(linears: dict[str, Linear]) -> dict[str, torch.Tensor]:
    return {f"{name}.{key}": t for name, p in linears.items() for key, t in (
        ("weight", p.weight), ("shape", torch.tensor([p.out_features, p.in_features])),
        ("blocks", torch.tensor(kernels.BLOCK_FORMATS[p.blocks][0])))}


def kept_block_linears(path: Path, config, cache: Path) -> dict[str, Linear]:
    """`block_linears`, memory-mapped from `cache` when it holds them (written by `blocks_digest`'s code), else read
    from the GGUF and written there for the next process (atomically), as `compact_pair` keeps the packed target."""
    try:
        saved = torch.load(cache, mmap=True, weights_only=True, map_location="cpu") if cache.exists() else None
        if saved is not None and saved.get("layout") == blocks_digest():
            return {name: _state_linear(saved["state"], name) for name in saved["names"]}
    except (RuntimeError, OSError, EOFError, ValueError, KeyError, TypeError, pickle.UnpicklingError,
            zipfile.BadZipFile) as exc:
        print(f"rakv: kept GGUF blocks {cache} are unreadable ({type(exc).__name__}); rebuilding them",
              file=sys.stderr, flush=True)
    linears = block_linears(path, config)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.name}.tmp{os.getpid()}")
    try:
        torch.save({"layout": blocks_digest(), "names": list(linears), "state": _blocks_state(linears)}, tmp)
        os.replace(tmp, cache)
    finally:
        tmp.unlink(missing_ok=True)
    return linears


def _config_of(saved: dict):
    from transformers import AutoConfig

    return AutoConfig.for_model(**saved)


def _read(cache: Path) -> tuple[CompactLM, CompactLM] | None:
    """The pair kept in `cache`, memory-mapped; None (and one line saying so) when the file is unreadable or not
    what today's layout writes."""
    if not cache.exists():
        return None
    try:
        saved = torch.load(cache, mmap=True, weights_only=True, map_location="cpu")
        if saved.get("layout") != layout_digest():
            raise ValueError("written by another layout")
        target = CompactLM.from_state(_config_of(saved["config"]), saved["target"])
        return target, target.int8_draft(saved["draft"])
    except (RuntimeError, OSError, EOFError, ValueError, KeyError, TypeError, AttributeError, IndexError,
            pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        print(f"rakv: packed weights {cache} are unreadable ({type(exc).__name__}: {str(exc)[:120]}); "
              "rebuilding them from the GGUF", file=sys.stderr, flush=True)  # stdout may be a command's JSON
        return None


def _write(cache: Path, config, target: CompactLM, draft: CompactLM) -> None:
    """Atomically: a partial file is never seen under the final name (a concurrent writer's rename wins whole)."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.name}.tmp{os.getpid()}")
    try:
        torch.save({"layout": layout_digest(), "config": config.to_dict(), "target": target.state(),
                    "draft": draft.state()}, tmp)
        os.replace(tmp, cache)
    finally:
        tmp.unlink(missing_ok=True)


def compact_pair(path: Path, cache: Path, dtype: torch.dtype) -> tuple[CompactLM, CompactLM]:
    """The compact target of a GGUF and its int8 draft (CompactLM.int8_draft): mapped from `cache` when it holds
    them, else built from the GGUF tensor by tensor and written there for the next process."""
    kept = _read(cache)
    if kept is not None:
        return kept
    config = gguf_config(path)
    with torch.no_grad():
        target = CompactLM.from_state(config, packed_state(path, config, dtype))
        draft = target.int8_draft()
    _write(cache, config, target, draft)
    return target, draft
