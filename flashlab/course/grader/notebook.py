"""The authoring convention of the book's exercises, and the student versions built with nbgrader.

Every chapter ends with 3-5 exercises. An exercise is three cells:

1. a markdown cell stating the task (the *prompt*);
2. a *solution* code cell whose function body (or, for a Triton kernel, the
   top-level definitions) sits between ``### BEGIN SOLUTION``
   and ``### END SOLUTION``, with nbgrader metadata
   ``{"grade": false, "solution": true, "grade_id": "chNN-exK-solution", ...}``;
3. a *tests* code cell with visible ``assert``s, then hidden ones between
   ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``, with nbgrader metadata
   ``{"grade": true, "solution": false, "locked": true, "points": P,
   "grade_id": "chNN-exK-tests", ...}``.

A tests cell is self-contained: it imports what it uses, and of the notebook it uses
only the functions the solution cells define (the grader runs it outside the
student's kernel, see :mod:`flashlab.course.grader.session`).

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
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import nbformat

REPO_ROOT = Path(__file__).resolve().parents[3]
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


def gradebook_submissions(path: Path) -> int:
    """Submissions recorded in nbgrader's gradebook at ``path`` (0 if it has none or is unreadable)."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return int(db.execute("SELECT COUNT(*) FROM submitted_assignment").fetchone()[0])
    except sqlite3.Error:
        return 0


def keep_gradebook(outdir: Path) -> Path | None:
    """Copy ``outdir/gradebook.db`` to ``outdir/gradebook-<UTC time>.db`` if it holds
    submissions (grades), say so on stderr, and return the copy; else None."""
    import datetime

    db = outdir / "gradebook.db"
    if not db.is_file():
        return None
    count = gradebook_submissions(db)
    if count == 0:
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    backup = outdir / f"gradebook-{stamp}.db"
    shutil.copy2(db, backup)
    print(f"{db} holds {count} graded submission(s): kept a copy as {backup.name} before rebuilding",
          file=sys.stderr)
    return backup


def build(outdir: str | Path, notebooks: Sequence[str | Path] | None = None) -> list[Chapter]:
    """Build student versions of every notebook that has exercises.

    Parameters
    ----------
    outdir : str or Path
        Where the nbgrader course is written; the paths it owns
        (``source/ release/ solutions/ gradebook.db nbgrader_config.py``) are
        deleted and rewritten, anything else there is left alone. A gradebook that
        holds submissions is first copied aside (:func:`keep_gradebook`).
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
    keep_gradebook(outdir)
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

