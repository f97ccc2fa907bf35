"""The import rule of ARCHITECTURE.md: the teaching core imports neither flashlab.lab nor
flashlab.course, the lab does not import the course, and no package has an import cycle.

`make test` runs `lint-imports` on the package itself; these tests also show that the
contract catches a broken rule, on a copy of the package with one bad import added."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def lint_available() -> None:
    if not LINT.exists():
        pytest.skip("lint-imports is not installed (pip install import-linter)")


def test_the_package_keeps_its_contracts(lint_available) -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    "module, bad_import, contract",
    [
        ("hardware.py", "import flashlab.lab.results", "course > lab > teaching core"),
        ("kernels/forward.py", "import flashlab.course.show", "course > lab > teaching core"),
        ("lab/measure.py", "import flashlab.course.site", "course > lab > teaching core"),
        ("reference/common.py", "import flashlab.reference.naive", "no import cycles"),
    ],
)
def test_a_broken_rule_is_caught(tmp_path: Path, lint_available, module: str, bad_import: str, contract: str) -> None:
    shutil.copytree(ROOT / "flashlab", tmp_path / "flashlab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "flashlab" / module
    target.write_text(target.read_text() + f"\n{bad_import}  # breaks the rule\n")
    result = _lint(tmp_path)
    assert result.returncode != 0, result.stdout[-3000:]
    assert f"{contract}" in result.stdout and "BROKEN" in result.stdout
