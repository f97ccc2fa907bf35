"""The book's website: every chapter is a numbered page, search and prev/next work,
nothing is loaded from the network, and every equation is typeset.

The site is built once for the module (about 10 s). The math check opens each page that
has equations (every notebook and every page of book/) in headless Chromium with DNS
switched off, so MathJax can only come from the local copy, and checks that MathJax
typeset every equation without a TeX error. One Chromium run takes a few seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from flashlab.course.site import REPO, build_site, latex_delimiters_to_dollars, staged_toc, strip_heading_numbers


NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
MATH_CHAPTER = "02_online_softmax"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-quic", "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves: offline for sure
    "--virtual-time-budget=15000",
]
NETWORK = re.compile(r"^(https?:)?//", re.IGNORECASE)


def test_toc_keeps_what_exists_and_adds_new_chapters_in_place():
    toc = {"format": "jb-book", "root": "intro", "parts": [
        {"caption": "Preface", "chapters": [{"file": "notebooks/00_preface"}]},
        {"caption": "Chapters", "numbered": True, "chapters": [
            {"file": "notebooks/01_naive_attention"}, {"file": "notebooks/03_flash_attention"}]},
        {"caption": "Beyond", "numbered": True, "chapters": [{"file": "notebooks/09_beyond"}]},
        {"caption": "Appendices", "chapters": [{"file": "glossary"}]},
    ]}
    nbs = ["notebooks/01_naive_attention", "notebooks/03_flashattention_v1", "notebooks/10_paged_kv"]
    out = staged_toc(toc, nbs, set(nbs) | {"glossary"})
    files = [[e["file"] for e in p["chapters"]] for p in out["parts"]]
    assert files == [nbs[:2], nbs[2:], ["glossary"]]  # empty "Preface" dropped; new files placed by name
    assert out["parts"][0]["numbered"] is True


def test_markdown_rewrites_for_the_site():
    md = "Inline \\(x^2\\) and \\[y\\]; code `\\(kept\\)`; escaped \\$5."
    assert latex_delimiters_to_dollars(md) == "Inline $x^2$ and $$y$$; code `\\(kept\\)`; escaped \\$5."
    md = "# Chapter 2 — Online softmax\n## 2.10 Merging\n## 4 questions\n## 1.5 TB/s\n"
    assert strip_heading_numbers(md, 2) == "# Online softmax\n## Merging\n## 4 questions\n## 1.5 TB/s\n"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Build the site from the repository's notebooks; return the html folder."""
    index = build_site(tmp_path_factory.mktemp("site"))
    return index.parent


class _Tags(HTMLParser):
    """Collect (tag, attributes) of every start tag, and the prose text (outside script, style, pre, code)."""

    NOT_PROSE = ("script", "style", "pre", "code")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        if tag in self.NOT_PROSE:
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in self.NOT_PROSE and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def parse(html: str) -> _Tags:
    p = _Tags()
    p.feed(html)
    return p


def page(site: Path, stem: str) -> Path:
    return site / "notebooks" / f"{stem}.html"


@pytest.mark.slow
def test_every_notebook_is_a_page_in_the_navigation(site):
    assert NOTEBOOKS, "no notebooks in notebooks/"
    # index.html redirects to the landing page, which carries the navigation sidebar
    landing = re.search(r'url=([^"\s]+)"', (site / "index.html").read_text(encoding="utf-8"))
    nav = parse((site / (landing.group(1) if landing else "index.html")).read_text(encoding="utf-8"))
    linked = {a.get("href", "").split("#")[0] for tag, a in nav.tags if tag == "a"}
    for nb in NOTEBOOKS:
        assert page(site, nb.stem).is_file(), f"{nb.name} was not rendered"
        assert f"notebooks/{nb.stem}.html" in linked, f"{nb.name} is missing from the navigation"


@pytest.mark.slow
def test_chapters_are_numbered_in_file_order(site):
    numbers = []
    for nb in NOTEBOOKS:
        if nb.stem.startswith("00_"):
            continue  # the preface is not numbered
        html = page(site, nb.stem).read_text(encoding="utf-8")
        # the article's title is the <h1> with a permalink (the theme repeats the bare title elsewhere)
        title = re.search(r'<h1>((?:(?!</h1>).)*?)<a class="headerlink"', html, re.S)
        assert title, f"{nb.name}: no title"
        number = re.match(r'<span class="section-number">(\d+)\.\s*</span>', title.group(1))
        assert number, f"{nb.name}: the chapter title carries no number: {title.group(1)!r}"
        numbers.append(int(number.group(1)))
        rest = re.sub(r"<[^>]+>", "", title.group(1)[number.end():]).strip()
        assert not re.match(r"(Chapter\s+)?\d", rest), f"{nb.name}: numbered twice on the site: {rest!r}"
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers), numbers


@pytest.mark.slow
def test_search_and_prev_next(site):
    assert (site / "search.html").is_file()
    index = (site / "searchindex.js").read_text(encoding="utf-8")
    assert "softmax" in index.lower(), "the search index does not know the word 'softmax'"
    html = page(site, MATH_CHAPTER).read_text(encoding="utf-8")
    classes = " ".join(a.get("class", "") for tag, a in parse(html).tags if tag == "a")
    assert "left-prev" in classes and "right-next" in classes, "no previous/next links on the chapter page"


@pytest.mark.slow
def test_no_page_loads_anything_from_the_network(site):
    bad = []
    for path in sorted(site.rglob("*.html")):
        if "_static" in path.relative_to(site).parts:
            continue  # MathJax's own test pages, if any
        for tag, a in parse(path.read_text(encoding="utf-8")).tags:
            if tag in ("script", "img", "iframe", "source", "audio", "video"):
                url = a.get("src", "")
            elif tag == "link" and a.get("rel", "").lower() not in ("canonical", "alternate", "next", "prev", "index", "search"):
                url = a.get("href", "")
            else:
                continue
            if NETWORK.match(url.strip()):
                bad.append(f"{path.relative_to(site)}: <{tag}> {url}")
        if "thebe-launch-button" in path.read_text(encoding="utf-8"):
            bad.append(f"{path.relative_to(site)}: a thebe launch button (would load thebe from unpkg.com)")
    for css in sorted((site / "_static").rglob("*.css")):
        for url in re.findall(r"@import\s+(?:url\()?['\"]?([^'\")\s;]+)", css.read_text(encoding="utf-8", errors="replace")):
            if NETWORK.match(url):
                bad.append(f"{css.relative_to(site)}: @import {url}")
    assert not bad, "pages that would reach the network:\n" + "\n".join(bad)


@pytest.mark.slow
def test_every_image_and_internal_link_resolves(site):
    """A crawler over the built pages: every <img> and every local file a page links to exists,
    and every #fragment names an id (or a name) on the page it points to."""
    from urllib.parse import unquote, urlsplit

    ids: dict[Path, set[str]] = {}

    def ids_of(path: Path) -> set[str]:
        if path not in ids:
            tags = parse(path.read_text(encoding="utf-8")).tags
            ids[path] = {a[k] for _, a in tags for k in ("id", "name") if a.get(k)}
        return ids[path]

    bad, checked = [], 0
    for path in sorted(site.rglob("*.html")):
        if "_static" in path.relative_to(site).parts or path.name in ("genindex.html", "search.html"):
            continue
        for tag, a in parse(path.read_text(encoding="utf-8")).tags:
            url = a.get("src", "") if tag == "img" else a.get("href", "") if tag == "a" else ""
            if not url or NETWORK.match(url) or url.startswith(("mailto:", "javascript:", "data:")):
                continue
            parts = urlsplit(url)
            target = path if not parts.path else (path.parent / unquote(parts.path)).resolve()
            checked += 1
            where = f"{path.relative_to(site)}: <{tag}> {url}"
            if not target.is_file():
                bad.append(f"{where} (no such file)")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in ids_of(target):
                bad.append(f"{where} (no id {parts.fragment!r} there)")
    assert checked > 100, f"only {checked} links and images found: is the crawler reading the pages?"
    assert not bad, f"{len(bad)} broken images or internal links:\n" + "\n".join(bad[:40])


def _chromium() -> str:
    """Path of a Chromium binary; installs Debian's package (as `make chromium` does) if missing."""
    names = ("chromium", "chromium-browser", "google-chrome")
    found = next((shutil.which(n) for n in names if shutil.which(n)), None)
    if found:
        return found
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run("apt-get update -qq && apt-get install -y -qq chromium", shell=True,
                       env=env, capture_output=True, timeout=900)
        found = shutil.which("chromium")
    if not found:
        pytest.skip("headless Chromium is not installed and could not be installed here "
                    "(run `make chromium`, or install the Debian package chromium)")
    return found


def count_equations(html: str) -> int:
    """Number of equations Sphinx wrote on a page: the elements of class "math" (MathJax must typeset each)."""
    return sum(
        1 for tag, a in parse(html).tags
        if tag in ("span", "div") and "math" in a.get("class", "").split()
    )


RAW_DELIMITERS = ("$$", "\\[", "\\(")
_TEX_SOURCE = re.compile(r'<script type="math/tex[^"]*" id="MathJax-Element-(\d+)">(.*?)</script>', re.S)
_UNDEFINED = re.compile(r'<mtext mathcolor="red">(\\[^<]*)</mtext>')  # how noUndefined shows an unknown \command


def raw_math_left(text: str) -> list[str]:
    """Each raw TeX delimiter in a page's visible text, with a little of the text around it."""
    found = []
    for raw in RAW_DELIMITERS:
        at = text.find(raw)
        if at >= 0:
            context = " ".join(text[max(0, at - 40):at + 60].split())
            found.append(f"untypeset math ({raw}) is left in the text: ...{context}...")
    return found


def math_problems(path: Path, profile: Path) -> list[str]:
    """Open an HTML page in offline headless Chromium and list what is wrong with its equations.

    An empty list means MathJax typeset every equation of the page (at least one MathJax
    frame per element of class "math"), reported no TeX error, and left no raw $$, \\[ or
    \\( in the visible text. Each TeX error names the equation's source. `profile` is a
    fresh folder for Chromium's user data.
    """
    equations = count_equations(path.read_text(encoding="utf-8"))
    result = subprocess.run(
        [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    dom = result.stdout
    if "</html>" not in dom:
        return [f"Chromium printed no page (exit {result.returncode}): {result.stderr[-2000:]}"]

    parsed = parse(dom)
    problems = []
    # MathJax 2 replaces each equation by <span class="MathJax" id="MathJax-Element-N-Frame" data-mathml="...">
    # followed by <script type="math/tex" id="MathJax-Element-N">TeX source</script>.
    frames = {
        m.group(1): a.get("data-mathml", "")
        for tag, a in parsed.tags
        if (m := re.fullmatch(r"MathJax-Element-(\d+)-Frame", a.get("id", "")))
    }
    if len(frames) < equations:
        problems.append(f"MathJax typeset {len(frames)} of {equations} equations"
                        + (" (did the local MathJax load?)" if not frames else ""))

    sources = {n: " ".join(tex.split()) for n, tex in _TEX_SOURCE.findall(dom)}
    named = 0
    for n, mathml in frames.items():
        if "<merror" in mathml:
            problems.append(f"TeX error in equation {n} of the page: {sources.get(n, '(source not found)')}")
        elif undefined := _UNDEFINED.findall(mathml):
            problems.append(f"undefined control sequence {', '.join(undefined)} in equation {n} of the page: "
                            f"{sources.get(n, '(source not found)')}")
        else:
            continue
        named += 1
    # the error marks themselves, in case an erroring equation carries no data-mathml
    marks = sum(1 for _, a in parsed.tags if {"merror", "noError"} & set(a.get("class", "").split()))
    if marks > named:
        problems.append(f"MathJax marked {marks} TeX errors on the page (class merror or noError)")

    problems += raw_math_left("".join(parsed.text))
    return problems


# every page of the site: the chapters, then the prose pages of book/ (site paths without ".html")
PAGES = [f"notebooks/{nb.stem}" for nb in NOTEBOOKS] + sorted(p.stem for p in (REPO / "book").glob("*.md"))
MATH_CHAPTERS = ("02", "03", "04", "05", "06", "07")  # chapters that are built on equations


def _source(name: str) -> str:
    return f"{name}.ipynb" if name.startswith("notebooks/") else f"book/{name}.md"


@pytest.mark.slow
def test_the_math_check_covers_every_page(site):
    """PAGES lists every page of the site, and the chapters built on equations do have equations
    (so the Chromium check cannot pass by finding no math)."""
    counts = {}
    for prefix in MATH_CHAPTERS:
        nb = next((nb for nb in NOTEBOOKS if nb.stem.startswith(f"{prefix}_")), None)
        assert nb, f"no notebook for chapter {prefix} in notebooks/"
        path = page(site, nb.stem)
        counts[nb.stem] = count_equations(path.read_text(encoding="utf-8")) if path.is_file() else 0
    assert all(counts.values()), f"chapters without a single equation on the site: {counts}"
    assert counts.get(MATH_CHAPTER, 0) >= 10, f"expected many equations in {MATH_CHAPTER}; the page has {counts.get(MATH_CHAPTER)}"

    skip = {"index.html", "genindex.html", "search.html"}  # the redirect and Sphinx's generated pages
    built = {p.relative_to(site).with_suffix("").as_posix() for p in site.rglob("*.html")
             if "_static" not in p.relative_to(site).parts and p.name not in skip}
    missed = sorted(built - set(PAGES))
    assert not missed, f"pages on the site that the math check does not open: {missed}"


@pytest.mark.slow
@pytest.mark.parametrize("name", PAGES)
def test_equations_are_typeset_offline(site, tmp_path, name):
    """MathJax, loaded from the site's own copy with the network switched off, typesets every
    equation of the page without a TeX error. Pages without math only get the raw-TeX check."""
    path = site / f"{name}.html"
    assert path.is_file(), f"{_source(name)} was not rendered to {name}.html (is it listed in book/_toc.yml?)"
    html = path.read_text(encoding="utf-8")
    if count_equations(html):
        problems = math_problems(path, tmp_path / "profile")
    else:  # no element of class "math": MathJax ignores the page, so no TeX may be left in its text
        problems = raw_math_left("".join(parse(html).text))
    shown = problems[:30] + ([f"... and {len(problems) - 30} more"] if len(problems) > 30 else [])
    assert not problems, f"{name}.html (from {_source(name)}):\n  " + "\n  ".join(shown)
