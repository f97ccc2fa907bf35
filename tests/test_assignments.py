"""Assignments: student versions built with nbgrader hide the solutions, and the
checks grade them.

Covers every notebooks/*.ipynb (found by glob, so new chapters are tested
without edits) and the fixture tests/fixtures/90_toy_chapter.ipynb, a toy
chapter that self-tests the machinery, including wrong answers the checks must
catch.

Exercise counts: every chapter 01+ has 2-4 exercises. 00_preface is not a
chapter with content, so it may have none (or 2-4 if it ever gets some).
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from flashlab.assignments import (
    BEGIN_HIDDEN,
    BEGIN_SOLUTION,
    END_HIDDEN,
    END_SOLUTION,
    NOTEBOOKS_DIR,
    build,
    exercises,
)

FIXTURE = Path(__file__).parent / "fixtures" / "90_toy_chapter.ipynb"
BOOK = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
ALL = [*BOOK, FIXTURE]
# Notebooks that carry exercises (the preface has none); the per-exercise tests run over these.
GRADED = [p for p in ALL if exercises(p)]
CELL_TIMEOUT_S = 300

# Lines too common to count as leaked solution text.
TRIVIAL = re.compile(r"^(pass|return|else:|try:|finally:|break|continue|[\s()\[\]{},:;]*)$")

# Wrong answers the checks must catch: (solution grade_id, body, caught by the visible tests alone?)
WRONG = {
    "softmax-without-max": (
        "toy-ex1-solution",
        ["e = np.exp(x)", "return e / e.sum(axis=-1, keepdims=True)"],
        False,  # right on small inputs: only the hidden overflow test sees it
    ),
    "merge-without-rescale": ("toy-ex2-solution", ["return max(m_a, m_b), l_a + l_b"], True),
}


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


# ---------------------------------------------------------------- notebook helpers


def _cell(nb: nbformat.NotebookNode, grade_id: str) -> nbformat.NotebookNode:
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            return cell
    raise KeyError(f"no cell with grade_id {grade_id!r}")


def _error(cell: nbformat.NotebookNode) -> str | None:
    """Name of the exception a cell raised when executed, or None."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return out["ename"]
    return None


def _region(source: str, begin: str, end: str) -> tuple[list[str], list[str]]:
    """(lines inside begin/end regions, lines outside), stripped."""
    inside, outside, within = [], [], False
    for line in source.splitlines():
        if begin in line:
            within = True
        elif end in line:
            within = False
        else:
            (inside if within else outside).append(line.strip())
    return inside, outside


def _leaks(source: nbformat.NotebookNode, student: nbformat.NotebookNode) -> list[str]:
    """Markers, and non-trivial lines that the source has only inside solution or
    hidden-test regions, found in ``student``."""
    student_text = "\n".join(cell.source for cell in student.cells)
    student_lines = {line.strip() for line in student_text.splitlines()}
    found = [m for m in (BEGIN_SOLUTION, END_SOLUTION, BEGIN_HIDDEN, END_HIDDEN) if m in student_text]
    for begin, end in ((BEGIN_SOLUTION, END_SOLUTION), (BEGIN_HIDDEN, END_HIDDEN)):
        secret, public = set(), set()
        for cell in source.cells:
            inside, outside = _region(cell.source, begin, end)
            secret.update(inside)
            public.update(outside)
        found += sorted(line for line in secret - public if not TRIVIAL.match(line) and line in student_lines)
    return found


def _with_body(nb: nbformat.NotebookNode, solution_id: str, body: list[str]) -> nbformat.NotebookNode:
    """Copy of ``nb`` whose solution ``solution_id`` is ``body``: replaces the
    region between the markers (source notebook) or nbgrader's stub (student one)."""
    nb = copy.deepcopy(nb)
    cell = _cell(nb, solution_id)
    lines = cell.source.splitlines()
    if any(BEGIN_SOLUTION in line for line in lines):
        start = next(i for i, line in enumerate(lines) if BEGIN_SOLUTION in line) + 1
        stop = next(i for i, line in enumerate(lines) if END_SOLUTION in line)
        indent = re.match(r"\s*", lines[start - 1]).group(0)
    else:
        stop = next(i for i, line in enumerate(lines) if "raise NotImplementedError()" in line) + 1
        start = stop - 2 if "YOUR CODE HERE" in lines[stop - 2] else stop - 1
        indent = re.match(r"\s*", lines[stop - 1]).group(0)
    cell.source = "\n".join(lines[:start] + [indent + b for b in body] + lines[stop:])
    return nb


def _execute(nb: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return nb


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Build the book's and the fixture's student versions; map notebook stem -> Chapter."""
    root = tmp_path_factory.mktemp("assignments")
    chapters = build(root / "book", BOOK) + build(root / "fixture", [FIXTURE])
    return {ch.name: ch for ch in chapters}


@pytest.fixture(scope="module")
def executed(built: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], nbformat.NotebookNode]:
    """Every notebook with exercises executed whole, as solutions ("source") and as
    handed out ("student"), plus the fixture's wrong answers; run in parallel,
    one kernel per notebook."""
    jobs: dict[tuple[str, str], tuple[nbformat.NotebookNode, Path]] = {}
    for name, ch in built.items():
        cwd = ch.source.parent
        source = nbformat.read(ch.source, as_version=4)
        student = nbformat.read(ch.release, as_version=4)
        jobs[(name, "source")] = (source, cwd)
        jobs[(name, "student")] = (student, cwd)
        if ch.source == FIXTURE:
            for variant, (solution_id, body, _) in WRONG.items():
                jobs[(name, f"source:{variant}")] = (_with_body(source, solution_id, body), cwd)
                jobs[(name, f"student:{variant}")] = (_with_body(student, solution_id, body), cwd)
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {key: pool.submit(_execute, nb, cwd) for key, (nb, cwd) in jobs.items()}
        return {key: fut.result() for key, fut in futures.items()}


# ---------------------------------------------------------------- authoring convention


def test_fixture_exercises_are_parsed() -> None:
    found = exercises(FIXTURE)
    assert [ex.name for ex in found] == ["toy-ex1", "toy-ex2"]
    assert [ex.points for ex in found] == [2.0, 1.0]
    nb = nbformat.read(FIXTURE, as_version=4)
    for ex in found:
        assert nb.cells[ex.prompt_cell].cell_type == "markdown"
        assert BEGIN_SOLUTION in nb.cells[ex.solution_cell].source
        assert nb.cells[ex.tests_cell].metadata["nbgrader"]["grade_id"] == ex.tests_id
        assert ex.prompt_cell < ex.solution_cell < ex.tests_cell


def test_markers_without_metadata_are_rejected(tmp_path: Path) -> None:
    nb = nbformat.read(FIXTURE, as_version=4)
    del _cell(nb, "toy-ex2-solution").metadata["nbgrader"]
    broken = tmp_path / "broken.ipynb"
    nbformat.write(nb, broken)
    with pytest.raises(ValueError, match=r"broken.ipynb, cell \d+: contains '### BEGIN SOLUTION'"):
        exercises(broken)


def test_leak_check_flags_the_solutions() -> None:
    """The check below can fail: the source notebook leaks its own solutions."""
    nb = nbformat.read(FIXTURE, as_version=4)
    leaked = _leaks(nb, nb)
    assert BEGIN_SOLUTION in leaked and "z = x - x.max(axis=-1, keepdims=True)" in leaked
    assert "big = np.array([1000.0, 1001.0])" in leaked


def test_grade_ids_are_unique_across_the_book() -> None:
    owner: dict[str, str] = {}
    for path in ALL:
        for ex in exercises(path):
            for grade_id in (ex.solution_id, ex.tests_id):
                assert grade_id not in owner, f"{grade_id} in {path.name} is also in {owner[grade_id]}"
                owner[grade_id] = path.name


@pytest.mark.parametrize("path", BOOK, ids=_ids(BOOK))
def test_chapter_has_two_to_four_exercises(path: Path) -> None:
    found = exercises(path)
    number = int(path.stem[:2])
    allowed = ({0} if number == 0 else set()) | {2, 3, 4}
    assert len(found) in allowed, f"{path.name}: {len(found)} exercises, expected {sorted(allowed)}"
    for k, ex in enumerate(found, start=1):
        assert ex.points > 0, f"{path.name} {ex.tests_id}: points must be > 0"
        expected = f"ch{number:02d}-ex{k}"
        assert ex.name == expected and ex.tests_id == f"{expected}-tests", (
            f"{path.name} exercise {k}: grade_ids {ex.solution_id!r}/{ex.tests_id!r}, "
            f"expected {expected}-solution/{expected}-tests"
        )


# ---------------------------------------------------------------- the build


def test_every_notebook_with_exercises_gets_a_student_version(built: dict) -> None:
    expected = {p.stem for p in ALL if exercises(p)}
    assert set(built) == expected
    for ch in built.values():
        assert ch.release.is_file() and ch.solutions.is_file()
        assert ch.release.parent.parent.name == "release"


def test_build_is_idempotent(tmp_path: Path) -> None:
    first = build(tmp_path, [FIXTURE])
    before = first[0].release.read_text()
    stale = tmp_path / "release" / "99_removed_chapter" / "99_removed_chapter.ipynb"
    stale.parent.mkdir()
    stale.write_text("{}")
    second = build(tmp_path, [FIXTURE])
    assert second[0].release.read_text() == before
    assert not stale.exists()
    assert sorted(p.name for p in (tmp_path / "release").iterdir()) == [FIXTURE.stem]


def test_build_accepts_sparse_hand_written_metadata(tmp_path: Path) -> None:
    """Authors need not compute checksums or spell out every nbgrader key."""
    nb = nbformat.read(FIXTURE, as_version=4)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if meta:
            keep = ("grade_id", "points") if meta["grade"] else ("grade_id",)
            flags = {"grade": True} if meta["grade"] else {"solution": True}
            cell.metadata["nbgrader"] = {**{k: meta[k] for k in keep}, **flags,
                                         "checksum": "stale", "cell_type": "markdown"}
    sparse = tmp_path / FIXTURE.name
    nbformat.write(nb, sparse)
    (chapter,) = build(tmp_path / "out", [sparse])
    student = nbformat.read(chapter.release, as_version=4)
    assert "raise NotImplementedError()" in _cell(student, "toy-ex1-solution").source
    assert not _leaks(nb, student)


@pytest.mark.parametrize("path", GRADED, ids=_ids(GRADED))
def test_student_version_hides_solutions_and_hidden_tests(path: Path, built: dict) -> None:
    source = nbformat.read(path, as_version=4)
    student = nbformat.read(built[path.stem].release, as_version=4)
    leaked = _leaks(source, student)
    assert not leaked, f"{path.name}: the student version shows solution or hidden-test text: {leaked}"
    for cell in student.cells:
        assert cell.cell_type != "code" or (cell.outputs == [] and cell.execution_count is None)


# ---------------------------------------------------------------- executing them


@pytest.mark.slow
@pytest.mark.parametrize("path", GRADED, ids=_ids(GRADED))
def test_solutions_pass_every_test_cell(path: Path, built: dict, executed: dict) -> None:
    nb = executed[(path.stem, "source")]
    errors = {i: _error(c) for i, c in enumerate(nb.cells) if _error(c)}
    assert not errors, f"{path.name}: cells raised (index: exception) {errors}"


@pytest.mark.slow
@pytest.mark.parametrize("path", GRADED, ids=_ids(GRADED))
def test_student_version_fails_every_test_cell(path: Path, built: dict, executed: dict) -> None:
    nb = executed[(path.stem, "student")]
    for ex in built[path.stem].exercises:
        raised = _error(_cell(nb, ex.tests_id))
        assert raised in {"NotImplementedError", "AssertionError"}, (
            f"{path.name} {ex.tests_id}: with the stub, expected NotImplementedError or "
            f"AssertionError; got {raised or 'no error'}"
        )
    tests_ids = {ex.tests_id for ex in built[path.stem].exercises}
    for i, cell in enumerate(nb.cells):
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") not in tests_ids:
            assert _error(cell) in {None, "NotImplementedError"}, f"{path.name} cell {i} raised {_error(cell)}"


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(WRONG))
def test_wrong_answers_are_caught(variant: str, executed: dict) -> None:
    solution_id, _, visible_catches = WRONG[variant]
    tests_id = solution_id.replace("-solution", "-tests")
    graded = executed[(FIXTURE.stem, f"source:{variant}")]  # visible + hidden tests
    assert _error(_cell(graded, tests_id)) == "AssertionError"
    others = [c for c in graded.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade", False)]
    assert sum(_error(c) is not None for c in others) == 1, "only the wrong exercise may fail"
    visible = executed[(FIXTURE.stem, f"student:{variant}")]  # what the student sees
    assert (_error(_cell(visible, tests_id)) == "AssertionError") is visible_catches


@pytest.mark.slow
def test_nbgrader_autograde_scores_submissions(tmp_path: Path) -> None:
    """The instructor's path: autograde restores the hidden tests and scores."""
    (chapter,) = build(tmp_path, [FIXTURE])
    student = nbformat.read(chapter.release, as_version=4)
    right_merge = ["m = max(m_a, m_b)", "return m, l_a * np.exp(m_a - m) + l_b * np.exp(m_b - m)"]
    submissions = {
        "alice": nbformat.read(chapter.solutions, as_version=4),  # 3 of 3
        "bob": student,  # stubs: 0
        # right merge (1 point) but a softmax that passes only the visible tests
        "carol": _with_body(_with_body(student, "toy-ex2-solution", right_merge),
                            "toy-ex1-solution", WRONG["softmax-without-max"][1]),
    }
    for who, nb in submissions.items():
        target = tmp_path / "submitted" / who / chapter.name / chapter.release.name
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    run = subprocess.run([sys.executable, "-m", "nbgrader", "autograde", chapter.name],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}", "flashlab") as gb:
        scores = {who: gb.find_submission(chapter.name, who).score for who in submissions}
    assert scores == {"alice": 3.0, "bob": 0.0, "carol": 1.0}
