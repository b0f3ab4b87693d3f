"""The composed config's schema: Hydra structured configs for the pipeline's root config and the profile's sections.

conf/config.yaml names `config_schema` first in its defaults list, so every stage's primary config is composed onto
`PipelineConfig` (registered in Hydra's ConfigStore by `register_schemas`): a key a profile misspells, in its yaml
or in a command-line override (`profile.study.repeets=3`, `+profile.serving.rate=[1]`), or a value of the wrong
type, fails at composition with OmegaConf's own message, which scripts/run_stage.py prints as one line. The yaml
files hold the values; these classes hold the keys and their types, and a default only for a key some profiles
leave out (its default is what a stage does without it). `configuration/` is composed onto `ConfigurationEntry`
the same way (rakv.experiments.config.configuration).

A stage takes its section as one of these objects at its boundary (`section(cfg.profile.study)` -> StudySection),
so its body reads typed attributes. Sizes written as 1 or as 0.5 (`Number`) and the maps of overrides (a serving
trace's settings, the rates per family) keep each value's own type, so the composed values, the dumps in outputs/
and the metadata.json files read exactly as the yaml wrote them. Only this module and hydra are imported: it is
registered before composition (scripts/run_stage.py), before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

Number = int | float  # a size written either way (0.5 MiB, 64 MiB): kept as written, never turned into a float
LengthBins = list[list[int]]  # [low, high) prompt lengths in tokens


@dataclass
class StudySection:
    """profile.study: the main study's grid (rakv.experiments.study); the feasibility stage sets it from its own."""

    length_bins: LengthBins = MISSING
    prompts_per_bin: int = MISSING
    repeats: int = MISSING  # rakv-asd runs per scenario (0: the action sweep only)
    sweep_repeats: int = MISSING  # measurements of every (scenario, action)
    new_tokens: int = MISSING
    model_warmup_requests: int = MISSING


@dataclass
class SensitivitySection:
    """profile.sensitivity: the sensitivity stage's sizes (rakv.experiments.sensitivity)."""

    prompts: int = MISSING
    new_tokens: int = MISSING
    controlled_alphas: list[float] = MISSING
    budgets_mib: list[Number] = MISSING
    trace_requests: int = MISSING
    trace_families: int = MISSING
    output_lengths: list[int] = MISSING
    reuse_output_lengths: list[int] = MISSING
    reuse_prompts: int = MISSING
    reuse_repeats: int = MISSING
    prompt_lengths: list[int] = MISSING
    reuse_rates: list[float] = MISSING
    repeats: int = MISSING


@dataclass
class DistributionSizes:
    """profile.sampling.distribution: the distribution tests' sizes."""

    prompts: int = MISSING
    seeds: int = MISSING
    positions: int = MISSING
    configurations: list[str] | None = None  # None: every configuration of the profile


@dataclass
class StructuredSizes:
    records: int = MISSING
    new_tokens: int = MISSING


@dataclass
class LongContextSizes:
    bins: LengthBins = MISSING
    per_bin: int = MISSING
    questions: int = MISSING
    new_tokens: int = MISSING
    budgets_mib: list[Number] = MISSING


@dataclass
class SamplingSection:
    """profile.sampling: the sampling stage's sizes (rakv.experiments.sampling; design: experiment/sampling.yaml)."""

    prompts_per_dataset: int = MISSING
    seeds: int = MISSING
    new_tokens: int = MISSING
    distribution: DistributionSizes = MISSING
    structured: StructuredSizes = MISSING
    long_context: LongContextSizes = MISSING


@dataclass
class CostCalibration:
    prefill_lengths: list[int] = MISSING
    contexts: list[int] = MISSING
    repeats: int = MISSING


@dataclass
class CostSide:
    """profile.feasibility.cost_side: the larger pairs' costs on their architecture twins."""

    pairs: list[str] = MISSING
    prompt_tokens: int = MISSING
    controlled_alphas: list[float] = MISSING
    controlled_k: list[int] = MISSING
    calibration: CostCalibration = MISSING


@dataclass
class FeasibilitySection:
    """profile.feasibility: the feasibility stage (rakv.experiments.feasibility; conf/feasibility.yaml)."""

    configuration: str = MISSING
    length_bins: LengthBins = MISSING
    prompts_per_bin: int = MISSING
    repeats: int = MISSING
    new_tokens: int = MISSING
    cost_side: CostSide = MISSING


@dataclass
class ServingSection:
    """profile.serving: the serving study's sizes (rakv.experiments.serving; design: conf/experiment/serving.yaml).
    `trace` and `family_trace` override `rakv trace`'s settings (rakv.serving.trace.TraceOptions: their keys are
    checked there, by name, before any model work)."""

    configuration: str = MISSING
    requests: int = MISSING
    max_new_tokens: int = MISSING
    prompt_words: int = MISSING
    trace: dict[str, Any] = MISSING  # every family's trace
    rates: dict[str, list[Any]] = MISSING  # requests per second, per family (a family left out is not run)
    repeats: int = MISSING
    family_configuration: dict[str, str] = field(default_factory=dict)  # a family's own configuration
    family_trace: dict[str, dict[str, Any]] = field(default_factory=dict)  # a family's own trace settings
    pilot: str | None = None  # a pilot run: the plan's minimum detectable differences


@dataclass
class Profile:
    """profile: a named size of every stage (conf/profile/*.yaml). Without a `sampling` section the sampling stage
    is skipped; without a `serving` section the serving stage stops with a one-line error."""

    name: str = MISSING
    study: StudySection = MISSING
    sensitivity: SensitivitySection = MISSING
    feasibility: FeasibilitySection = MISSING
    sampling: SamplingSection | None = None
    serving: ServingSection | None = None
    before_engines: list[str] = field(default_factory=list)  # the same profile's runs with earlier engines


@dataclass
class DatasetEntry:
    """data.<name>: one dataset (conf/dataset/)."""

    name: str = MISSING
    split: str = MISSING
    source: str = MISSING


@dataclass
class CalibrationOptions:
    recalibrate: str = MISSING  # auto, always or never
    refuse_spread: float | None = None  # None: CalibrationPlan's own gate


@dataclass
class ShardOptions:
    """study: which shard of the study's runs this process runs (conf/hydra/launcher/slurm.yaml), and what the
    rakv-asd controller learns from (docs/cluster.md): `per_configuration`, one controller per configuration over all
    its runs in the seeded order (one process only), or `per_block`, one per block of `block_prompts` prompts of a
    dataset over that block's runs in the same order, which a sharded study (shards are blocks) decides identically."""

    shard_index: int = MISSING
    num_shards: int = MISSING
    merge_only: bool = MISSING
    learning: str = "per_configuration"
    block_prompts: int = 1


@dataclass
class PipelineConfig:
    """The root of every stage's composed config (conf/config.yaml). The groups typed elsewhere or per stage
    (cache, controller, serving, experiment) are `Any` here: Hydra's struct mode still refuses their unknown keys
    on the command line, and their own constructors check them (rakv.experiments.config.validate)."""

    cache: Any = MISSING
    controller: Any = MISSING
    data: dict[str, DatasetEntry] = MISSING
    experiment: Any = MISSING
    serving: Any = MISSING
    profile: Profile = MISSING
    configurations: list[str] = MISSING  # conf/configuration/ names
    datasets: list[str] = MISSING
    seed: int = MISSING
    device: str = MISSING
    dtype: str = MISSING
    kernels: str = MISSING
    threads: int | None = MISSING
    results_dir: str = MISSING
    calibration: CalibrationOptions = MISSING
    study: ShardOptions = MISSING
    heads: Any = None  # the heads stage's settings (conf/heads/, conf/heads.yaml; rakv.experiments.heads)


@dataclass
class ConfigurationEntry:
    """One option of conf/configuration/: a model pair (rakv.runtime.models.PAIR_NAMES) with a proposer
    (rakv.runtime.proposers.PROPOSERS), its target at a precision (rakv.runtime.models.PRECISIONS). A configuration
    of several proposers for one target (rakv-asd chooses (reuse, proposer, k) per request; docs/heads.md) names
    them in `proposers` too, the first of them being `proposer` (the engine's own)."""

    pair: str = MISSING
    proposer: str | None = None  # one proposer (every configuration but the *-all ones)
    precision: str = "fp32"
    proposers: list[str] = field(default_factory=list)  # several proposers, the first `proposer` (the engine's)


ROOT_SCHEMA = "config_schema"  # conf/config.yaml's first default
CONFIGURATION_SCHEMA = "configuration_schema"  # each conf/configuration/*.yaml's first default


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent): before any composition of conf/."""
    store = ConfigStore.instance()
    store.store(name=ROOT_SCHEMA, node=PipelineConfig)
    store.store(group="configuration", name=CONFIGURATION_SCHEMA, node=ConfigurationEntry)


def section(node: DictConfig):
    """A composed section as its dataclass (StudySection, ServingSection, ...): the stage boundary's typed object."""
    return OmegaConf.to_object(node)


SKIPPED_LINES = ("reference_type=", "object_type=", "To append to your config use")


def one_line(exc: BaseException) -> str:
    """Hydra's and OmegaConf's message of a failed composition (the exception and its causes) on one line, without
    OmegaConf's type detail lines, Hydra's advice to append and its search path."""
    parts: list[str] = []
    while exc is not None:
        for line in str(exc).splitlines():
            line = line.strip()
            if line.startswith("Config search path:"):
                break
            # Hydra's "To append ... use +key" is no way out for a typed section (validate refuses the key)
            if line and not line.startswith(SKIPPED_LINES) and line not in parts:
                parts.append(line)
        exc = exc.__cause__
    return " ".join(parts)


def first_of_each_sweep(overrides: list[str]) -> list[str] | None:
    """The overrides with each sweep (`a=1,2`, `range(8)`) at its first value: one job's composition of a multirun;
    None where Hydra's parser refuses them (Hydra then reports it itself)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        return [f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override()
                else o.input_line for o in parsed]
    except (HydraException, StopIteration):
        return None


def composition_error(config_dir: str, config_name: str, arguments: list[str]) -> str | None:
    """Why `arguments` (a stage's Hydra overrides, `-m` allowed) do not compose onto `config_name`, on one line;
    None when they compose, or when Hydra's own flags (--cfg, --help, ...) are among them (Hydra answers those).
    scripts/run_stage.py asks before hydra.main, which would print the same message over several lines."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = [a for a in arguments if a not in ("-m", "--multirun")]
    if any(a.startswith("-") for a in overrides):
        return None
    overrides = first_of_each_sweep(overrides)
    if overrides is None:
        return None
    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        return one_line(exc)
    return None


register_schemas()
