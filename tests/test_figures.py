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


# The site's text column is about 750 px, 7.8 inches at 96 px per inch: a figure that wide
# or narrower shows its point sizes at their size; a wider one is scaled down.
COLUMN_INCHES = 7.8
SMALLEST_POINTS = 9.0
LEGIBLE = ("memory_pyramid", "roofline_h200", "naive_step_shares_h200", "naive_vs_fused_h200")


def small_text(fig) -> list[tuple[str, float]]:
    """(text, size as the reader sees it) of every visible text under SMALLEST_POINTS."""
    from matplotlib.text import Text

    fig.canvas.draw()
    scale = min(1.0, COLUMN_INCHES / fig.get_figwidth())
    return [(t.get_text()[:40], round(t.get_fontsize() * scale, 1))
            for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip()
            and t.get_fontsize() * scale < SMALLEST_POINTS - 1e-9]


def test_figure_text_is_legible_at_the_column_width():
    import matplotlib.pyplot as plt

    for stem in LEGIBLE:
        fig = figures.get(stem)()
        found = small_text(fig)
        plt.close(fig)
        assert not found, f"{stem}: text under {SMALLEST_POINTS} pt at the column's width: {found}"


def test_small_text_is_caught():
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(COLUMN_INCHES * 2, 3))
    fig.text(0.5, 0.5, "twelve points, shown at six", fontsize=12)
    assert small_text(fig) == [("twelve points, shown at six", 6.0)]
    plt.close(fig)
