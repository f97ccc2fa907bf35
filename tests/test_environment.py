"""environment.yml (conda cannot run here) must parse and list exactly pyproject's dependencies."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def _key(spec: str) -> tuple[str, str, str]:
    req = Requirement(spec)
    return req.name.lower().replace("_", "-"), str(req.specifier), str(req.marker or "")


def test_environment_yml_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "flashlab"
    conda, pip = [], []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip += dep["pip"]
        else:
            conda.append(dep)
    assert any(d.startswith("python") for d in conda) and "pip" in conda
    assert "-e ." in pip
    listed = {_key(d) for d in conda + pip if not d.startswith(("python", "-e")) and d != "pip"}

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_key(d) for d in project["dependencies"]}
    for extra in ("book", "test"):
        wanted |= {_key(d) for d in project["optional-dependencies"][extra]}
    assert listed == wanted, f"only in environment.yml: {listed - wanted}; only in pyproject: {wanted - listed}"
