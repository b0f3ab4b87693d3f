"""The benchmarks' options, declared once as frozen dataclasses, and their flags generated from the fields (as
rakv.runtime.flags generates the command's; docs/layout.md).

The library takes these records (`EngineBenchOptions`, `ServingBenchOptions`, `VllmServeOptions`), never the
scripts' parsed arguments; a script adds the fields' flags (`add_flags`), its own flags for what to print, and
builds the record (`options_from`). A field's flag is --field-name; its help, metavar, choices and nargs are in
`field(metadata=...)`; its default is the field's (a factory for one read from conf/, which stays the one source
of the serving defaults). A bool is a switch (--name sets it); a tuple takes one or more values (nargs +, or the
field's `nargs`).
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import MISSING, dataclass, field, fields
from types import NoneType, UnionType

from rakv.runtime.actions import AR
from rakv.runtime.kernels import KERNEL_MODES
from rakv.runtime.models import PRECISIONS
from rakv.runtime.paths import conf_file


def flag(help: str | None = None, default=MISSING, **meta):
    """A field that is a flag: its default, help and argparse's metavar / choices / nargs."""
    meta = {"help": help, **meta}
    if callable(default) and not isinstance(default, type):
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


def _kind(cls: type, name: str):
    """(the flag's value type, whether it takes several): int for `int | None`, (int, True) for tuple[int, ...]."""
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(h for h in typing.get_args(hint) if h is not NoneType)
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True
    return hint, False


def default_of(spec) -> object:
    return spec.default_factory() if spec.default_factory is not MISSING else spec.default


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per field of `cls`, in declaration order."""
    for spec in fields(cls):
        kind, several = _kind(cls, spec.name)
        meta, default = spec.metadata, default_of(spec)
        extra = {key: meta[key] for key in ("metavar", "choices") if key in meta}
        if kind is bool:
            extra["action"] = "store_true"
        else:
            extra["type"] = kind
            if several:
                extra["nargs"] = meta.get("nargs", "+")
                default = None if default is None else list(default)
        parser.add_argument("--" + spec.name.replace("_", "-"), dest=spec.name, default=default,
                            help=meta.get("help"), **extra)


def options_from(cls: type, args: argparse.Namespace):
    """The record of `cls` from parsed flags (lists as tuples: the record is frozen)."""
    values = {}
    for spec in fields(cls):
        value = getattr(args, spec.name)
        values[spec.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def serving_default(name: str):
    """A default read from conf/serving/default.yaml when the flags are made (the one source of serving defaults)."""
    return lambda: getattr(conf_file("serving/default.yaml"), name)


@dataclass(frozen=True)
class EngineBenchOptions:
    """scripts/bench_engine.py's measurements (rakv.bench.engine)."""

    pair: str = flag(default="smollm2")
    new_tokens: int = flag(default=64)
    repeats: int = flag(default=3)
    long_prompt_tokens: int = flag(default=512)
    threads: int | None = flag(default=None)
    device: str = flag(default="cpu")
    kernels: str = flag("our side's kernels", default="compact", choices=KERNEL_MODES)
    precision: str = flag("our target's weights (rakv.runtime.models.PRECISIONS; transformers' side stays fp32)",
                          default="fp32", choices=PRECISIONS)
    no_peer: bool = flag("skip llama.cpp even when it is installed", default=False)

    def process_flags(self) -> list[str]:
        """The flags a fresh process of the benchmark (or `rakv generate` / `rakv serve`) runs the same pair with."""
        return ["--pair", self.pair, "--device", self.device, "--kernels", self.kernels,
                "--precision", self.precision] + (["--threads", str(self.threads)] if self.threads else [])


@dataclass(frozen=True)
class ServingBenchOptions:
    """scripts/bench_serving.py's measurements (rakv.bench.serving); the fields in the order its --out file's
    `args` lists them."""

    pair: str = flag(default="smollm2")
    proposer: str = flag(default=serving_default("proposer"))
    strategy: str = flag(default=AR)
    dataset: str = flag(default="humaneval")
    requests: int = flag(default=16)
    new_tokens: int = flag(default=32)
    prompt_words: int = flag(default=48)
    concurrency: tuple[int, ...] = flag(default=(1, 4, 8, 16))
    token_budget: int = flag(default=serving_default("token_budget"))
    kv_budget_mib: float = flag(default=serving_default("kv_budget_mib"))
    repeats: int = flag(default=1)
    no_peer: bool = flag("skip transformers' batched generate", default=False)
    peer: str | None = flag("also serve the requests through vLLM (scripts/setup_vllm_peer.sh)", default=None,
                            choices=("vllm",))
    vllm_venv: str = flag(default=".venv-vllm")
    vllm_weights: str = flag(default="results/peer/smollm2-fp32")
    vllm_eager: bool = flag("vLLM without torch.compile (a faster start)", default=False)
    vllm_threads: int | None = flag("OMP_NUM_THREADS for vLLM (default: its own choice, which on 2 cores is 1 "
                                    "thread)", default=None, metavar="N")
    vllm_ngram: int = flag("vLLM speculates K tokens by n-gram lookup (method ngram, n-grams of 1-3 tokens as rakv's "
                           "prompt lookup); compare with --strategy spec-kK --proposer prompt-lookup", default=0,
                           metavar="K")
    overload: int = flag("also serve N requests above capacity", default=0, metavar="N")
    overload_rate: float = flag(default=8.0)
    overload_tokens: int = flag(default=8)
    overload_kv_mib: float = flag(default=24.0)
    max_batch_overload: int = flag(default=16)
    device: str = flag(default="cpu")
    threads: int | None = flag(default=None)
    seed: int = flag(default=0)


@dataclass(frozen=True)
class VllmServeOptions:
    """scripts/bench_vllm_serve.py's servers and workloads (rakv.bench.vllm_serve)."""

    rates: tuple[float, ...] = flag(default=(0.5, 1.0))
    requests: int = flag(default=32)
    new_tokens: int = flag(default=32)
    prompt_words: int = flag(default=48)
    groups: int = flag(default=2)
    strategy: str = flag("rakv serve's --strategy", default=AR)
    seed: int = flag(default=0)
    vllm_venv: str = flag(default=".venv-vllm")
    vllm_weights: str = flag(default="results/peer/smollm2-fp32")
    vllm_eager: bool = flag(default=False)
    vllm_threads: tuple[int, ...] = flag("vLLM's server at each OMP_NUM_THREADS N in turn (0: its own choice, which "
                                         "on 2 cores gives its model 1 thread; rakv uses 2)", default=(0, 2),
                                         metavar="N")
    repeats: int = flag("each repeat its own prompts and Poisson arrivals (seed + 1000 r), the same for every engine; "
                        "the table gives the mean with its t interval over repeats", default=3)
    out: str = flag(default="results/peer/bench_vllm_serve")

    def repeat_seed(self, repeat: int) -> int:
        """Repeat r's seed, for its prompts and its Poisson arrivals: each repeat its own prompts, so that no cache
        holds an earlier repeat's."""
        return self.seed + 1000 * repeat
