"""What `rakv generate`, `calibrate` and `serve` open an engine with: the pair, its proposer, where and how it runs,
and its prefix KV store. Declared once here; the CLI's flags are generated from these fields (rakv.runtime.flags), with
conf/config.yaml (device, dtype, kernels, threads) and conf/cache/default.yaml (the store) as their defaults, read
through rakv.runtime.engine.engine_conf, as open_engine's are."""

from __future__ import annotations

from dataclasses import dataclass, field

from rakv.runtime.engine import Engine, conf_engine_options, engine_conf, loaded_engine
from rakv.runtime.kernels import KERNEL_MODES
from rakv.runtime.models import PAIR_NAMES, PRECISIONS
from rakv.runtime.proposers import PROPOSERS


@dataclass(frozen=True)
class EngineOptions:
    """The fields without a default take conf/'s (`conf_defaults`), the one source of their defaults."""

    pair: str = field(metadata={"help": f"model pair: {', '.join(PAIR_NAMES)}"})
    salt: str | None = field(metadata={
        "help": "isolation salt (tenant) of the KV store namespace, for requests that name none"})
    cache_budget_mib: float = field(metadata={"help": "byte budget of the prefix KV store"})
    reuse_draft: bool = field(metadata={  # false: --no-draft-reuse
        "flag": "--no-draft-reuse", "help": "store entries without the draft model's K/V (the ablation; conf/cache: "
                                            "reuse_draft)"})
    device: str = field(metadata={"help": "cpu, cuda, cuda:1 ..."})
    dtype: str = field(metadata={"help": "the models' weights and activations"})
    kernels: str = field(metadata={"choices": KERNEL_MODES, "help": (
        "compact: rakv.runtime.compact's forward (few ops per layer, C++ kernels for few rows, batched rows); "
        "stock: transformers as shipped")})
    threads: int | None = field(metadata={"help": "CPU threads (default: all cores)"})
    # choices: the registry itself, so its names are read when a flag is parsed (rakv.runtime.proposers)
    proposer: str = field(default="draft", metadata={"choices": PROPOSERS, "help": "who drafts for k > 0"})
    # a configuration's field (conf/configuration/*.yaml), not conf/config.yaml's: fp32 unless one says otherwise
    precision: str = field(default="fp32", metadata={"choices": PRECISIONS, "help": (
        "the target's weights: fp32, int8 (per-output int8, int8 activations) or q4_1 (the GGUF's Q4_1 blocks, "
        "head Q8_0, fp32 activations); compact kernels on the CPU only (docs/engine.md, Precision)")})

    @classmethod
    def conf_defaults(cls) -> dict:
        """The defaults conf/ holds for these fields (the pipeline's and the store's), so the CLI, open_engine and the
        stages agree."""
        return conf_engine_options()

    @classmethod
    def from_config(cls, cfg, pair: str, proposer: str, precision: str = "fp32") -> EngineOptions:
        """A stage's engine for one configuration, from the composed config (its overrides included)."""
        return cls(pair=pair, proposer=proposer, precision=precision, **engine_conf(cfg, cfg.cache))

    def open(self) -> Engine:
        return loaded_engine(self.pair, self.proposer, cache_budget_mib=self.cache_budget_mib, salt=self.salt,
                             device=self.device, dtype=self.dtype, threads=self.threads, kernels=self.kernels,
                             reuse_draft=self.reuse_draft, precision=self.precision)
