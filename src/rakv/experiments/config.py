"""The composed Hydra config (conf/) turned into the objects the stages use, and validated once.

`validate(cfg)` runs before any stage body (rakv.experiments.stages.run_stage): every rule the CLI's flags are
held to (k_set, beta, lambda, budgets, kernels) is checked here on the composed config too, through
the same constructors, so `./reproduce.sh controller.beta=1.5` fails at once with one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rakv.experiments.records import write_atomic
from rakv.runtime.actions import ADAPTIVE
from rakv.runtime.calibration import calibration_for
from rakv.runtime.controller import ControllerConfig
from rakv.runtime.costmodel import CostTable
from rakv.runtime.engine import PROPOSERS, Engine
from rakv.runtime.engine_options import EngineOptions
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import effective_mode
from rakv.runtime.models import PAIR_NAMES
from rakv.runtime.paths import CONF_DIR
from rakv.runtime.proposers import Proposer, proposer_type
from rakv.runtime.strategies import action_of
from rakv.runtime.workloads import Prompt, dataset_texts, parse_scenario, select_prompts


@dataclass(frozen=True)
class Configuration:
    """A model pair with a proposer: one option of conf/configuration/."""

    name: str
    pair: str
    proposer: str  # the proposer's name (rakv.runtime.proposers.PROPOSERS)

    @property
    def proposer_type(self) -> type[Proposer]:
        return proposer_type(self.proposer)


def configuration(name: str) -> Configuration:
    path = CONF_DIR / "configuration" / f"{name}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in (CONF_DIR / "configuration").glob("*.yaml"))
        raise RakvError(f"unknown configuration '{name}'; choose one of: {', '.join(options)}")
    entry = OmegaConf.load(path)
    return Configuration(name=name, pair=entry.pair, proposer=entry.proposer)


def configurations(cfg: DictConfig) -> list[Configuration]:
    return [configuration(name) for name in cfg.configurations]


def results_dir(cfg: DictConfig) -> Path:
    return Path(cfg.results_dir)


def controller_config(cfg: DictConfig) -> ControllerConfig:
    return ControllerConfig.from_conf(cfg.controller)


def engine_for(cfg: DictConfig, configuration: Configuration) -> Engine:
    return EngineOptions.from_config(cfg, configuration.pair, configuration.proposer).open()


def cost_table_for(cfg: DictConfig, engine: Engine) -> CostTable:
    """The calibration of this configuration on this machine (measured now if missing or stale), with a copy
    in the results folder."""
    return keep_calibration(cfg, engine, calibration_for(engine, cfg.calibration.recalibrate))


def keep_calibration(cfg: DictConfig, engine: Engine, table: CostTable) -> CostTable:
    """A copy of the cost table used, in results/<name>/calibration/<pair>-<proposer>.json (the analysis reads it)."""
    out = results_dir(cfg) / "calibration" / f"{engine.pair.name}-{engine.proposer}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(table.to_json(), indent=1))
    return table


def prompts_for(cfg: DictConfig, encode, dataset: str) -> list[Prompt]:
    """The profile's seeded prompt selection from one configured dataset (`encode`: text -> token ids)."""
    if dataset not in cfg.data:
        raise RakvError(f"dataset '{dataset}' has no entry under data (configured: {', '.join(cfg.data)})")
    entry = cfg.data[dataset]
    grid = cfg.profile.study
    texts = dataset_texts(entry.name, entry.source, entry.split)
    return select_prompts(dataset, texts, encode, [tuple(b) for b in grid.length_bins], grid.prompts_per_bin,
                          seed=cfg.seed)


def validate(cfg: DictConfig) -> None:
    """Every rule on the composed config, checked once before a stage starts; a RakvError names the key."""
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
        if c.pair not in PAIR_NAMES or c.proposer not in PROPOSERS:
            raise RakvError(f"configuration '{c.name}': pair must be one of {PAIR_NAMES} and proposer one of "
                            f"{PROPOSERS}, got {c.pair} / {c.proposer}")
    for dataset in cfg.datasets:
        if dataset not in cfg.data:
            raise RakvError(f"dataset '{dataset}' has no entry under data (configured: {', '.join(cfg.data)})")
    for scenario in cfg.experiment.get("scenarios", []):
        parse_scenario(scenario)
    for strategy in cfg.experiment.get("strategies", []):
        if strategy != ADAPTIVE:
            action_of(strategy)
    grid = cfg.profile.study
    if grid.prompts_per_bin < 1 or grid.new_tokens < 1 or grid.repeats < 0 or grid.sweep_repeats < 1:
        raise RakvError("profile.study: prompts_per_bin and new_tokens must be >= 1, repeats >= 0 and sweep_repeats "
                        ">= 1 (the AR reference is a measurement)")
    if any(low >= high for low, high in grid.length_bins):
        raise RakvError(f"profile.study.length_bins must be [low, high) with low < high, got {list(grid.length_bins)}")
    if cfg.experiment.name == "sampling":
        validate_sampling(cfg)
    if not 0 <= cfg.study.shard_index < cfg.study.num_shards:
        raise RakvError(f"study.shard_index must be in [0, {cfg.study.num_shards}), got {cfg.study.shard_index}")


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
        action_of(f"spec-k{k}")
