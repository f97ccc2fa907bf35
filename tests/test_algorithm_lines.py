"""Every "line N" comment of the FlashAttention references names the right line of its algorithm.

The references quote the papers' listings in their docstrings: FlashAttention (Dao et al.,
2022) Algorithm 1 in the docstring of :mod:`flashlab.reference.flash1` and Algorithm 4 in
that of ``flash1_backward``; FlashAttention-2 (Dao, 2023, arXiv 2307.08691) Algorithms 1
and 2 in the docstring of :mod:`flashlab.reference.flash2`. A listing is a run of lines
``N  text`` (or ``N-M  text``) after a sentence that names "Algorithm K". The code says
which line it implements in comments: ``# line 9: S_ij = tau Q_i K_j^T``, ``# Alg. 1 line
2: O = 0 in HBM``, ``# FA2 Alg. 2 line 11: ...``, ``# lines 10-13``.

For each comment this test finds the listing it refers to (the paper and algorithm named in
the comment, else in the enclosing function's docstring, else the module's own paper and
the first algorithm the function's docstring names) and checks that

- every line number it cites exists in that listing, and
- a single cited line agrees in text: the comment and listing line N share a *key*,
  the symbol the line defines (the name before ``=``, ``+=`` or ``<-``) or its leading
  word (``for``, ``load``, ``write``, ``split``, ``mask``).

Keys are what tell neighbouring lines apart (line 12 defines dV_j, line 13 dP_ij), so the
last test checks that no comment would also agree with the line before or after the one
it cites: a number off by one cannot pass.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

import flashlab

PACKAGE = Path(flashlab.__file__).parent

# module (relative to the package) -> the paper its bare "Alg. K" refers to
MODULES = {
    "reference/flash1.py": "FA1",
    "reference/flash2.py": "FA2",
    "reference/counting.py": None,  # names the paper in every reference
    "memory.py": "FA1",
}
LISTINGS_IN = {"FA1": "reference/flash1.py", "FA2": "reference/flash2.py"}

NUMBERED = re.compile(r"^(\s+)(\d+)(?:-(\d+))?\s+(\S.*)$")
ALGORITHM = re.compile(r"\b(?:(FA[12])\s+)?(?:Algorithm|Alg\.)\s*(\d+)")
REFERENCE = re.compile(r"(?:\b(FA[12])\s+)?(?:\bAlg\.\s*(\d+),?\s+)?\blines?\s+(\d+)(?:\s*-\s*(\d+))?\b")
TOKEN = r"[A-Za-z][A-Za-z0-9_~^]*"
ASSIGNED = re.compile(rf"({TOKEN})\s*(?:\+=|<-|←|(?<![<>=!])=(?!=))")


# ---------------------------------------------------------------- parsing
def _normalise(token: str) -> str:
    """Words compare without case ("Load" = "load", "MASK" = "mask"); symbols keep theirs (D != d)."""
    return token.lower() if token.isalpha() and len(token) >= 3 else token


def keys(text: str) -> set[str]:
    """The leading word of ``text`` and every symbol it assigns to."""
    found = {m.group(1) for m in ASSIGNED.finditer(text)}
    leading = re.match(TOKEN, text.strip())
    if leading:
        found.add(leading.group(0))
    return {_normalise(t) for t in found}


def listings(docstring: str) -> dict[int, dict[int, str]]:
    """{algorithm K: {line N: text}} of the numbered listings in a docstring."""
    result: dict[int, dict[int, str]] = {}
    lines = docstring.splitlines()
    i = 0
    while i < len(lines):
        if not NUMBERED.match(lines[i]):
            i += 1
            continue
        before = " ".join(lines[:i])
        named = ALGORITHM.findall(before)
        assert named, f"a numbered listing at {lines[i]!r} follows no sentence naming its Algorithm"
        listing = result.setdefault(int(named[-1][1]), {})
        while i < len(lines) and lines[i].strip():
            m = NUMBERED.match(lines[i])
            if m:
                indent, first, last, text = len(m.group(1)), int(m.group(2)), int(m.group(3) or m.group(2)), m.group(4)
                numbers = range(first, last + 1)
                for n in numbers:
                    assert n not in listing, f"line {n} is listed twice in Algorithm {named[-1][1]}"
                    listing[n] = text
            else:  # a continuation of the numbered line above it
                assert len(lines[i]) - len(lines[i].lstrip()) > indent, f"unnumbered line in a listing: {lines[i]!r}"
                for n in numbers:
                    listing[n] += "  " + lines[i].strip()
            i += 1
    return result


def all_listings() -> dict[tuple[str, int], dict[int, str]]:
    """{(paper, K): {N: text}} from the module and function docstrings of flash1 and flash2."""
    found: dict[tuple[str, int], dict[int, str]] = {}
    for paper, path in LISTINGS_IN.items():
        tree = ast.parse((PACKAGE / path).read_text())
        docstrings = [ast.get_docstring(tree)] + [
            ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
        ]
        for doc in filter(None, docstrings):
            for k, listing in listings(doc).items():
                assert (paper, k) not in found, f"{path}: {paper} Algorithm {k} is listed twice"
                found[(paper, k)] = listing
    return found


@dataclass(frozen=True)
class Citation:
    where: str  # "path:line"
    paper: str
    algorithm: int
    first: int
    last: int
    text: str  # what the comment says the line does

    def __str__(self) -> str:
        lines = f"line {self.first}" if self.first == self.last else f"lines {self.first}-{self.last}"
        return f"{self.where}: {self.paper} Alg. {self.algorithm} {lines}: {self.text!r}"


def _defaults(tree: ast.Module, module_paper: str | None) -> list[tuple[int, int, str | None, int | None]]:
    """(first line, last line, paper, algorithm) of each function, from its docstring."""
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            named = ALGORITHM.search(ast.get_docstring(node) or "")
            paper = (named.group(1) if named else None) or module_paper
            spans.append((node.lineno, node.end_lineno, paper, int(named.group(2)) if named else None))
    return spans


def citations(path: str) -> list[Citation]:
    """Every "line N" reference in the comments of one module."""
    source = (PACKAGE / path).read_text()
    spans = _defaults(ast.parse(source), MODULES[path])
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        comment, row = tok.string.lstrip("#").strip(), tok.start[0]
        inner = [s for s in spans if s[0] <= row <= s[1]]
        _, _, paper, algorithm = min(inner, key=lambda s: s[1] - s[0]) if inner else (0, 0, MODULES[path], None)
        matches = list(REFERENCE.finditer(comment))
        for m, after in zip(matches, matches[1:] + [None]):
            text = comment[m.end() : after.start() if after else len(comment)].lstrip(" :").strip()
            cited_paper = m.group(1) or paper
            cited_algorithm = int(m.group(2)) if m.group(2) else algorithm
            where = f"{path}:{row}"
            assert cited_paper and cited_algorithm, f"{where}: {comment!r} does not say which paper's algorithm"
            first = int(m.group(3))
            found.append(Citation(where, cited_paper, cited_algorithm, first, int(m.group(4) or first), text))
    return found


def agrees(citation: Citation, line_text: str) -> bool:
    return bool(keys(citation.text) & keys(line_text))


def problems(cites: list[Citation], paper_listings: dict[tuple[str, int], dict[int, str]]) -> list[str]:
    """What is wrong with each citation, one sentence per problem."""
    out = []
    for c in cites:
        listing = paper_listings.get((c.paper, c.algorithm))
        if listing is None:
            out.append(f"{c}: no listing of {c.paper} Algorithm {c.algorithm} in a docstring")
            continue
        missing = [n for n in range(c.first, c.last + 1) if n not in listing]
        if missing:
            out.append(f"{c}: line(s) {missing} are not in the listing")
        elif c.first == c.last and not agrees(c, listing[c.first]):
            out.append(f"{c}: shares no key ({sorted(keys(c.text))}) with listing line "
                       f"{c.first}, {listing[c.first]!r} ({sorted(keys(listing[c.first]))})")
    return out


# ---------------------------------------------------------------- the tests
PAPER_LISTINGS = all_listings()
CITATIONS = [c for path in MODULES for c in citations(path)]


def test_the_four_listings_are_found():
    assert set(PAPER_LISTINGS) == {("FA1", 1), ("FA1", 4), ("FA2", 1), ("FA2", 2)}
    # spot checks against the papers (FA1 Alg. 1 and 4, FA2 Alg. 1 and 2)
    assert keys(PAPER_LISTINGS[("FA1", 1)][9]) == {"S_ij"}
    assert keys(PAPER_LISTINGS[("FA1", 4)][13]) == {"P_ij"}
    assert keys(PAPER_LISTINGS[("FA1", 4)][21]) == {"dQ_i"}
    assert keys(PAPER_LISTINGS[("FA2", 1)][13]) == {"L_i"}
    assert keys(PAPER_LISTINGS[("FA2", 2)][4]) == {"D"}
    assert keys(PAPER_LISTINGS[("FA2", 2)][15]) == {"dQ_i"}
    assert 17 not in PAPER_LISTINGS[("FA2", 2)]  # "end for"


@pytest.mark.parametrize("path", list(MODULES))
def test_every_module_cites_lines(path):
    assert any(c.where.startswith(path + ":") for c in CITATIONS)


def test_every_line_comment_matches_its_listing():
    assert CITATIONS
    assert problems(CITATIONS, PAPER_LISTINGS) == []


def test_every_single_line_comment_has_text_to_compare():
    bare = [str(c) for c in CITATIONS if c.first == c.last and not keys(c.text)]
    assert bare == []


def test_a_number_off_by_one_is_caught():
    """Shift each single-line citation by +-1: wherever the shifted line exists, it must be reported."""
    shifted = []
    for c in CITATIONS:
        listing = PAPER_LISTINGS[(c.paper, c.algorithm)]
        for n in (c.first - 1, c.first + 1):
            if c.first == c.last and n in listing:
                shifted.append(Citation(c.where, c.paper, c.algorithm, n, n, c.text))
    assert shifted
    slipped = [str(c) for c in shifted if not problems([c], PAPER_LISTINGS)]
    assert slipped == []
