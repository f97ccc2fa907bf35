"""Held functions: the package functions an exercise forbids are not in the sandbox at all.

:mod:`flashlab.course.grader.served` replaces their bodies in the sandbox's package copy
by a request to the grader, which runs the real function unless an exercise that
forbids it is being checked. These tests check the rewrite, the grader's side of the
wire (what it refuses to decode or run), and, in a sandbox, that the chapter's own
cells still get the real results while the exercise's checks see the function refuse.
"""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from flashlab.course.assignments import replace_solution_body, solution_body
from flashlab.course.grader import codec, grading, sandbox, served, session
from flashlab.reference.softmax import OnlineSoftmaxState, softmax

FIXTURE = Path(__file__).parent / "fixtures" / "90_toy_chapter.ipynb"
SOFTMAX = "flashlab.reference.softmax:softmax"
UPDATE = "flashlab.reference.softmax:OnlineSoftmaxState.update"

SOURCE = '''"""A module."""
import functools


@functools.lru_cache(maxsize=None)
def square(
    x: int,
) -> int:
    """x squared."""
    return x * x


class Box:
    def __init__(self, v):
        self.v = v

    def twice(self, k=2):
        return self.v * k


def kept(x):
    return square(x) + 1
'''


def test_hold_source_replaces_bodies_and_keeps_the_rest() -> None:
    held = served.hold_source(SOURCE, "flashlab.toy", ["square", "Box.twice"])
    ns: dict = {}
    exec(compile(held, "<held>", "exec"), ns)  # noqa: S102 - our own text
    assert "x * x" not in held and "self.v * k" not in held, held
    assert "return square(x) + 1" in held and "self.v = v" in held
    assert ns["square"].__doc__ == "x squared." and hasattr(ns["square"], "cache_info")
    assert "flashlab.toy:Box.twice" in held and "'flashlab.toy:square', None" in held
    assert ns["Box"](3).v == 3


def test_hold_source_names_what_it_cannot_find() -> None:
    with pytest.raises(LookupError, match="no def 'cube'"):
        served.hold_source(SOURCE, "flashlab.toy", ["cube"])
    with pytest.raises(LookupError, match="no class 'Crate'"):
        served.hold_source(SOURCE, "flashlab.toy", ["Crate.twice"])


def test_the_package_copy_holds_no_forbidden_body(tmp_path: Path) -> None:
    specs = session.held_specs(session.FORBIDDEN)
    site = sandbox.package_copy(tmp_path, held=specs)
    text = (site / "flashlab" / "reference" / "softmax.py").read_text()
    assert "flashlab._held" in text and (site / "flashlab" / "_held.py").is_file()
    run = subprocess.run(
        [sys.executable, "-c", "import inspect, flashlab.reference.flash1 as f\n"
         "src = inspect.getsource(f.flash1_step)\n"
         "assert 'np.exp' not in src and 'flashlab._held' in src, src\n"
         "import flashlab.reference, flashlab.sim.events, flashlab.memory, flashlab.cycles\n"
         "try:\n    f.flash1_step(1, 2, 3, 4, 5)\nexcept RuntimeError as e:\n    print(e)\n"],
        cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "flash1_step runs only when the grader is there to answer" in run.stdout


def _request(spec: str, owner: object, *args: object, **kwargs: object) -> str:
    return codec.dumps({"spec": spec, "self": owner, "args": args, "kwargs": kwargs}, objects=True)


def test_the_grader_runs_a_held_function_on_data() -> None:
    x = np.array([[1.0, 3.0, 2.0, 5.0]])
    reply = codec.loads(served.answer(_request(SOFTMAX, None, x), frozenset({SOFTMAX})))
    assert np.array_equal(reply["ok"], softmax(x))
    state = OnlineSoftmaxState.empty(())
    reply = codec.loads(served.answer(_request(UPDATE, state, np.array([1.0, 3.0])), frozenset({UPDATE})),
                        objects=True)
    want = state.update(np.array([1.0, 3.0]))
    assert np.array_equal(reply["ok"].m, want.m) and np.array_equal(reply["ok"].l, want.l)
    assert reply["ok"].m.shape == (), "a 0-d array stays 0-d on the wire"


def test_the_grader_refuses_what_it_must() -> None:
    x = np.array([1.0, 2.0])

    def raised(text: str, served_: frozenset, refused: frozenset = frozenset()) -> tuple[str, str]:
        return codec.loads(served.answer(text, served_, refused))["raised"]

    ename, message = raised(_request(SOFTMAX, None, x), frozenset({SOFTMAX}), frozenset({SOFTMAX}))
    assert ename == "RuntimeError" and "switched off while this exercise is graded" in message
    assert raised(_request("flashlab.reference.naive:attention", None, x), frozenset({SOFTMAX}))[0] == \
        "PermissionError"
    assert raised(_request("os:system", None, "true"), frozenset({SOFTMAX}))[0] == "PermissionError"
    forged = ('{"__t":"dict","v":[["spec","%s"],["self",null],["args",{"__t":"tuple","v":'
              '[{"__t":"obj","cls":"%s","fields":{}}]}],["kwargs",{"__t":"dict","v":[]}]]}')
    before = set(sys.modules)
    for cls in ("antigravity:Thing", "subprocess:Popen", "flashlab.course.grader.session:Outcome",
                "flashlab.reference.softmax:softmax", "flashlab.kernels:torch._guards.Guard",
                "flashlab.reference.softmax:np.random.Generator", "flashlab.hardware:__class__"):
        ename, message = raised(forged % (SOFTMAX, cls), frozenset({SOFTMAX}))
        assert ename == "CodecError" and "cannot send" in message, (cls, ename, message)
    assert "antigravity" not in set(sys.modules) - before
    assert raised(_request(UPDATE, None, x), frozenset({UPDATE}))[0] == "TypeError"  # self must be the class's
    assert raised("not json", frozenset({SOFTMAX}))[0] == "CodecError"


def test_the_server_answers_and_times_out() -> None:
    server = served.Server({SOFTMAX, "flashlab.reference.naive:attention"})
    try:
        x = np.array([[0.0, 1.0]])
        assert np.array_equal(codec.loads(server.call(_request(SOFTMAX, None, x), (), 60))["ok"], softmax(x))
        big = np.zeros((16, 2000, 8))  # a long call is stopped, and the next one still works
        text = _request("flashlab.reference.naive:attention", None, big, big, big)
        assert codec.loads(server.call(text, (), 0.05))["raised"][0] == "TimeoutError"
        assert np.array_equal(codec.loads(server.call(_request(SOFTMAX, None, x), (), 60))["ok"], softmax(x))
    finally:
        server.close()


@pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="the sandbox cannot run here")
def test_chapter_cells_get_the_real_function_and_the_exercise_does_not(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """In a sandbox: a cell of the chapter calls the held softmax and gets its value; the
    student's softmax, which calls it too, raises while the tests call it."""
    monkeypatch.setitem(session.FORBIDDEN, "toy-ex1", (SOFTMAX,))
    key = nbformat.read(FIXTURE, as_version=4)
    nb = copy.deepcopy(key)
    at = next(i for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    nb.cells.insert(at, nbformat.v4.new_code_cell(
        "from flashlab.reference.softmax import softmax as _package\n"
        "print('chapter cell:', _package(np.array([0.0, np.log(3.0)])).round(6).tolist())"))
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade_id") == "toy-ex1-solution":
            cell.source = replace_solution_body(cell.source, "    return _package(x)\n")
        elif meta.get("solution"):
            cell.source = replace_solution_body(cell.source, solution_body(cell.source))
    executed = tmp_path / "executed.ipynb"
    # The code policy would refuse the notebook before it runs (it names the held softmax);
    # without it, the grader's holding must stop the call on its own.
    scores = {s.exercise: s for s in grading.grade_notebook(nb, FIXTURE, timeout=30, executed_path=executed,
                                                             code_policy=False)}
    assert scores["toy-ex1-tests"].points == 0
    assert "softmax is switched off while this exercise is graded" in scores["toy-ex1-tests"].message
    assert scores["toy-ex2-tests"].points == 1
    printed = "".join(o.get("text", "") for c in nbformat.read(executed, as_version=4).cells
                      for o in c.get("outputs", []))
    assert "chapter cell: [0.25, 0.75]" in printed


def test_held_module_names_a_real_module() -> None:
    for spec in session.held_specs(session.FORBIDDEN):
        module, _, qual = spec.partition(":")
        owner = importlib.import_module(module)
        for part in qual.split("."):
            owner = getattr(owner, part)
        assert callable(owner), spec
