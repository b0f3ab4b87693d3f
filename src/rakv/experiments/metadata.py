"""What produced a results folder, declared once: the study's and the serving study's metadata.json as typed records,
and a shipped run's about.json (docs/outputs.md: "metadata.json beside it: composed config, git commit, package
versions, hardware and calibration fingerprints").

`RunMetadata` is results/<name>/study/metadata.json (written by rakv.experiments.study), `ServingMetadata`
results/<name>/serving/metadata.json (rakv.experiments.serving); both are written and read only here
(`write_run_metadata`, `read_run_metadata`, `write_serving_metadata`, `read_serving_metadata`), through the record
codec of rakv.runtime.json_records, so an old or edited file stops with one line naming the field. The JSON keeps the
keys, their order and the indent it had when it was a dict, so a study written today reads as the shipped ones do.

The composed Hydra config stays a plain mapping inside the record (`config`: its schema is
rakv.experiments.schema's and changes with the code, while a shipped run keeps the one it ran under); the few values
the paper, the statistics and the scripts read of it are the records' properties, so no reader indexes it.

Shipped runs measured before a hardware field existed lack it (data/reference/offline-*-kernels/ and two of
data/reference/other-machines/ have no `isa`, `kernels_march`, `cores`, `caches`): those fields are optional, ABSENT
when the file lacks them and None when the machine has no such thing (a GPU's ISA).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rakv.experiments.records import git_commit, write_atomic
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import ABSENT, json_name, load_record, name_of, optional, read_record, to_json
from rakv.runtime.run_layout import RunLayout, ServingStudyLayout, StudyLayout


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """A machine as its calibration key records it (rakv.runtime.calibration.hardware_fingerprint): what changes the
    kernels' code path or their blocking, the device, and the versions of torch and transformers."""
    processor: str
    isa: str | None = optional()  # None: not a CPU; ABSENT: recorded before the field existed
    kernels_march: str | None = optional()
    kernels_isa: str | None = optional()  # rakv.runtime.kernels.target_isa: the -march resolved, its vector extensions
    cores: int | None = optional()
    caches: str | None = optional()
    device: str
    dtype: str
    threads: int | None  # None on a GPU
    torch: str
    transformers: str

    def machine_class(self) -> tuple:
        """What makes two machines one class (processor, ISA, the kernels' compile target and what it resolves to,
        cores, caches, device, threads, dtype), None where a field is unrecorded or there is none (the two read alike
        when comparing)."""
        values = (self.processor, self.isa, self.kernels_march, self.kernels_isa, self.cores, self.caches, self.device,
                  self.threads, self.dtype)
        return tuple(None if value is ABSENT else value for value in values)


@dataclass(frozen=True)
class Packages:
    """The versions of the packages a run imported (None: not installed)."""
    python: str
    rakv: str | None
    torch: str | None
    transformers: str | None
    datasets: str | None
    hydra_core: str | None = json_name("hydra-core")
    pandas: str | None
    pyarrow: str | None
    scipy: str | None
    numpy: str | None

    def installed(self) -> list[tuple[str, str]]:
        """(package, version) of every package installed, in this order."""
        return [(name_of(f), getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]


def package_versions() -> Packages:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {"python": sys.version.split()[0]}
    for f in fields(Packages)[1:]:
        try:
            found[f.name] = version(name_of(f))
        except PackageNotFoundError:
            found[f.name] = None
    return Packages(**found)


@dataclass(frozen=True)
class MachineLoad:
    """The machine's load average (1, 5, 15 minutes) when the study's runs began and ended, and its CPUs."""
    load_average_1_5_15min_at_start: list[float]
    load_average_1_5_15min_at_end: list[float]
    cpus: int | None


@dataclass(frozen=True)
class CalibrationKey:
    """What a cost table was measured for (rakv.runtime.calibration.calibration_key): the pair's fingerprint (its
    models' names, weights, dtypes and kernels: rakv.runtime.models, kept as written), the proposer, the machine
    and the method; a table of another key is stale."""
    pair: dict[str, Any]
    proposer: str
    hardware: Hardware
    method: str
    heads: str | None = optional()  # the heads proposer's trained set (its key): a retrained set is another proposer
    proposal: str | None = optional()  # how the heads' proposal is computed (rakv.runtime.heads.PROPOSAL)

    @property
    def pair_name(self) -> str:
        return self.pair["pair"]

    @property
    def target_kernels(self) -> str | None:
        """The target's kernels (their source's hash: one hash, one batch-one engine); None where unrecorded."""
        return self.pair["target"].get("kernels")

    @classmethod
    def of(cls, key: dict) -> CalibrationKey:
        """The record of a key as rakv.runtime.calibration.calibration_key builds it."""
        return load_record(cls, key, "calibration key")


def _profile(config: dict) -> dict:
    return config["profile"]


@dataclass(frozen=True)
class RunMetadata:
    """results/<name>/study/metadata.json: the study's provenance."""
    config: dict[str, Any]  # the composed Hydra config, resolved (read through the properties below)
    git_commit: str | None  # "-dirty" appended when the tracked files differed from it
    packages: Packages
    calibration_keys: dict[str, CalibrationKey]  # per configuration
    hardware: Hardware
    runs: int
    plan: str
    machine_load: MachineLoad

    @property
    def profile_name(self) -> str:
        return _profile(self.config)["name"]

    @property
    def new_tokens(self) -> int:
        """The study's new tokens per request."""
        return _profile(self.config)["study"]["new_tokens"]

    @property
    def sensitivity_new_tokens(self) -> int | None:
        """The sensitivity and feasibility stages' new tokens (None: the profile has no sensitivity section)."""
        return (_profile(self.config).get("sensitivity") or {}).get("new_tokens")

    @property
    def cost_side_prompt_tokens(self) -> int:
        """The feasibility cost side's prompt length: the request every price of the run is quoted at."""
        return _profile(self.config)["feasibility"]["cost_side"]["prompt_tokens"]

    @property
    def kernels(self) -> str:
        """The kernels mode the model forwards used ("stock" for a config from before the option existed)."""
        return self.config.get("kernels", "stock")

    @property
    def seed(self) -> int | None:
        return self.config.get("seed")

    @property
    def controller(self) -> dict:
        """The controller's section (rakv.runtime.controller.ControllerConfig.from_conf reads it)."""
        return self.config["controller"]

    @property
    def short_commit(self) -> str:
        return (self.git_commit or "unknown")[:12]

    @property
    def study_kernels(self) -> str | None:
        """The kernels every configuration's calibration names, None where they differ or are unrecorded."""
        found = {key.target_kernels for key in self.calibration_keys.values()}
        return found.pop() if len(found) == 1 else None


@dataclass(frozen=True)
class ServingMetadata:
    """results/<name>/serving/metadata.json: the serving study's provenance."""
    config: dict[str, Any]  # the composed Hydra config of the serving stage, resolved
    git_commit: str | None
    packages: Packages
    cells: int
    runs: int

    @property
    def profile_name(self) -> str:
        return _profile(self.config)["name"]

    @property
    def experiment(self) -> dict:
        """The run's experiment section (the serving design as it ran: families, margins, goals, SLO steps)."""
        return self.config["experiment"]

    @property
    def serving_grid(self) -> dict:
        """The run's profile.serving section (configuration, rates, repeats, requests, pilot)."""
        return dict(_profile(self.config)["serving"])

    @property
    def slo_steps(self) -> dict:
        """The decode steps each SLO was set at (its SLOs were measured by them)."""
        return self.experiment["slo_steps"]


@dataclass(frozen=True)
class SamplingDesign:
    """results/<name>/sampling/design.json: the sampling stage's design (its experiment and the profile's sizes, as
    composed), the commit each part was measured with (a part measured earlier keeps its own) and the machine."""
    experiment: dict[str, Any]
    sizes: dict[str, Any]
    parts: dict[str, str | None]  # part -> the commit it was measured with (None: not a git checkout)
    hardware: Hardware

    @property
    def distribution_level(self) -> float:
        """The distribution tests' level (0.05 where the design names none)."""
        return float((self.experiment.get("distribution") or {}).get("alpha", 0.05))

    @property
    def power_resamples(self) -> int:
        """The resamples of the distribution tests' power estimate (200 where the design names none)."""
        return int((self.experiment.get("distribution") or {}).get("power_resamples", 200))


def write_sampling_design(record: SamplingDesign, layout: RunLayout) -> None:
    write_atomic(layout.sampling_design, json.dumps(to_json(record), indent=1))


def read_sampling_design(layout: RunLayout) -> SamplingDesign | None:
    """The sampling stage's design.json, None before the stage has written one."""
    path = layout.sampling_design
    return read_record(SamplingDesign, path) if path.exists() else None


@dataclass(frozen=True)
class About:
    """A shipped run's about.json (data/reference/other-machines/<run>/): its label, machine, commit and source."""
    label: str
    machine: str
    commit: str
    source: str
    engine: str = optional()


def composed_config(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def study_metadata(cfg: DictConfig, calibration_keys: dict[str, dict], runs: int, plan: str,
                   load: MachineLoad) -> RunMetadata:
    """The study's record: `calibration_keys` as rakv.runtime.calibration.calibration_key builds them; the machine's
    is the first configuration's (every configuration runs on one machine)."""
    keys = {name: CalibrationKey.of(key) for name, key in calibration_keys.items()}
    return RunMetadata(config=composed_config(cfg), git_commit=git_commit(), packages=package_versions(),
                       calibration_keys=keys, hardware=next(iter(keys.values())).hardware, runs=runs, plan=plan,
                       machine_load=load)


def serving_metadata(cfg: DictConfig, cells: int, runs: int) -> ServingMetadata:
    return ServingMetadata(config=composed_config(cfg), git_commit=git_commit(), packages=package_versions(),
                           cells=cells, runs=runs)


def write_run_metadata(record: RunMetadata, study: StudyLayout) -> None:
    write_atomic(study.metadata, json.dumps(to_json(record), indent=1))


def write_serving_metadata(record: ServingMetadata, serving: ServingStudyLayout) -> None:
    # default=str: as the dict was written (a config value JSON cannot hold is written as its text)
    write_atomic(serving.metadata, json.dumps(to_json(record), indent=1, default=str))


def read_run_metadata(layout: RunLayout) -> RunMetadata:
    """A results folder's study/metadata.json, every field checked (RakvError naming the file and the field)."""
    return read_record(RunMetadata, layout.study.metadata, "run the study stage first")


def run_metadata_if_any(layout: RunLayout) -> RunMetadata | None:
    """`read_run_metadata`, None where the folder has no study metadata (a summary shipped without it)."""
    return read_run_metadata(layout) if layout.study.metadata.exists() else None


def read_serving_metadata(layout: RunLayout) -> ServingMetadata:
    return read_record(ServingMetadata, layout.serving.metadata, "run the serving stage first")


def read_about(layout: RunLayout) -> About:
    return read_record(About, layout.about)


def check_shipped(layout: RunLayout) -> list[str]:
    """Every metadata file of a shipped run read through its record: the one-line errors of those that do not read
    (empty when all do)."""
    errors = []
    for path, read in ((layout.study.metadata, read_run_metadata), (layout.serving.metadata, read_serving_metadata),
                       (layout.sampling_design, read_sampling_design), (layout.about, read_about)):
        if path.exists():
            try:
                read(layout)
            except RakvError as exc:
                errors.append(str(exc))
    return errors
