"""The seed documents' numbers stay checkable against the book (flashlab.course.claims).

(a) book/seed_numbers.md is what ``python -m flashlab.course.claims`` writes now;
(b) every record is well-formed and its anchor occurs in the notebook it names;
(c) every reproduced number is printed in that notebook's outputs, to the seed's precision.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

from flashlab.course.claims import CHAPTERS, CLAIMS, STATUSES, render, round_sig, significant_digits

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"


@lru_cache(maxsize=None)
def notebook_text(name: str) -> tuple[str, str]:
    """(all cell sources, all text outputs) of notebooks/<name>."""
    nb = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))
    sources, outputs = [], []
    for cell in nb["cells"]:
        src = cell["source"]
        sources.append("".join(src) if isinstance(src, list) else src)
        for out in cell.get("outputs", []):
            if "text" in out:
                outputs.append("".join(out["text"]))
            for mime, data in out.get("data", {}).items():
                if mime.startswith("text/"):
                    outputs.append("".join(data) if isinstance(data, list) else data)
    return "\n".join(sources), "\n".join(outputs)


def test_page_is_generated():
    page = (REPO / "book" / "seed_numbers.md").read_text(encoding="utf-8")
    assert page == render(), "book/seed_numbers.md is stale: run python -m flashlab.course.claims book/seed_numbers.md"


def test_page_is_in_toc():
    assert "file: seed_numbers" in (REPO / "book" / "_toc.yml").read_text(encoding="utf-8")


def test_ids_unique():
    ids = [c.id for c in CLAIMS]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.id)
def test_record_well_formed(claim):
    assert claim.status in STATUSES
    assert claim.chapter in CHAPTERS
    assert claim.claim.endswith(".") and claim.seed and claim.source
    if claim.num is not None:
        claim.value  # parses
    if claim.status in ("reproduced", "modelled", "differs"):
        assert claim.where, f"{claim.id}: a {claim.status} record needs a where"
    if claim.status == "differs":
        assert claim.ours and claim.note, f"{claim.id}: say what we found and why it differs"
    if claim.status == "not covered":
        assert claim.where is None and claim.note, f"{claim.id}: say where it should go"
    if claim.where:
        name, anchor = claim.where
        assert (NOTEBOOKS / name).is_file(), f"{claim.id}: no notebook {name}"
        src, out = notebook_text(name)
        assert anchor in src or anchor in out, f"{claim.id}: {anchor!r} not found in {name}"


REPRODUCED = [c for c in CLAIMS if c.status == "reproduced" and isinstance(c.value, float)]


@pytest.mark.parametrize("claim", REPRODUCED, ids=lambda c: c.id)
def test_reproduced_number_printed(claim):
    assert claim.shown, f"{claim.id}: a reproduced number needs the text the notebook prints"
    _, out = notebook_text(claim.where[0])
    pattern = r"(?<![\d.])" + re.escape(claim.shown) + r"(?![\d])"
    assert re.search(pattern, out), f"{claim.id}: {claim.shown!r} is not in the outputs of {claim.where[0]}"
    ours = float(claim.shown.replace(",", ""))
    digits = significant_digits(claim.num)
    assert round_sig(ours, digits) == pytest.approx(claim.value, rel=1e-9), (
        f"{claim.id}: the notebook prints {claim.shown}, which is not the seed's {claim.num} "
        f"to {digits} significant digits")
