"""conf/ composes for every profile and experiment, validates once with one-line errors, and the package keeps its
one-way import rule (runtime modules never import experiment modules)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rakv.experiments.config import (
    CONF_DIR,
    configuration,
    configuration_names,
    configurations,
    controller_config,
    validate,
)
from rakv.experiments.schema import ServingSection, StudySection, section
from rakv.experiments.stages import PRIMARY_CONFIGS
from rakv.runtime.errors import RakvError

SRC = Path(__file__).resolve().parents[1] / "src" / "rakv"
PROFILES = sorted(p.stem for p in (CONF_DIR / "profile").glob("*.yaml"))
PRIMARY = ("config", *sorted(set(PRIMARY_CONFIGS.values())))  # the stages' primary configs
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def composed(name="config", *overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=name, overrides=["results_dir=/tmp/rakv-compose", *overrides])


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("primary", PRIMARY)
def test_every_profile_composes_and_validates_for_every_stage(primary, profile):
    cfg = composed(primary, f"profile={profile}")
    validate(cfg)
    assert configurations(cfg) and all(d in cfg.data for d in cfg.datasets)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    validate(composed("config", f"experiment={experiment}"))


def test_feasibility_is_the_main_study_with_overrides():
    cfg = composed("feasibility", "profile=offline")
    assert list(cfg.configurations) == [cfg.profile.feasibility.configuration]
    assert cfg.profile.study.repeats == 0 and cfg.profile.study.new_tokens == cfg.profile.feasibility.new_tokens
    assert list(cfg.experiment.strategies) == []


def test_controller_defaults_come_from_conf():
    cfg = composed()
    config = controller_config(cfg)
    assert list(config.k_set) == list(cfg.controller.k_set) and config.beta == cfg.controller.beta


def run_stage(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/run_stage.py", *arguments], cwd=SRC.parents[1],
                          capture_output=True, text=True, timeout=300)


def one_line_error(done: subprocess.CompletedProcess, stage: str = "study") -> str:
    """The stage's stderr, checked to be one `STAGE: error: ...` line with a non-zero exit and nothing run."""
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"{stage}: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and not done.stdout
    return done.stderr


@pytest.mark.parametrize("override, message", [
    ("profile.study.repeets=3", "Key 'repeets' not in 'StudySection' full_key: profile.study.repeets"),
    ("profile.sensitivity.prompts=many", "could not be converted to Integer full_key: profile.sensitivity.prompts"),
    ("-m profile.serving.repeat=1,2", "Key 'repeat' not in 'ServingSection'"),  # a sweep: its first job's
])
def test_a_wrong_key_or_type_in_a_profile_override_fails_at_composition_with_one_line(override, message):
    assert message in one_line_error(run_stage("study", "profile=smoke", *override.split(), "results_dir=/tmp/x"))


def test_a_wrong_key_in_a_profile_yaml_fails_at_composition_with_one_line(tmp_path):
    """A profile of its own (found through hydra.searchpath) that misspells a key of the study's section."""
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "misspelt.yaml").write_text(
        "# @package _global_\ndefaults: [smoke, _self_]\nprofile:\n  name: misspelt\n  study:\n    repeets: 3\n")
    error = one_line_error(run_stage("sampling", f"hydra.searchpath=[file://{tmp_path}]", "profile=misspelt"),
                           "sampling")
    assert "In 'profile/misspelt'" in error and "Key 'repeets' not in 'StudySection'" in error


def test_a_key_added_to_a_typed_section_fails_before_the_stage():
    """`+key=value` passes composition (Hydra opens the config to add it); validate refuses it in one line."""
    with pytest.raises(RakvError, match=r"profile.study.repeets: not a key of StudySection"):
        validate(composed("config", "+profile.study.repeets=3"))


@pytest.mark.parametrize("profile", PROFILES)
def test_a_stage_takes_its_section_as_its_dataclass_with_the_composed_values(profile):
    cfg = composed("feasibility", f"profile={profile}")
    study, serving = section(cfg.profile.study), section(cfg.profile.serving)
    assert isinstance(study, StudySection) and isinstance(serving, ServingSection)
    assert study.new_tokens == cfg.profile.feasibility.new_tokens and study.repeats == 0  # feasibility's interpolation
    assert serving.rates == OmegaConf.to_container(cfg.profile.serving.rates)  # 1.5 and 4 keep their types


@pytest.mark.parametrize("name", configuration_names())
def test_every_configuration_is_composed_by_hydra_onto_its_schema(name):
    entry = OmegaConf.load(CONF_DIR / "configuration" / f"{name}.yaml")
    chosen = configuration(name)
    assert (chosen.name, chosen.pair, chosen.proposer) == (name, entry.pair, entry.proposer)


LAUNCHERS = ("joblib", "local", "slurm")


def launcher_config(name: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={name}"], return_hydra_config=True)
    return cfg.hydra.launcher


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_composes(launcher):
    assert launcher_config(launcher)._target_.startswith("hydra_plugins.")


def test_the_local_submitit_launcher_is_the_slurm_one_but_for_the_executor():
    """CI exercises slurm.yaml's path through local.yaml: every key they have in common holds the same value."""
    local, slurm = launcher_config("local"), launcher_config("slurm")
    assert local._target_.endswith("LocalLauncher") and slurm._target_.endswith("SlurmLauncher")
    differing = {key for key in set(local) & set(slurm) - {"_target_"} if local[key] != slurm[key]}
    assert not differing, f"local.yaml and slurm.yaml differ in {sorted(differing)}"


@pytest.mark.parametrize("override, message", [
    ("controller.k_set=[0,3]", "k_set values must be 0 or one of"),
    ("controller.beta=1.5", "beta must be in"),
    ("controller.memory_penalty_s_per_byte=-1", "memory_penalty_s_per_byte must be >= 0"),
    ("controller.memory_budget_mib=0", "memory_budget_mib must be positive"),
    ("cache.budget_mib=0", "cache.budget_mib must be positive"),
    ("kernels=turbo", "unknown kernels mode"),
    ("device=gpu0", "is not a torch device"),
    ("calibration.recalibrate=sometimes", "calibration.recalibrate must be"),
    ("configurations=[nonesuch]", "unknown configuration 'nonesuch'"),
    ("datasets=[humaneval,nonesuch]", "dataset 'nonesuch' has no entry"),
    ("experiment.scenarios=[partial-150]", "partial scenario rate"),
    ("experiment.strategies=[spec-k3]", "unknown strategy 'spec-k3'"),
    ("profile.study.new_tokens=0", "new_tokens must be >= 1"),
    ("study.shard_index=2", "study.shard_index must be in"),
])
def test_each_rule_fails_the_composed_config_with_one_line(override, message):
    with pytest.raises(RakvError, match=message):
        validate(composed("config", override))


# The layers, bottom up, and what each may import (besides itself): runtime (one request), serving (several
# requests in flight), experiments (the pipeline around them: the studies run both), bench (the benchmarks' logic
# behind scripts/bench_*.py and the vLLM peer's scripts: it runs both, never the pipeline; the experiments read its
# shipped reports through its records, rakv.bench.peer_reports); `rakv.cli`, the command, sits on top of runtime
# and serving.
MAY_IMPORT = {"runtime": set(), "serving": {"runtime"}, "experiments": {"runtime", "serving", "bench"},
              "bench": {"runtime", "serving"}}
LAYER_MODULES = [(layer, p) for layer in MAY_IMPORT for p in sorted((SRC / layer).glob("*.py"))]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rakv"):
            names.add(node.module.removeprefix("rakv").lstrip(".") or next(a.name for a in node.names))
        elif isinstance(node, ast.Import):
            names.update(a.name.removeprefix("rakv.") for a in node.names if a.name.startswith("rakv."))
    return {name.split(".")[0] for name in names}


def test_the_package_is_its_layers_and_the_command():
    assert {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(MAY_IMPORT)
    assert {p.stem for p in SRC.glob("*.py")} == {"__init__", "cli"}


@pytest.mark.parametrize("layer, path", LAYER_MODULES, ids=[f"{layer}.{p.stem}" for layer, p in LAYER_MODULES])
def test_each_layer_imports_only_the_layers_below_it(layer, path):
    imported = imported_modules(path)
    outside = imported - MAY_IMPORT[layer] - {layer}
    assert imported <= MAY_IMPORT[layer] | {layer}, f"{layer}.{path.stem} imports {outside}"


def test_the_command_line_never_imports_the_experiments():
    assert imported_modules(SRC / "cli.py") <= {"runtime", "serving"}


def module_imports(path: Path) -> set[str]:
    """The rakv modules a file imports, lazily inside functions too (`rakv.runtime.kernels`, ...)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rakv"):
            for alias in node.names:  # `from rakv.runtime import kernels` names a module
                candidate = f"{node.module}.{alias.name}"
                names.add(candidate if (SRC.parent / (candidate.replace(".", "/") + ".py")).exists() else node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("rakv."))
    return names


def test_no_module_of_rakv_is_part_of_an_import_cycle():
    graph = {".".join(p.relative_to(SRC.parent).with_suffix("").parts): module_imports(p) for p in SRC.rglob("*.py")}
    graph = {m.removesuffix(".__init__"): {d for d in deps if d in graph or f"{d}.__init__" in graph}
             for m, deps in graph.items()}

    def reaches(start, goal, seen):
        return any(d == goal or (d not in seen and not seen.add(d) and reaches(d, goal, seen))
                   for d in graph.get(start, ()))

    cyclic = sorted(m for m in graph if reaches(m, m, set()))
    assert not cyclic, f"modules in an import cycle: {', '.join(cyclic)}"


def test_no_function_in_src_or_scripts_is_over_60_lines():
    files = sorted(SRC.rglob("*.py")) + sorted((SRC.parents[1] / "scripts").glob("*.py"))
    long = [f"{p.relative_to(SRC.parents[1])}:{node.name} ({node.end_lineno - node.lineno + 1})" for p in files
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60]
    assert not long, f"functions over 60 lines: {', '.join(long)}"
