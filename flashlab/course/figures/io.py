"""Chapter 4: IO complexity, counted by the simulated memory and drawn against the formulas.

``io_vs_n`` plots, on log-log axes, the element moves between HBM and SRAM that
:func:`flashlab.memory.count_standard` and :func:`~flashlab.memory.count_flash` count
for growing N (markers), with the leading-order formulas of Theorem 2 of the
FlashAttention paper as lines (4N^2 + 2Nd + 2N^2 d/b and 12 N^2 d^2 / M + 3Nd).

``io_vs_m`` fixes N and d and lets the SRAM grow: FlashAttention's count falls as 1/M
until everything fits (M = 4Nd, one pass), standard attention's hardly moves, and
below M ~ 2d^2 (about 1.8 d^2 at N = 1024, d = 64) FlashAttention moves *more* than
standard attention.

Every marker is a simulated run; nothing is drawn from the formulas alone except
the lines labelled as formulas. Colours are the Okabe-Ito palette. Both figures are
drawn at the width of the site's text column (about 7.5 inches), so a font size in
points is the size a reader sees; no text is smaller than 9.5 pt.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from flashlab.memory import count_flash, count_standard, flash_io_formula, standard_io_formula

__all__ = ["io_vs_n", "io_vs_m"]

# Okabe & Ito (2008): vermilion, blue, bluish green, reddish purple
_STANDARD, _FLASH, _FLASH_2, _GREY = "#D55E00", "#0072B2", "#009E73", "0.45"
_WIDTH_IN = 7.5  # the text column of the site, so points are points
_TEXT_PT, _TITLE_PT = 9.5, 11  # legends and labels inside the axes; titles


def io_vs_n(d: int = 64, sram_sizes: tuple[int, ...] = (32768, 131072),
            Ns: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384)) -> Figure:
    """Counted HBM <-> SRAM moves against N, standard vs FlashAttention, log-log.

    Parameters
    ----------
    d : head dimension.
    sram_sizes : values of M (elements); standard attention is drawn at the first,
        FlashAttention at each.
    Ns : sequence lengths.
    """
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 5), layout="constrained")
    N_line = np.unique(np.geomspace(Ns[0], Ns[-1], 100).astype(int))  # formulas take integer N
    M0 = sram_sizes[0]
    ax.plot(Ns, [count_standard(N, d, M0).total for N in Ns], "o", color=_STANDARD, ms=7,
            label=f"standard, counted (M = {M0:,})")
    ax.plot(N_line, [standard_io_formula(int(N), d, M0, exact=False) for N in N_line], "-",
            color=_STANDARD, lw=1.2, alpha=0.7, label=r"formula $4N^2 + 2Nd + 2N^2d/b$")
    for M, colour in zip(sram_sizes, (_FLASH, _FLASH_2, _GREY)):
        ax.plot(Ns, [count_flash(N, d, M).total for N in Ns], "s", color=colour, ms=7,
                label=f"FlashAttention, counted (M = {M:,})")
        ax.plot(N_line, [flash_io_formula(int(N), d, M, exact=False) for N in N_line], "--",
                color=colour, lw=1.2, alpha=0.8, label=rf"formula $12N^2d^2/M + 3Nd$ (M = {M:,})")
    ax.plot(N_line, 4 * N_line * d, ":", color="0.3", lw=1.2,
            label=r"reading Q, K, V and writing O once: $4Nd$")
    ax.set(xscale="log", yscale="log", xlabel="sequence length N",
           ylabel="elements moved between HBM and SRAM",
           title=f"One attention head, d = {d}: both grow as $N^2$")
    ax.set_xticks(Ns, [f"{N:,}" for N in Ns])
    ax.minorticks_off()
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=_TEXT_PT, loc="upper left")
    ax.title.set_fontsize(_TITLE_PT)
    return fig


def io_vs_m(N: int = 1024, d: int = 64,
            sram_sizes: tuple[int, ...] = tuple(2**k for k in range(10, 19))) -> Figure:
    """Counted moves against the SRAM size M at fixed N and d, log-log.

    Parameters
    ----------
    N, d : sequence length and head dimension.
    sram_sizes : values of M (elements); each must be a multiple of 4d.
    """
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 5), layout="constrained")
    Ms = np.array(sram_sizes)
    flash = np.array([count_flash(N, d, M).total for M in Ms])
    standard = np.array([count_standard(N, d, M).total for M in Ms])
    M_line = np.unique(np.geomspace(Ms[0], Ms[-1], 200).astype(int))
    ax.axvspan(Ms[0] / 1.3, 2 * d * d, color=_GREY, alpha=0.12, lw=0)
    top = flash.max() * 2.5
    ax.text(2 * d * d / 1.1, top / 1.15, r"$M \lesssim 2d^2$", ha="right", va="top",
            fontsize=_TEXT_PT, color="0.25")
    ax.plot(Ms, standard, "o-", color=_STANDARD, ms=7, lw=1, label="standard, counted")
    ax.plot(Ms, flash, "s", color=_FLASH, ms=7, label="FlashAttention, counted")
    ax.plot(M_line, [flash_io_formula(N, d, int(M), exact=False) for M in M_line], "--",
            color=_FLASH, lw=1.2, zorder=3, label=r"formula $12N^2d^2/M + 3Nd$")
    ax.axhline(4 * N * d, ls=":", color="0.3", lw=1.2,
               label=r"$4Nd$: read Q, K, V and write O once")
    ax.axvline(4 * N * d, ls=":", color=_FLASH_2, lw=1.2)
    ax.text(4 * N * d / 1.08, top / 1.15, "M = 4Nd:\nK, V in one block", ha="right", va="top",
            fontsize=_TEXT_PT, color=_FLASH_2)
    above = np.nonzero(flash > standard)[0]
    if above.size:
        cross = Ms[above[-1] + 1] if above[-1] + 1 < Ms.size else Ms[-1]
        ax.annotate(f"FlashAttention moves less\nfrom M = {cross:,} on",
                    xy=(cross, flash[above[-1] + 1]),
                    xytext=(cross * 1.5, flash[above[-1] + 1] * 2.5), fontsize=_TEXT_PT,
                    arrowprops={"arrowstyle": "->", "color": "0.3"})
    ax.set(xscale="log", yscale="log", xlabel="SRAM size M (elements)",
           ylabel="elements moved between HBM and SRAM",
           title=f"N = {N:,}, d = {d}: FlashAttention's IO falls as 1/M")
    ax.set_ylim(4 * N * d / 1.6, top)
    ax.set_xticks(Ms, [f"{M:,}" for M in Ms], rotation=30)
    ax.minorticks_off()
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=_TEXT_PT, loc="lower left")
    ax.title.set_fontsize(_TITLE_PT)
    return fig

