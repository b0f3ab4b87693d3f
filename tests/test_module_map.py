"""The house's map and room sizes: docs/layout.md's module map is generated from the modules' docstrings and is
current (scripts/write_module_map.py), and no module of the package or the scripts grows past 700 lines."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 700  # lines per module (issue 61): past it a module holds more than one job


def module_lines() -> dict[str, int]:
    files = sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
    return {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in files}


def test_no_module_is_over_700_lines():
    sizes = module_lines()
    assert len(sizes) > 80
    long = [f"{path} ({n})" for path, n in sizes.items() if n > LIMIT]
    assert not long, f"modules over {LIMIT} lines (split them by job): {', '.join(long)}"


def test_the_module_map_is_current():
    done = subprocess.run([sys.executable, "scripts/write_module_map.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_map_check_fails_on_a_stale_map(tmp_path, monkeypatch):
    """Positive control: a map that lost a row is stale."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import write_module_map
    finally:
        sys.path.pop(0)
    fresh = write_module_map.module_map()
    assert "| `run_layout` |" in fresh and "| `summary` |" in fresh
    stale = (ROOT / "docs" / "layout.md").read_text().replace("| `run_layout` |", "| `run_layout_old` |")
    target = tmp_path / "layout.md"
    target.write_text(stale)
    monkeypatch.setattr(write_module_map, "MAP", target)
    monkeypatch.setattr(sys, "argv", ["write_module_map.py", "--check"])
    assert write_module_map.main() == 1
