"""How a model's forward runs on the CPU: `stock` (transformers as shipped) or `fast`.

Decoding one token, or verifying k + 1, is a pass over all the weights with a handful of rows, so
its floor is weight bytes / memory bandwidth. Measured on the 2-core AVX-512 machine this artifact
was built on (`scripts/bench_engine.py` prints the current numbers), stock transformers is 3-6x
above that floor for two reasons, and the `fast` mode removes both:

- `nn.Linear` (and GPT-2's `Conv1D`) on 1-9 rows. `F.linear` goes to an MKL path that streams the weights at a third of
  the bandwidth for one row and is slower still for 2-3 rows than for 5. `FastLinear` computes
  `W @ x.T` (one row duplicated to two, which MKL's GEMM threads well) for 1-2 rows, and uses a
  oneDNN-packed copy of the weight for 3-64 rows (flat cost from 3 to 9 rows). Prefill (more rows)
  keeps `F.linear`. The packed copy costs one more copy of the Linear weights in memory.
- `DynamicCache` appends each step's K/V with `torch.cat`, reallocating every layer's whole sequence
  per token. `GrowingLayer` writes into a buffer with spare room and crops by shortening its view.

Both are exact in the sense that matters here: the same math in fp32 with other summation orders,
so logits differ in the last bits; greedy outputs are checked against `generate` by the tests and
against AR by every study run. Only CPU modules are changed: on CUDA `fast` is `stock`, so the mode
recorded in a model's fingerprint says what actually ran (K/V computed by different kernels never
share prefix-store entries).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KERNEL_MODES = ("stock", "fast")
_FAST_ATTR = "_rakv_kernels"  # set on a module whose forward runs the fast path
_PACKED_MAX_ROWS = 64  # above this (prefill) F.linear's GEMM is efficient


def effective_mode(mode: str, device: torch.device) -> str:
    """The mode that will run: `fast` only on CPU."""
    if mode not in KERNEL_MODES:
        from rakv.errors import RakvError

        raise RakvError(f"unknown kernels mode '{mode}'; choose one of: {', '.join(KERNEL_MODES)}")
    return mode if device.type == "cpu" else "stock"


def kernels_of(module: torch.nn.Module) -> str:
    return getattr(module, _FAST_ATTR, "stock")


class FastLinear(torch.nn.Module):
    """A Linear whose few-row products take the CPU's fast paths (see the module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        """weight [out, in] (nn.Linear's layout), contiguous."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight, self.bias = weight, bias
        # packed for a small batch; measured flat from 3 to 9 rows whatever batch size it is packed for
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        m = rows.shape[0]
        if m <= 2:
            both = torch.cat([rows, rows]) if m == 1 else rows.contiguous()
            y = torch.mm(self.weight, both.t()).t()[:m]
            if self.bias is not None:
                y = y + self.bias
        elif m <= _PACKED_MAX_ROWS:
            y = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.packed, self.bias, "none", [], "")
        else:
            y = torch.nn.functional.linear(rows, self.weight, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)


def _swap_linears(module: torch.nn.Module) -> int:
    """Replace fp32 nn.Linear and GPT-2's Conv1D (weight stored [in, out]) by FastLinear; returns how many."""
    from transformers.pytorch_utils import Conv1D

    swapped = 0
    for name, child in module.named_children():
        if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32:
            setattr(module, name, FastLinear(child.weight, child.bias))  # shares the (possibly tied) weight
        elif type(child) is Conv1D and child.weight.dtype == torch.float32:
            setattr(module, name, FastLinear(child.weight.t().contiguous(), child.bias))
        else:
            swapped += _swap_linears(child)
            continue
        swapped += 1
    return swapped


def apply_kernels(module: torch.nn.Module, mode: str, device: torch.device) -> str:
    """Prepare `module` (already on `device`, in eval mode) for `mode`; returns the mode that runs."""
    mode = effective_mode(mode, device)
    if mode == "fast" and kernels_of(module) != "fast":
        with torch.no_grad():
            _swap_linears(module)  # fp32 Linears only: quantised or bf16 layers keep their own kernels
        setattr(module, _FAST_ATTR, "fast")
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
    """An empty (or `kv`-filled) DynamicCache for `model`; with growing layers when the model runs `fast`.

    kv: per layer (keys, values) [1, heads, length, head_dim], copied in.
    """
    cache = DynamicCache(config=model.config)
    if kernels_of(model) == "fast":
        cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    for layer, (keys, values) in zip(cache.layers, kv or ()):
        layer.update(keys, values)
    return cache
