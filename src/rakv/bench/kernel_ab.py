"""Two builds of kernels.cpp in one process, timed in turn on a pair's own weights, with their outputs compared bit
for bit (scripts/ab_kernels.py). On a machine whose memory bandwidth moves with other guests' load, two runs of a
benchmark minutes apart differ by more than a kernel change does; interleaving the old and the new build within
one process is what makes their ratio a measurement (docs/engine.md quotes ratios measured so).

The base build is kernels.cpp at a git revision, the new one the working tree's (or any file). Both are compiled
with the flags rakv.runtime.kernels.native uses, as extensions of their own names, with their Python classes
module-local (pybind11 registers a class once per process otherwise, and the second build's import would fail); that
edit is to the copies compiled here, not to the source. The weights are packed by this checkout's Python
(rakv.runtime.kernels.pack / pack_int8), so the two sources must share that layout.

Cases: the GEMM over every projection of the pair's fp32 target and of its int8 draft at a given number of rows
(one pass through all of them, as a step makes), and the attention of every layer for `segments` requests, each
with `rows` new rows after `positions` cached ones (a decode is rows = 1; a verify of k drafts rows = k + 1).
"""

from __future__ import annotations

import fcntl
import os
import re
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rakv.runtime.kernels import build_directory, target_arch
from rakv.runtime.paths import ROOT

SOURCE = "src/rakv/runtime/kernels.cpp"


@dataclass(frozen=True)
class AttentionCase:
    segments: int
    positions: int
    rows: int = 1

    @classmethod
    def parse(cls, text: str) -> AttentionCase:
        """`segments:positions[:rows]`, e.g. 16:256 (16 decodes at 256 positions) or 1:256:5 (a verify of k = 4)."""
        parts = text.split(":")
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts) or int(parts[0]) < 1:
            raise ValueError(f"attention case '{text}': segments:positions[:rows], e.g. 16:256 or 1:256:5")
        values = [int(p) for p in parts]
        if len(values) == 3 and values[2] < 1:
            raise ValueError(f"attention case '{text}': at least one new row")
        return cls(*values)

    def label(self) -> str:
        return f"attention {self.segments} x {self.rows} row(s) at {self.positions} positions"


def source_at(revision: str) -> str:
    """kernels.cpp as committed at `revision`."""
    out = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{SOURCE}"], capture_output=True, text=True)
    if out.returncode != 0:
        raise ValueError(f"no {SOURCE} at revision '{revision}': {out.stderr.strip().splitlines()[-1]}")
    return out.stdout


def module_local(source: str) -> str:
    """The source with every `py::class_<...>(m, "Name")` registered module-local."""
    return re.sub(r'(py::class_<[^>]*(?:<[^>]*>)?[^>]*>\(m, "\w+")\)', r"\1, py::module_local())", source)


def build(source: str, name: str):
    """`source` compiled as extension `name` (the flags of rakv.runtime.kernels.native), in a folder beside the
    kernels' own build folder, named by the extension; serialised by an flock as native() is (a lock file found
    while holding it is a killed build's leftover, which would make torch's `load` wait forever)."""
    from torch.utils.cpp_extension import load

    folder = build_directory().parent / f"ab-{name}-{target_arch()}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "rakv.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (folder / "lock").unlink(missing_ok=True)
        path = folder / f"{name}.cpp"
        text = module_local(source)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        return load(name=name, sources=[str(path)], build_directory=str(folder),
                    extra_cflags=["-O3", f"-march={target_arch()}", "-fopenmp", "-ffp-contract=off"], verbose=False)


def gemm_case(projections, rows: int):
    """One pass through `projections` (rakv.runtime.compact.Linear) at `rows` rows of random input, as a function
    of a build returning the outputs."""
    inputs = {k: torch.randn(rows, k) for k in {p.in_features for p in projections}}

    def run(mod):
        outs = []
        for p in projections:
            x = inputs[p.in_features]
            if p.scale is not None:
                outs.append(mod.gemm_i8(x, p.weight, p.colsum, p.out_features, p.scale, p.bias, None))
            else:
                outs.append(mod.gemm(x, p.weight, p.out_features, p.bias, None))
        return outs

    return run


def attention_case(case: AttentionCase, layers: int, heads: int, kv_heads: int, head_dim: int, seed: int = 0):
    """Every layer's attention for `case` on random queries, keys and values (each layer its own K/V buffers, as in
    a model), as a function of a build returning the outputs. The new rows' keys and values are written into the
    buffers at the same positions on every call, so repeated calls compute the same thing."""
    generator = torch.Generator().manual_seed(seed)
    capacity = case.positions + case.rows
    buffers = [([torch.randn(1, kv_heads, capacity, head_dim, generator=generator) for _ in range(case.segments)],
                [torch.randn(1, kv_heads, capacity, head_dim, generator=generator) for _ in range(case.segments)])
               for _ in range(layers)]
    qkv = torch.randn(case.segments * case.rows, (heads + 2 * kv_heads) * head_dim, generator=generator)
    starts, lengths = [case.positions] * case.segments, [case.rows] * case.segments
    scale = head_dim ** -0.5

    def run(mod):
        return [mod.attention(qkv.clone(), keys, values, starts, lengths, heads, kv_heads, scale, None, None)
                for keys, values in buffers]

    return run


@dataclass(frozen=True)
class CaseTiming:
    """One case on every build: each build's median ms, its ratio to the first build's, whether every output
    of every build is bitwise equal to the first's, and, for a kernel that rounds otherwise (e.g. attention in
    another order), how far: the largest |other - first| over an output's largest |first|, 0.0 when equal."""

    case: str
    ms: dict[str, float]
    over_first: dict[str, float]
    bitwise_equal: bool
    max_relative_difference: float


@dataclass(frozen=True)
class KernelAbReport:
    """scripts/ab_kernels.py --json: the base revision, the new source's label, a row per case."""

    base: str
    new: str
    rows: list[CaseTiming]


def compare(builds: dict, cases: dict, repeats: int) -> list[CaseTiming]:
    """Each case timed on each build in turn, `repeats` rounds (after one untimed round whose outputs are compared
    bit for bit); medians, and each build's ratio to the first."""
    rows = []
    for label, run in cases.items():
        outputs = {name: run(mod) for name, mod in builds.items()}
        first = next(iter(outputs.values()))
        equal = all(len(o) == len(first) and all(torch.equal(a, b) for a, b in zip(o, first))
                    for o in outputs.values())
        difference = max((relative_difference(a, b) for o in outputs.values() for a, b in zip(o, first)),
                         default=0.0)
        times = {name: [] for name in builds}
        for _ in range(repeats):
            for name, mod in builds.items():
                start = time.perf_counter()
                run(mod)
                times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        base = next(iter(medians.values()))
        rows.append(CaseTiming(label, medians, {n: m / base for n, m in medians.items()}, equal, difference))
    return rows


def relative_difference(other: torch.Tensor, first: torch.Tensor) -> float:
    """max |other - first| / max |first| (0.0 when equal; inf when shapes differ or first is all zeros and other
    is not)."""
    if other.shape != first.shape:
        return float("inf")
    if torch.equal(other, first):
        return 0.0
    scale = first.double().abs().max().item()
    gap = (other.double() - first.double()).abs().max().item()
    return gap / scale if scale > 0 else float("inf")


def describe_builds(base: str, new: str) -> str:
    return (f"base: {base}; new: {new}; -march={target_arch()}, {torch.get_num_threads()} threads, "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}")


def read_new_source(path: str | None) -> tuple[str, str]:
    """The new build's source and its label: `path`, or the working tree's kernels.cpp."""
    file = Path(path) if path else ROOT / SOURCE
    if not file.is_file():
        raise ValueError(f"no such kernels source: {file}")
    return file.read_text(), str(file) if path else "working tree"
