"""Assignments: student versions built with nbgrader hide the solutions, and the
checks grade them.

Covers every notebooks/*.ipynb (found by glob, so new chapters are tested
without edits) and the fixture tests/fixtures/90_toy_chapter.ipynb, a toy
chapter that self-tests the machinery, including wrong answers the checks must
catch.

Grading (`make grade`, flashlab.course.assignments.grade): fake classes of students are
graded from student versions with answers filled in, including wrong, missing,
unreadable and hanging ones; tests/test_mutations.py checks the bank of wrong answers.

Exercise counts: every chapter 01+ has 3-5 graded exercises, at least one of them a
derivation or a design (book/instructor.md's table says which). 00_preface is not a
chapter with content, so it may have none (or 3-5 if it ever gets some).
"""

from __future__ import annotations

import copy
import csv
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

from flashlab.course.assignments import (
    BEGIN_HIDDEN,
    BEGIN_SOLUTION,
    END_HIDDEN,
    END_SOLUTION,
    GRADE_COLUMNS,
    NOTEBOOKS_DIR,
    build,
    exercises,
    feedback_text,
    find_submissions,
    grade,
    load_extra_tests,
    main,
    outputs_of,
    replace_solution_body,
    solution_body,
    strip_hidden_tests,
)

FIXTURE = Path(__file__).parent / "fixtures" / "90_toy_chapter.ipynb"
MUTANTS = Path(__file__).parent / "mutations" / "mutants.yaml"
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
def test_chapter_has_three_to_five_exercises(path: Path) -> None:
    found = exercises(path)
    number = int(path.stem[:2])
    allowed = ({0} if number == 0 else set()) | {3, 4, 5}
    assert len(found) in allowed, f"{path.name}: {len(found)} exercises, expected {sorted(allowed)}"
    for k, ex in enumerate(found, start=1):
        assert ex.points > 0, f"{path.name} {ex.tests_id}: points must be > 0"
        expected = f"ch{number:02d}-ex{k}"
        assert ex.name == expected and ex.tests_id == f"{expected}-tests", (
            f"{path.name} exercise {k}: grade_ids {ex.solution_id!r}/{ex.tests_id!r}, "
            f"expected {expected}-solution/{expected}-tests"
        )


def test_every_chapter_asks_for_a_derivation_or_a_design() -> None:
    """The instructor's table gives each exercise a kind; every chapter has a derivation or a design."""
    page = (NOTEBOOKS_DIR.parent / "book" / "instructor.md").read_text(encoding="utf-8")
    kinds = dict(re.findall(r"^\|[^|]*\| (ch\d\d-ex\d) \| [^|]+ \| (\w+) \| \d+ \| \d+ min \|$", page, re.M))
    book = {ex.name: path.stem for path in BOOK for ex in exercises(path)}
    assert set(kinds) == set(book), f"the table's exercises differ from the book's: {sorted(set(kinds) ^ set(book))}"
    assert set(kinds.values()) <= {"count", "algorithm", "derivation", "design"}, sorted(set(kinds.values()))
    for chapter in sorted(set(book.values())):
        mine = [kinds[name] for name, stem in book.items() if stem == chapter]
        assert {"derivation", "design"} & set(mine), f"{chapter}: no derivation or design among {mine}"


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


# ---------------------------------------------------------------- grading submissions (`make grade`)


def _answered(student: nbformat.NotebookNode, source: nbformat.NotebookNode,
              bodies: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The student version with every answer of ``source`` filled in, except those in
    ``bodies`` (solution grade_id -> body), which are filled with the given body."""
    nb = copy.deepcopy(student)
    answers = {cell.metadata["nbgrader"]["grade_id"]: solution_body(cell.source)
               for cell in source.cells if cell.get("metadata", {}).get("nbgrader", {}).get("solution")}
    answers.update(bodies or {})
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = replace_solution_body(cell.source, answers[gid])
    return nb


def _without(nb: nbformat.NotebookNode, *grade_ids: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") not in grade_ids]
    return nb


def _put(nb: nbformat.NotebookNode, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def _read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.mark.slow
def test_grade_scores_a_class(tmp_path: Path, built: dict) -> None:
    """What `make grade SUBMISSIONS=...` does: two students, one chapter of the book
    (answers filled into the student version, so the hidden tests must come back from
    the book) and the toy chapter; CSV rows per student and exercise."""
    chapter, toy = built["02_online_softmax"], built[FIXTURE.stem]
    book_nb = nbformat.read(chapter.source, as_version=4)
    student_nb = nbformat.read(chapter.release, as_version=4)
    wrong = "ch02-ex3-empty-merge-nan"  # from the mutation bank: only the hidden tests catch it
    body = next(m["body"] for m in yaml.safe_load(MUTANTS.read_text()) if m["id"] == wrong)
    sub = tmp_path / "submitted"
    _put(_answered(student_nb, book_nb), sub / "alice" / "02_online_softmax.ipynb")
    _put(_answered(nbformat.read(toy.release, as_version=4), nbformat.read(FIXTURE, as_version=4)),
         sub / "alice" / f"{FIXTURE.stem}.ipynb")
    bob = _without(_answered(student_nb, book_nb, {"ch02-ex3-solution": body}), "ch02-ex4-solution", "ch02-ex4-tests")
    _put(bob, sub / "bob" / "02_online_softmax" / "02_online_softmax.ipynb")  # nbgrader's layout; no toy chapter

    out = tmp_path / "grades" / "grades.csv"
    rows = grade(sub, out, notebooks=[chapter.source, FIXTURE], timeout=CELL_TIMEOUT_S)
    columns, written = _read_csv(out)
    assert columns == list(GRADE_COLUMNS) == ["student", "chapter", "exercise", "points", "max_points", "status", "message"]
    assert [{k: str(v) for k, v in r.items()} for r in rows] == [
        {**r, "points": str(float(r["points"])), "max_points": str(float(r["max_points"]))} for r in written]
    table = {(r["student"], r["exercise"]): (float(r["points"]), float(r["max_points"]), r["status"]) for r in written}
    assert [r["chapter"] for r in written[:4]] == ["02_online_softmax"] * 4
    assert table == {
        ("alice", "ch02-ex1-tests"): (1, 1, "passed"),
        ("alice", "ch02-ex2-tests"): (2, 2, "passed"),
        ("alice", "ch02-ex3-tests"): (2, 2, "passed"),
        ("alice", "ch02-ex4-tests"): (1, 1, "passed"),
        ("alice", "toy-ex1-tests"): (2, 2, "passed"),
        ("alice", "toy-ex2-tests"): (1, 1, "passed"),
        ("bob", "ch02-ex1-tests"): (1, 1, "passed"),
        ("bob", "ch02-ex2-tests"): (2, 2, "passed"),
        ("bob", "ch02-ex3-tests"): (0, 2, "failed"),
        ("bob", "ch02-ex4-tests"): (0, 1, "missing"),
        ("bob", "toy-ex1-tests"): (0, 2, "missing"),
        ("bob", "toy-ex2-tests"): (0, 1, "missing"),
    }
    messages = {(r["student"], r["exercise"]): r["message"] for r in written}
    assert messages[("bob", "ch02-ex3-tests")] == "AssertionError: two empty states merge to an empty state (no nan)"
    assert "ch02-ex4-solution" in messages[("bob", "ch02-ex4-tests")]
    assert messages[("bob", "toy-ex1-tests")] == f"no notebook submitted for {FIXTURE.stem}"
    assert all(messages[k] == "" for k, v in table.items() if v[2] == "passed")
    # beside it: one row per student, and a feedback file per student
    summary, feedback = outputs_of(out)
    assert summary == out.with_name("grades_summary.csv") and feedback == out.with_name("grades_feedback")
    columns, per_student = _read_csv(summary)
    assert columns == ["student", "02_online_softmax", FIXTURE.stem, "total", "max_points"]
    assert per_student == [
        {"student": "alice", "02_online_softmax": "6", FIXTURE.stem: "3", "total": "9", "max_points": "9"},
        {"student": "bob", "02_online_softmax": "3", FIXTURE.stem: "0", "total": "3", "max_points": "9"}]
    assert sorted(p.name for p in feedback.iterdir()) == ["alice.md", "bob.md"]
    text = (feedback / "bob.md").read_text(encoding="utf-8")
    assert "**3 of 9 points.**" in text and "## 02_online_softmax: 3 of 6 points" in text
    assert "| ch02-ex3 | 0 of 2 | a hidden test failed: AssertionError: two empty states merge" in text
    assert "| ch02-ex4 | 0 of 1 | missing: " in text and "| ch02-ex1 | 1 of 1 | passed |" in text
    hidden = [line.strip() for cell in book_nb.cells if cell.metadata.get("nbgrader", {}).get("grade")
              for line in _region(cell.source, BEGIN_HIDDEN, END_HIDDEN)[1] if len(line.strip()) > 12]
    assert hidden and not [line for line in hidden if line in text], "feedback quotes no hidden test"


@pytest.mark.slow
def test_grade_survives_bad_submissions(tmp_path: Path, built: dict) -> None:
    """Unanswered, unreadable, tampered, hanging, kernel-killing and stray notebooks:
    0 points with a status, never a crash (toy chapter, fast)."""
    toy = built[FIXTURE.stem]
    source, student = nbformat.read(FIXTURE, as_version=4), nbformat.read(toy.release, as_version=4)
    name = f"{FIXTURE.stem}.ipynb"
    sub = tmp_path / "sub"
    _put(student, sub / "stub" / name)                                        # nothing answered
    (sub / "garbled").mkdir(parents=True)
    (sub / "garbled" / name).write_text("{not a notebook", encoding="utf-8")   # unreadable
    tampered = _answered(student, source, {"toy-ex1-solution": "return x"})
    _cell(tampered, "toy-ex1-tests").source = "pass  # the student emptied the tests"
    _put(tampered, sub / "tampered" / name)
    hangs = _answered(student, source, {"toy-ex1-solution": "import time\nwhile True:\n    time.sleep(0.05)"})
    _put(hangs, sub / "hangs" / name)
    dies = _answered(student, source, {"toy-ex1-solution": "import os\nos._exit(1)"})
    _put(dies, sub / "dies" / name)                                            # kills its kernel
    no_tests = _without(_answered(student, source), "toy-ex2-tests")          # tests cell deleted: put back
    _put(no_tests, sub / "no_tests" / name)
    _put(student, sub / "stray" / "notes.ipynb")                               # not a chapter: ignored
    with pytest.warns(UserWarning, match="ignored .*notes.ipynb"):
        rows = grade(sub, tmp_path / "g.csv", notebooks=[FIXTURE], timeout=3,
                     code_policy=False)  # the kernel's own limits, not the policy, are tested here
    got = {(r["student"], r["exercise"]): (r["points"], r["status"], r["message"]) for r in rows}
    assert got[("stub", "toy-ex1-tests")] == (0, "error", "NotImplementedError: not answered (the stub still raises)")
    assert got[("garbled", "toy-ex2-tests")][:2] == (0, "error")
    assert got[("garbled", "toy-ex2-tests")][2].startswith("could not read the notebook: ")
    assert got[("tampered", "toy-ex1-tests")][:2] == (0, "failed"), "the tests cell comes back from the book"
    assert got[("tampered", "toy-ex2-tests")][:2] == (1, "passed")
    assert got[("hangs", "toy-ex1-tests")][:2] == (0, "error")
    assert got[("hangs", "toy-ex1-tests")][2] == \
        "TimeoutError: softmax(...) ran past the 3 s limit of the tests cell and was interrupted"
    assert got[("hangs", "toy-ex2-tests")][:2] == (1, "passed"), "a timeout costs only the cell that hung"
    assert got[("no_tests", "toy-ex2-tests")][:2] == (1, "passed")
    for exercise in ("toy-ex1-tests", "toy-ex2-tests"):
        assert got[("dies", exercise)][:2] == (0, "error") and "Kernel died" in got[("dies", exercise)][2]
    assert {k for k, v in got.items() if k[0] == "stray"} == {("stray", "toy-ex1-tests"), ("stray", "toy-ex2-tests")}
    assert all(v[1] == "missing" for k, v in got.items() if k[0] == "stray")


def test_a_named_pipe_or_a_huge_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    """A FIFO named like a chapter used to block the grader's read, so no one was graded; a
    very large notebook cost the grader its memory. Both score 0 at once, with the reason."""
    import os
    import threading

    from flashlab.course.grader import grade_notebook, grading

    sub = tmp_path / "sub"
    (sub / "mallory").mkdir(parents=True)
    os.mkfifo(sub / "mallory" / f"{FIXTURE.stem}.ipynb")
    (sub / "big").mkdir()
    big = sub / "big" / f"{FIXTURE.stem}.ipynb"
    with open(big, "wb") as f:
        f.truncate(grading.MAX_NOTEBOOK_BYTES + 1)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(
        fifo=grade_notebook(sub / "mallory" / f"{FIXTURE.stem}.ipynb", FIXTURE),
        big=grade_notebook(big, FIXTURE)), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "reading the named pipe blocked the grader"
    for name, words in (("fifo", "not a regular file"), ("big", "MiB is read")):
        assert all(s.points == 0 and s.status == "error" and words in s.message for s in result[name]), result[name]


def test_grade_rejects_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="one folder per student"):
        grade(tmp_path / "nowhere", tmp_path / "g.csv", notebooks=[FIXTURE])
    with pytest.raises(ValueError, match="chapters must name notebooks with exercises"):
        grade(tmp_path, tmp_path / "g.csv", notebooks=[FIXTURE], chapters=["02_online_softmax"])


def test_find_submissions_accepts_both_layouts(tmp_path: Path) -> None:
    for rel in ("ann/02_x.ipynb", "ben/02_x/02_x.ipynb", "ann/02_x/02_x.ipynb", "cy/other.ipynb",
                "cy/.ipynb_checkpoints/02_x-checkpoint.ipynb", "top.ipynb", "__MACOSX/ann/02_x.ipynb",
                "__MACOSX/ann/02_x/02_x.ipynb"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    (tmp_path / "dee").mkdir()
    found, ignored = find_submissions(tmp_path, ["02_x"])
    assert found == {"ann": {"02_x": tmp_path / "ann/02_x.ipynb"}, "ben": {"02_x": tmp_path / "ben/02_x/02_x.ipynb"},
                     "cy": {}, "dee": {}}
    assert sorted(p.relative_to(tmp_path).as_posix() for p in ignored) == ["ann/02_x/02_x.ipynb", "cy/other.ipynb", "top.ipynb"]


def test_find_submissions_accepts_flat_lms_downloads(tmp_path: Path) -> None:
    """Canvas, Moodle and plain <name>_<id>_<chapter>.ipynb downloads, straight in the folder."""
    names = {
        "ann_42_02_x.ipynb": ("ann_42", "02_x"),                                   # <name>_<id>_<chapter>
        "ann_42_03_y (1).ipynb": ("ann_42", "03_y"),                               # a browser's copy suffix
        "smithbob_LATE_1234_998877_02_x-1.ipynb": ("smithbob_1234", "02_x"),       # Canvas, late, renamed
        "smithbob_1234_998878_03_y.ipynb": ("smithbob_1234", "03_y"),              # Canvas: another submission id
        "Cy Dee_77_assignsubmission_file_02_x.ipynb": ("Cy Dee_77", "02_x"),       # Moodle, flat
        "Eve Fo_78_assignsubmission_file_/03_y.ipynb": ("Eve Fo_78", "03_y"),      # Moodle, one folder each
    }
    for rel in [*names, "ann_42_02_x-2.ipynb", "02_x.ipynb", "notes.ipynb", "__MACOSX/._ann_42_02_x.ipynb"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    found, ignored = find_submissions(tmp_path, ["02_x", "03_y"])
    assert {(s, c): p.relative_to(tmp_path).as_posix() for s, mine in found.items() for c, p in mine.items()} == {
        v: k for k, v in names.items()}
    assert sorted(p.name for p in ignored) == ["02_x.ipynb", "ann_42_02_x-2.ipynb", "notes.ipynb"], \
        "a second file for one student and chapter is reported, not graded"


def test_extra_tests_are_checked_before_grading(tmp_path: Path) -> None:
    (tmp_path / "toy-ex1.py").write_text("assert softmax is not None\n")
    (tmp_path / "toy-ex2-tests.py").write_text("pass\n")
    (tmp_path / "README.md").write_text("not a test")
    assert load_extra_tests(tmp_path, [FIXTURE]) == {"toy-ex1": "assert softmax is not None\n", "toy-ex2": "pass\n"}
    (tmp_path / "toy-ex3.py").write_text("pass\n")
    with pytest.raises(ValueError, match="toy-ex3.py: the file must be named <exercise>.py"):
        load_extra_tests(tmp_path, [FIXTURE])
    (tmp_path / "toy-ex3.py").unlink()
    (tmp_path / "toy-ex1.py").write_text("assert (\n")
    with pytest.raises(ValueError, match="toy-ex1.py are not valid Python"):
        load_extra_tests(tmp_path, [FIXTURE])
    with pytest.raises(FileNotFoundError, match="extra_tests must be a folder"):
        load_extra_tests(tmp_path / "nowhere", [FIXTURE])


@pytest.mark.slow
def test_extra_hidden_tests_are_merged_in(tmp_path: Path, built: dict) -> None:
    """The instructor's folder of extra hidden tests catches an answer the book's tests
    accept (a softmax that subtracts the maximum of the whole array, not of each row),
    and the feedback says a hidden test failed without quoting it."""
    toy = built[FIXTURE.stem]
    source, student = nbformat.read(FIXTURE, as_version=4), nbformat.read(toy.release, as_version=4)
    global_max = "e = np.exp(x - x.max())\nreturn e / e.sum(axis=-1, keepdims=True)"
    sub = tmp_path / "sub"
    _put(_answered(student, source), sub / "honest" / FIXTURE.name)
    _put(_answered(student, source, {"toy-ex1-solution": global_max}), sub / "global_max" / FIXTURE.name)
    extra = tmp_path / "extra"
    extra.mkdir()
    secret = "rows_far_apart = np.array([[0.0, 1.0], [1000.0, 1001.0]])"
    (extra / "toy-ex1.py").write_text(f"{secret}\nout = softmax(rows_far_apart)\n"
                                      "assert np.allclose(out.sum(axis=-1), 1.0), 'rows of very different size'\n")
    without = {(r["student"], r["exercise"]): r["status"] for r in grade(sub, tmp_path / "a.csv", notebooks=[FIXTURE])}
    assert without[("global_max", "toy-ex1-tests")] == "passed", "the book's own tests accept it"
    rows = grade(sub, tmp_path / "b.csv", notebooks=[FIXTURE], extra_tests=extra)
    got = {(r["student"], r["exercise"]): (r["status"], r["message"]) for r in rows}
    assert got[("global_max", "toy-ex1-tests")] == ("failed", "AssertionError: rows of very different size")
    assert got[("honest", "toy-ex1-tests")] == ("passed", "") and got[("global_max", "toy-ex2-tests")][0] == "passed"
    text = (outputs_of(tmp_path / "b.csv")[1] / "global_max.md").read_text(encoding="utf-8")
    assert "a hidden test failed: AssertionError: rows of very different size" in text and secret not in text


def test_feedback_says_which_check_failed_without_its_source() -> None:
    from flashlab.course.grader import Score

    text = feedback_text("ann", [("02_x", [
        Score("ch02-ex1-tests", 1.0, 1.0, "passed"),
        Score("ch02-ex2-tests", 0.0, 2.0, "failed", "AssertionError (line 7 of the cell)", "hidden"),
        Score("ch02-ex3-tests", 0.0, 2.0, "failed", "AssertionError: divide by sqrt(d)", "visible"),
        Score("ch02-ex4-tests", 0.0, 1.0, "error", "NotImplementedError: not answered (the stub still raises)",
              "visible")])])
    assert "**1 of 6 points.**" in text and "## 02_x: 1 of 6 points" in text
    assert "| ch02-ex2 | 0 of 2 | a hidden test failed: AssertionError (the hidden test gives no message) |" in text
    assert "| ch02-ex3 | 0 of 2 | a visible check failed: AssertionError: divide by sqrt(d) |" in text
    assert "line 7" not in text


def test_replace_solution_body_in_book_and_student_versions(built: dict) -> None:
    toy = built[FIXTURE.stem]
    book = _cell(nbformat.read(FIXTURE, as_version=4), "toy-ex2-solution").source
    student = _cell(nbformat.read(toy.release, as_version=4), "toy-ex2-solution").source
    for source in (book, student):
        new = replace_solution_body(source, "if True:\n    return 1, 2\n")
        assert new.splitlines()[0].startswith("def merge(") and new.splitlines()[-2:] == ["    if True:", "        return 1, 2"]
        assert BEGIN_SOLUTION not in new and "NotImplementedError" not in new
    assert solution_body(book).splitlines()[0] == "m = max(m_a, m_b)"
    assert strip_hidden_tests(_cell(nbformat.read(FIXTURE, as_version=4), "toy-ex2-tests").source).splitlines()[-1] \
        == "assert np.isclose(l, np.exp(np.array([1.0, 3, 2, 5]) - 5).sum())"


@pytest.mark.slow
def test_command_line_grade_and_build(tmp_path: Path, built: dict, capsys: pytest.CaptureFixture) -> None:
    toy = built[FIXTURE.stem]
    _put(_answered(nbformat.read(toy.release, as_version=4), nbformat.read(FIXTURE, as_version=4)),
         tmp_path / "sub" / "alice" / f"{FIXTURE.stem}.ipynb")
    out = tmp_path / "grades.csv"
    assert main(["grade", str(tmp_path / "sub"), "--out", str(out), "--notebooks", str(FIXTURE)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^alice\s+3\s+3\s+2\s+0\s+0\s+0$", printed, re.M), printed
    assert [r["status"] for r in _read_csv(out)[1]] == ["passed", "passed"]
    assert main(["grade", str(tmp_path / "sub"), "--out", str(out), "--notebooks", str(FIXTURE),
                 "--student", "bob"]) == 2
    assert "students must name students of" in capsys.readouterr().err
    _put(nbformat.read(toy.release, as_version=4), tmp_path / "sub" / "bob" / f"{FIXTURE.stem}.ipynb")
    assert main(["grade", str(tmp_path / "sub"), "--out", str(out), "--notebooks", str(FIXTURE),
                 "--student", "alice"]) == 0
    assert {r["student"] for r in _read_csv(out)[1]} == {"alice"}, "--student grades that student only"
    captured = capsys.readouterr()
    assert re.search(r"graded: 100%.*\b1/1\b", captured.err), captured.err    # tqdm's bar
    assert f"summary per student: {out.with_name('grades_summary.csv').resolve()}" in captured.out
    assert main(["grade", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert "one folder per student" in capsys.readouterr().err
    # the build command, with and without its name
    assert main([str(tmp_path / "course"), str(FIXTURE)]) == 0
    assert main(["build", str(tmp_path / "course2"), str(FIXTURE)]) == 0
    assert (tmp_path / "course" / "release" / FIXTURE.stem / FIXTURE.name).is_file()
    assert (tmp_path / "course2" / "release" / FIXTURE.stem / FIXTURE.name).is_file()


@pytest.mark.slow
def test_build_keeps_a_gradebook_that_holds_grades(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Rebuilding after autograde copies the gradebook aside instead of destroying it."""
    import sqlite3

    (chapter,) = build(tmp_path, [FIXTURE])
    assert not list(tmp_path.glob("gradebook-*.db")), "an empty gradebook needs no copy"
    with sqlite3.connect(tmp_path / "gradebook.db") as db:  # what autograde records, reduced to one row
        columns = [r[1] for r in db.execute("PRAGMA table_info(submitted_assignment)")]
        assert "id" in columns
        db.execute("PRAGMA foreign_keys = OFF")
        db.execute(f"INSERT INTO submitted_assignment ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                   ["x"] * len(columns))
    before = (tmp_path / "gradebook.db").read_bytes()
    build(tmp_path, [FIXTURE])
    (kept,) = tmp_path.glob("gradebook-*.db")
    assert kept.read_bytes() == before
    assert "holds 1 graded submission(s): kept a copy as gradebook-" in capsys.readouterr().err
