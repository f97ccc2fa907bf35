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


# Third-party modules imported by the package or its tests, and the distribution that
# provides each (the import name and the name on PyPI differ for some).
DISTRIBUTION = {"yaml": "pyyaml", "jupyter_client": "jupyter-client", "ml_dtypes": "ml-dtypes", "jupyter_server_mathjax": "jupyter-server-mathjax",
                "IPython": "ipython", "zmq": "pyzmq"}


def _third_party_imports() -> set[str]:
    import ast
    import sys

    found: set[str] = set()
    local = {"flashlab", *(p.stem for p in (ROOT / "tests").glob("*.py"))}  # the package and the tests' own modules
    for path in [*(ROOT / "flashlab").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in local:
                    found.add(top)
    return found


def test_every_import_is_declared():
    """A module the code imports must be a dependency of the package or of an extra, so a
    fresh `pip install -e .[book,test]` can run everything."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    declared = {Requirement(s).name.lower().replace("_", "-") for s in specs}
    missing = {m for m in _third_party_imports() if DISTRIBUTION.get(m, m).replace("_", "-") not in declared}
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"


def test_requires_python_covers_the_standard_library_used():
    """tests import tomllib, new in Python 3.11: requires-python and environment.yml say 3.11."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python>=3.11" in env["dependencies"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
