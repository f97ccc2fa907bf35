"""The preface's timeline figure: four generations of FlashAttention, 2022-2026.

Top: a timeline with one marker per paper, its GPU, the bottleneck it attacked and
its headline result. Bottom, under each marker: the GPU's dense 16-bit tensor-core
peak (TFLOP/s, from :mod:`flashlab.hardware`) as a light bar, and the share of that
peak the paper reports as a dark bar (a hatched band where the paper gives a range).

Everything drawn comes from :mod:`flashlab.generations` and :mod:`flashlab.hardware`.
Colours are the Okabe-Ito palette, which stays distinguishable under the common
forms of colour blindness.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from flashlab.generations import GENERATIONS, Generation

__all__ = ["timeline", "COLOURS"]

# Okabe & Ito (2008), "Color Universal Design": blue, vermilion, bluish green, reddish purple
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7")


def _caption(gen: Generation) -> str:
    """Bottleneck and headline, wrapped to fit one year of width."""
    bottleneck = textwrap.fill(f"held back by: {gen.bottleneck}", 26)
    headline = textwrap.fill(gen.headline, 26)
    return f"{bottleneck}\n\n{headline}"


def timeline(dtype: str = "bf16") -> Figure:
    """Draw the timeline of the four generations and the growth of their GPUs.

    Parameters
    ----------
    dtype : the 16-bit input type whose dense tensor peak is shown ("fp16" or "bf16";
        the two are equal on every GPU in the book).
    """
    fig = plt.figure(figsize=(11, 6.8), layout="constrained")  # pyplot-managed, so plt.show() displays it
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[1.25, 1])
    years = [g.year for g in GENERATIONS]
    lo, hi = min(years) - 0.55, max(years) + 0.55

    # --- top: the timeline -------------------------------------------------------
    top.axhline(0, color="0.35", lw=1.5, zorder=1)
    for year in years:  # a tick only where there is a paper
        top.plot([year, year], [-0.04, 0.04], color="0.35", lw=1)
        top.text(year, -0.09, str(year), ha="center", va="top", fontsize=10, color="0.25")
    for gen, colour in zip(GENERATIONS, COLOURS):
        top.scatter([gen.year], [0], s=160, color=colour, zorder=3, edgecolor="white", linewidth=1.5)
        top.text(gen.year, 0.13, gen.version, ha="center", va="bottom", fontsize=11.5,
                 fontweight="bold", color=colour)
        top.text(gen.year, 0.40, f"{gen.hardware.name} · {gen.short_authors}", ha="center",
                 va="bottom", fontsize=9, color="0.3")
        top.text(gen.year, -0.30, _caption(gen), ha="center", va="top", fontsize=8.8,
                 linespacing=1.25, bbox=dict(boxstyle="round,pad=0.45", fc="white", ec=colour, lw=1.2))
    top.set_xlim(lo, hi)
    top.set_ylim(-1.30, 0.62)
    top.axis("off")
    top.set_title("FlashAttention, four generations: one question — what is holding the computation back?",
                  fontsize=12.5, loc="left")

    # --- bottom: what each GPU offered, and what each paper reached ---------------
    width = 0.42
    for gen, colour in zip(GENERATIONS, COLOURS):
        peak = gen.hardware.peak_flops(dtype) / 1e12
        low, high = gen.utilisation
        x0 = gen.year - width / 2
        bottom.add_patch(Rectangle((x0, 0), width, peak, fc=colour, alpha=0.22, ec=colour, lw=1))
        bottom.add_patch(Rectangle((x0, 0), width, low * peak, fc=colour, ec=colour, lw=1))
        if high > low:
            bottom.add_patch(Rectangle((x0, low * peak), width, (high - low) * peak, fc="white",
                                       ec=colour, hatch="////", lw=1))
        share = f"{low:.0%}" if high == low else f"{low:.0%}–{high:.0%}"
        note = "\n" + textwrap.fill(f"({gen.utilisation_note})", 10) if gen.utilisation_note else ""
        bottom.text(gen.year, peak + 40, f"{gen.gpu} peak\n{peak:,.0f} TFLOP/s", ha="center",
                    va="bottom", fontsize=9)
        label_y = max(high * peak, 300)  # clear of the axis for the short A100 bars
        bottom.text(gen.year + width / 2 + 0.04, label_y, f"paper:\n{share}{note}", ha="left",
                    va="center", fontsize=8.5, color=colour, fontweight="bold")
    bottom.set_ylim(0, 2750)
    bottom.set_ylabel(f"dense {dtype} tensor TFLOP/s")
    bottom.spines[["top", "right"]].set_visible(False)
    bottom.set_xticks(years, [f"{g.year}\n{g.gpu}" for g in GENERATIONS])
    bottom.set_title("light: the GPU's peak (flashlab.hardware)   dark: share of peak the paper reports"
                     "   hatched: the paper gives a range", fontsize=9.5, loc="left", color="0.3")
    return fig
