"""Command line of the exercises' grader (the code lives in :mod:`flashlab.course.grader`).

    python -m flashlab.course.assignments [build] OUTDIR [NOTEBOOK ...]
    python -m flashlab.course.assignments grade SUBMISSIONS [--out build/grades.csv] [--chapter NAME ...]
                                                [--student NAME ...] [--extra-tests DIR]
                                                [--unsafe-no-sandbox] [--no-code-policy]

``build`` writes the student versions with nbgrader (:func:`~flashlab.course.grader.build`);
``grade`` grades a folder of submissions, each notebook in its own bubblewrap sandbox
(:func:`~flashlab.course.grader.grade`) into a CSV per exercise, a summary CSV per
student and a feedback file per student. Default notebooks: every ``notebooks/*.ipynb``
of the repository.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from flashlab.course.grader import *
from flashlab.course.grader import (
    DEFAULT_CELL_TIMEOUT_S,
    DEFAULT_NOTEBOOK_TIMEOUT_S,
    GRADE_COLUMNS,
    STATUSES,
    Chapter,
    SandboxUnavailable,
    build,
    grade,
    new_salt,
    outputs_of,
)
from flashlab.course.grader.session import FORBIDDEN  # noqa: F401


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
    summary, feedback = outputs_of(out_csv)
    lines.append(f"grades: {out_csv}")
    lines.append(f"summary per student: {summary}")
    lines.append(f"feedback per student: {feedback}")
    lines.append(f"graded in {seconds:.1f} s")
    return "\n".join(lines)


def _main_grade(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flashlab.course.assignments grade",
        description="Grade a folder of submitted notebooks into a CSV of scores per student and exercise. "
                    "Each notebook runs in its own bubblewrap sandbox; the book's tests cells (hidden tests "
                    "included) run in the grader and call the student's functions in the sandbox.",
        epilog="Layout: SUBMISSIONS/<student>/<chapter>.ipynb or SUBMISSIONS/<student>/<chapter>/<chapter>.ipynb "
               "(nbgrader's submitted/ folder), or flat LMS downloads SUBMISSIONS/<name>_<id>_<chapter>.ipynb "
               "(Canvas's <name>_<id>_<submission id>_<chapter>.ipynb, Moodle's "
               "<Full Name>_<id>_assignsubmission_file_<chapter>.ipynb), <chapter> being the notebook's name, "
               f"e.g. 02_online_softmax. CSV columns: {', '.join(GRADE_COLUMNS)}. Beside the CSV: "
               "<stem>_summary.csv (student, points per chapter, total, max_points) and "
               "<stem>_feedback/<student>.md.",
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
    parser.add_argument("--student", action="append", dest="students", metavar="NAME",
                        help="grade only this student (repeatable), e.g. to regrade one")
    parser.add_argument("--extra-tests", type=Path, default=None, metavar="DIR",
                        help="a folder of more hidden tests, <exercise>.py each (e.g. ch02-ex1.py), run after "
                             "the book's tests of that exercise")
    parser.add_argument("--no-feedback", action="store_true", help="do not write the feedback files")
    parser.add_argument("--quiet", action="store_true", help="no progress bar while grading")
    parser.add_argument("--notebook-timeout", type=float, default=DEFAULT_NOTEBOOK_TIMEOUT_S,
                        help=f"seconds each whole notebook may run (default: {DEFAULT_NOTEBOOK_TIMEOUT_S:g})")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="grade without the bubblewrap sandbox: submissions then run with your "
                             "permissions and can read the answer key and change other grades")
    parser.add_argument("--no-code-policy", action="store_true",
                        help="run submissions that break the code policy (book/instructor.md, 'What a submission's "
                             "code may contain'); their probes' findings can then be forged")
    parser.add_argument("--salt", type=int, default=None,
                        help="mixed into the seeds of the tests' random inputs (default: a fresh random one, "
                             "printed at the end; pass it again to regrade with the same inputs)")
    parser.add_argument("--no-interpret", action="store_true",
                        help="do not set TRITON_INTERPRET=1 in the kernels (Triton then uses a GPU if present)")
    args = parser.parse_args(argv)
    args.salt = new_salt() if args.salt is None else args.salt
    start = time.perf_counter()
    bar = []
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not args.unsafe_no_sandbox:
        print("note: grading as root; Linux does not apply the sandbox's process limit to root's processes, "
              "so a fork bomb is stopped only by the machine (run the grader as an ordinary user: see the "
              "instructor's page, 'The sandbox')", file=sys.stderr)

    def progress(done: int, total: int) -> None:
        if args.quiet:
            return
        if not bar:
            from tqdm import tqdm

            bar.append(tqdm(total=total, desc="graded", unit="notebook", file=sys.stderr, dynamic_ncols=True))
        bar[0].update(done - bar[0].n)

    try:
        rows = grade(args.submissions, args.out, notebooks=args.notebooks, chapters=args.chapters,
                     timeout=args.timeout, jobs=args.jobs, triton_interpret=not args.no_interpret,
                     executed_dir=args.executed, notebook_timeout=args.notebook_timeout,
                     unsafe_no_sandbox=args.unsafe_no_sandbox, students=args.students, progress=progress,
                     extra_tests=args.extra_tests, feedback=not args.no_feedback, salt=args.salt,
                     code_policy=not args.no_code_policy)
    except (FileNotFoundError, ValueError, SandboxUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        for b in bar:
            b.close()
    print(_grade_summary(rows, args.out.resolve(), time.perf_counter() - start))
    print(f"the hidden tests drew their random inputs with --salt {args.salt} (pass it to regrade with the "
          "same inputs)")
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

