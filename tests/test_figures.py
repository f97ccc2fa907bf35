"""Every figure comes from code: figures/ holds exactly what flashlab.course.figures draws now.

The test redraws every registered figure into a temporary folder and compares the set
of files and each PNG's pixel size with figures/ (bytes differ across matplotlib and
font versions, sizes do not). After changing a figure, run `make figures`."""

from __future__ import annotations

import struct
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from flashlab.course import figures  # noqa: E402

COMMITTED = Path(__file__).resolve().parent.parent / "figures"


def png_size(path: Path) -> tuple[int, int]:
    with path.open("rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", header[16:24])


def test_figures_folder_matches_the_code(tmp_path):
    written = figures.save_all(tmp_path)
    expected = {p.name for p in written}
    assert expected == {f"{stem}.{ext}" for stem in figures.FIGURES for ext in ("png", "svg")}
    committed = {p.name for p in COMMITTED.iterdir() if p.suffix in {".png", ".svg"}}
    assert committed == expected, (
        f"run `make figures`: missing {sorted(expected - committed)}, stale {sorted(committed - expected)}"
    )
    for name in sorted(n for n in expected if n.endswith(".png")):
        assert png_size(COMMITTED / name) == png_size(tmp_path / name), f"{name} changed size: run `make figures`"


def test_unknown_stem_is_refused():
    import pytest

    with pytest.raises(ValueError, match="stem must be one of"):
        figures.get("fig99")
