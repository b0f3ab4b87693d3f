"""How a model's forward runs: `stock` (transformers as shipped) or `compact` (rakv.runtime.compact).

Decoding one token, or verifying k + 1, is a pass over all the weights with a handful of rows, so
its floor is weight bytes / memory bandwidth. `compact` replaces transformers' per-forward machinery by
a few tensor operations per layer (rakv.runtime.compact: why and how) and keeps each request's K/V in a
buffer with spare room (`GrowingLayer`): `DynamicCache` appends with `torch.cat`, reallocating every
layer's whole sequence per token. `linear` picks, per row count, the GEMM path measured fastest on the
CPU (`scripts/bench_engine.py` prints the step costs this gives; the numbers behind each choice are in
its docstring).

Both modes compute the same math in fp32 with other summation orders, so logits differ in the last
bits; greedy outputs are checked against `generate` by the tests and against AR by every study run. The
mode is recorded in each model's fingerprint, so K/V computed by different kernels never share
prefix-store entries. `compact` is plain torch and runs unchanged on CUDA, where `linear` is `F.linear`.
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KERNEL_MODES = ("stock", "compact")
_COMPACT_ATTR = "_rakv_compact"  # the rakv.runtime.compact.CompactLM that runs a compact module's forward


def effective_mode(mode: str, device: torch.device) -> str:
    """The mode that will run (both run on every device); an unknown mode is refused."""
    if mode not in KERNEL_MODES:
        from rakv.runtime.errors import RakvError

        raise RakvError(f"unknown kernels mode '{mode}'; choose one of: {', '.join(KERNEL_MODES)}")
    return mode


def kernels_of(module) -> str:
    return "compact" if compact_of(module) is not None else "stock"


def compact_of(module):
    """The CompactLM that runs `module`'s forward (a compact-only model, such as the int8 draft, is its own),
    or None (stock)."""
    return getattr(module, _COMPACT_ATTR, None)


SKINNY_MAX_ROWS = 16  # rows up to which the skinny kernel beats MKL here (scripts/bench_engine.py --gemv)


@lru_cache(maxsize=None)
def skinny():
    """The C++ kernels of `skinny.cpp` (y = x W^T for 1-16 rows, fp32 or int8 weights), compiled on first use
    for this machine's instruction set (about a minute, then cached under $TORCH_EXTENSIONS_DIR)."""
    from torch.utils.cpp_extension import load

    source = Path(__file__).with_name("skinny.cpp")
    try:
        return load(name="rakv_skinny", sources=[str(source)], extra_cflags=["-O3", "-march=native", "-fopenmp"],
                    verbose=False)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        from rakv.runtime.errors import RakvError

        raise RakvError(f"kernels=compact needs its C++ GEMV kernels compiled (a C++ compiler and ninja), which "
                        f"failed: {str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__}; "
                        "run with kernels=stock instead") from None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           small: bool | None = None) -> torch.Tensor:
    """x [m, in] @ weight [out, in]^T (+ bias) by the path measured fastest for m rows.

    Measured on the 2-core machine by `scripts/bench_engine.py --gemv` (30 layers of SmolLM2's fused projections,
    425 MB, 2 threads, 20.6 GB/s streaming): MKL reads the weights at 4-7 GB/s for one row (`F.linear`,
    `torch.mm(W, x.T)`), 11 GB/s at best for 2-4 rows (`mm`) and 7 for 8-16; the skinny kernel at 15-16 GB/s for
    1-2 rows, 15 for 4, 10 for 8, and on par with MKL at 16.
    Prefill (more rows) is compute-bound and goes to MKL's GEMM. `small` forces the choice (None: by row count).
    """
    if small is None:
        small = x.shape[0] <= SKINNY_MAX_ROWS
    if x.device.type == "cpu" and small and weight.dtype == torch.float32:
        return skinny().skinny_linear(x, weight, bias)
    return gemm(x, weight, bias)


GEMM_MIN_ROWS = 12  # from 12 rows on, MKL's sgemm gives each row the bits it has in any larger GEMM (measured)


def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` whose rows do not depend on how many rows are computed with them. MKL takes other code paths
    for 1-3, 5-7 and 9-11 rows, whose sums differ in the last bits from a large GEMM's (tests/test_kernels.py
    checks both facts on the machine it runs on); a few rows that must match their whole prefill (a chunk of it,
    rakv.runtime.decoding.forward_rows) are padded with zero rows to 12. Off the CPU: F.linear as it is."""
    rows = x.shape[0]
    if x.device.type != "cpu" or rows >= GEMM_MIN_ROWS:
        return torch.nn.functional.linear(x, weight, bias)
    padded = torch.cat([x, x.new_zeros(GEMM_MIN_ROWS - rows, x.shape[1])])
    return torch.nn.functional.linear(padded, weight, bias)[:rows]


def linear_int8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None, small: bool | None = None) -> torch.Tensor:
    """x [m, in] @ (weight [out, in] int8 * scale [out])^T (+ bias): weight-only int8, fp32 activations."""
    if small if small is not None else x.shape[0] <= SKINNY_MAX_ROWS:
        return skinny().skinny_linear_int8(x, weight, scale, bias)
    # many rows (a draft's prefill): dequantise one projection at a time and use the GEMM
    return gemm(x, weight.float() * scale[:, None], bias)


def apply_kernels(module: torch.nn.Module, mode: str, device: torch.device) -> str:
    """Prepare `module` (already on `device`, in eval mode) for `mode`; returns the mode that runs."""
    mode = effective_mode(mode, device)
    if mode == "compact" and kernels_of(module) != "compact":
        from rakv.runtime.compact import CompactLM

        with torch.no_grad():
            setattr(module, _COMPACT_ATTR, CompactLM(module))
    return kernels_of(module)


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose K/V live in a buffer with spare room: appends write in place, crops shorten the view.

    `keys` / `values` are always views of the first `length` positions, as DynamicLayer's tensors are.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.length = 0
        self._keys = self._values = None

    def lazy_initialization(self, key_states, value_states) -> None:
        self.device = key_states.device
        self._keys = key_states.new_empty((*key_states.shape[:2], 0, key_states.shape[3]))
        self._values = value_states.new_empty((*value_states.shape[:2], 0, value_states.shape[3]))
        self.is_initialized = True

    def _reserve(self, needed: int) -> None:
        capacity = self._keys.shape[2]
        if needed <= capacity:
            return
        capacity = max(needed + 64, 2 * capacity)
        keys = self._keys.new_empty((*self._keys.shape[:2], capacity, self._keys.shape[3]))
        values = self._values.new_empty((*self._values.shape[:2], capacity, self._values.shape[3]))
        keys[:, :, : self.length].copy_(self._keys[:, :, : self.length])
        values[:, :, : self.length].copy_(self._values[:, :, : self.length])
        self._keys, self._values = keys, values

    def _expose(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[2]
        self._reserve(end)
        self._keys[:, :, self.length:end].copy_(key_states)
        self._values[:, :, self.length:end].copy_(value_states)
        self.length = end
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        assert tokens_to_remove <= 0, "crop takes the negative number of tokens to remove, as DynamicLayer's"
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self.length = max(self.length + tokens_to_remove, 0)
        self._expose()

    def reset(self) -> None:
        self.length = 0
        self._keys = self._values = None
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
