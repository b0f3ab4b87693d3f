"""The composed Hydra config (conf/) turned into the objects the stages use, and validated once.

The config is composed onto its schema (rakv.experiments.schema: a misspelt key or a wrong type fails at composition);
`validate(cfg)` runs before any stage body (rakv.experiments.stages.run_stage): keys a `+` override added to a typed
section, values a profile left out, and every rule the CLI's flags are held to (k_set, beta, lambda, budgets,
kernels) are checked here on the composed config too, through the same constructors, so
`./reproduce.sh controller.beta=1.5` fails at once with one line.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cache

import torch
from omegaconf import DictConfig, OmegaConf

from rakv.experiments.records import write_atomic
from rakv.experiments.schema import ConfigurationEntry, StudySection, one_line, section
from rakv.runtime.actions import ADAPTIVE, spec
from rakv.runtime.calibration import CalibrationPlan, calibration_prompts, load_or_calibrate, precision_of
from rakv.runtime.controller import ControllerConfig
from rakv.runtime.costmodel import CostTable
from rakv.runtime.engine import Engine
from rakv.runtime.engine_options import EngineOptions
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import effective_mode
from rakv.runtime.models import PAIR_NAMES
from rakv.runtime.paths import CONF_DIR
from rakv.runtime.proposers import PROPOSERS, Proposer, proposer_type
from rakv.runtime.run_layout import RunLayout
from rakv.runtime.strategies import action_of
from rakv.runtime.workloads import Prompt, dataset_texts, parse_scenario, select_prompts


@dataclass(frozen=True)
class Configuration:
    """A model pair with a proposer: one option of conf/configuration/."""

    name: str
    pair: str
    proposer: str  # the proposer's name (rakv.runtime.proposers.PROPOSERS); of several, the first (the engine's)
    precision: str = "fp32"  # the target's weights (rakv.runtime.models.PRECISIONS)
    proposers: tuple[str, ...] = ()  # several proposers for one target (rakv-asd chooses among them); () for one

    @property
    def proposer_type(self) -> type[Proposer]:
        return proposer_type(self.proposer)

    @property
    def chooses_proposer(self) -> bool:
        """Whether this configuration holds several proposers (its actions name theirs: `heads:r0k4`)."""
        return len(self.proposers) > 1

    @property
    def all_proposers(self) -> tuple[str, ...]:
        return self.proposers or (self.proposer,)


def configuration_names() -> list[str]:
    """The options of conf/configuration/ (its yaml files; the schema stored beside them is none)."""
    return sorted(p.stem for p in (CONF_DIR / "configuration").glob("*.yaml"))


@cache
def configuration(name: str) -> Configuration:
    """An option of conf/configuration/, composed by Hydra onto its schema (ConfigurationEntry): the same loader and
    checks as the stages' config, within a stage's Hydra context or a fresh one on conf/."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if name not in configuration_names():
        raise RakvError(f"unknown configuration '{name}'; choose one of: {', '.join(configuration_names())}")
    overrides = [f"+configuration={name}"]
    try:
        if GlobalHydra.instance().is_initialized():  # inside scripts/run_stage.py's Hydra: its conf/
            node = compose(overrides=overrides)
        else:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                node = compose(overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise RakvError(f"configuration '{name}': {one_line(exc)}") from None
    return configuration_of(name, OmegaConf.to_object(node.configuration))


def configuration_of(name: str, entry: ConfigurationEntry) -> Configuration:
    """A composed conf/configuration/ entry as the Configuration the stages use; one proposer, or several listed in
    `proposers` with `proposer` (when given) the first of them."""
    if entry.proposer is None and not entry.proposers:
        raise RakvError(f"configuration '{name}': name its `proposer` (or a list of `proposers`)")
    if entry.proposers and (len(set(entry.proposers)) != len(entry.proposers)
                            or entry.proposer not in (None, entry.proposers[0])):
        raise RakvError(f"configuration '{name}': proposers {entry.proposers} must name each proposer once, the "
                        f"first being `proposer` ({entry.proposer})")
    return Configuration(name=name, pair=entry.pair, proposer=entry.proposer or entry.proposers[0],
                         precision=entry.precision, proposers=tuple(entry.proposers))


def configurations(cfg: DictConfig) -> list[Configuration]:
    return [configuration(name) for name in cfg.configurations]


def run_layout(cfg: DictConfig) -> RunLayout:
    """The results folder the composed config names (`results_dir`, results/<profile>/ by default)."""
    return RunLayout.of(cfg.results_dir)


def controller_config(cfg: DictConfig) -> ControllerConfig:
    return ControllerConfig.from_conf(cfg.controller)


def engine_for(cfg: DictConfig, configuration: Configuration) -> Engine:
    return EngineOptions.from_config(cfg, configuration.pair, configuration.proposer,
                                     configuration.precision).open()


def cost_table_for(cfg: DictConfig, engine: Engine) -> CostTable:
    """The calibration of this configuration on this machine (measured now if missing or stale), with a copy
    in the results folder."""
    return keep_calibration(cfg, engine, load_or_calibrate(engine, calibration_prompts(engine.encode),
                                                           recalibrate=cfg.calibration.recalibrate,
                                                           plan=noise_gate(cfg)))


def cost_tables_for(cfg: DictConfig, configuration: Configuration, engine: Engine) -> dict[str, CostTable]:
    """Each proposer's calibration of this configuration (one for a single proposer), as `cost_table_for` keeps
    them: one file per pair and proposer, shared with the single-proposer configurations of that pair."""
    return {name: cost_table_for(cfg, engine.with_proposer(name)) for name in configuration.all_proposers}


def noise_gate(cfg: DictConfig) -> CalibrationPlan:
    """The calibrations' noise gate: CalibrationPlan's, or one set in the config (`calibration.refuse_spread`: a
    test fixture on a machine its own workers load opens it for itself, explicitly)."""
    spread = cfg.calibration.refuse_spread
    return CalibrationPlan() if spread is None else CalibrationPlan(refuse_spread=spread)


def keep_calibration(cfg: DictConfig, engine: Engine, table: CostTable) -> CostTable:
    """A copy of the cost table used, in results/<name>/calibration/<pair>-<proposer>.json (the analysis reads it)."""
    out = run_layout(cfg).calibration(engine.pair.name, engine.proposer, precision_of(engine.pair))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(table.to_json(), indent=1))
    return table


def prompts_for(cfg: DictConfig, encode, dataset: str) -> list[Prompt]:
    """The profile's seeded prompt selection from one configured dataset (`encode`: text -> token ids)."""
    if dataset not in cfg.data:
        raise RakvError(f"dataset '{dataset}' has no entry under data (configured: {', '.join(cfg.data)})")
    entry = cfg.data[dataset]
    grid: StudySection = section(cfg.profile.study)
    texts = dataset_texts(entry.name, entry.source, entry.split)
    return select_prompts(dataset, texts, encode, [tuple(b) for b in grid.length_bins], grid.prompts_per_bin,
                          seed=cfg.seed)


def validate(cfg: DictConfig) -> None:
    """Every rule on the composed config, checked once before a stage starts; a RakvError names the key."""
    schema_errors = unknown_keys(cfg) + [f"{key}: no value (the profile leaves it out)"
                                         for key in sorted(OmegaConf.missing_keys(cfg))]
    if schema_errors:
        raise RakvError(f"the composed config does not fit its schema (rakv.experiments.schema): "
                        f"{'; '.join(schema_errors)}")
    controller_config(cfg)
    if cfg.cache.budget_mib <= 0:
        raise RakvError(f"cache.budget_mib must be positive, got {cfg.cache.budget_mib}")
    if cfg.cache.salt is not None and not isinstance(cfg.cache.salt, str):
        raise RakvError(f"cache.salt must be a string or null, got {cfg.cache.salt!r}")
    try:
        device = torch.device(cfg.device)
    except RuntimeError:
        raise RakvError(f"device '{cfg.device}' is not a torch device (cpu, cuda, cuda:1, ...)") from None
    effective_mode(cfg.kernels, device)
    if cfg.calibration.recalibrate not in ("auto", "always", "never"):
        raise RakvError(f"calibration.recalibrate must be auto, always or never, got '{cfg.calibration.recalibrate}'")
    for c in configurations(cfg):
        if c.pair not in PAIR_NAMES or any(p not in PROPOSERS for p in c.all_proposers):
            raise RakvError(f"configuration '{c.name}': pair must be one of {PAIR_NAMES} and proposer one of "
                            f"{tuple(PROPOSERS)}, got {c.pair} / {'/'.join(c.all_proposers)}")
    for dataset in cfg.datasets:
        if dataset not in cfg.data:
            raise RakvError(f"dataset '{dataset}' has no entry under data (configured: {', '.join(cfg.data)})")
    for scenario in cfg.experiment.get("scenarios", []):
        parse_scenario(scenario)
    for strategy in cfg.experiment.get("strategies", []):
        if strategy != ADAPTIVE:
            action_of(strategy)
    grid: StudySection = section(cfg.profile.study)
    if grid.prompts_per_bin < 1 or grid.new_tokens < 1 or grid.repeats < 0 or grid.sweep_repeats < 1:
        raise RakvError("profile.study: prompts_per_bin and new_tokens must be >= 1, repeats >= 0 and sweep_repeats "
                        ">= 1 (the AR reference is a measurement)")
    if any(low >= high for low, high in grid.length_bins):
        raise RakvError(f"profile.study.length_bins must be [low, high) with low < high, got {grid.length_bins}")
    if cfg.experiment.name == "sampling":
        validate_sampling(cfg)
    if not 0 <= cfg.study.shard_index < cfg.study.num_shards:
        raise RakvError(f"study.shard_index must be in [0, {cfg.study.num_shards}), got {cfg.study.shard_index}")
    validate_learning(cfg.study)


def validate_learning(study) -> None:
    """study.learning and study.block_prompts; a sharded study learns per block (docs/cluster.md)."""
    if study.learning not in ("per_configuration", "per_block"):
        raise RakvError(f"study.learning must be per_configuration or per_block, got '{study.learning}'")
    if study.block_prompts < 1:
        raise RakvError(f"study.block_prompts must be >= 1, got {study.block_prompts}")
    if study.num_shards > 1 and study.learning != "per_block":
        raise RakvError("a sharded study needs study.learning=per_block: with one controller per configuration each "
                        "shard's would learn from its share of the runs only (another experiment); compare it with a "
                        "one-process study run with study.learning=per_block too")


def unknown_keys(node: DictConfig, path: str = "") -> list[str]:
    """Keys of a typed section that its dataclass lacks: Hydra's `+key=value` adds them past the schema (a plain
    `key=value` or a key in a yaml already fails at composition), and OmegaConf.to_object would drop them unread."""
    kind, found = OmegaConf.get_type(node), []
    names = {f.name for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else None
    for key in node.keys():
        where = f"{path}{key}"
        if names is not None and key not in names:
            found.append(f"{where}: not a key of {kind.__name__} (added with '+'?)")
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            found += unknown_keys(child, f"{where}.")
    return found


def validate_sampling(cfg: DictConfig) -> None:
    """The sampling stage's design (conf/experiment/sampling.yaml): temperatures, top-p and the rules it names."""
    from rakv.runtime.verification import CONTROL_RULES, VERIFY_RULES

    exp = cfg.experiment
    if any(t < 0 for t in exp.temperatures) or not 0 < exp.top_p <= 1:
        raise RakvError(f"experiment.temperatures must be >= 0 and top_p in (0, 1], got {list(exp.temperatures)} "
                        f"and {exp.top_p}")
    for rule in exp.verify_rules:
        if rule not in VERIFY_RULES:
            raise RakvError(f"experiment.verify_rules: unknown rule '{rule}'; choose from {', '.join(VERIFY_RULES)}")
    for arm in exp.distribution.arms:
        if arm not in VERIFY_RULES + CONTROL_RULES:
            raise RakvError(f"experiment.distribution.arms: unknown rule '{arm}'; choose from "
                            f"{', '.join(VERIFY_RULES + CONTROL_RULES)}")
    if exp.distribution.temperature <= 0:
        raise RakvError("experiment.distribution.temperature must be > 0 (the tests compare sampled outputs)")
    for k in exp.ks:
        action_of(spec(k))
