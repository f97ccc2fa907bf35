"""Build the book's website: ``python -m flashlab.course.site build [OUT_DIR] [--instructor]``.

Two editions of one site. The **student edition** (the default, ``make book``, into
``build/site``) shows every exercise as the student gets it: the solution cells hold
nbgrader's stub and the tests cells only the visible tests. The **instructor edition**
(``--instructor``, ``make book-instructor``, into ``build/site-instructor``) shows the
notebooks as committed, solutions and hidden tests included.

The site is a Jupyter Book 1.x build (Sphinx + myst-nb + sphinx-book-theme) in
four steps, none of which touches the source tree or the network:

1. **Stage** ``book/`` (config, table of contents, prose pages, ``_static/``),
   ``notebooks/*.ipynb`` and ``figures/`` into ``OUT_DIR``, mirroring the
   repository layout so that a notebook's ``../figures/x.png`` still resolves.
   For the student edition each notebook with exercises is first built into its
   student version by the grader (:func:`flashlab.course.grader.build`, nbgrader's
   ``generate_assignment``) and its exercise cells replace the book's
   (:func:`student_notebook`); every other cell keeps its committed outputs.
   Markdown cells are lightly rewritten on the way (``\\(x\\)`` becomes ``$x$``; a
   chapter's hand-written heading numbers are dropped because Sphinx numbers them).
2. **Filter the table of contents**: chapters whose notebook does not exist yet are
   left out, and notebooks that exist but are not listed are added next to the
   listed entry that precedes them in file-name order (so a new chapter appears
   as soon as its notebook is committed).
3. **Render** with ``jupyter-book build``; notebooks are *not* executed (their
   committed outputs are shown; ``pytest --nbval`` checks those separately).
4. **Install MathJax**: the MathJax 2.7 shipped in the PyPI package
   ``jupyter-server-mathjax`` is copied to ``_static/mathjax/`` of the built site,
   where ``mathjax_path`` in ``book/_config.yml`` points. It is copied after Sphinx
   has run because Jupyter Book adds every ``.js`` file of ``book/_static`` to
   every page.

The result is ``OUT_DIR/_build/html/index.html``; open it straight from disk.
"""

from __future__ import annotations

import argparse
import copy
import filecmp
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from flashlab.course.grader import build as build_student_versions

__all__ = ["EDITIONS", "REPO", "build_site", "default_out_dir", "latex_delimiters_to_dollars",
           "mathjax_source", "stage", "staged_toc", "strip_heading_numbers", "student_notebook"]

REPO = Path(__file__).resolve().parents[2]
MATHJAX_DEST = Path("_static") / "mathjax"
EDITIONS = ("student", "instructor")
STUDENT_VERSIONS = Path("_build") / "student-versions"  # the grader's nbgrader course, under the staging folder
# What the instructor edition adds to the title and footer of book/_config.yml.
INSTRUCTOR_TITLE = " (instructor edition, with solutions)"
INSTRUCTOR_FOOTER = ("Instructor edition: every exercise shows its solution and hidden tests. "
                     "The public site is the student edition (make book).")


def default_out_dir(edition: str = "student") -> Path:
    """Where an edition is staged by default: ``build/site`` or ``build/site-instructor``."""
    _check_edition(edition)
    return REPO / "build" / ("site" if edition == "student" else "site-instructor")


def _check_edition(edition: str) -> None:
    if edition not in EDITIONS:
        raise ValueError(f"edition must be one of {EDITIONS}; got {edition!r}")


def mathjax_source() -> Path:
    """The folder holding ``MathJax.js`` (MathJax 2.7) inside ``jupyter-server-mathjax``."""
    try:
        import jupyter_server_mathjax
    except ImportError as err:  # pragma: no cover - the [book] extra installs it
        raise RuntimeError(
            "the site needs a local MathJax from the package jupyter-server-mathjax; "
            "install the book extra: pip install -e '.[book]'"
        ) from err
    static = Path(jupyter_server_mathjax.__file__).parent / "static"
    if not (static / "MathJax.js").is_file():
        raise RuntimeError(f"no MathJax.js under {static}; reinstall jupyter-server-mathjax")
    return static


def _sync_file(src: Path, dst: Path) -> None:
    """Copy src to dst unless an identical file is there (keeps mtimes, so Sphinx rebuilds only what changed)."""
    if dst.is_file() and filecmp.cmp(src, dst, shallow=False):
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


_CODE = re.compile(r"(```.*?```|~~~.*?~~~|`[^`\n]*`)", re.DOTALL)
_INLINE = re.compile(r"\\\((.+?)\\\)", re.DOTALL)
_DISPLAY = re.compile(r"\\\[(.+?)\\\]", re.DOTALL)


def latex_delimiters_to_dollars(markdown: str) -> str:
    r"""Rewrite ``\(x\)`` as ``$x$`` and ``\[x\]`` as ``$$x$$`` outside code.

    Jupyter typesets both forms in markdown cells, but MyST reads ``\(`` as an escaped
    parenthesis and would print "(x)". Code spans and fenced blocks are left alone.
    """
    parts = _CODE.split(markdown)
    for i in range(0, len(parts), 2):  # even parts are prose, odd parts are code
        parts[i] = _DISPLAY.sub(lambda m: f"$${m.group(1)}$$", _INLINE.sub(lambda m: f"${m.group(1)}$", parts[i]))
    return "".join(parts)


def strip_heading_numbers(markdown: str, chapter: int) -> str:
    """Drop the chapter's own numbers from its headings: Sphinx numbers them on the site.

    In JupyterLab a chapter reads "# Chapter 2 — Online softmax" and "## 2.1 Where ...";
    on the site these would become "2. Chapter 2 — Online softmax" and "2.1. 2.1 Where ...".
    Only numbers that belong to this chapter are removed ("## 4 questions" stays).
    """
    markdown = re.sub(rf"^#[ \t]+Chapter[ \t]+{chapter}[ \t]*[—–:.-][ \t]*", "# ", markdown, flags=re.M)
    return re.sub(rf"^(#{{2,6}})[ \t]+{chapter}(?:\.\d+)+\.?[ \t]+", r"\1 ", markdown, flags=re.M)


def _nbgrader_id(cell: dict) -> str | None:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta.get("grade_id") if isinstance(meta, dict) and (meta.get("solution") or meta.get("grade")) else None


def student_notebook(book: dict, release: dict) -> dict:
    """The book's notebook as the student edition shows it.

    book    : the notebook as committed (solutions, hidden tests, outputs of every cell)
    release : its student version from the grader (nbgrader's ``release/``: stubs, visible
              tests only, no outputs)

    Returns a copy of ``book`` in which each exercise cell (nbgrader metadata with
    ``solution`` or ``grade``) takes the source of the release cell with the same grade_id
    and loses its outputs (they were computed from the solution and the hidden tests);
    every other cell keeps its committed outputs. Raises ValueError naming the grade_id
    if the release lacks an exercise cell of the book.
    """
    released = {gid: cell for cell in release.get("cells", []) if (gid := _nbgrader_id(cell))}
    out = copy.deepcopy(book)
    for cell in out.get("cells", []):
        gid = _nbgrader_id(cell)
        if gid is None:
            continue
        if gid not in released:
            raise ValueError(f"release must hold every exercise cell of the book; grade_id {gid!r} is missing")
        cell["source"] = released[gid]["source"]
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return out


def _stage_notebook(src: Path, dst: Path, release: Path | None = None) -> None:
    """Copy a notebook for the site, rewriting its markdown cells.

    release : the notebook's student version; when given, the staged notebook is
              :func:`student_notebook` of the two.

    See latex_delimiters_to_dollars and strip_heading_numbers; the chapter number is the
    file name's prefix (02_online_softmax.ipynb is chapter 2; 00 is the unnumbered preface).
    """
    nb = json.loads(src.read_text(encoding="utf-8"))
    changed = release is not None
    if release is not None:
        nb = student_notebook(nb, json.loads(release.read_text(encoding="utf-8")))
    prefix = re.match(r"(\d+)_", src.name)
    chapter = int(prefix.group(1)) if prefix else 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new = latex_delimiters_to_dollars(text)
        if chapter:
            new = strip_heading_numbers(new, chapter)
        if new != text:
            cell["source"], changed = new, True
    if not changed:
        _sync_file(src, dst)
        return
    _write_if_changed(dst, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def _write_if_changed(dst: Path, text: str) -> None:
    """Write text to dst unless dst already holds it (keeps mtimes, so Sphinx rebuilds only what changed)."""
    if not dst.is_file() or dst.read_text(encoding="utf-8") != text:
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text, encoding="utf-8")


def _sync_dir(src: Path, dst: Path, pattern: str, releases: dict[str, Path] | None = None) -> set[Path]:
    """Mirror the files of src matching pattern into dst; delete staged files that are gone from src.

    releases : notebook file name -> its student version (see _stage_notebook)
    """
    releases = releases or {}
    wanted = {p.relative_to(src) for p in src.glob(pattern) if p.is_file()} if src.is_dir() else set()
    wanted = {p for p in wanted if ".ipynb_checkpoints" not in p.parts}
    for rel in wanted:
        if rel.suffix == ".ipynb":
            _stage_notebook(src / rel, dst / rel, releases.get(rel.name))
        else:
            _sync_file(src / rel, dst / rel)
    if dst.is_dir():
        for p in list(dst.glob(pattern)):
            if p.is_file() and p.relative_to(dst) not in wanted:
                p.unlink()
    return wanted


def _student_versions(notebooks_dir: Path, workdir: Path) -> dict[str, Path]:
    """Build the student version of every notebook of notebooks_dir with exercises into
    workdir (the grader's nbgrader course); return notebook file name -> release notebook."""
    chapters = build_student_versions(workdir, sorted(notebooks_dir.glob("*.ipynb")))
    return {ch.source.name: ch.release for ch in chapters}


def staged_toc(toc: dict, notebooks: list[str], pages: set[str]) -> dict:
    """Return the table of contents restricted to what exists.

    toc       : the parsed ``book/_toc.yml`` (format jb-book, with parts)
    notebooks : existing notebooks as TOC paths without suffix, e.g. ``"notebooks/02_online_softmax"``
    pages     : every existing page (notebooks and prose), same form

    Listed entries whose page does not exist are dropped. An existing notebook that is
    not listed joins the part of the listed notebook entry just before it in file-name
    order (the first notebook part if none precedes it). Notebook entries are kept in
    file-name order within a part; empty parts are dropped; an entry's ``sections`` keep
    only the pages that exist.
    """
    parts = [dict(part, chapters=list(part.get("chapters", []))) for part in toc["parts"]]
    listed = sorted(
        (entry["file"], i)
        for i, part in enumerate(parts)
        for entry in part["chapters"]
        if entry.get("file", "").startswith("notebooks/")
    )
    listed_files = {f for f, _ in listed}
    for nb in notebooks:
        if nb in listed_files:
            continue
        before = [i for f, i in listed if f < nb]
        target = before[-1] if before else (listed[0][1] if listed else len(parts) - 1)
        parts[target]["chapters"].append({"file": nb})

    for part in parts:
        kept = [e for e in part["chapters"] if e.get("file") in pages]
        for i, entry in enumerate(kept):  # an entry's sections (e.g. the lab notes): the existing ones
            if "sections" in entry:
                sections = [s for s in entry["sections"] if s.get("file") in pages]
                kept[i] = {k: v for k, v in entry.items() if k != "sections"}
                if sections:
                    kept[i]["sections"] = sections
        others = [e for e in kept if not e["file"].startswith("notebooks/")]
        nbs = sorted((e for e in kept if e["file"].startswith("notebooks/")), key=lambda e: e["file"])
        part["chapters"] = nbs + others
    out = dict(toc)
    out["parts"] = [p for p in parts if p["chapters"]]
    return out


def stage(out_dir: Path, repo: Path = REPO, notebooks_dir: Path | None = None, edition: str = "student") -> Path:
    """Copy the book's sources into out_dir and write the filtered _toc.yml there; return out_dir.

    edition : "student" stages the student versions of the exercises (built by the grader
              into ``out_dir/_build/student-versions``, which Sphinx does not read); "instructor" stages the notebooks as committed
              and marks the edition in the title and footer of ``_config.yml``.
    """
    _check_edition(edition)
    out_dir = Path(out_dir)
    book = repo / "book"
    notebooks_dir = Path(notebooks_dir) if notebooks_dir else repo / "notebooks"
    out_dir.mkdir(parents=True, exist_ok=True)

    for src in book.iterdir():
        if src.is_file() and src.name not in ("_toc.yml", "_config.yml"):
            _sync_file(src, out_dir / src.name)
    _sync_dir(book / "_static", out_dir / "_static", "**/*")
    config = (book / "_config.yml").read_text(encoding="utf-8")
    if edition == "instructor":
        settings = yaml.safe_load(config)
        settings["title"] = settings.get("title", "") + INSTRUCTOR_TITLE
        settings.setdefault("html", {})["extra_footer"] = INSTRUCTOR_FOOTER
        config = yaml.safe_dump(settings, sort_keys=False, allow_unicode=True)
    _write_if_changed(out_dir / "_config.yml", config)

    releases = _student_versions(notebooks_dir, out_dir / STUDENT_VERSIONS) if edition == "student" else {}
    nbs = _sync_dir(notebooks_dir, out_dir / "notebooks", "*.ipynb", releases)
    _sync_dir(repo / "figures", out_dir / "figures", "**/*")
    notes = _sync_dir(book / "lab_notes", out_dir / "lab_notes", "*.md")

    notebooks = sorted(f"notebooks/{p.with_suffix('').as_posix()}" for p in nbs)
    prose = {p.stem for p in book.glob("*.md")} | {p.stem for p in book.glob("*.ipynb")}
    prose |= {f"lab_notes/{p.with_suffix('').as_posix()}" for p in notes}
    toc = yaml.safe_load((book / "_toc.yml").read_text(encoding="utf-8"))
    toc = staged_toc(toc, notebooks, set(notebooks) | prose)
    header = "# Generated by flashlab/course/site.py from book/_toc.yml; do not edit.\n"
    _write_if_changed(out_dir / "_toc.yml", header + yaml.safe_dump(toc, sort_keys=False, allow_unicode=True))
    return out_dir


def build_site(
    out_dir: Path | str | None = None,
    notebooks_dir: Path | str | None = None,
    quiet: bool = True,
    edition: str = "student",
) -> Path:
    """Stage, render and install MathJax; return the path of the built ``index.html``.

    out_dir       : staging folder; the HTML lands in ``out_dir/_build/html``
                    (default: :func:`default_out_dir` of the edition)
    notebooks_dir : where the chapters are read from (default: the repository's notebooks/)
    quiet         : pass ``--quiet`` to jupyter-book (warnings are still printed)
    edition       : "student" (exercises without solutions or hidden tests) or "instructor"
    """
    _check_edition(edition)
    out_dir = Path(out_dir if out_dir is not None else default_out_dir(edition)).resolve()
    stage(out_dir, notebooks_dir=notebooks_dir, edition=edition)
    cmd = [
        sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
        "build", str(out_dir), "--builder", "html", "--keep-going",
    ]
    if quiet:
        cmd.append("--quiet")
    result = subprocess.run(cmd, cwd=out_dir)
    html = out_dir / "_build" / "html"
    index = html / "index.html"
    if result.returncode != 0 or not index.is_file():
        raise RuntimeError(f"jupyter-book build failed (exit {result.returncode}); see the messages above")
    shutil.copytree(mathjax_source(), html / MATHJAX_DEST, dirs_exist_ok=True)
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashlab.course.site", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the site and print the path of index.html")
    b.add_argument("out_dir", nargs="?", default=None,
                   help="staging folder (default: build/site, or build/site-instructor with --instructor)")
    b.add_argument("--instructor", action="store_true",
                   help="the instructor edition: exercises with their solutions and hidden tests")
    b.add_argument("--notebooks", default=None, help="read the chapters from this folder instead of notebooks/")
    b.add_argument("--verbose", action="store_true", help="show jupyter-book's full output")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    edition = "instructor" if args.instructor else "student"
    index = build_site(args.out_dir, notebooks_dir=args.notebooks, quiet=not args.verbose, edition=edition)
    print(f"built in {time.perf_counter() - start:.1f} s")
    print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
