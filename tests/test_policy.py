"""The submission code policy (flashlab.course.grader.policy): honest code passes, each rule refuses.

The answer key (every solution cell of notebooks/*.ipynb, as the book has it and as the
student version's stub), the right answers of tests/mutations/correct.yaml and the
mistakes of mutants.yaml must pass: the policy may never refuse an honest answer. Then
each rule refuses a minimal example, naming the construct and its line. The grading
path (a refused notebook scores 0 everywhere without running, --no-code-policy) is
tested on the toy chapter without a kernel.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest
import yaml

from flashlab.course import assignments
from flashlab.course.grader import grade_notebook, policy
from flashlab.course.grader.notebook import NOTEBOOKS_DIR, exercises, replace_solution_body
from flashlab.course.grader.session import FORBIDDEN, held_specs

HERE = Path(__file__).parent
FIXTURE = HERE / "fixtures" / "90_toy_chapter.ipynb"
BOOK = [*sorted(NOTEBOOKS_DIR.glob("*.ipynb")), FIXTURE]
STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
#: Mutants the policy refuses: wrong answers that reach a private package function.
REFUSED_MUTANTS = {"ch06-ex1-calls-build": "`_build`"}
#: ... and wrong answers that call the package function their exercise asks them to write.
REFUSED_MUTANTS.update({name: "an exercise asks you to write it yourself" for name in (
    "ch05-ex4-calls-warp-exchange", "ch06-ex2-calls-package", "ch03-ex1-calls-flash1-step",
    "ch04-ex1-calls-count-flash", "ch05-ex2-calls-schedule", "ch07-ex2-calls-softexp-helpers",
    "ch10-ex1-calls-combine", "ch10-ex2-calls-ring-step-bytes")})
#: Every function the grader holds, as grading passes them to the policy.
HELD = held_specs(FORBIDDEN)


def _solutions() -> dict[str, tuple[str, list[str]]]:
    found = {}
    for path in BOOK:
        nb = nbformat.read(path, as_version=4)
        sources = [c.source for c in nb.cells if c.cell_type == "code"]
        for ex in exercises(path):
            found[ex.name] = (nb.cells[ex.solution_cell].source, sources)
    return found


SOLUTIONS = _solutions()
VARIANTS = [e for name in ("correct.yaml", "mutants.yaml")
            for e in yaml.safe_load((HERE / "mutations" / name).read_text(encoding="utf-8"))]


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_the_answer_key_and_the_stub_pass(name: str) -> None:
    source, book = SOLUTIONS[name]
    for cell in (source, replace_solution_body(source, STUB)):
        found = policy.check_cells([(0, name, cell)], book, HELD)
        assert found == [], f"{name}: {[str(v) for v in found]}"


@pytest.mark.parametrize("entry", VARIANTS, ids=[e["id"] for e in VARIANTS])
def test_the_banks_answers_pass(entry: dict) -> None:
    source, book = SOLUTIONS[entry["exercise"]]
    found = policy.check_cells([(0, entry["id"], replace_solution_body(source, entry["body"]))], book, HELD)
    if entry["id"] in REFUSED_MUTANTS:
        assert found and any(REFUSED_MUTANTS[entry["id"]] in v.what for v in found), [str(v) for v in found]
    else:
        assert found == [], f"{entry['id']}: {[str(v) for v in found]}"


BOOK_CELLS = ["import numpy as np\nimport torch\nx = np.arange(3.0)"]
# (cell source, the line refused, words the message must contain)
REFUSED = [
    ("import os", 1, "importing `os`"),
    ("import numpy as np\nfrom flashlab.course import grader", 2, "importing `flashlab.course.grader`"),
    ("from flashlab.lab import bench", 1, "`flashlab.lab.bench`"),
    ("from numpy import load", 1, "`numpy.load`"),
    ("from . import x", 1, "relative imports"),
    ("from math import *", 1, "import *"),
    ("y = 1\nf = getattr", 2, "the name `getattr` is not allowed"),
    ("g = globals()['np']", 1, "the name `globals`"),
    ("ok = 'x' in globals()\nv = vars()", 2, "the name `vars`"),
    ("a = 1\n\n__flashlab__ = None", 3, "`__flashlab__`"),
    ("def f(x):\n    return x.__class__", 2, "the attribute `__class__`"),
    ("def f(x):\n    return x._private", 2, "the attribute `_private`"),
    ("def f():\n    yield 1\ng = f()\nh = g.gi_frame", 4, "the attribute `gi_frame`"),
    ("def f(frame):\n    return frame.f_back.f_globals", 2, "the attribute `f_back`"),
    ("def f(m):\n    return m.modules", 2, "the attribute `modules`"),
    ("y = np.lib.stride_tricks.as_strided", 1, "`as_strided`"),
    ("import flashlab.reference\nz = flashlab.reference.os", 2, "the attribute `os`"),
    ("y = sys", 1, "the name `sys`"),
    ("s = 'a__b'", 1, "a string containing `__`"),
    ("s = b'__'", 1, "a string containing `__`"),
    ("v = 1\ns = f'{v}__'", 2, "a string containing `__`"),
    ("np.asarray = list", 1, "changing `np.asarray`"),
    ("import math\nmath.exp = abs", 2, "changing `math.exp`"),
    ("x[0] = 5.0", 1, "changing `x[0]`"),
    ("m = np\nm.exp = abs", 2, "changing `m.exp`"),
    ("del np.exp", 1, "changing `np.exp`"),
    ("np.e += 1", 1, "changing `np.e`"),
    ("t = torch.load", 1, "`torch.load`"),
    ("def f(fmt, x):\n    return fmt.format(x)", 2, "`.format` on a format string that is not a literal"),
    ("def f(x):\n    return '{0.real}'.format(x)", 2, "looks up an attribute or an item"),
    ("def f(x):\n    return '{0[k]}'.format_map(x)", 2, "looks up an attribute or an item"),
    ("class A:\n    def __eq__(self, other):\n        return True", 2, "`__eq__`"),
    ("def __init__(self):\n    pass", 1, "`__init__`"),
    ("%time x = 1", 1, "IPython magics"),
    ("y = 2\n!ls", 2, "IPython magics"),
    ("def f(:\n", 1, "does not parse"),
    ("y = _ih", 1, "`_ih`"),
    ("y = display", 1, "the name `display`"),
    ("from typing import get_type_hints", 1, "`get_type_hints`"),
]


@pytest.mark.parametrize("source, line, words", REFUSED, ids=[r[2] + f"-{i}" for i, r in enumerate(REFUSED)])
def test_each_rule_refuses_a_minimal_example(source: str, line: int, words: str) -> None:
    found = policy.check_cells([(7, "toy-ex1-solution", source)], BOOK_CELLS)
    assert found, f"{source!r} passed the policy"
    assert any(v.line == line and words in v.what for v in found), [str(v) for v in found]
    assert str(found[0]).startswith("cell 7 (toy-ex1-solution), line ")


HELD_CELLS = ["from flashlab.sim.events import pingpong, Tile\nfrom flashlab.reference import ring"]
# Naming a held function at all (a table of its answers could be built while the chapter's
# cells run, when the grader still serves it): (cell, line, the function named)
HELD_REFUSED = [
    ("table = {s: pingpong(Tile(), 16, s) for s in range(1, 16)}", 1, "pingpong"),
    ("from flashlab.reference.ring import shard_positions as sp", 1, "shard_positions"),
    ("x = 1\nt = ring.shard_positions(4, 8, 0)", 2, "shard_positions"),
    ("import flashlab.sim.events as ev\nf = ev.pingpong", 2, "pingpong"),
    ("from flashlab.sim import events\ndef f():\n    return events.pingpong", 3, "pingpong"),
]


@pytest.mark.parametrize("source, line, name", HELD_REFUSED)
def test_naming_a_held_function_is_refused(source: str, line: int, name: str) -> None:
    found = policy.check_cells([(3, "", source)], HELD_CELLS, ["flashlab.sim.events:pingpong",
                                                             "flashlab.reference.ring:shard_positions"])
    assert any(v.line == line and f"`{name}`" in v.what and "write it yourself" in v.what for v in found), \
        [str(v) for v in found]


def test_a_students_own_function_of_a_held_name_passes() -> None:
    """Writing ``pingpong`` yourself is allowed where the book did not import the package's
    (where it did, the name stays refused: a cell before the student's def would reach the
    book's)."""
    source = "def pingpong(tile, n, s):\n    return [tile, n, s]\nx = pingpong(1, 4, 2)"
    held = ["flashlab.sim.events:pingpong"]
    assert policy.check_cells([(0, "", source)], ["import numpy as np"], held) == []
    assert policy.check_cells([(0, "", source)], HELD_CELLS, held) != []


ALLOWED = [
    "class S:\n    def __init__(self, m):\n        self.m = m\n    def __repr__(self):\n        return 'S'",
    "from dataclasses import dataclass\n@dataclass\nclass P:\n    x: float\n    def __post_init__(self):\n"
    "        self.x = float(self.x)",
    "def f(x, _unused=None):\n    _y = x + 1\n    for _ in range(2):\n        pass\n    return _y",
    "def f(out, state):\n    out[0] = 1\n    state.m = 2\n    out += 1\n    return out",
    "y = np.zeros(3)\ny[0] = 1.0\nz = y.copy()\nz[1:] += 2",
    "import triton\nimport triton.language as tl\n@triton.jit\ndef k(X, B: tl.constexpr):\n"
    "    tl.store(X + tl.arange(0, B), tl.load(X + tl.arange(0, B)))",
    "from flashlab.reference import softmax\nfrom flashlab import reference\nimport numpy.linalg as la",
    "def f(x):\n    return '{:.3f} {name}'.format(x, name='a') + f'{x!r:>5}'",
    "if 'softmax' not in globals():\n    pass",
]


@pytest.mark.parametrize("source", ALLOWED)
def test_honest_constructs_pass(source: str) -> None:
    assert policy.check_cells([(0, "", source)], BOOK_CELLS) == []


def _toy(body: str, before: str | None = None) -> nbformat.NotebookNode:
    nb = nbformat.read(FIXTURE, as_version=4)
    nb = copy.deepcopy(nb)
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "toy-ex1-solution")
    nb.cells[at].source = replace_solution_body(nb.cells[at].source, body)
    if before is not None:
        nb.cells.insert(at, nbformat.v4.new_code_cell(before))
    return nb


def test_only_the_students_cells_are_checked() -> None:
    book = nbformat.read(FIXTURE, as_version=4)
    assert policy.check_notebook(book, book) == []
    edited = _toy("return np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)", before="y = getattr")
    (violation,) = policy.check_notebook(edited, book)
    assert (violation.cell, violation.label, violation.line) == (5, "", 1)


def test_a_refused_notebook_scores_zero_without_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebook is refused before any kernel starts (KernelSession is never made)."""
    from flashlab.course.grader import grading, sandbox

    monkeypatch.setattr(sandbox, "require", lambda unsafe: False)

    def no_kernel(*a, **k):
        raise AssertionError("a refused notebook must not be run")

    monkeypatch.setattr(grading, "KernelSession", no_kernel)
    nb = _toy("import sys\n__flashlab__ = sys\nreturn x")
    scores = grade_notebook(nb, FIXTURE)
    assert [(s.points, s.status) for s in scores] == [(0.0, "error"), (0.0, "error")]
    assert "cell 5 (toy-ex1-solution), line 3: importing `sys`" in scores[0].message
    assert scores[0].message.startswith("the notebook was not run") and "(and " in scores[0].message
    ran = grade_notebook(nb, FIXTURE, code_policy=False)  # with the policy off, it is run
    assert "must not be run" in ran[0].message


def test_the_command_line_flag(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = {}

    def fake_grade(*a, **k):
        seen.update(k)
        return []

    monkeypatch.setattr(assignments, "grade", fake_grade)
    (tmp_path / "sub").mkdir()
    for argv, expected in (([], True), (["--no-code-policy"], False)):
        assert assignments.main(["grade", str(tmp_path / "sub"), "--out", str(tmp_path / "g.csv"), "--quiet",
                                 *argv]) == 0
        assert seen["code_policy"] is expected
