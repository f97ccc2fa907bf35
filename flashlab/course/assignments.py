"""Student versions of the book's exercises, built with nbgrader.

Every chapter ends with 2-4 exercises. An exercise is three cells:

1. a markdown cell stating the task (the *prompt*);
2. a *solution* code cell whose function body sits between ``### BEGIN SOLUTION``
   and ``### END SOLUTION``, with nbgrader metadata
   ``{"grade": false, "solution": true, "grade_id": "chNN-exK-solution", ...}``;
3. a *tests* code cell with visible ``assert``s, then hidden ones between
   ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``, with nbgrader metadata
   ``{"grade": true, "solution": false, "locked": true, "points": P,
   "grade_id": "chNN-exK-tests", ...}``.

:func:`build` copies each notebook that has exercises into a throwaway nbgrader
course directory and runs ``nbgrader generate_assignment`` on it (offline, in
this process). The result, under ``outdir``::

    nbgrader_config.py         course settings (course_id "flashlab")
    gradebook.db               nbgrader's database: grade cells, hidden tests
    source/<chapter>/<chapter>.ipynb    the notebook as nbgrader saw it
    release/<chapter>/<chapter>.ipynb   student version: stubs, no hidden tests, no outputs
    solutions/<chapter>/<chapter>.ipynb the book's notebook as committed (the solutions)

``outdir`` is a working nbgrader course: ``python -m nbgrader autograde <chapter>``
run inside it grades submissions put under ``submitted/<student>/<chapter>/``.

:func:`grade` is the kit's own grader, without nbgrader's database: it takes a
folder of submissions, ``<folder>/<student>/<chapter>.ipynb`` (or nbgrader's
``<folder>/<student>/<chapter>/<chapter>.ipynb``), puts the hidden tests back
from the book's notebooks (tests cells matched by grade_id), executes each
notebook in a fresh kernel with a per-cell timeout and ``TRITON_INTERPRET=1``,
and writes one CSV row per student and exercise (:data:`GRADE_COLUMNS`): full
points when the tests cell raises nothing, else 0 with a status (:data:`STATUSES`)
and the first line of the error. :func:`grade_variants` runs many answers to a
chapter's exercises in one kernel; ``tests/test_mutations.py`` uses it to check
that a bank of known-wrong answers (``tests/mutations/``) is caught.

Command line::

    python -m flashlab.course.assignments [build] OUTDIR [NOTEBOOK ...]
    python -m flashlab.course.assignments grade SUBMISSIONS [--out build/grades.csv] [--chapter NAME ...]

(default notebooks: every ``notebooks/*.ipynb`` of the repository).
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import nbformat

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
COURSE_ID = "flashlab"

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"

# The paths under outdir that build() owns and rewrites on every run.
_OWNED = ("nbgrader_config.py", "gradebook.db", "source", "release", "solutions")

_CONFIG = f'''\
# Written by flashlab.course.assignments; rewritten by every `make assignments`.
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "{COURSE_ID}"
# Run nbgrader from this folder: the course root is the working directory.
'''


@dataclass(frozen=True)
class Exercise:
    """One exercise of a notebook: where its cells are and what it is worth.

    Attributes
    ----------
    notebook : Path
        The notebook holding the exercise.
    name : str
        The grade_id shared by the two cells, without suffix, e.g. ``"ch02-ex1"``.
    solution_id, tests_id : str
        The nbgrader grade_ids of the solution and tests cells.
    points : float
        Points of the tests cell (> 0).
    prompt_cell : int or None
        Index of the markdown cell stating the task (the nearest markdown cell
        before the solution cell), if any.
    solution_cell, tests_cell : int
        Indices of the solution and tests cells in ``notebook.cells``.
    """

    notebook: Path
    name: str
    solution_id: str
    tests_id: str
    points: float
    prompt_cell: int | None
    solution_cell: int
    tests_cell: int


@dataclass(frozen=True)
class Chapter:
    """A notebook built into a student version: ``name`` is its file stem."""

    name: str
    source: Path
    release: Path
    solutions: Path
    exercises: tuple[Exercise, ...]

    @property
    def points(self) -> float:
        """Total points of the chapter's exercises."""
        return sum(ex.points for ex in self.exercises)


def _nbgrader_meta(cell: nbformat.NotebookNode) -> dict | None:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else None


def _where(path: Path, index: int) -> str:
    return f"{path.name}, cell {index}"


def exercises(notebook_path: str | Path) -> list[Exercise]:
    """The exercises of a notebook, in order, checked against the convention.

    Parameters
    ----------
    notebook_path : str or Path
        An ``.ipynb`` file.

    Returns
    -------
    list of Exercise
        Empty when the notebook has no nbgrader cells (e.g. the preface).

    Raises
    ------
    FileNotFoundError
        If ``notebook_path`` does not exist.
    ValueError
        If a cell breaks the convention: solution markers in a cell without
        solution metadata, a solution cell without markers, a tests cell
        without points > 0, a solution cell with no tests cell after it, or a
        grade_id used twice. The message names the notebook, the cell and what
        was expected.
    """
    path = Path(notebook_path)
    if not path.is_file():
        raise FileNotFoundError(f"notebook_path must be an existing .ipynb file; got {str(path)!r}")
    nb = nbformat.read(path, as_version=4)

    found: list[Exercise] = []
    seen: dict[str, int] = {}
    pending: tuple[int, str] | None = None  # (solution cell index, grade_id) awaiting its tests
    last_markdown: int | None = None
    prompt: int | None = None

    for i, cell in enumerate(nb.cells):
        meta = _nbgrader_meta(cell)
        source = cell.get("source", "")
        if cell.cell_type == "markdown" and meta is None:
            last_markdown = i
        has_solution = BEGIN_SOLUTION in source
        has_hidden = BEGIN_HIDDEN in source
        if meta is None:
            if has_solution or has_hidden:
                marker = BEGIN_SOLUTION if has_solution else BEGIN_HIDDEN
                raise ValueError(
                    f"{_where(path, i)}: contains {marker!r} but has no nbgrader cell metadata; "
                    "expected metadata {'nbgrader': {'solution': true, ...}} (solution cell) or "
                    "{'nbgrader': {'grade': true, 'points': P, ...}} (tests cell)"
                )
            continue

        grade_id = meta.get("grade_id")
        if not isinstance(grade_id, str) or not grade_id:
            raise ValueError(f"{_where(path, i)}: nbgrader metadata must have a non-empty grade_id; got {grade_id!r}")
        if grade_id in seen:
            raise ValueError(f"{_where(path, i)}: grade_id {grade_id!r} is already used by cell {seen[grade_id]}")
        seen[grade_id] = i

        if meta.get("solution"):
            if cell.cell_type != "code" or not has_solution or END_SOLUTION not in source:
                raise ValueError(
                    f"{_where(path, i)} ({grade_id}): a solution cell must be a code cell with "
                    f"{BEGIN_SOLUTION!r} ... {END_SOLUTION!r}; got a {cell.cell_type} cell without them"
                )
            if pending is not None:
                raise ValueError(
                    f"{_where(path, i)} ({grade_id}): expected the tests cell of {pending[1]!r} "
                    f"(cell {pending[0]}) before another solution cell"
                )
            pending = (i, grade_id)
            prompt = last_markdown
        elif meta.get("grade"):
            points = meta.get("points")
            if isinstance(points, bool) or not isinstance(points, (int, float)) or not points > 0:
                raise ValueError(f"{_where(path, i)} ({grade_id}): a tests cell needs points > 0; got {points!r}")
            if pending is None:
                raise ValueError(f"{_where(path, i)} ({grade_id}): a tests cell must follow a solution cell; none before it")
            if has_hidden and END_HIDDEN not in source:
                raise ValueError(f"{_where(path, i)} ({grade_id}): {BEGIN_HIDDEN!r} without {END_HIDDEN!r}")
            sol_index, sol_id = pending
            name = sol_id.removesuffix("-solution")
            found.append(Exercise(path, name, sol_id, grade_id, float(points), prompt, sol_index, i))
            pending = None
        elif has_solution or has_hidden:
            raise ValueError(
                f"{_where(path, i)} ({grade_id}): has markers but its metadata marks it neither "
                "solution nor grade"
            )
    if pending is not None:
        raise ValueError(f"{_where(path, pending[0])} ({pending[1]}): solution cell has no tests cell after it")
    return found


def _normalised(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy nbgrader accepts as authored: complete v3 metadata, no stale checksums."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        meta = _nbgrader_meta(cell)
        if meta is None:
            cell.get("metadata", {}).pop("nbgrader", None)
            continue
        for key in ("grade", "solution", "locked", "task"):
            meta[key] = bool(meta.get(key, False))
        meta["schema_version"] = 3
        meta["cell_type"] = cell.cell_type  # nbgrader rejects a stale cell_type
        meta.pop("checksum", None)  # recomputed by generate_assignment
        if not meta["grade"]:
            meta.pop("points", None)
    return nb


def _alembic_head(fallback: Callable[[], str]) -> str:
    """The gradebook schema version nbgrader stamps on a new database.

    nbgrader asks a bare ``alembic`` executable for it (2-3 s); reading the same
    migration scripts in-process takes 0.1 s. ``fallback`` is nbgrader's own way.
    """
    try:
        from alembic.config import Config as AlembicConfig
        from alembic.script import ScriptDirectory
        from nbgrader.dbutil import _temp_alembic_ini

        with _temp_alembic_ini("sqlite://") as ini:
            head = ScriptDirectory.from_config(AlembicConfig(ini)).get_current_head()
        if head:
            return head
    except Exception:  # noqa: BLE001 - any trouble: let nbgrader do it its way
        pass
    return fallback()


def _generate(outdir: Path, chapters: Sequence[str]) -> None:
    """Run ``nbgrader generate_assignment`` for each chapter, in this process."""
    import nbgrader.api
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    config = Config()
    config.CourseDirectory.root = str(outdir)
    config.CourseDirectory.course_id = COURSE_ID
    coursedir = CourseDirectory(config=config)
    api = NbGraderAPI(coursedir=coursedir, config=config)
    # The fallback runs a bare `alembic` from PATH: make it this interpreter's one
    # (the venv's bin/), whether or not the venv is activated.
    original = nbgrader.api.get_alembic_version
    old_path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), old_path])
    nbgrader.api.get_alembic_version = lambda: _alembic_head(original)
    try:
        for chapter in chapters:
            result = api.generate_assignment(chapter, force=True, create=True)
            if not result["success"]:
                raise RuntimeError(
                    f"nbgrader generate_assignment failed for {chapter}:\n"
                    f"{result.get('log', '')}\n{result.get('error', '')}"
                )
    finally:
        nbgrader.api.get_alembic_version = original
        os.environ["PATH"] = old_path


def build(outdir: str | Path, notebooks: Sequence[str | Path] | None = None) -> list[Chapter]:
    """Build student versions of every notebook that has exercises.

    Parameters
    ----------
    outdir : str or Path
        Where the nbgrader course is written; the paths it owns
        (``source/ release/ solutions/ gradebook.db nbgrader_config.py``) are
        deleted and rewritten, anything else there is left alone.
    notebooks : sequence of str or Path, optional
        The notebooks to consider; default every ``notebooks/*.ipynb``.
        Notebooks without exercises are skipped.

    Returns
    -------
    list of Chapter
        One per notebook with exercises, in file-name order.
    """
    outdir = Path(outdir).resolve()
    paths = sorted(NOTEBOOKS_DIR.glob("*.ipynb")) if notebooks is None else [Path(p) for p in notebooks]
    names = [p.stem for p in paths]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"notebooks must have distinct file names; got {duplicates} more than once")
    for name in names:
        if "+" in name:
            raise ValueError(f"notebook names must not contain '+' (nbgrader forbids it); got {name!r}")

    outdir.mkdir(parents=True, exist_ok=True)
    for owned in _OWNED:
        target = outdir / owned
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    (outdir / "nbgrader_config.py").write_text(_CONFIG)
    for folder in ("release", "solutions"):
        (outdir / folder).mkdir()

    chapters: list[Chapter] = []
    for path in paths:
        found = exercises(path)
        if not found:
            continue
        name = path.stem
        nb = nbformat.read(path, as_version=4)
        for folder, content in (("source", _normalised(nb)), ("solutions", nb)):
            target = outdir / folder / name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(content, target)
        chapters.append(
            Chapter(name, path, outdir / "release" / name / path.name, outdir / "solutions" / name / path.name,
                    tuple(found))
        )
    if chapters:
        _generate(outdir, [ch.name for ch in chapters])
    return chapters


# ---------------------------------------------------------------- grading

#: Columns of the grades CSV, in order.
GRADE_COLUMNS = ("student", "chapter", "exercise", "points", "max_points", "status", "message")
#: What a status means. Every exercise of every graded chapter gets one row per student.
STATUSES = {
    "passed": "the tests cell (visible and hidden tests) ran without an exception: full points",
    "failed": "a check rejected the answer (the tests cell raised AssertionError): 0 points",
    "error": "the tests cell raised something else (the unanswered stub's NotImplementedError, "
             "a crash, a timeout) or never ran (unreadable notebook, dead kernel): 0 points",
    "missing": "the submission has no such exercise (its solution cell was deleted) or no "
               "notebook for the chapter: 0 points",
}
DEFAULT_CELL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Score:
    """The grade of one exercise: one row of the grades CSV without student and chapter.

    ``exercise`` is the grade_id of the tests cell (``chNN-exK-tests``); ``status`` is
    one of :data:`STATUSES`; ``message`` is the first line of the error, empty when passed.
    """

    exercise: str
    points: float
    max_points: float
    status: str
    message: str = ""


@dataclass(frozen=True)
class _Outcome:
    """What executing one cell did: ``ok`` or the exception's name and first line."""

    ok: bool
    ename: str = ""
    evalue: str = ""

    @property
    def line(self) -> str:
        first = (self.evalue.strip().splitlines() or [""])[0]
        if first.startswith("(line "):
            return f"{self.ename} {first}"
        return f"{self.ename}: {first}" if first else self.ename


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _body_lines(body: str) -> list[str]:
    import textwrap

    return textwrap.dedent(body).strip("\n").splitlines()


def replace_solution_body(source: str, body: str) -> str:
    """A solution cell's ``source`` with its answer replaced by ``body``.

    The answer is the region between ``### BEGIN SOLUTION`` and ``### END SOLUTION``
    (markers dropped) in the book's notebook, or nbgrader's stub (``# YOUR CODE HERE``
    and ``raise NotImplementedError()``) in a student version. ``body`` is dedented and
    re-indented to the region's indentation.
    """
    lines = source.splitlines()
    begin = [i for i, line in enumerate(lines) if BEGIN_SOLUTION in line]
    if begin:
        start = begin[0]
        stop = next((i for i in range(start, len(lines)) if END_SOLUTION in lines[i]), None)
        if stop is None:
            raise ValueError(f"{BEGIN_SOLUTION!r} without {END_SOLUTION!r} in the cell")
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        stop += 1
    else:
        raising = [i for i, line in enumerate(lines) if "raise NotImplementedError()" in line]
        if not raising:
            raise ValueError("the cell has neither solution markers nor nbgrader's NotImplementedError stub")
        stop = raising[0] + 1
        start = stop - 2 if stop >= 2 and "YOUR CODE HERE" in lines[stop - 2] else stop - 1
        indent = lines[stop - 1][: len(lines[stop - 1]) - len(lines[stop - 1].lstrip())]
    new = [indent + line if line.strip() else "" for line in _body_lines(body)]
    return "\n".join(lines[:start] + new + lines[stop:])


def solution_body(source: str) -> str:
    """The answer of a book's solution cell: the dedented lines between the markers."""
    import textwrap

    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if BEGIN_SOLUTION in line) + 1
    stop = next(i for i in range(start, len(lines)) if END_SOLUTION in lines[i])
    return textwrap.dedent("\n".join(lines[start:stop]))


def strip_hidden_tests(source: str) -> str:
    """A tests cell's source as the student sees it: the hidden region removed."""
    kept, hidden = [], False
    for line in source.splitlines():
        if BEGIN_HIDDEN in line:
            hidden = True
        elif END_HIDDEN in line:
            hidden = False
        elif not hidden:
            kept.append(line)
    return "\n".join(kept)


def _grade_id(cell: nbformat.NotebookNode) -> str | None:
    meta = _nbgrader_meta(cell)
    return meta.get("grade_id") if meta else None


def _for_grading(submitted: nbformat.NotebookNode, source: nbformat.NotebookNode,
                 found: Sequence[Exercise]) -> tuple[nbformat.NotebookNode, dict[str, tuple[int, int] | None]]:
    """The submission as it is graded: every tests cell (and any other locked cell of the
    source) replaced by the source's version, hidden tests included, matched by grade_id;
    a tests cell the student deleted is put back after its solution cell.

    Returns the notebook and, per exercise name, the (solution, tests) cell indices,
    or None when the submission has no solution cell for it (``missing``).
    """
    nb = copy.deepcopy(submitted)
    locked = {
        _grade_id(cell): cell for cell in source.cells
        if _nbgrader_meta(cell) and (_nbgrader_meta(cell).get("locked") or _nbgrader_meta(cell).get("grade"))
    }
    first: dict[str, int] = {}
    for i, cell in enumerate(nb.cells):
        gid = _grade_id(cell)
        if gid and gid not in first:
            first[gid] = i
            if gid in locked:
                nb.cells[i] = copy.deepcopy(locked[gid])
    # Tests cells the student deleted, whose solution cell is still there: put them back.
    for ex in found:
        if ex.solution_id in first and ex.tests_id not in first:
            sol = first[ex.solution_id]
            cell = copy.deepcopy(source.cells[ex.tests_cell])
            cell.outputs, cell.execution_count = [], None
            nb.cells.insert(sol + 1, cell)
            first = {g: (i + 1 if i > sol else i) for g, i in first.items()}
            first[ex.tests_id] = sol + 1
    where: dict[str, tuple[int, int] | None] = {}
    for ex in found:
        sol, tests = first.get(ex.solution_id), first.get(ex.tests_id)
        where[ex.name] = (sol, tests) if sol is not None and tests is not None and sol < tests else None
    for cell in nb.cells:  # a fresh run: no stale outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb, where


class _Kernel:
    """One Jupyter kernel executing the cells of one notebook, one at a time.

    Each cell gets ``timeout`` seconds; past it the kernel is interrupted and the cell
    counts as raised ``TimeoutError``. Two timeouts in a row (a kernel that ignores the
    interrupt) stop the run: :meth:`run` then answers without executing.
    """

    def __init__(self, nb: nbformat.NotebookNode, cwd: Path, timeout: float, triton_interpret: bool):
        from nbclient import NotebookClient

        self.timeout = timeout
        self.env = dict(os.environ)
        if triton_interpret:  # kernels run on the CPU, whatever GPU the grader has
            self.env["TRITON_INTERPRET"] = "1"
        self.client = NotebookClient(
            nb, timeout=timeout, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
            error_on_timeout={"ename": "TimeoutError", "evalue": f"the cell ran past the {timeout:g} s "
                              "limit and was interrupted", "traceback": []},
            resources={"metadata": {"path": str(cwd)}}, on_cell_executed=self._record,
        )
        self._reply: dict | None = None
        self._timeouts_in_a_row = 0
        self.stopped: str | None = None  # why the run stopped early, if it did

    def _record(self, cell, cell_index, execute_reply) -> None:  # nbclient hook
        self._reply = execute_reply

    def session(self):
        import subprocess

        # The kernel's own log (e.g. ipykernel's transport warning) is not the notebook's
        # output, which arrives as messages: keep it off the grader's terminal.
        return self.client.setup_kernel(env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def run(self, cell: nbformat.NotebookNode, index: int) -> _Outcome:
        if cell.cell_type != "code" or not cell.source.strip():
            return _Outcome(True)
        if self.stopped:
            return _Outcome(False, "NotRun", self.stopped)
        self._reply = None
        try:
            self.client.execute_cell(cell, index)
        except Exception as exc:  # noqa: BLE001 - the kernel died or stopped answering
            self.stopped = f"the notebook stopped at cell {index}: {type(exc).__name__}: {exc}".splitlines()[0]
            return _Outcome(False, "NotRun", self.stopped)
        content = (self._reply or {}).get("content", {})
        if content.get("status") == "ok":
            self._timeouts_in_a_row = 0
            return _Outcome(True)
        if not content:
            return _Outcome(False, "NoReply", "the kernel did not answer")
        ename = str(content.get("ename") or "Error")
        evalue = str(content.get("evalue") or "")
        if not evalue.strip():  # a bare `assert`: say where
            lines = re.findall(r"Cell In\[\d*\], line (\d+)", _ANSI.sub("", "\n".join(content.get("traceback") or [])))
            evalue = f"(line {lines[0]} of the cell)" if lines else ""
        if ename == "TimeoutError" and "limit and was interrupted" in evalue:
            self._timeouts_in_a_row += 1
            if self._timeouts_in_a_row >= 2:
                self.stopped = f"the notebook stopped at cell {index}: two cells in a row ran past the time limit"
        else:
            self._timeouts_in_a_row = 0
        return _Outcome(False, ename, evalue)


def _score(ex: Exercise, solution: _Outcome | None, tests: _Outcome | None) -> Score:
    """Full points when the tests cell ran cleanly; the status says why not otherwise."""
    if tests is None:
        return Score(ex.tests_id, 0.0, ex.points, "missing",
                     f"the submission has no cell with grade_id {ex.solution_id!r}")
    if tests.ok:
        return Score(ex.tests_id, ex.points, ex.points, "passed", "")
    status = "failed" if tests.ename == "AssertionError" else "error"
    message = tests.line
    if tests.ename == "NotImplementedError":
        message = "NotImplementedError: not answered (the stub still raises)"
    if solution is not None and not solution.ok and solution.ename != "NotRun":
        message = f"the solution cell raised {solution.line}"
    return Score(ex.tests_id, 0.0, ex.points, status, message)


def _all(found: Sequence[Exercise], status: str, message: str) -> list[Score]:
    return [Score(ex.tests_id, 0.0, ex.points, status, message) for ex in found]


def grade_notebook(submission: str | Path | nbformat.NotebookNode, source: str | Path, *,
                   timeout: float = DEFAULT_CELL_TIMEOUT_S, triton_interpret: bool = True,
                   executed_path: str | Path | None = None) -> list[Score]:
    """Grade one submitted notebook against the book's notebook ``source``.

    The hidden tests are put back from ``source`` (every tests cell is replaced by the
    source's, matched by grade_id), the notebook is executed top to bottom in a fresh
    kernel (in a scratch folder, ``TRITON_INTERPRET=1`` when ``triton_interpret``, at
    most ``timeout`` seconds per cell) up to the last tests cell, and each tests cell
    earns its points if it raises nothing. Never raises for a bad submission: an
    unreadable notebook, a deleted exercise, a crash or a dead kernel give 0 points
    with a status and a message.

    Parameters
    ----------
    submission : path or notebook
        The student's notebook (a student version from ``build`` with answers filled in).
    source : path
        The book's notebook of the same chapter (solutions and hidden tests).
    timeout : float
        Seconds each cell may run.
    triton_interpret : bool
        Set ``TRITON_INTERPRET=1`` in the kernel, so Triton kernels run on the CPU.
    executed_path : path, optional
        Where to write the executed notebook (it holds the hidden tests: not for students).

    Returns
    -------
    list of Score
        One per exercise of ``source``, in order.
    """
    import tempfile

    found = exercises(source)
    source_nb = nbformat.read(source, as_version=4)
    if isinstance(submission, nbformat.NotebookNode):
        submitted = submission
    else:
        try:
            submitted = nbformat.read(submission, as_version=4)
            if not isinstance(submitted.get("cells"), list):
                raise ValueError("no list of cells")
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the submission's fault
            line = (str(exc).strip().splitlines() or [""])[0]
            return _all(found, "error", f"could not read the notebook: {type(exc).__name__}: {line}"[:300])
    try:
        nb, where = _for_grading(submitted, source_nb, found)
    except Exception as exc:  # noqa: BLE001
        return _all(found, "error", f"could not prepare the notebook: {type(exc).__name__}: {exc}"[:300])
    present = [w for w in where.values() if w is not None]
    outcomes: dict[int, _Outcome] = {}
    if present:
        last = max(tests for _, tests in present)
        with tempfile.TemporaryDirectory(prefix="flashlab-grade-") as cwd:
            kernel = _Kernel(nb, Path(cwd), timeout, triton_interpret)
            try:
                with kernel.session():
                    for index in range(last + 1):
                        outcomes[index] = kernel.run(nb.cells[index], index)
            except Exception as exc:  # noqa: BLE001 - the kernel would not start or shut down
                reason = f"the kernel failed: {type(exc).__name__}: {exc}".splitlines()[0]
                for index in range(last + 1):
                    outcomes.setdefault(index, _Outcome(False, "NotRun", reason))
    if executed_path is not None:
        executed_path = Path(executed_path)
        executed_path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, executed_path)
    scores = []
    for ex in found:
        w = where[ex.name]
        scores.append(_score(ex, None, None) if w is None else _score(ex, outcomes.get(w[0]), outcomes.get(w[1])))
    return scores


def find_submissions(submissions: str | Path, chapters: Sequence[str]) -> tuple[dict[str, dict[str, Path]], list[Path]]:
    """The notebooks of a submissions folder: ``{student: {chapter: path}}`` and the
    ``.ipynb`` files that match no chapter (ignored).

    Layout: one folder per student, named by the student's id, holding
    ``<chapter>.ipynb`` or, as nbgrader collects them, ``<chapter>/<chapter>.ipynb``,
    where ``<chapter>`` is the notebook's name without ``.ipynb`` (e.g.
    ``02_online_softmax``). Folders and files starting with ``.`` are skipped.
    """
    root = Path(submissions)
    if not root.is_dir():
        raise FileNotFoundError(f"submissions must be a folder with one folder per student; got {str(root)!r}")
    known = set(chapters)
    found: dict[str, dict[str, Path]] = {}
    ignored: list[Path] = []
    for path in sorted(root.rglob("*.ipynb"), key=lambda p: (len(p.parts), p)):  # flat layout first
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if len(rel.parts) == 2 and path.stem in known:
            student, chapter = rel.parts[0], path.stem
        elif len(rel.parts) == 3 and path.stem in known and rel.parts[1] == path.stem:
            student, chapter = rel.parts[0], path.stem
        else:
            ignored.append(path)
            continue
        mine = found.setdefault(student, {})
        if chapter in mine:  # both layouts: keep the flat one, report the other
            ignored.append(path)
            continue
        mine[chapter] = path
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.name.startswith("."):
            found.setdefault(entry.name, {})
    return dict(sorted(found.items())), ignored


def grade(submissions: str | Path, out_csv: str | Path, *, notebooks: Sequence[str | Path] | None = None,
          chapters: Sequence[str] | None = None, timeout: float = DEFAULT_CELL_TIMEOUT_S,
          jobs: int | None = None, triton_interpret: bool = True,
          executed_dir: str | Path | None = None) -> list[dict]:
    """Grade a folder of submissions into a CSV of scores per student and exercise.

    Parameters
    ----------
    submissions : str or Path
        One folder per student (named by the student's id) holding
        ``<chapter>.ipynb`` or nbgrader's ``<chapter>/<chapter>.ipynb``; see
        :func:`find_submissions`.
    out_csv : str or Path
        The CSV written, columns :data:`GRADE_COLUMNS`; its folder is created.
    notebooks : sequence of paths, optional
        The book's notebooks (solutions and hidden tests); default ``notebooks/*.ipynb``.
    chapters : sequence of str, optional
        The chapters graded, e.g. ``["02_online_softmax"]``; default every chapter
        that at least one student submitted. A student without a notebook for a
        graded chapter gets ``missing`` rows for it.
    timeout : float
        Seconds each cell may run.
    jobs : int, optional
        Notebooks executed at once (one kernel each); default the number of CPUs, at most 4.
    triton_interpret : bool
        Set ``TRITON_INTERPRET=1`` in the kernels: Triton kernels run on the CPU.
    executed_dir : str or Path, optional
        Also write each executed notebook to ``executed_dir/<student>/<chapter>.ipynb``
        (tracebacks for the instructor; they contain the hidden tests).

    Returns
    -------
    list of dict
        The CSV's rows (points as floats), ordered by student, chapter, exercise.
    """
    import csv
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    paths = sorted(NOTEBOOKS_DIR.glob("*.ipynb")) if notebooks is None else [Path(p) for p in notebooks]
    sources = {p.stem: p for p in paths if exercises(p)}
    if chapters is not None:
        unknown = sorted(set(chapters) - set(sources))
        if unknown:
            raise ValueError(f"chapters must name notebooks with exercises ({sorted(sources)}); got {unknown}")
    found, ignored = find_submissions(submissions, list(sources))
    for path in ignored:
        warnings.warn(f"ignored {path}: expected <student>/<chapter>.ipynb or <student>/<chapter>/<chapter>.ipynb "
                      f"with <chapter> one of {sorted(sources)}", stacklevel=2)
    graded = list(chapters) if chapters is not None else sorted({c for mine in found.values() for c in mine})
    graded = [c for c in sources if c in graded]  # file-name order

    def one(student: str, chapter: str) -> list[Score]:
        path = found[student].get(chapter)
        if path is None:
            return _all(exercises(sources[chapter]), "missing", f"no notebook submitted for {chapter}")
        executed = None if executed_dir is None else Path(executed_dir) / student / f"{chapter}.ipynb"
        return grade_notebook(path, sources[chapter], timeout=timeout, triton_interpret=triton_interpret,
                              executed_path=executed)

    keys = [(student, chapter) for student in found for chapter in graded]
    workers = max(1, jobs if jobs else min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda key: one(*key), keys))
    rows = [
        {"student": student, "chapter": chapter, **{k: getattr(s, k) for k in GRADE_COLUMNS[2:]}}
        for (student, chapter), scores in zip(keys, results) for s in scores
    ]
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with out_csv.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=GRADE_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "points": f"{row['points']:g}", "max_points": f"{row['max_points']:g}"})
    return rows


@dataclass(frozen=True)
class VariantResult:
    """How the checks judged one variant (e.g. a known-wrong answer) of one exercise.

    ``graded`` is the score with the hidden tests (as :func:`grade` scores it);
    ``visible`` the score with only the tests the student sees.
    """

    name: str
    exercise: str
    graded: Score
    visible: Score


def grade_variants(notebook: str | Path, variants: Mapping[str, tuple[str, str]], *,
                   timeout: float = DEFAULT_CELL_TIMEOUT_S,
                   triton_interpret: bool = True) -> tuple[list[Score], dict[str, VariantResult]]:
    """Grade many answers to one chapter's exercises in one kernel (a mutation check).

    The book's notebook runs once, top to bottom, like :func:`grade_notebook` runs a
    submission. After each exercise's tests cell, each variant of that exercise is
    tried in the same kernel: its body replaces the answer (see
    :func:`replace_solution_body`), then the tests cell runs without and with the hidden
    tests; finally the book's solution and tests cell run again, so later exercises see
    the right answer. The chapter's prose cells run once instead of once per variant.

    Parameters
    ----------
    notebook : str or Path
        A book notebook with exercises.
    variants : mapping
        ``name -> (exercise, body)``, ``exercise`` being the exercise name
        (``"ch02-ex1"``) or either of its grade_ids.

    Returns
    -------
    (list of Score, dict of VariantResult)
        The book's solutions graded (one Score per exercise: ``passed`` only if the
        tests passed the first time and again after every variant), and each variant's
        result by name.
    """
    import tempfile

    found = exercises(notebook)
    if not found:
        if variants:
            raise ValueError(f"{Path(notebook).name} has no exercises; got variants {sorted(variants)}")
        return [], {}
    by_name = {ex.name: ex for ex in found}
    wanted: dict[str, list[tuple[str, str]]] = {}
    for name, (target, body) in variants.items():
        key = target.removesuffix("-solution").removesuffix("-tests")
        if key not in by_name:
            raise ValueError(f"variant {name!r}: exercise must be one of {sorted(by_name)}; got {target!r}")
        wanted.setdefault(key, []).append((name, body))
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    at_tests = {ex.tests_cell: ex for ex in found}
    committed: dict[str, Score] = {}
    results: dict[str, VariantResult] = {}
    with tempfile.TemporaryDirectory(prefix="flashlab-variants-") as cwd:
        kernel = _Kernel(nb, Path(cwd), timeout, triton_interpret)
        with kernel.session():
            for index, cell in enumerate(nb.cells[: max(at_tests) + 1]):
                outcome = kernel.run(cell, index)
                ex = at_tests.get(index)
                if ex is None:
                    continue
                solution_cell, tests_cell = nb.cells[ex.solution_cell], nb.cells[ex.tests_cell]
                committed[ex.name] = _score(ex, None, outcome)
                for name, body in wanted.get(ex.name, []):
                    variant = copy.deepcopy(solution_cell)
                    variant.source = replace_solution_body(solution_cell.source, body)
                    visible = copy.deepcopy(tests_cell)
                    visible.source = strip_hidden_tests(tests_cell.source)
                    sol = kernel.run(variant, ex.solution_cell)
                    seen = _score(ex, sol, kernel.run(visible, ex.tests_cell))
                    graded = _score(ex, sol, kernel.run(copy.deepcopy(tests_cell), ex.tests_cell))
                    results[name] = VariantResult(name, ex.name, graded, seen)
                    kernel.run(copy.deepcopy(solution_cell), ex.solution_cell)  # the book's answer again
                    again = _score(ex, None, kernel.run(copy.deepcopy(tests_cell), ex.tests_cell))
                    if again.status != "passed" and committed[ex.name].status == "passed":
                        committed[ex.name] = Score(ex.tests_id, 0.0, ex.points, again.status,
                                                   f"after variant {name!r}: {again.message}")
    return [committed[ex.name] for ex in found], results


def _summary(chapters: Sequence[Chapter], outdir: Path, seconds: float) -> str:
    lines = [f"{'chapter':<28} {'exercises':>9} {'points':>7}"]
    for ch in chapters:
        lines.append(f"{ch.name:<28} {len(ch.exercises):>9} {ch.points:>7g}")
    total_ex = sum(len(ch.exercises) for ch in chapters)
    total_pts = sum(ch.points for ch in chapters)
    if not chapters:
        lines.append("(no notebook has exercises yet)")
    lines.append(f"{'total':<28} {total_ex:>9} {total_pts:>7g}")
    lines.append(f"student versions: {outdir / 'release'}")
    lines.append(f"solutions:        {outdir / 'solutions'}")
    lines.append(f"built in {seconds:.1f} s")
    return "\n".join(lines)


def _grade_summary(rows: Sequence[dict], out_csv: Path, seconds: float) -> str:
    students: dict[str, list[dict]] = {}
    for row in rows:
        students.setdefault(row["student"], []).append(row)
    lines = [f"{'student':<24} {'points':>7} {'of':>5}  " + " ".join(f"{s:>7}" for s in STATUSES)]
    for student, mine in students.items():
        counts = [sum(r["status"] == s for r in mine) for s in STATUSES]
        lines.append(f"{student:<24} {sum(r['points'] for r in mine):>7g} {sum(r['max_points'] for r in mine):>5g}  "
                     + " ".join(f"{c:>7}" for c in counts))
    if not rows:
        lines.append("(no submission found)")
    lines.append(f"grades: {out_csv}")
    lines.append(f"graded in {seconds:.1f} s")
    return "\n".join(lines)


def _main_grade(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flashlab.course.assignments grade",
        description="Grade a folder of submitted notebooks into a CSV of scores per student and exercise. "
                    "The hidden tests are put back from the book's notebooks before each submission runs.",
        epilog="Layout: SUBMISSIONS/<student>/<chapter>.ipynb or SUBMISSIONS/<student>/<chapter>/<chapter>.ipynb "
               "(nbgrader's submitted/ folder), <chapter> being the notebook's name, e.g. 02_online_softmax. "
               f"CSV columns: {', '.join(GRADE_COLUMNS)}.",
    )
    parser.add_argument("submissions", type=Path, help="folder with one folder per student")
    parser.add_argument("--out", type=Path, default=Path("build/grades.csv"), help="CSV written (default: build/grades.csv)")
    parser.add_argument("--chapter", action="append", dest="chapters", metavar="NAME",
                        help="grade this chapter (repeatable; default: every chapter someone submitted)")
    parser.add_argument("--notebooks", nargs="+", type=Path, metavar="NOTEBOOK",
                        help="the book's notebooks with solutions and hidden tests (default: notebooks/*.ipynb)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_CELL_TIMEOUT_S,
                        help=f"seconds each cell may run (default: {DEFAULT_CELL_TIMEOUT_S:g})")
    parser.add_argument("--jobs", type=int, default=None, help="notebooks run at once (default: CPUs, at most 4)")
    parser.add_argument("--executed", type=Path, default=None, metavar="DIR",
                        help="also write the executed notebooks here (they contain the hidden tests)")
    parser.add_argument("--no-interpret", action="store_true",
                        help="do not set TRITON_INTERPRET=1 in the kernels (Triton then uses a GPU if present)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        rows = grade(args.submissions, args.out, notebooks=args.notebooks, chapters=args.chapters,
                     timeout=args.timeout, jobs=args.jobs, triton_interpret=not args.no_interpret,
                     executed_dir=args.executed)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(_grade_summary(rows, args.out.resolve(), time.perf_counter() - start))
    return 0


def _main_build(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flashlab.course.assignments [build]",
        description="Build student versions (solutions and hidden tests stripped) with nbgrader.",
        epilog="To grade submissions: python -m flashlab.course.assignments grade SUBMISSIONS --out build/grades.csv "
               "(see `python -m flashlab.course.assignments grade -h`).",
    )
    parser.add_argument("outdir", type=Path, help="output folder, e.g. build/assignments")
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks (default: notebooks/*.ipynb)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    chapters = build(args.outdir, args.notebooks or None)
    print(_summary(chapters, args.outdir.resolve(), time.perf_counter() - start))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line.

    ``python -m flashlab.course.assignments [build] OUTDIR [NOTEBOOK ...]`` builds the student
    versions (``build`` may be left out, as before); ``python -m flashlab.course.assignments
    grade SUBMISSIONS --out CSV`` grades submissions.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "grade":
        return _main_grade(argv[1:])
    if argv and argv[0] == "build":
        argv = argv[1:]
    return _main_build(argv)


if __name__ == "__main__":
    sys.exit(main())
