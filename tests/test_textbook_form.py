"""The chapters keep the textbook's form: prose a student can read through, code and output
that fit the page, and a "Check your understanding" section with folded answers.

The limits (one place, so a chapter's author can run just this file):
- at most WORDS words of prose (markdown cells) per notebook;
- no code line wider than CODE_WIDTH characters, no output line wider than OUTPUT_WIDTH;
- no code cell longer than CELL_LINES lines (blank lines and ``# NBVAL_`` markers not
  counted), an exercise cell (nbgrader) no longer than EXERCISE_LINES (hidden tests,
  which the student's version does not show, not counted);
- no whole-function source dumps (``inspect.getsource``); the course layer's
  ``show.excerpt`` keeps an excerpt short;
- chapters 1-9 end with a "Check your understanding" section of at least QUESTIONS
  questions, each answer folded away in a ``<details>`` block.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
WORDS = 6000
CODE_WIDTH = 88
OUTPUT_WIDTH = 100
CELL_LINES = 15
EXERCISE_LINES = 30
QUESTIONS = 4
CHECKED_CHAPTERS = tuple(f"{n:02d}" for n in range(1, 10))  # chapters 1-9

# What the site shows instead of text/plain when a richer form is there.
_RICH = ("text/html", "text/markdown", "image/png", "image/svg+xml", "text/latex")


def _cells(nb: Path) -> list[dict]:
    return json.loads(nb.read_text(encoding="utf-8"))["cells"]


def _src(cell: dict) -> str:
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def prose_words(cells: list[dict]) -> int:
    """Words of the markdown cells (the same count as the project's stop hook)."""
    md = " ".join(_src(c) for c in cells if c["cell_type"] == "markdown")
    return len(re.findall(r"[A-Za-z0-9']+", md))


def _output_lines(cell: dict) -> list[str]:
    lines: list[str] = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            text = out.get("text", "")
        elif "data" in out:
            data = out["data"]
            if any(k in data for k in _RICH):
                continue
            text = data.get("text/plain", "")
        else:  # an error: nbval fails on it anyway
            continue
        text = "".join(text) if isinstance(text, list) else text
        lines += text.splitlines()
    return lines


def _counted_lines(source: str) -> int:
    """Lines a reader sees: not blank, not an nbval marker, not inside hidden tests."""
    source = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", "", source, flags=re.S)
    return sum(1 for line in source.splitlines()
               if line.strip() and not line.strip().startswith("# NBVAL_"))


def form_problems(nb: Path) -> list[str]:
    """Every way ``nb`` falls short of the limits above, as readable lines."""
    cells = _cells(nb)
    found = []
    words = prose_words(cells)
    if words > WORDS:
        found.append(f"{words} words of prose; at most {WORDS} (move lab logs to the appendix)")
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        src = _src(cell)
        wide = [n for n, line in enumerate(src.splitlines(), 1) if len(line) > CODE_WIDTH]
        if wide:
            found.append(f"cell {i}: code lines {wide} are wider than {CODE_WIDTH} characters")
        limit = EXERCISE_LINES if cell.get("metadata", {}).get("nbgrader") else CELL_LINES
        if _counted_lines(src) > limit:
            found.append(f"cell {i}: {_counted_lines(src)} lines of code; at most {limit}")
        if "getsource" in src:
            found.append(f"cell {i}: prints a whole function (getsource); use show.excerpt")
        out_wide = [n for n, line in enumerate(_output_lines(cell), 1) if len(line) > OUTPUT_WIDTH]
        if out_wide:
            found.append(f"cell {i}: output lines {out_wide[:8]} are wider than {OUTPUT_WIDTH}")
    return found


def check_questions(cells: list[dict]) -> tuple[int, int]:
    """(questions, folded answers) in the "Check your understanding" section: the markdown
    from its heading to the next heading of the same or a higher level. Questions are the
    numbered list items at the start of a line; answers are ``<details>`` blocks."""
    md = "\n\n".join(_src(c) for c in cells if c["cell_type"] == "markdown")
    head = re.search(r"^(#{1,3}) [^\n]*Check your understanding[^\n]*$", md, re.M)
    if not head:
        return 0, 0
    level = len(head.group(1))
    rest = md[head.end():]
    nxt = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    section = rest[: nxt.start()] if nxt else rest
    outside = re.sub(r"<details>.*?</details>", "", section, flags=re.S)
    questions = len(re.findall(r"^(?:\d+\.|\*\*\d+\.)\s", outside, re.M))
    answers = len(re.findall(r"<details>\s*<summary>", section))
    return questions, answers


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_fits_the_textbook_form(nb: Path) -> None:
    found = form_problems(nb)
    assert not found, f"{nb.name}:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("nb", [p for p in NOTEBOOKS if p.name[:2] in CHECKED_CHAPTERS],
                         ids=lambda p: p.stem)
def test_chapter_ends_with_check_questions(nb: Path) -> None:
    questions, answers = check_questions(_cells(nb))
    assert questions >= QUESTIONS, (
        f"{nb.name}: its 'Check your understanding' section has {questions} numbered "
        f"questions; at least {QUESTIONS} expected")
    assert answers >= questions, (
        f"{nb.name}: {questions} questions but {answers} folded answers "
        "(<details><summary>Answer</summary> ... </details> after each question)")


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A notebook that breaks each limit is caught by each check."""
    long_prose = " ".join(["word"] * (WORDS + 1))
    bad = {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": long_prose},
        {"cell_type": "code", "metadata": {}, "execution_count": 1,
         "source": "x = 1  # " + "y" * CODE_WIDTH + "\n" + "z = 2\n" * (CELL_LINES + 1)
         + "inspect.getsource(f)",
         "outputs": [{"output_type": "stream", "name": "stdout", "text": "w" * 101}]},
        {"cell_type": "markdown", "metadata": {},
         "source": "## Check your understanding\n\n1. Why?\n\n<details><summary>Answer</summary>"
                   "Because.</details>\n\n2. How?\n"},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "01_bad.ipynb"
    path.write_text(json.dumps(bad))
    found = "\n".join(form_problems(path))
    for what in ("words of prose", "wider than 88", "lines of code", "getsource", "wider than 100"):
        assert what in found
    assert check_questions(bad["cells"]) == (2, 1)
