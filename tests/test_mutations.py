"""The mutation bank: the exercises' checks catch known-wrong answers.

tests/mutations/mutants.yaml lists wrong answers to the book's exercises (mutants),
each a replacement for the code between ``### BEGIN SOLUTION`` and ``### END
SOLUTION`` of one exercise. Here every mutant is graded with the chapter's tests,
hidden ones included, and must lose the exercise's points; every committed solution
must earn all of them; and each mutant's ``caught_by`` (``visible`` or ``hidden``)
must be true, so the instructor page can say which mistakes only the hidden tests see.
tests/mutations/correct.yaml lists right answers written differently; each must pass.

Each chapter runs once, in one kernel (:func:`flashlab.course.assignments.grade_variants`,
which shares its cell runner and scoring with ``grade``): after an exercise's tests
cell, its mutants are tried one after the other, then the book's answer is put back.
All chapters with exercises run in parallel, one kernel per CPU.

Adding an exercise to a chapter? Add at least one mutant for it to the bank.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
import yaml

from flashlab.course.assignments import (
    NOTEBOOKS_DIR,
    REPO_ROOT,
    VariantResult,
    exercises,
    grade_variants,
    replace_solution_body,
    solution_body,
)

BANK_PATH = Path(__file__).parent / "mutations" / "mutants.yaml"
BANK: list[dict] = yaml.safe_load(BANK_PATH.read_text(encoding="utf-8"))
# Right answers written differently from the book's: they must pass.
CORRECT: list[dict] = yaml.safe_load((Path(__file__).parent / "mutations" / "correct.yaml").read_text(encoding="utf-8"))
KEYS = {"id", "exercise", "mistake", "caught_by", "body"}
# exercise name ("ch02-ex1") -> (notebook, Exercise), over the whole book
BOOK = {ex.name: (path, ex) for path in sorted(NOTEBOOKS_DIR.glob("*.ipynb")) for ex in exercises(path)}
CHAPTERS = sorted({path for path, _ in BOOK.values()})
CELL_TIMEOUT_S = 120
# A mutant stopped by one of these is broken (or hangs), not wrong: it proves nothing about the checks.
BROKEN = {"NameError", "SyntaxError", "IndentationError", "UnboundLocalError", "NotImplementedError",
          "TimeoutError", "NotRun", "NoReply"}


def _ids(items: list) -> list[str]:
    return [m["id"] if isinstance(m, dict) else Path(m).stem for m in items]


@pytest.fixture(scope="module")
def graded() -> dict[str, tuple[list, dict[str, VariantResult]]]:
    """Each chapter graded once with its mutants: stem -> (committed scores, mutant results)."""
    def run(path: Path):
        variants = {m["id"]: (m["exercise"], m["body"]) for m in BANK + CORRECT
                    if BOOK.get(m["exercise"], (None,))[0] == path}
        return grade_variants(path, variants, timeout=CELL_TIMEOUT_S)

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = list(pool.map(run, CHAPTERS))
    return {path.stem: result for path, result in zip(CHAPTERS, results)}


# ---------------------------------------------------------------- the bank itself


def test_bank_is_well_formed() -> None:
    assert len(BANK) >= 10, f"the bank must hold at least 10 mutants; it has {len(BANK)}"
    ids = [m.get("id") for m in BANK]
    assert len(ids) == len(set(ids)), f"mutant ids must be unique; repeated: {sorted({i for i in ids if ids.count(i) > 1})}"
    for m in BANK:
        assert set(m) == KEYS, f"{m.get('id')}: expected keys {sorted(KEYS)}, got {sorted(m)}"
        assert m["exercise"] in BOOK, f"{m['id']}: no exercise {m['exercise']!r} in notebooks/ (have {sorted(BOOK)})"
        assert m["id"].startswith(m["exercise"] + "-"), f"{m['id']}: ids start with the exercise, e.g. {m['exercise']}-..."
        assert m["caught_by"] in {"visible", "hidden"}, f"{m['id']}: caught_by must be visible or hidden"
        assert m["mistake"].strip(), f"{m['id']}: say what the student got wrong"


@pytest.mark.parametrize("mutant", BANK, ids=_ids(BANK))
def test_mutant_is_valid_python_and_differs_from_the_solution(mutant: dict) -> None:
    path, ex = BOOK[mutant["exercise"]]
    cell = nbformat.read(path, as_version=4).cells[ex.solution_cell]
    mutated = replace_solution_body(cell.source, mutant["body"])
    compile(mutated, f"{mutant['id']}", "exec")  # a SyntaxError would be 'caught' for nothing
    squash = lambda text: [line.split("#")[0].rstrip() for line in text.strip().splitlines() if line.strip()]  # noqa: E731
    assert squash(mutant["body"]) != squash(solution_body(cell.source)), f"{mutant['id']} is the committed solution"


def test_every_exercise_has_a_mutant() -> None:
    covered = {m["exercise"] for m in BANK}
    missing = sorted(set(BOOK) - covered)
    assert not missing, f"exercises without a known-wrong answer in {BANK_PATH.name}: {missing}"


def test_instructor_page_lists_the_bank() -> None:
    page = (REPO_ROOT / "book" / "instructor.md").read_text(encoding="utf-8")
    absent = [m["id"] for m in BANK if f"`{m['id']}`" not in page]
    assert not absent, f"book/instructor.md does not list these mutants: {absent}"
    absent = [name for name in BOOK if name not in page]
    assert not absent, f"book/instructor.md does not list these exercises: {absent}"


# ---------------------------------------------------------------- grading them


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS, ids=_ids(CHAPTERS))
def test_committed_solutions_get_full_points(chapter: Path, graded: dict) -> None:
    committed, _ = graded[chapter.stem]
    short = [(s.exercise, s.status, s.message) for s in committed if s.status != "passed" or s.points != s.max_points]
    assert not short, f"{chapter.name}: the book's own solutions lose points: {short}"


@pytest.mark.slow
@pytest.mark.parametrize("mutant", BANK, ids=_ids(BANK))
def test_mutant_is_caught(mutant: dict, graded: dict) -> None:
    path, ex = BOOK[mutant["exercise"]]
    result = graded[path.stem][1][mutant["id"]]
    score = result.graded
    assert score.points < score.max_points and score.status in {"failed", "error"}, (
        f"{mutant['id']} ({mutant['mistake']}) earns {score.points:g}/{score.max_points:g} points in {path.name}: "
        "strengthen the exercise's hidden tests"
    )
    ename = score.message.split(":")[0].split(" ")[0]
    assert ename not in BROKEN, f"{mutant['id']}: stopped by {score.message!r}, so the mutant is broken, not wrong"


@pytest.mark.slow
@pytest.mark.parametrize("mutant", BANK, ids=_ids(BANK))
def test_mutant_is_caught_by_the_declared_tests(mutant: dict, graded: dict) -> None:
    path, _ = BOOK[mutant["exercise"]]
    result = graded[path.stem][1][mutant["id"]]
    seen = "visible" if result.visible.status != "passed" else "hidden"
    assert seen == mutant["caught_by"], (
        f"{mutant['id']}: declared caught_by {mutant['caught_by']}, but the visible tests "
        f"{'reject' if seen == 'visible' else 'accept'} it ({result.visible.message or 'passed'})"
    )


@pytest.mark.slow
@pytest.mark.parametrize("answer", CORRECT, ids=_ids(CORRECT))
def test_a_right_answer_written_differently_passes(answer: dict, graded: dict) -> None:
    path, _ = BOOK[answer["exercise"]]
    score = graded[path.stem][1][answer["id"]].graded
    assert score.status == "passed", f"{answer['id']} ({answer['why']}) is right but scores {score}"


@pytest.mark.slow
@pytest.mark.parametrize("mutant", [m for m in BANK if "-calls-" in m["id"]],
                         ids=_ids([m for m in BANK if "-calls-" in m["id"]]))
def test_calling_the_package_is_stopped_by_the_grader(mutant: dict, graded: dict) -> None:
    """These answers would be right: what stops them is the function switched off."""
    path, _ = BOOK[mutant["exercise"]]
    message = graded[path.stem][1][mutant["id"]].graded.message
    assert "is switched off while this exercise is graded" in message, f"{mutant['id']}: {message}"
