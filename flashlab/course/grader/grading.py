"""Grading submissions: each notebook in its own sandbox, the checks outside it.

:func:`grade` takes a folder of submissions (:func:`find_submissions`), grades every
notebook with :func:`grade_notebook` and, once every sandbox is gone, writes the CSV
itself (:data:`GRADE_COLUMNS`, one row per student and exercise). For one notebook:

1. the submission is read as data; the book's tests cells (hidden tests included)
   take the place of the tests cells, matched by grade_id (:func:`_for_grading`);
2. a kernel starts in a fresh sandbox (:mod:`.sandbox`) holding only the submitted
   notebook, and runs the submission's cells top to bottom, except the tests cells;
3. at each tests cell the grader runs the book's tests in its own process
   (:class:`.session.Checker`), calling the student's functions in the kernel and
   receiving what they return as data;
4. a tests cell that raises nothing earns its points.

:func:`grade_variants` runs many answers to a chapter's exercises in one sandbox;
``tests/test_mutations.py`` uses it to check that a bank of known-wrong answers is
caught, and ``tests/exploits/`` that submissions attacking the grader get nothing.
"""

from __future__ import annotations

import copy
import os
import re
import stat
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import nbformat

from . import policy, sandbox
from .notebook import (
    BEGIN_HIDDEN,
    END_HIDDEN,
    NOTEBOOKS_DIR,
    Exercise,
    _grade_id,
    _nbgrader_meta,
    exercises,
    replace_solution_body,
    strip_hidden_tests,
)
from .session import FORBIDDEN, Checker, KernelSession, Outcome, defined_names, held_specs

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
#: Seconds one whole notebook may take, whatever its cells do.
DEFAULT_NOTEBOOK_TIMEOUT_S = 1200.0


@dataclass(frozen=True)
class Score:
    """The grade of one exercise: one row of the grades CSV without student and chapter.

    ``exercise`` is the grade_id of the tests cell (``chNN-exK-tests``); ``status`` is
    one of :data:`STATUSES`; ``message`` is the first line of the error, empty when passed;
    ``check`` whether the check that raised was a ``"visible"`` or a ``"hidden"`` one
    (``""`` when passed, missing, or not known). ``check`` is not a CSV column: the
    feedback files use it.
    """

    exercise: str
    points: float
    max_points: float
    status: str
    message: str = ""
    check: str = ""


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
    for ex in found:  # tests cells the student deleted, whose solution cell is still there
        if ex.solution_id in first and ex.tests_id not in first:
            sol = first[ex.solution_id]
            cell = copy.deepcopy(source.cells[ex.tests_cell])
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


def _score(ex: Exercise, solution: Outcome | None, tests: Outcome | None) -> Score:
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
    if tests.ename == "DeadKernelError":
        message = f"Kernel died: {tests.evalue}"
    check = tests.check
    if solution is not None and not solution.ok and solution.ename != "NotRun":
        message, check = f"the solution cell raised {solution.line}", ""
    return Score(ex.tests_id, 0.0, ex.points, status, message[:500], check)


def _all(found: Sequence[Exercise], status: str, message: str) -> list[Score]:
    return [Score(ex.tests_id, 0.0, ex.points, status, message) for ex in found]


@contextmanager
def package_site(site: Path | None = None) -> Iterator[Path]:
    """The package copy the sandboxes import (:func:`.sandbox.package_copy`), made once."""
    if site is not None:
        yield site
        return
    with tempfile.TemporaryDirectory(prefix="flashlab-site-") as tmp:
        yield sandbox.package_copy(Path(tmp), held=held_specs(FORBIDDEN))


def new_salt() -> int:
    """A fresh secret salt for the tests' random inputs (:class:`.session.Checker`)."""
    import secrets

    return secrets.randbelow(1 << 32)


def linked(root: str | Path, path: str | Path) -> bool:
    """Whether ``path``, or a folder between ``root`` and it, is a symbolic link, or it lies
    outside ``root``: such a submission could name the answer key or another student's notebook."""
    root, path = Path(root), Path(path)
    rel = path.relative_to(root)
    steps = [root.joinpath(*rel.parts[:i]) for i in range(1, len(rel.parts) + 1)]
    return any(p.is_symlink() for p in steps) or not path.resolve().is_relative_to(root.resolve())


#: The largest submitted notebook read (bytes): a chapter with its outputs is well under 5 MB.
MAX_NOTEBOOK_BYTES = 20 << 20


def _read(submission: str | Path | nbformat.NotebookNode) -> nbformat.NotebookNode:
    if isinstance(submission, nbformat.NotebookNode):
        return submission
    info = os.lstat(submission)
    if stat.S_ISLNK(info.st_mode):  # it could name the answer key, or a classmate's notebook
        raise ValueError("the submission is a symbolic link, not a notebook")
    if not stat.S_ISREG(info.st_mode):  # reading a FIFO or a device would block the whole run
        raise ValueError("the submission is not a regular file (a named pipe, a device or a folder)")
    if info.st_size > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"the notebook is {info.st_size / 2**20:.0f} MiB; at most {MAX_NOTEBOOK_BYTES >> 20} MiB "
                         "is read (clear large outputs and submit again)")
    nb = nbformat.read(submission, as_version=4)
    if not isinstance(nb.get("cells"), list):
        raise ValueError("no list of cells")
    return nb


def grade_notebook(submission: str | Path | nbformat.NotebookNode, source: str | Path, *,
                   timeout: float = DEFAULT_CELL_TIMEOUT_S, notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT_S,
                   triton_interpret: bool = True, executed_path: str | Path | None = None,
                   unsafe_no_sandbox: bool = False, site: Path | None = None,
                   limits: sandbox.Limits = sandbox.Limits(),
                   extra_tests: Mapping[str, str] | None = None, salt: int | None = None,
                   code_policy: bool = True) -> list[Score]:
    """Grade one submitted notebook against the book's notebook ``source``.

    The submission's cells run in a fresh kernel in its own sandbox (``TRITON_INTERPRET=1``
    when ``triton_interpret``; at most ``timeout`` seconds per cell and
    ``notebook_timeout`` for the whole notebook); each of the book's tests cells runs in
    the grader when the submission reaches it and earns its points if it raises nothing.
    Never raises for a bad submission: an unreadable notebook, a deleted exercise, a
    crash or a dead kernel give 0 points with a status and a message.

    Parameters
    ----------
    submission : path or notebook
        The student's notebook (a student version from ``build`` with answers filled in).
    source : path
        The book's notebook of the same chapter (solutions and hidden tests).
    executed_path : path, optional
        Where to write the executed notebook (it holds the hidden tests: not for students).
    unsafe_no_sandbox : bool
        Run the kernel without bubblewrap (the checks still run outside the kernel, but
        the submission can read and write whatever the grader can).
    site : path, optional
        A package copy from :func:`package_site`, to share one between notebooks.
    extra_tests : mapping, optional
        Exercise name (``"ch02-ex1"``) -> Python source of more hidden tests, run after
        the book's tests in the same tests cell (see :func:`load_extra_tests`).
    salt : int, optional
        Mixed into every seed the tests give ``np.random.default_rng``, so their random
        inputs are not the public book's (:class:`.session.Checker`); None: the book's.
    code_policy : bool
        Check the cells the student wrote or edited against :mod:`.policy` first; a
        notebook that breaks it is not run, and every exercise gets 0 (``error``) with a
        message naming the cell, the line and the construct. False: skip the check
        (the sandbox and the outside checks still hold; the probes' findings can then be forged).

    Returns
    -------
    list of Score
        One per exercise of ``source``, in order.

    Raises
    ------
    SandboxUnavailable
        If bubblewrap cannot run here and ``unsafe_no_sandbox`` is false.
    """
    sandboxed = sandbox.require(unsafe_no_sandbox)
    found = exercises(source)
    source_nb = with_extra_tests(nbformat.read(source, as_version=4), found, extra_tests or {})
    try:
        submitted = _read(submission)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the submission's fault
        line = (str(exc).strip().splitlines() or [""])[0]
        return _all(found, "error", f"could not read the notebook: {type(exc).__name__}: {line}"[:300])
    try:
        nb, where = _for_grading(submitted, source_nb, found)
    except Exception as exc:  # noqa: BLE001
        return _all(found, "error", f"could not prepare the notebook: {type(exc).__name__}: {exc}"[:300])
    if code_policy:
        violations = policy.check_notebook(nb, source_nb, held_specs(FORBIDDEN))
        if violations:
            return _all(found, "error", policy.summary(violations)[:500])
    tests_at = {w[1]: ex for ex, w in ((ex, where[ex.name]) for ex in found) if w is not None}
    solution_at = {w[0]: ex for ex, w in ((ex, where[ex.name]) for ex in found) if w is not None}
    outcomes: dict[int, Outcome] = {}
    if tests_at:
        last = max(tests_at)
        with package_site(site) as site_dir, tempfile.TemporaryDirectory(prefix="flashlab-grade-") as private:
            shown = Path(private) / f"{Path(source).stem}.ipynb"  # the submission as the student sent it
            try:
                if isinstance(submission, (str, Path)):
                    shutil.copyfile(submission, shown)
                else:
                    nbformat.write(submitted, shown)
                with KernelSession(site=site_dir, notebook=shown, cell_timeout=timeout,
                                   notebook_timeout=notebook_timeout, triton_interpret=triton_interpret,
                                   sandboxed=sandboxed, limits=limits) as kernel:
                    checker = Checker(kernel, salt)
                    for index in range(last + 1):
                        cell = nb.cells[index]
                        if cell.cell_type != "code":
                            continue
                        if index in tests_at:
                            ex = tests_at[index]
                            outcome, outputs = checker.run(cell.source, ex.name, ex.tests_id)
                        else:
                            outcome, outputs = kernel.run_cell(cell.source)
                            if index in solution_at:
                                ex = solution_at[index]
                                checker.define(defined_names(source_nb.cells[ex.solution_cell].source))
                        outcomes[index] = outcome
                        cell.outputs = outputs
            except sandbox.SandboxUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - the kernel would not start or shut down
                reason = f"the kernel failed: {type(exc).__name__}: {exc}".splitlines()[0]
                for index in range(last + 1):
                    outcomes.setdefault(index, Outcome(False, "NotRun", reason))
    if executed_path is not None:
        executed_path = Path(executed_path)
        executed_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            nbformat.write(nb, executed_path)
        except Exception as exc:  # noqa: BLE001 - a cell the student broke; the grades stand
            executed_path.write_text(f"could not write the executed notebook: {type(exc).__name__}: {exc}\n")
    scores = []
    for ex in found:
        w = where[ex.name]
        scores.append(_score(ex, None, None) if w is None else _score(ex, outcomes.get(w[0]), outcomes.get(w[1])))
    return scores


#: Folders an LMS or an archiver adds that hold no submissions.
SKIPPED_FOLDERS = ("__MACOSX",)
#: Moodle's suffix of a submission's folder or file name: ``<Full Name>_<id>_assignsubmission_file_``.
MOODLE_SUFFIX = "_assignsubmission_file_"
#: What a browser or an LMS appends to a repeated file name: ``-1``, `` (2)``.
_COPY_SUFFIX = re.compile(r"(-\d+| \(\d+\))$")


def _flat_name(stem: str, chapters: Sequence[str]) -> tuple[str, str] | None:
    """(student, chapter) of a file downloaded flat from an LMS, or None.

    ``stem`` (the file name without ``.ipynb``) must end with ``_<chapter>``, perhaps
    followed by a copy suffix (``-1``, `` (2)``). Of what comes before, Moodle's
    ``_assignsubmission_file`` and Canvas's ``_LATE`` marker are dropped, and so is a
    last number that follows another number (Canvas's submission id, which differs per
    chapter: ``<name>_<user id>_<submission id>``). What is left names the student.
    """
    import re

    base = _COPY_SUFFIX.sub("", stem)
    for chapter in sorted(chapters, key=len, reverse=True):
        if not base.endswith("_" + chapter):
            continue
        student = base[: -len(chapter) - 1]
        student = student.removesuffix(MOODLE_SUFFIX.rstrip("_")).removesuffix(MOODLE_SUFFIX)
        student = re.sub(r"_LATE(?=_|$)", "", student)
        student = re.sub(r"(_\d+)_\d+$", r"\1", student)
        return (student, chapter) if student.strip("_ ") else None
    return None


def find_submissions(submissions: str | Path, chapters: Sequence[str]) -> tuple[dict[str, dict[str, Path]], list[Path]]:
    """The notebooks of a submissions folder: ``{student: {chapter: path}}`` and the
    ``.ipynb`` files that match no chapter, or repeat one (ignored).

    Accepted, ``<chapter>`` being the notebook's name without ``.ipynb`` (e.g.
    ``02_online_softmax``):

    - one folder per student, named by the student's id, holding ``<chapter>.ipynb``
      or, as nbgrader collects them, ``<chapter>/<chapter>.ipynb``; a Moodle folder
      ``<Full Name>_<id>_assignsubmission_file_/<chapter>.ipynb`` is the student
      ``<Full Name>_<id>``;
    - flat files straight in the folder, as an LMS downloads them: ``<student>_<chapter>.ipynb``,
      where ``<student>`` is e.g. ``<name>_<id>``; Canvas's
      ``<name>[_LATE]_<user id>_<submission id>_<chapter>[-N].ipynb`` is the student
      ``<name>_<user id>``, Moodle's ``<Full Name>_<id>_assignsubmission_file_<chapter>.ipynb``
      the student ``<Full Name>_<id>`` (see :func:`_flat_name`).

    Folders and files starting with ``.`` are skipped, and so are ``__MACOSX``
    folders (the resource forks a Mac's zip adds). When one student has two notebooks
    for a chapter, the first in this order is graded and the other reported: a
    student folder's ``<chapter>.ipynb``, then nbgrader's layout, then a flat file.
    """
    root = Path(submissions)
    if not root.is_dir():
        raise FileNotFoundError(f"submissions must be a folder with one folder per student; got {str(root)!r}")
    known = set(chapters)
    found: dict[str, dict[str, Path]] = {}
    ignored: list[Path] = []

    def student_of(folder: str) -> str:
        return folder.removesuffix(MOODLE_SUFFIX) or folder

    order = {2: 0, 3: 1, 1: 2}  # depth below root: student folder, nbgrader's layout, flat

    def rank(p: Path) -> tuple:  # a file without a copy suffix before its copies
        base = _COPY_SUFFIX.sub("", p.stem)
        return order.get(len(p.relative_to(root).parts), 3), p.parent, base, base != p.stem, p.name

    for path in sorted(root.rglob("*.ipynb"), key=rank):
        rel = path.relative_to(root)
        if any(part.startswith(".") or part in SKIPPED_FOLDERS for part in rel.parts):
            continue
        if len(rel.parts) == 2 and path.stem in known or len(rel.parts) == 3 and path.stem in known and rel.parts[1] == path.stem:
            student, chapter = student_of(rel.parts[0]), path.stem
        elif len(rel.parts) == 1 and _flat_name(path.stem, chapters) is not None:
            student, chapter = _flat_name(path.stem, chapters)
        else:
            ignored.append(path)
            continue
        mine = found.setdefault(student, {})
        if chapter in mine:
            ignored.append(path)
            continue
        mine[chapter] = path
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.name.startswith(".") and entry.name not in SKIPPED_FOLDERS:
            found.setdefault(student_of(entry.name), {})
    return dict(sorted(found.items())), sorted(ignored)


def load_extra_tests(folder: str | Path, sources: Sequence[str | Path]) -> dict[str, str]:
    """The instructor's extra hidden tests: exercise name -> Python source.

    ``folder`` holds one file per exercise, ``<exercise>.py`` (e.g. ``ch02-ex1.py``;
    ``ch02-ex1-tests.py`` works too). Each is run by the grader right after the book's
    tests of that exercise, in the same namespace (the student's functions, and what
    the book's tests imported and defined), as if it stood between the hidden-tests
    markers of the tests cell: it is never part of a student version, and a failure
    costs the exercise its points like any hidden test. Other files are ignored.

    Raises
    ------
    FileNotFoundError
        If ``folder`` is not a folder.
    ValueError
        If a file names no exercise of ``sources``, or is not valid Python.
    """
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"extra_tests must be a folder of <exercise>.py files; got {str(root)!r}")
    names = {ex.name for path in sources for ex in exercises(path)}
    extra: dict[str, str] = {}
    for path in sorted(root.glob("*.py")):
        name = path.stem.removesuffix("-tests")
        if name not in names:
            raise ValueError(f"extra tests {path.name}: the file must be named <exercise>.py with <exercise> "
                             f"one of {sorted(names)}; got {path.stem!r}")
        code = path.read_text(encoding="utf-8")
        try:
            compile(code, str(path), "exec")
        except SyntaxError as exc:
            raise ValueError(f"extra tests {path.name} are not valid Python: {exc}") from None
        extra[name] = code
    return extra


def with_extra_tests(nb: nbformat.NotebookNode, found: Sequence[Exercise],
                     extra: Mapping[str, str]) -> nbformat.NotebookNode:
    """A copy of the book's notebook whose tests cells end with the extra hidden tests."""
    mine = {ex.name: ex for ex in found if ex.name in extra}
    if not mine:
        return nb
    nb = copy.deepcopy(nb)
    for name, ex in mine.items():
        cell = nb.cells[ex.tests_cell]
        cell.source = f"{cell.source.rstrip()}\n{BEGIN_HIDDEN}\n{extra[name].rstrip()}\n{END_HIDDEN}\n"
    return nb


def summary_rows(rows: Sequence[Mapping], chapters: Sequence[str]) -> list[dict]:
    """One row per student: ``student``, the points of each chapter, ``total``, ``max_points``."""
    out: dict[str, dict] = {}
    for row in rows:
        mine = out.setdefault(row["student"], {"student": row["student"], **{c: 0.0 for c in chapters},
                                               "total": 0.0, "max_points": 0.0})
        mine[row["chapter"]] += row["points"]
        mine["total"] += row["points"]
        mine["max_points"] += row["max_points"]
    return list(out.values())


def _write_csv(path: Path, columns: Sequence[str], rows: Sequence[Mapping]) -> None:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{v:g}" if isinstance(v, float) else _cell(v) for k, v in row.items()})


def _cell(value: object) -> object:
    """A CSV cell a spreadsheet shows as text: a name or message starting with ``=``, ``+``,
    ``-``, ``@`` (a formula to Excel and LibreOffice) gets a leading apostrophe."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def feedback_text(student: str, graded: Sequence[tuple[str, Sequence[Score]]]) -> str:
    """A student's feedback in Markdown: per chapter and exercise, the points and why
    points were lost. It quotes the first line of what failed (the check's own
    message), never a test's source, and says whether the check was a visible one or
    a hidden test."""
    total = sum(s.points for _, scores in graded for s in scores)
    most = sum(s.max_points for _, scores in graded for s in scores)
    lines = [f"# Feedback for {student}", "", f"**{total:g} of {most:g} points.**", ""]
    for chapter, scores in graded:
        got, of = sum(s.points for s in scores), sum(s.max_points for s in scores)
        lines += [f"## {chapter}: {got:g} of {of:g} points", "",
                  "| exercise | points | result |", "|---|---|---|"]
        for s in scores:
            lines.append(f"| {s.exercise.removesuffix('-tests')} | {s.points:g} of {s.max_points:g} | "
                         f"{_why(s).replace('|', '/')} |")
        lines.append("")
    lines += ["A *visible check* is one of the asserts of the exercise's tests cell in your notebook; run",
              "that cell to see it fail. A *hidden test* is a check the grader adds: its message says what",
              "it looked at. Every exercise is all or nothing.", ""]
    return "\n".join(lines)


def _why(score: Score) -> str:
    if score.status == "passed":
        return "passed"
    if score.status == "missing":
        return f"missing: {score.message}"
    message = score.message
    if score.check == "hidden" and message.endswith("of the cell)"):  # an assert without a message
        message = message.split(" (line ")[0] + " (the hidden test gives no message)"
    where = {"visible": "a visible check failed", "hidden": "a hidden test failed"}.get(
        score.check, "failed" if score.status == "failed" else "error")
    return f"{where}: {message}" if message else where


def write_feedback(folder: Path, results: Mapping[str, Sequence[tuple[str, Sequence[Score]]]]) -> list[Path]:
    """``folder/<student>.md`` for each student (:func:`feedback_text`); the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for student, graded in results.items():
        path = folder / f"{student}.md"
        path.write_text(feedback_text(student, graded), encoding="utf-8")
        written.append(path)
    return written


def outputs_of(out_csv: str | Path) -> tuple[Path, Path]:
    """Where :func:`grade` writes, beside ``out_csv``: the summary CSV and the feedback folder
    (``grades.csv`` -> ``grades_summary.csv``, ``grades_feedback/``)."""
    out_csv = Path(out_csv)
    return out_csv.with_name(f"{out_csv.stem}_summary.csv"), out_csv.with_name(f"{out_csv.stem}_feedback")


def grade(submissions: str | Path, out_csv: str | Path, *, notebooks: Sequence[str | Path] | None = None,
          chapters: Sequence[str] | None = None, timeout: float = DEFAULT_CELL_TIMEOUT_S,
          notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT_S, jobs: int | None = None,
          triton_interpret: bool = True, executed_dir: str | Path | None = None,
          unsafe_no_sandbox: bool = False, progress: Callable[[int, int], None] | None = None,
          students: Sequence[str] | None = None, extra_tests: str | Path | None = None,
          feedback: bool = True, salt: int | None = None, code_policy: bool = True) -> list[dict]:
    """Grade a folder of submissions into a CSV of scores per student and exercise, a
    summary CSV per student, and a feedback file per student.

    Parameters
    ----------
    submissions : str or Path
        One folder per student (named by the student's id) holding
        ``<chapter>.ipynb`` or nbgrader's ``<chapter>/<chapter>.ipynb``, or flat LMS
        downloads ``<name>_<id>_<chapter>.ipynb``; see :func:`find_submissions`.
    out_csv : str or Path
        The CSV written, columns :data:`GRADE_COLUMNS`; its folder is created. Beside it
        (:func:`outputs_of`): ``<stem>_summary.csv``, one row per student (``student``,
        one column of points per graded chapter, ``total``, ``max_points``), and
        ``<stem>_feedback/<student>.md``. All are written by this process after every
        sandbox has stopped.
    notebooks : sequence of paths, optional
        The book's notebooks (solutions and hidden tests); default ``notebooks/*.ipynb``.
    chapters : sequence of str, optional
        The chapters graded, e.g. ``["02_online_softmax"]``; default every chapter
        that at least one student submitted. A student without a notebook for a
        graded chapter gets ``missing`` rows for it.
    timeout, notebook_timeout : float
        Seconds each cell, and each whole notebook, may run.
    jobs : int, optional
        Notebooks graded at once (one sandbox each); default the number of CPUs, at most 4.
    executed_dir : str or Path, optional
        Also write each executed notebook to ``executed_dir/<student>/<chapter>.ipynb``
        (tracebacks for the instructor; they contain the hidden tests).
    unsafe_no_sandbox : bool
        Grade without the sandbox (see :func:`grade_notebook`).
    progress : callable, optional
        Called as ``progress(done, total)`` after each notebook.
    students : sequence of str, optional
        Grade only these students (folder names), e.g. to regrade one; the CSV then
        holds their rows only.
    extra_tests : str or Path, optional
        A folder of the instructor's extra hidden tests, ``<exercise>.py`` each
        (:func:`load_extra_tests`).
    feedback : bool
        Write the feedback files (default True).
    salt : int, optional
        Mixed into the seeds of the tests' random inputs (see :func:`grade_notebook`); by
        default a fresh random one, so no one can compute the hidden tests' answers in
        advance from the public book. Pass the same salt to regrade with the same inputs.
    code_policy : bool
        Check each submission's own cells against :mod:`.policy` before running it
        (default True; see :func:`grade_notebook`).

    Returns
    -------
    list of dict
        The CSV's rows (points as floats), ordered by student, chapter, exercise.

    Raises
    ------
    SandboxUnavailable
        Before anything runs, if bubblewrap cannot run and ``unsafe_no_sandbox`` is false.
    """
    import threading
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    sandbox.require(unsafe_no_sandbox)
    salt = new_salt() if salt is None else salt
    paths = sorted(NOTEBOOKS_DIR.glob("*.ipynb")) if notebooks is None else [Path(p) for p in notebooks]
    sources = {p.stem: p for p in paths if exercises(p)}
    if chapters is not None:
        unknown = sorted(set(chapters) - set(sources))
        if unknown:
            raise ValueError(f"chapters must name notebooks with exercises ({sorted(sources)}); got {unknown}")
    extra = {} if extra_tests is None else load_extra_tests(extra_tests, list(sources.values()))
    found, ignored = find_submissions(submissions, list(sources))
    if students is not None:
        unknown = sorted(set(students) - set(found))
        if unknown:
            raise ValueError(f"students must name students of {str(submissions)!r} ({sorted(found)}); "
                             f"got {unknown}")
        found = {name: found[name] for name in found if name in set(students)}
    for path in ignored:
        warnings.warn(f"ignored {path}: expected <student>/<chapter>.ipynb, <student>/<chapter>/<chapter>.ipynb "
                      f"or <student>_<chapter>.ipynb with <chapter> one of {sorted(sources)}, once per student "
                      "and chapter", stacklevel=2)
    graded = list(chapters) if chapters is not None else sorted({c for mine in found.values() for c in mine})
    graded = [c for c in sources if c in graded]  # file-name order
    keys = [(student, chapter) for student in found for chapter in graded]
    done = [0]
    lock = threading.Lock()

    with package_site() as site:
        def one(student: str, chapter: str) -> list[Score]:
            path = found[student].get(chapter)
            if path is None:
                scores = _all(exercises(sources[chapter]), "missing", f"no notebook submitted for {chapter}")
            elif linked(submissions, path):
                scores = _all(exercises(sources[chapter]), "error",
                              "the submission is a symbolic link, not a notebook: submit the file itself")
            else:
                executed = None if executed_dir is None else Path(executed_dir) / student / f"{chapter}.ipynb"
                try:
                    scores = grade_notebook(path, sources[chapter], timeout=timeout,
                                            notebook_timeout=notebook_timeout, triton_interpret=triton_interpret,
                                            executed_path=executed, unsafe_no_sandbox=unsafe_no_sandbox, site=site,
                                            extra_tests=extra, salt=salt, code_policy=code_policy)
                except sandbox.SandboxUnavailable:
                    raise
                except Exception as exc:  # noqa: BLE001 - one notebook never stops the others' grades
                    line = (str(exc).strip().splitlines() or [""])[0]
                    scores = _all(exercises(sources[chapter]), "error",
                                  f"the grader failed on this notebook: {type(exc).__name__}: {line}"[:300])
            with lock:
                done[0] += 1
                if progress is not None:
                    progress(done[0], len(keys))
            return scores

        workers = max(1, jobs if jobs else min(4, os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(lambda key: one(*key), keys))
    rows = [
        {"student": student, "chapter": chapter, **{k: getattr(s, k) for k in GRADE_COLUMNS[2:]}}
        for (student, chapter), scores in zip(keys, results) for s in scores
    ]
    summary_csv, feedback_dir = outputs_of(out_csv)
    _write_csv(Path(out_csv), GRADE_COLUMNS, rows)
    _write_csv(summary_csv, ["student", *graded, "total", "max_points"], summary_rows(rows, graded))
    if feedback:
        by_student: dict[str, list[tuple[str, Sequence[Score]]]] = {}
        for (student, chapter), scores in zip(keys, results):
            by_student.setdefault(student, []).append((chapter, scores))
        write_feedback(feedback_dir, by_student)
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
                   timeout: float = DEFAULT_CELL_TIMEOUT_S, triton_interpret: bool = True,
                   unsafe_no_sandbox: bool = False) -> tuple[list[Score], dict[str, VariantResult]]:
    """Grade many answers to one chapter's exercises in one sandbox (a mutation check).

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
    sandboxed = sandbox.require(unsafe_no_sandbox)
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
    at_tests = {ex.tests_cell: ex for ex in found}
    at_solution = {ex.solution_cell: ex for ex in found}
    committed: dict[str, Score] = {}
    results: dict[str, VariantResult] = {}
    with package_site() as site, KernelSession(site=site, cell_timeout=timeout,
                                               notebook_timeout=max(DEFAULT_NOTEBOOK_TIMEOUT_S, 60 * timeout),
                                               triton_interpret=triton_interpret, sandboxed=sandboxed) as kernel:
        checker = Checker(kernel)
        for index, cell in enumerate(nb.cells[: max(at_tests) + 1]):
            if cell.cell_type != "code":
                continue
            ex = at_tests.get(index)
            if ex is None:
                kernel.run_cell(cell.source)
                if index in at_solution:
                    checker.define(defined_names(cell.source))
                continue
            tests = cell.source
            committed[ex.name] = _score(ex, None, checker.run(tests, ex.name, ex.tests_id)[0])
            solution = nb.cells[ex.solution_cell].source
            for name, body in wanted.get(ex.name, []):
                sol = kernel.run_cell(replace_solution_body(solution, body))[0]
                seen = _score(ex, sol, checker.run(strip_hidden_tests(tests), ex.name, ex.tests_id)[0])
                graded = _score(ex, sol, checker.run(tests, ex.name, ex.tests_id)[0])
                results[name] = VariantResult(name, ex.name, graded, seen)
                kernel.run_cell(solution)  # the book's answer again
                again = _score(ex, None, checker.run(tests, ex.name, ex.tests_id)[0])
                if again.status != "passed" and committed[ex.name].status == "passed":
                    committed[ex.name] = Score(ex.tests_id, 0.0, ex.points, again.status,
                                               f"after variant {name!r}: {again.message}")
    return [committed[ex.name] for ex in found], results
