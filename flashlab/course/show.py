"""Show pieces of the package's own source in a chapter, without importing what they need.

The chapters quote the kernels they explain (a Triton kernel cannot be imported on a machine
without Triton's runtime, so the source is read from the file, not from the live object):

    from flashlab.course import show
    show.source("kernels/forward.py", "_attend", start="for start_n")   # the loop of one function
    show.source("kernels/forward.py", "online_softmax_step", body=True)  # without its docstring
    show.docstring("kernels/backward.py", start="Two ways to get dQ", stop="For GQA")
    show.excerpt("kernels/forward.py", "online_softmax_step", start="m_new =", stop="return")

:func:`excerpt` is what a chapter shows a student: at most :data:`EXCERPT_LINES` lines of one
function, dedented and displayed as a highlighted code block (Markdown), so the page shows
the few lines that implement an equation, not a whole function with its docstring.

Each prints the text and returns it; a name or marker that is not there raises a ValueError
that says which file and what was looked for, so a chapter cannot silently quote stale code.
"""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["source", "docstring", "excerpt", "EXCERPT_LINES", "EXCERPT_WIDTH", "PACKAGE"]

PACKAGE = Path(__file__).resolve().parents[1]  # flashlab/
EXCERPT_LINES = 20  # the longest excerpt a chapter may show
EXCERPT_WIDTH = 100  # characters: an output line's limit (the site sets outputs at 9 pt)


def _read(path: str) -> tuple[str, ast.Module]:
    file = PACKAGE / path
    if not file.is_file():
        raise ValueError(f"path must name a file inside the flashlab package, e.g. 'kernels/forward.py'; got {path!r}")
    text = file.read_text(encoding="utf-8")
    return text, ast.parse(text)


#: What a function's source calls where a grader's package copy holds its body.
HELD = "flashlab._held"


def _function(tree: ast.Module, name: str, path: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    raise ValueError(f"name must be a top-level function or class of {path} (one of {names}); got {name!r}")


def _cut(lines: list[str], start: str | None, stop: str | None, where: str) -> list[str]:
    if start is not None:
        hits = [i for i, line in enumerate(lines) if start in line]
        if not hits:
            raise ValueError(f"start marker {start!r} does not occur in {where}")
        lines = lines[hits[0]:]
    if stop is not None:
        hits = [i for i, line in enumerate(lines) if stop in line]
        if not hits:
            raise ValueError(f"stop marker {stop!r} does not occur in {where} (after the start marker)")
        lines = lines[: hits[0]]
    return lines


def source(path: str, name: str, *, start: str | None = None, stop: str | None = None, body: bool = False,
           quiet: bool = False) -> str:
    """The source of top-level function ``name`` in ``flashlab/<path>``, from the first line
    containing ``start`` (default: the ``def`` line) up to, not including, the first line
    containing ``stop`` (default: the end). ``body=True`` leaves out the signature and the
    docstring. Printed unless ``quiet``; returned either way."""
    text, tree = _read(path)
    node = _function(tree, name, path)
    lines = ast.get_source_segment(text, node).splitlines()
    if any(HELD in line for line in lines):  # a grader's sandbox: the code is not in this copy
        out = f"# {path}:{name}: held by the grader while this notebook is graded"
        if not quiet:
            print(out)
        return out
    if body:  # from the line after the docstring (comments before the first statement kept), else after the def
        has_doc = isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
        after = node.body[0].end_lineno if has_doc else node.body[0].lineno - 1
        lines = lines[after + 1 - node.lineno:]
    out = "\n".join(_cut(lines, start, stop, f"{path}:{name}"))
    if not quiet:
        print(out)
    return out


def docstring(path: str, name: str | None = None, *, start: str | None = None, stop: str | None = None,
              quiet: bool = False) -> str:
    """The docstring of ``flashlab/<path>`` (``name=None``: the module's; otherwise that top-level
    function's or class's), cut between the ``start`` and ``stop`` markers as in :func:`source`."""
    text, tree = _read(path)
    node = tree if name is None else _function(tree, name, path)
    doc = ast.get_docstring(node)
    if doc is None:
        raise ValueError(f"{path}{':' + name if name else ''} has no docstring")
    out = "\n".join(_cut(doc.splitlines(), start, stop, f"the docstring of {path}{':' + name if name else ''}"))
    if not quiet:
        print(out)
    return out


def _comment_above(line: str) -> list[str]:
    """``code  # note`` wider than EXCERPT_WIDTH -> ``# note`` on the line above ``code``."""
    if len(line) <= EXCERPT_WIDTH or "  # " not in line:
        return [line]
    code, note = line.split("  # ", 1)
    if code.count('"') % 2 or code.count("'") % 2:  # the "#" is inside a string
        return [line]
    indent = code[: len(code) - len(code.lstrip())]
    return [f"{indent}# {note}", code.rstrip()]


#: Lines an excerpt leaves out: the kernel's time stamps (``_stamp(...)``, compiled only when
#: ``STAMPS`` is on), which measure the code and are not part of the algorithm shown.
EXCERPT_HIDDEN = ("_stamp(",)


def excerpt(path: str, name: str, *, start: str | None = None, stop: str | None = None,
            body: bool = True, quiet: bool = False) -> str:
    """A short excerpt of top-level function ``name`` in ``flashlab/<path>``, cut as in
    :func:`source` (``body=True`` by default: no signature, no docstring), dedented and
    displayed as a highlighted Python block, without the lines of :data:`EXCERPT_HIDDEN`.
    Returns the excerpt's text.

    A line wider than :data:`EXCERPT_WIDTH` with a trailing comment has the comment moved
    to its own line above it. Raises ValueError if the excerpt is longer than
    :data:`EXCERPT_LINES` lines (choose tighter ``start``/``stop`` markers) or a line is
    still wider than :data:`EXCERPT_WIDTH`."""
    import textwrap

    text = source(path, name, start=start, stop=stop, body=body, quiet=True)
    text = textwrap.dedent(text).strip("\n")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith(EXCERPT_HIDDEN)]
    where = f"{path}:{name}"
    if len(lines) > EXCERPT_LINES:
        raise ValueError(f"an excerpt of {where} must be at most {EXCERPT_LINES} lines; got "
                         f"{len(lines)} (start={start!r}, stop={stop!r}): choose tighter markers")
    lines = [part for line in lines for part in _comment_above(line)]
    text = "\n".join(lines)
    wide = [i for i, line in enumerate(lines, 1) if len(line) > EXCERPT_WIDTH]
    if wide:
        raise ValueError(f"an excerpt of {where} must have lines of at most {EXCERPT_WIDTH} "
                         f"characters; lines {wide} of the excerpt are wider: choose other "
                         f"markers or shorten them in {path}")
    if not quiet:
        from IPython.display import Markdown, display

        display(Markdown(f"```python\n{text}\n```"))
    return text
