"""How a model's forward runs: `stock` (transformers as shipped) or `compact` (rakv.runtime.compact), and the
compact forward's kernels.

Decoding one token, or verifying k + 1, is a pass over all the weights with a handful of rows, so its floor is
weight bytes / memory bandwidth; a prefill is the same pass with hundreds of rows, bound by the FMA units. On the
CPU, `compact` runs every pass, whatever its row count, through the C++ kernels of `kernels.cpp` (compiled on
first use for this machine; its header says how and why), which are **batch-invariant by construction**: a row's
logits are bit-identical whether it is computed alone, in a verify of k + 1 rows, beside other requests' rows or as
one row of a prefill chunk of any size (tests/test_kernels.py checks logits bitwise under hypothesis). Projections
take their weights packed once in panels of 32 outputs (`pack`), which replace the dense tensors: one copy.

Each function here is the CPU kernel on the CPU and plain torch elsewhere, so `compact` runs unchanged on CUDA
(where batch invariance is not claimed). `stock` and `compact` compute the same math in fp32 with other summation
orders, so their logits differ in the last bits; greedy outputs are checked against `generate` by the tests and
against AR by every study run. The mode is recorded in each model's fingerprint, with the kernels' source digest,
so K/V computed by different kernels never share prefix-store entries or calibrations.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KERNEL_MODES = ("stock", "compact")
PANEL = 32  # outputs per packed panel (kernels.cpp: kPanel)
COMPACT_ATTR = "_rakv_compact"  # the rakv.runtime.compact.CompactLM that runs a compact module's forward
_SOURCE = Path(__file__).with_name("kernels.cpp")


def effective_mode(mode: str, device: torch.device) -> str:
    """The mode that will run (both run on every device); an unknown mode is refused."""
    if mode not in KERNEL_MODES:
        from rakv.runtime.errors import RakvError

        raise RakvError(f"unknown kernels mode '{mode}'; choose one of: {', '.join(KERNEL_MODES)}")
    return mode


def mode_label(mode: str) -> str:
    """The kernels part of a model's identity: the mode, and for compact the digest of the kernels' source."""
    if mode != "compact":
        return mode
    digest = hashlib.blake2b(_SOURCE.read_bytes(), digest_size=4).hexdigest()
    return f"compact:{digest}" if target_arch() == "native" else f"compact:{digest}@{target_arch()}"


def int8_dot() -> str:
    """The instruction kernels.cpp's int8 GEMM uses here (avx512-vnni, avx-vnni, or avx2's multiply-adds: the same
    integers either way)."""
    return native().int8_dot()


def kernels_of(module) -> str:
    return "compact" if compact_of(module) is not None else "stock"


def compact_of(module):
    """The CompactLM that runs `module`'s forward (a compact-only model, such as the int8 draft, is its own),
    or None (stock)."""
    return getattr(module, COMPACT_ATTR, None)


def target_arch() -> str:
    """The -march the kernels compile for: this machine's (`native`), or $RAKV_KERNELS_MARCH, e.g. `x86-64-v3`
    (AVX2 + FMA, no AVX-512) to run and test the AVX2 code paths on a machine that has AVX-512."""
    return os.environ.get("RAKV_KERNELS_MARCH", "native")


# the vector extensions the kernels' code paths test for (kernels.cpp's #if), as the compiler predefines them
ISA_MACROS = {"__AVX2__": "avx2", "__FMA__": "fma", "__F16C__": "f16c", "__AVX512F__": "avx512f",
              "__AVX512BW__": "avx512bw", "__AVX512VL__": "avx512vl", "__AVX512VNNI__": "avx512vnni",
              "__AVXVNNI__": "avxvnni"}
# CPU flags (/proc/cpuinfo) each extension needs at run time
ISA_CPU_FLAGS = {"avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512bw": "avx512bw",
                 "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni"}
# never generated, whatever -march resolves to: a CPU (or a VM's flag list) may name AMX without the OS granting its
# tiles (a peer built with them died with SIGILL: docs/engine.md, "Precision")
NO_AMX = ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]


def _compiler() -> str:
    return os.environ.get("CXX", "c++")  # the compiler torch's cpp_extension builds with


@cache
def target_isa() -> str:
    """The instruction set the kernels compile for, as the compiler resolves $RAKV_KERNELS_MARCH (or native): the
    -march it means (`gcc -Q --help=target`) and the vector extensions kernels.cpp tests for that the compiler then
    predefines, e.g. `sapphirerapids+avx2.avx512bw.avx512f.avx512vl.avx512vnni.f16c.fma`. What keys the build
    folder: two machines with the same -march=native string but other instruction sets never share a build."""
    from rakv.runtime.errors import RakvError

    flags = [f"-march={target_arch()}", *NO_AMX]
    try:
        macros = subprocess.run([_compiler(), *flags, "-dM", "-E", "-x", "c++", "-"], input="", text=True,
                                capture_output=True, check=True).stdout
        described = subprocess.run([_compiler(), *flags, "-Q", "--help=target"], text=True, capture_output=True,
                                   check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RakvError(f"kernels=compact: the compiler ({_compiler()}) cannot build for -march={target_arch()}: "
                        f"{str(getattr(exc, 'stderr', '') or exc).strip()[:160]}") from None
    defined = {line.split()[1] for line in macros.splitlines() if line.startswith("#define ")}
    extensions = sorted(name for macro, name in ISA_MACROS.items() if macro in defined)
    march = next((line.split()[-1] for line in described.splitlines() if line.strip().startswith("-march=")),
                 target_arch())
    return f"{march}+{'.'.join(extensions)}"


def missing_cpu_flags(isa: str, cpu_flags: set[str] | None = None) -> list[str]:
    """The extensions `isa` (target_isa's form) uses that this CPU does not list (/proc/cpuinfo), or [] where the
    flags cannot be read (not Linux)."""
    if cpu_flags is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
        line = next((line for line in text.splitlines() if line.startswith("flags")), "")
        cpu_flags = set(line.partition(":")[2].split())
    return [name for name in isa.partition("+")[2].split(".") if name and ISA_CPU_FLAGS.get(name) not in cpu_flags]


def build_directory() -> Path:
    """Where the kernels compile and stay: one folder per source digest, instruction set (`target_isa`: the resolved
    -march and its vector extensions), Python and torch (a .so built against another torch is never loaded), under
    torch's extension root ($TORCH_EXTENSIONS_DIR if set)."""
    from torch.utils.cpp_extension import get_default_build_root

    digest = hashlib.blake2b(_SOURCE.read_bytes(), digest_size=4).hexdigest()
    tag = f"{sys.implementation.cache_tag}-torch{torch.__version__}-{target_isa()}-{digest}"
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()  # (torch's helper ignores the variable)
    return Path(root) / "rakv" / re.sub(r"[^A-Za-z0-9_.-]", "_", tag)


@cache
def native():
    """The C++ kernels of `kernels.cpp`, compiled on first use for this machine's instruction set (about a minute,
    then kept in `build_directory()`; a changed source compiles again). -ffp-contract=off: scalar code computes
    exactly the operations written, as the vector code does. No AMX (NO_AMX), and a build whose extensions this
    CPU does not list is refused with one line (missing_cpu_flags) instead of dying with SIGILL.

    torch's `load` serialises builds with a lock *file* that a process killed while compiling leaves behind, after
    which every later `load` waits for it forever (a CI run hung so). Here builds are serialised by an flock, which
    the OS releases when its holder dies, and a lock file found while holding it can only be such a leftover."""
    from torch.utils.cpp_extension import load

    from rakv.runtime.errors import RakvError

    folder = build_directory()
    missing = missing_cpu_flags(target_isa())
    if missing:
        raise RakvError(f"kernels=compact: the build for -march={target_arch()} ({target_isa()}) needs "
                        f"{', '.join(missing)}, which this CPU does not list; set RAKV_KERNELS_MARCH to a target this "
                        "CPU has (e.g. x86-64-v3) or run with kernels=stock")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "rakv.flock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            (folder / "lock").unlink(missing_ok=True)
            # compiled from a copy in the folder: the build's command names the copy, the same from every checkout
            # of this source (another checkout's path would make ninja compile again, and again on returning)
            source = folder / _SOURCE.name
            if not source.exists() or source.read_bytes() != _SOURCE.read_bytes():
                shutil.copyfile(_SOURCE, source)
            return load(name="rakv_kernels", sources=[str(source)], build_directory=str(folder),
                        extra_cflags=["-O3", f"-march={target_arch()}", *NO_AMX, "-fopenmp", "-ffp-contract=off"],
                        verbose=False)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        reason = next((line.strip() for line in lines if "error" in line.lower() and "build" not in line.lower()),
                      lines[-1].strip())
        raise RakvError(f"kernels=compact needs its C++ kernels compiled (a C++ compiler, ninja, AVX2, FMA and F16C), "
                        f"which failed: {reason}; run with kernels=stock instead") from None


def on_cpu(x: torch.Tensor) -> bool:
    return x.device.type == "cpu"


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> panels [ceil(out / 32), in, 32], zero rows past `out`: the layout kernels.cpp's GEMM streams."""
    out, inner = weight.shape
    groups = -(-out // PANEL)
    if groups * PANEL != out:
        weight = torch.cat([weight, weight.new_zeros(groups * PANEL - out, inner)])
    return weight.reshape(groups, PANEL, inner).transpose(1, 2).contiguous()


def unpack(packed: torch.Tensor, out: int) -> torch.Tensor:
    """The [out, in] matrix of a packed one (a copy)."""
    return packed.transpose(1, 2).reshape(-1, packed.shape[1])[:out]


def panel_rows(packed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of the fp32 matrix packed in `packed` (a tied output head used as the embedding table)."""
    return native().panel_rows(packed, ids)


def linear(x: torch.Tensor, weight: torch.Tensor, out: int, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """(x W^T + bias) + residual. CPU: `weight` packed (`pack`); elsewhere [out, in] fp32."""
    if on_cpu(x):
        return native().gemm(x, weight, out, bias, residual)
    y = F.linear(x, weight, bias)
    return y if residual is None else residual + y


def pack_int8(quantised: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [out, in] -> (panels [ceil(out / 32), ceil(in / 4), 32, 4], zero-padded; their int32 row sums
    [ceil(out / 32) * 32]): the layout of kernels.cpp's integer GEMM (four k's of one output side by side)."""
    out, inner = quantised.shape
    groups, quads = -(-out // PANEL), -(-inner // 4)
    padded = torch.zeros(groups * PANEL, quads * 4, dtype=torch.int8, device=quantised.device)
    padded[:out, :inner] = quantised
    colsum = padded.sum(dim=1, dtype=torch.int32).contiguous()
    return padded.view(groups, PANEL, quads, 4).permute(0, 2, 1, 3).contiguous(), colsum


def unpack_int8(packed: torch.Tensor, out: int, inner: int) -> torch.Tensor:
    """The int8 [out, in] matrix of `pack_int8`'s panels (a copy)."""
    groups, quads = packed.shape[:2]
    return packed.permute(0, 2, 1, 3).reshape(groups * PANEL, quads * 4)[:out, :inner]


def linear_int8(x: torch.Tensor, weight: torch.Tensor, colsum: torch.Tensor, out: int, scale: torch.Tensor,
                bias: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """(x (W_q * scale)^T + bias) + residual with int8 weights (`pack_int8`) and each row of x quantised to int8 on
    its own (kernels.cpp: gemm_int8; exact integer sums). CPU only."""
    return native().gemm_i8(x, weight, colsum, out, scale, bias, residual)


# the block-quantised formats of kernels.cpp's gemm_q (kernels.cpp: kQ4_1, kQ8_0): id, a GGUF block's bytes (fp16 d,
# [fp16 m,] 32 quants), a packed block's bytes (32 outputs x 32 k)
BLOCK_FORMATS = {"q4_1": (0, 20, 640), "q8_0": (1, 34, 1088)}
QBLOCK = 32  # k per block


def quantise_blocks(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp32 [out, in] -> the GGUF's own blocks [out, in / 32, block bytes] uint8, quantised by gguf's reference
    code (gguf.quants, the same rounding as llama.cpp's reference quantiser). `in` must be a multiple of 32."""
    from gguf import GGMLQuantizationType, quantize

    from rakv.runtime.errors import RakvError

    out, inner = weight.shape
    if inner % QBLOCK:
        raise RakvError(f"{fmt} needs an input width that is a multiple of {QBLOCK}, not {inner}")
    kind = GGMLQuantizationType.Q4_1 if fmt == "q4_1" else GGMLQuantizationType.Q8_0
    raw = quantize(weight.detach().float().cpu().contiguous().numpy(), kind)
    return torch.from_numpy(raw.copy()).view(out, inner // QBLOCK, BLOCK_FORMATS[fmt][1])


def pack_blocks(raw: torch.Tensor, fmt: str) -> torch.Tensor:
    """A GGUF tensor's blocks, [out, in / 32, 20 (Q4_1) or 34 (Q8_0)] uint8 as stored in the file, -> the panels of
    kernels.cpp's gemm_q, [ceil(out / 32), in / 32, 640 or 1088] uint8: per 32 outputs and 32 k, the 32 scales d
    (fp16), for Q4_1 the 32 minimums m (fp16), then per k the 32 outputs' quants (Q4_1: byte j holds output j in
    its low nibble and output j + 16 in its high one; Q8_0: one int8 each). The same values, moved; padded outputs
    are zero."""
    out, blocks, width = raw.shape
    groups = -(-out // PANEL)
    if groups * PANEL != out:
        raw = torch.cat([raw, raw.new_zeros(groups * PANEL - out, blocks, width)])
    raw = raw.view(groups, PANEL, blocks, width).permute(0, 2, 1, 3)  # [G, blocks, 32 outputs, width]
    d = raw[..., 0:2].reshape(groups, blocks, 2 * PANEL)
    if fmt == "q4_1":
        m = raw[..., 2:4].reshape(groups, blocks, 2 * PANEL)
        qs = raw[..., 4:]  # [G, blocks, 32 outputs, 16]: k = j in the low nibbles, k = j + 16 in the high ones
        q = torch.cat([qs & 15, qs >> 4], dim=-1).transpose(-1, -2)  # [G, blocks, 32 k, 32 outputs]
        nibbles = q[..., :PANEL // 2] | (q[..., PANEL // 2:] << 4)  # [G, blocks, 32 k, 16]
        parts = [d, m, nibbles.reshape(groups, blocks, -1)]
    else:
        q = raw[..., 2:].transpose(-1, -2)  # [G, blocks, 32 k, 32 outputs]
        parts = [d, q.reshape(groups, blocks, -1)]
    return torch.cat(parts, dim=-1).contiguous()


def unpack_blocks(packed: torch.Tensor, fmt: str, out: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 [out, in] weights of `pack_blocks`' panels (or only `rows` of them), de-quantised as gguf does:
    (d * q) + m for Q4_1, d * q for Q8_0, in fp32 (exact products, one rounding)."""
    groups, blocks, _ = packed.shape
    ids = torch.arange(out) if rows is None else rows.long()
    sel = packed[ids // PANEL]  # [T, blocks, bytes]
    lane = (ids % PANEL)[:, None]

    def fp16_at(offset: int) -> torch.Tensor:  # [T, blocks] each row's fp16 (its lane's two bytes at `offset`)
        pairs = sel[:, :, offset:offset + 2 * PANEL].reshape(len(ids), blocks, PANEL, 2)
        mine = pairs.gather(2, lane[:, :, None, None].expand(-1, blocks, 1, 2)).contiguous()
        return mine.view(torch.float16)[..., 0, 0].float()

    d = fp16_at(0)
    if fmt == "q4_1":
        m = fp16_at(2 * PANEL)
        nibbles = sel[:, :, 4 * PANEL:].view(len(ids), blocks, QBLOCK, PANEL // 2)
        byte = nibbles.gather(3, (lane % (PANEL // 2))[:, :, None, None].expand(-1, blocks, QBLOCK, 1))[..., 0]
        q = torch.where(lane[:, :, None] < PANEL // 2, byte & 15, byte >> 4).float()
        return ((d[..., None] * q) + m[..., None]).reshape(len(ids), blocks * QBLOCK)
    q8 = sel[:, :, 2 * PANEL:].view(len(ids), blocks, QBLOCK, PANEL)
    q = q8.gather(3, lane[:, :, None, None].expand(-1, blocks, QBLOCK, 1))[..., 0].view(torch.int8).float()
    return (d[..., None] * q).reshape(len(ids), blocks * QBLOCK)


def linear_blocks(x: torch.Tensor, weight: torch.Tensor, fmt: str, out: int, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """(x W^T + bias) + residual with W in `pack_blocks`' panels (kernels.cpp: gemm_q; fp32 activations, each output
    one FMA chain over k: bitwise `linear` over the de-quantised weights). CPU only."""
    return native().gemm_q(x, weight, BLOCK_FORMATS[fmt][0], out, bias, residual)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if on_cpu(x):
        return native().rms_norm(x, weight, eps)
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))  # LlamaRMSNorm's order


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    if on_cpu(x):
        return native().layer_norm(x, weight, bias, eps)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused [T, 2I] gate/up projection."""
    if on_cpu(gate_up):
        return native().silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation (GPT-2's gelu_new)."""
    if on_cpu(x):
        return native().gelu(x)
    return F.gelu(x, approximate="tanh")


def _rope_(qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, heads: int) -> None:
    """Rotary embedding of the first `heads` heads of each row of `qkv` [T, width], in place (torch; the CPU
    kernel does this inside `attention`): x * cos + roll(x, head_dim / 2) * sin_signed."""
    head_dim = cos.shape[-1]
    rotated = qkv[:, :heads * head_dim].view(qkv.shape[0], heads, head_dim)
    rotated.copy_(rotated * cos[:, None] + rotated.roll(head_dim // 2, dims=-1) * sin_signed[:, None])


def attention(qkv: torch.Tensor, layers: list, starts: list[int], lengths: list[int], heads: int, kv_heads: int,
              scale: float, rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Causal grouped-query attention of every segment of a batched forward, for one layer.

    qkv [T, (heads + 2 kv_heads) head_dim]: the segments' rows one after another; with `rotary` (cos, sin_signed
    [T, head_dim], sin with its first half negated) queries and keys are rotated first, in place. layers[s]:
    segment s's GrowingLayer, holding its first starts[s] positions and already extended by lengths[s]
    (`GrowingLayer.extend`), whose new positions are written here. Returns [T, heads * head_dim]."""
    if on_cpu(qkv):
        cos, sin_signed = rotary or (None, None)
        return native().attention(qkv, [layer.buffers[0] for layer in layers], [layer.buffers[1] for layer in layers],
                                  starts, lengths, heads, kv_heads, scale, cos, sin_signed)
    if rotary is not None:
        _rope_(qkv, *rotary, heads + kv_heads)
    head_dim = qkv.shape[1] // (heads + 2 * kv_heads)
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    outputs, row = [], 0
    for layer, start, n in zip(layers, starts, lengths):
        rows = qkv[row:row + n]
        keys, values = layer.buffers
        keys[0, :, start:start + n] = rows[:, q_width:q_width + kv_width].view(n, kv_heads, head_dim).transpose(0, 1)
        values[0, :, start:start + n] = rows[:, q_width + kv_width:].view(n, kv_heads, head_dim).transpose(0, 1)
        mask = None if n == 1 else (torch.arange(start + n, device=qkv.device)[None, :]
                                    <= torch.arange(start, start + n, device=qkv.device)[:, None])
        attended = F.scaled_dot_product_attention(
            rows[:, :q_width].view(n, heads, head_dim).transpose(0, 1).unsqueeze(0), keys[:, :, :start + n],
            values[:, :, :start + n], attn_mask=mask, scale=scale, enable_gqa=heads != kv_heads)
        outputs.append(attended[0].transpose(0, 1).reshape(n, q_width))
        row += n
    return torch.cat(outputs) if len(outputs) > 1 else outputs[0]


def native_blocks(blocks: list, gated: bool, heads: int, kv_heads: int, scale: float) -> list:
    """kernels.cpp's `Block` of each of rakv.runtime.compact's blocks (CPU; the tensors shared, not copied), for
    `forward_blocks`."""
    lib = native()

    def projection(p):
        fmt = BLOCK_FORMATS[p.blocks][0] if p.blocks else -1
        return lib.projection(p.weight, p.out_features, p.bias, p.scale, p.colsum, fmt)

    def norm(n):
        return lib.RowNorm(n.weight, n.bias, n.eps)

    return [lib.Block(norm(b.norm_in), projection(b.qkv), projection(b.out), norm(b.norm_mlp), projection(b.up),
                      projection(b.down), gated, heads, kv_heads, scale) for b in blocks]


def forward_blocks(blocks: list, x: torch.Tensor, layers: list[list], starts: list[int], lengths: list[int],
                   rotary: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """Every layer of a step in one C++ call (CPU): `blocks` from `native_blocks`; layers[i]: block i's GrowingLayer
    of each segment, already extended (as `attention` takes them). The same kernels in the same order as one call
    each: the same bits."""
    cos, sin_signed = rotary or (None, None)
    keys = [[layer.buffers[0] for layer in these] for these in layers]
    values = [[layer.buffers[1] for layer in these] for these in layers]
    return native().forward_blocks(blocks, x, keys, values, starts, lengths, cos, sin_signed)


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose K/V live in a buffer with spare room: appends write in place, crops shorten the view.

    `keys` / `values` are views of the first `length` positions, as DynamicLayer's tensors are (made when read: a
    batched step extends every layer of every request, so nothing is done per extension but counting); `buffers`
    the whole (keys, values) buffers [1, heads, capacity, head_dim], which the compact attention writes into.
    """

    def __init__(self, **kwargs):
        self.length = 0
        self.buffers = None
        super().__init__(**kwargs)

    @property
    def keys(self):
        return None if self.buffers is None else self.buffers[0][:, :, :self.length]

    @keys.setter
    def keys(self, value):
        assert value is None, "a GrowingLayer's keys are a view of its buffer"

    @property
    def values(self):
        return None if self.buffers is None else self.buffers[1][:, :, :self.length]

    @values.setter
    def values(self, value):
        assert value is None, "a GrowingLayer's values are a view of its buffer"

    def lazy_initialization(self, key_states, value_states) -> None:
        self.device = key_states.device
        self.buffers = (key_states.new_empty((*key_states.shape[:2], 0, key_states.shape[3])),
                        value_states.new_empty((*value_states.shape[:2], 0, value_states.shape[3])))
        self.is_initialized = True

    def _reserve(self, needed: int) -> None:
        keys, values = self.buffers
        capacity = keys.shape[2]
        if needed <= capacity:
            return
        capacity = max(needed + 64, 2 * capacity)
        grown = []
        for old in (keys, values):
            new = old.new_empty((*old.shape[:2], capacity, old.shape[3]))
            new[:, :, : self.length].copy_(old[:, :, : self.length])
            grown.append(new)
        self.buffers = tuple(grown)

    def extend(self, n: int, heads: int, head_dim: int, like: torch.Tensor) -> None:
        """Room for n more positions, counted as held: the caller writes them (rakv.runtime.kernels.attention)."""
        if not self.is_initialized:
            empty = like.new_empty((1, heads, 0, head_dim))
            self.lazy_initialization(empty, empty)
        self._reserve(self.length + n)
        self.length += n

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[2]
        self._reserve(end)
        self.buffers[0][:, :, self.length:end].copy_(key_states)
        self.buffers[1][:, :, self.length:end].copy_(value_states)
        self.length = end
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        assert tokens_to_remove <= 0, "crop takes the negative number of tokens to remove, as DynamicLayer's"
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self.length = max(self.length + tokens_to_remove, 0)

    def reset(self) -> None:
        self.length = 0
        self.buffers = None
        super().reset()


def new_kv_cache(model: torch.nn.Module, kv=None) -> DynamicCache:
    """An empty (or `kv`-filled) DynamicCache for `model`; with growing layers when the model runs `compact`.

    kv: per layer (keys, values) [1, heads, length, head_dim], copied in.
    """
    cache = DynamicCache(config=model.config)
    if kernels_of(model) == "compact":
        cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    for layer, (keys, values) in zip(cache.layers, kv or ()):
        layer.update(keys, values)
    return cache
