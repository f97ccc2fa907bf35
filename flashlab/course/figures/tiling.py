"""Figures 3.1 and 3.2 of chapter 3: where the data goes, and the tiling of Algorithm 1.

``dataflow`` (Figure 3.1) draws the two memory levels, HBM below and the chip's SRAM
above, and every array that crosses the boundary between them. (a) Standard
attention runs three kernels; the N x N matrices S and P are each written to HBM
and read back, four trips of N^2 numbers. (b) FlashAttention runs one fused kernel;
only the N x d arrays Q, K, V, O (and the 2N numbers m, l) cross the boundary,
and v1 reads and writes O, m, l once per outer step (Tc times).
The sizes printed on the figure are computed for the ``n`` and ``d`` given.

``tiling`` (Figure 3.2; after the FlashAttention paper, Fig. 1, middle) draws Q split into Tr
row blocks, K^T and V^T into Tc column blocks, with the block sizes of
:func:`flashlab.reference.block_sizes`, and highlights one step of Algorithm 1: the
outer loop is at K/V block j, the inner loop at Q block i, and the tile S_ij is the
only piece of S that exists.

Both are drawn :data:`WIDTH` inches wide, the width of the book's text column, with no
text smaller than :data:`MIN_FONT` points, so the labels stay legible on the page.

Glossary: HBM (高带宽显存); SRAM (片上存储); kernel (内核, one GPU program);
tile (分块); outer / inner loop (外层 / 内层循环).
Colours are the Okabe-Ito palette.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from flashlab.reference.flash1 import block_sizes

__all__ = ["dataflow", "tiling", "WIDTH", "MIN_FONT"]

WIDTH = 7.0  # inches: about 700 px at the notebook's 100 dpi, the text column's width
MIN_FONT = 9.5  # points: the smallest text on these figures

# Okabe & Ito (2008)
_BLUE, _SKY, _GREEN, _ORANGE, _VERMILLION = ("#0072B2", "#56B4E9", "#009E73", "#E69F00", "#D55E00")
_INK = "#222222"
_HBM_FILL, _SRAM_FILL = "#FFF3DC", "#E3F1FB"
_SMALL, _BODY, _TITLE = MIN_FONT, 10.5, 12.0  # font sizes in points


def _millions(x: float) -> str:
    return f"{x / 1e6:.1f} M" if x < 1e9 else f"{x / 1e9:.1f} G"


def _box(ax: Axes, x: float, y: float, w: float, h: float, label: str, fc: str, ec: str = _INK,
         fontsize: float = _BODY, **kw) -> None:
    ax.add_patch(Rectangle((x, y), w, h, fc=fc, ec=ec, lw=1.2, **kw))
    ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=fontsize, color=_INK)


def _kernel(ax: Axes, x: float, y: float, w: float, h: float, label: str) -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.08", fc="white", ec=_BLUE,
                                lw=1.6))
    ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=_SMALL, color=_INK)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], colour: str,
           lw: float, label: str = "", label_at: float = 0.5, dx: float = 0.08,
           ha: str = "left") -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=lw,
                                 color=colour, shrinkA=0, shrinkB=0))
    if label:
        x = start[0] + label_at * (end[0] - start[0]) + dx
        y = start[1] + label_at * (end[1] - start[1])
        ax.text(x, y, label, ha=ha, va="center", fontsize=_SMALL, color=colour,
                fontweight="bold")


def _levels(ax: Axes, boundary: float, top: float, bottom: float) -> None:
    """Background: HBM below the boundary, SRAM (on chip) above it."""
    ax.add_patch(Rectangle((-0.3, -0.3), 10.6, boundary + 0.3, fc=_HBM_FILL, ec="none", zorder=0))
    ax.add_patch(Rectangle((-0.3, boundary), 10.6, top - boundary, fc=_SRAM_FILL, ec="none",
                           zorder=0))
    ax.axhline(boundary, color="0.4", lw=1.2, ls="--", zorder=0.5)
    ax.text(-0.2, top - 0.1, "on chip: SRAM (fast, small)", ha="left", va="top",
            fontsize=_SMALL, color=_BLUE, style="italic")
    ax.text(10.2, 0.05, "off chip: HBM (large, slow)", ha="right", va="bottom",
            fontsize=_SMALL, color="#8A5A00", style="italic")
    ax.set_xlim(-0.3, 10.3)
    ax.set_ylim(bottom, top)
    ax.axis("off")


def dataflow(n: int = 4096, d: int = 64) -> Figure:
    """Figure 3.1: the arrays that cross the HBM/SRAM boundary, standard attention vs
    FlashAttention, one panel above the other.

    Parameters
    ----------
    n, d : sequence length and head dimension used for the sizes printed on the figure
        (one head; numbers of elements, not bytes).
    """
    fig = plt.figure(figsize=(WIDTH, 9.6), layout="constrained")
    top_ax, bottom_ax = fig.subplots(2, 1)
    boundary, top, bottom = 2.6, 6.0, -1.9
    small = n * d  # numbers in Q, K, V or O
    big = n * n  # numbers in S or P
    hbm_y, h_small, h_big = 0.45, 0.9, 1.6

    # ---- (a) standard attention: three kernels, S and P go down to HBM and back up ----
    ax = top_ax
    _levels(ax, boundary, top, bottom)
    for name, x in (("Q", 0.0), ("K", 0.95)):
        _box(ax, x, hbm_y, 0.75, h_small, name, _SKY)
    _box(ax, 2.65, hbm_y, 1.7, h_big, "S\n(N×N)", _VERMILLION, alpha=0.85)
    _box(ax, 5.45, hbm_y, 1.7, h_big, "P\n(N×N)", _VERMILLION, alpha=0.85)
    _box(ax, 7.95, hbm_y, 0.75, h_small, "V", _SKY)
    _box(ax, 9.0, hbm_y, 0.75, h_small, "O", _GREEN)
    ky, kh = 4.0, 1.0
    _kernel(ax, 0.2, ky, 2.5, kh, "kernel 1\n" r"$S = QK^\top/\sqrt{d}$")
    _kernel(ax, 3.45, ky, 3.0, kh, "kernel 2\n" r"$P = \mathrm{softmax}(S)$")
    _kernel(ax, 7.45, ky, 2.3, kh, "kernel 3\n" r"$O = PV$")
    thin, thick = 1.3, 3.2
    _arrow(ax, (0.37, hbm_y + h_small), (0.8, ky - 0.08), _BLUE, thin)
    _arrow(ax, (1.32, hbm_y + h_small), (1.6, ky - 0.08), _BLUE, thin)
    _arrow(ax, (2.2, ky - 0.08), (3.0, hbm_y + h_big), _VERMILLION, thick, "① write S", 0.78,
           -0.12, "right")
    _arrow(ax, (4.0, hbm_y + h_big), (4.3, ky - 0.08), _VERMILLION, thick, "② read S", 0.45, 0.1)
    _arrow(ax, (5.75, ky - 0.08), (6.1, hbm_y + h_big), _VERMILLION, thick, "③ write P", 0.45,
           0.1)
    _arrow(ax, (6.8, hbm_y + h_big), (7.75, ky - 0.08), _VERMILLION, thick, "④ read P", 0.45,
           0.1)
    _arrow(ax, (8.32, hbm_y + h_small), (8.5, ky - 0.08), _BLUE, thin)
    _arrow(ax, (9.35, ky - 0.08), (9.37, hbm_y + h_small), _GREEN, thin)
    ax.text(-0.2, -0.45, f"N×N traffic: 4 trips × N² = {_millions(4 * big)} numbers\n"
            f"N×d traffic: Q, K, V read, O written = {_millions(4 * small)} numbers",
            ha="left", va="top", fontsize=_BODY, color=_INK)
    ax.set_title("(a) standard attention: three kernels", loc="left", fontsize=_TITLE)

    # ---- (b) FlashAttention: one fused kernel, only the N x d arrays cross ----
    ax = bottom_ax
    _levels(ax, boundary, top, bottom)
    for name, x in (("Q", 0.3), ("K", 2.3), ("V", 4.3)):
        _box(ax, x, hbm_y, 1.0, h_small, name, _SKY)
    _box(ax, 7.0, hbm_y, 2.4, h_small, "O\n" r"and $m, \ell$ (2N)", _GREEN)
    ax.add_patch(FancyBboxPatch((0.0, 3.2), 10.0, 2.15, boxstyle="round,pad=0.08", fc="white",
                                ec=_BLUE, lw=1.6))
    ax.text(5.0, 5.05, "one fused kernel, for each pair of blocks (i, j):", ha="center",
            va="center", fontsize=_BODY, color=_INK)
    steps = (r"$S_{ij} = \tau Q_i K_j^\top$",
             r"$\tilde m_{ij}$, $\tilde P_{ij}$, $\tilde\ell_{ij}$" "\n(tile's softmax)",
             r"rescale $O_i$;" "\n" r"add $\tilde P_{ij} V_j$")
    for k, (label, x) in enumerate(zip(steps, (0.2, 3.55, 6.9))):
        _box(ax, x, 3.45, 2.9, 1.1, label, _SRAM_FILL, ec=_BLUE)
        if k < 2:
            _arrow(ax, (x + 2.9, 4.0), (x + 3.35, 4.0), _BLUE, 1.3)
    for x_from, x_to, name in ((0.8, 1.2, "$Q_i$"), (2.8, 2.9, "$K_j$"), (4.8, 4.5, "$V_j$")):
        _arrow(ax, (x_from, hbm_y + h_small), (x_to, 3.2), _BLUE, 1.3, name, 0.55, 0.08)
    _arrow(ax, (7.5, hbm_y + h_small), (7.5, 3.2), _GREEN, 1.3, "read", 0.55, -0.1, "right")
    _arrow(ax, (8.9, 3.2), (8.9, hbm_y + h_small), _GREEN, 1.3, "write", 0.45, 0.1)
    ax.text(8.2, 2.25, "$T_c$ times\n(v1)", ha="center", va="center", fontsize=_SMALL,
            color=_GREEN)
    ax.text(-0.2, -0.45, "N×N traffic: none ($S_{ij}$ and $\\tilde P_{ij}$ stay in SRAM)\n"
            "N×d traffic: Q, K, V, O (v1 re-reads Q and O; §3.2)",
            ha="left", va="top", fontsize=_BODY, color=_INK)
    ax.set_title("(b) FlashAttention: one fused kernel", loc="left", fontsize=_TITLE)
    fig.suptitle(f"Figure 3.1. What crosses the HBM boundary\n(one head, N = {n}, d = {d}; "
                 "numbers, not bytes)", fontsize=_TITLE, x=0.01, ha="left")
    return fig


def tiling(n: int = 512, d: int = 64, sram_size: int = 32768, i: int = 3, j: int = 2) -> Figure:
    """Figure 3.2: the blocks of Algorithm 1 and one step of its double loop.

    Parameters
    ----------
    n, d : sequence length and head dimension (drawn to scale: S is n x n, Q is n x d).
    sram_size : M, numbers that fit in SRAM; the block sizes are
        ``block_sizes(sram_size, d)``.
    i, j : the step to highlight, 1-based like the paper: Q block i, K/V block j.
    """
    Br, Bc = block_sizes(sram_size, d)
    Tr, Tc = math.ceil(n / Br), math.ceil(n / Bc)
    if not (1 <= i <= Tr and 1 <= j <= Tc):
        raise ValueError(f"i must be in 1..Tr = 1..{Tr} and j in 1..Tc = 1..{Tc}; "
                         f"got i={i}, j={j}")
    u = 8.0 / n  # drawing units per row/column: S is 8 x 8
    w = d * u  # width of the d-wide stripes
    gap = 0.3
    fig = plt.figure(figsize=(WIDTH, 8.6), layout="constrained")
    ax = fig.subplots()
    ax.set_aspect("equal")

    def rows(idx: int) -> tuple[float, float]:  # (top, height) of Q block idx, clipped at n
        top = (idx - 1) * Br * u
        return top, min(Br * u, 8.0 - top)

    def cols(idx: int) -> tuple[float, float]:
        left = (idx - 1) * Bc * u
        return left, min(Bc * u, 8.0 - left)

    # S: the tiles already done, the current one, those still to come
    for jj in range(1, Tc + 1):
        for ii in range(1, Tr + 1):
            (x, cw), (y, rh) = cols(jj), rows(ii)
            done = jj < j or (jj == j and ii < i)
            fc = _ORANGE if (ii, jj) == (i, j) else ("#F2F2F2" if done else "white")
            ax.add_patch(Rectangle((x, y), cw, rh, fc=fc, ec="0.55", lw=0.8,
                                   hatch="///" if done else None))
    (xj, wj), (yi, hi) = cols(j), rows(i)
    ax.add_patch(Rectangle((xj, 0), wj, 8.0, fill=False, ec=_BLUE, lw=2.2))  # column block
    ax.add_patch(Rectangle((xj, yi), wj, hi, fill=False, ec=_VERMILLION, lw=2.8))
    ax.text(xj + wj / 2, yi + hi / 2, f"$S_{{{i}{j}}}$\n{Br}×{Bc}", ha="center", va="center",
            fontsize=_BODY, fontweight="bold", color=_INK)

    # Q (left) and O (right): Tr row blocks; K^T (top) and V^T (bottom): Tc column blocks
    for ii in range(1, Tr + 1):
        y, rh = rows(ii)
        on = ii == i
        weight = "bold" if on else "normal"
        ax.add_patch(Rectangle((-gap - w, y), w, rh, fc=_SKY if on else "white", ec="0.4",
                               lw=0.9))
        ax.add_patch(Rectangle((8 + gap, y), w, rh, fc=_GREEN if on else "white", ec="0.4",
                               lw=0.9))
        ax.text(-gap - w / 2, y + rh / 2, f"$Q_{ii}$", ha="center", va="center",
                fontsize=_SMALL, fontweight=weight)
        label = f"$O_{ii}, \\ell_{ii}, m_{ii}$" if on else f"$O_{ii}$"
        ax.text(8 + gap + w + 0.1, y + rh / 2, label, ha="left", va="center", fontsize=_SMALL,
                fontweight=weight)
    for jj in range(1, Tc + 1):
        x, cw = cols(jj)
        on = jj == j
        weight = "bold" if on else "normal"
        ax.add_patch(Rectangle((x, -gap - w), cw, w, fc=_SKY if on else "white", ec="0.4",
                               lw=0.9))
        ax.add_patch(Rectangle((x, 8 + gap), cw, w, fc=_SKY if on else "white", ec="0.4",
                               lw=0.9))
        ax.text(x + cw / 2, -gap - w / 2, f"$K_{jj}^\\top$", ha="center", va="center",
                fontsize=_SMALL, fontweight=weight)
        ax.text(x + cw / 2, 8 + gap + w / 2, f"$V_{jj}^\\top$", ha="center", va="center",
                fontsize=_SMALL, fontweight=weight)

    # the two loops
    ya = -gap - w - 0.3
    ax.add_patch(FancyArrowPatch((0.1, ya), (7.9, ya), arrowstyle="-|>", mutation_scale=16,
                                 lw=1.8, color=_BLUE))
    ax.text(4.0, ya - 0.15, f"outer loop: j = 1..{Tc}\nload $K_j, V_j$ once each",
            ha="center", va="bottom", fontsize=_BODY, color=_BLUE)
    xl = -gap - w - 0.35
    ax.add_patch(FancyArrowPatch((xl, 0.1), (xl, 7.9), arrowstyle="-|>", mutation_scale=16,
                                 lw=1.8, color=_VERMILLION))
    ax.text(xl - 0.15, 4.0, f"inner loop: i = 1..{Tr}\n"
            r"read and write $O_i, \ell_i, m_i$",
            ha="right", va="center", fontsize=_BODY, color=_VERMILLION, rotation=90,
            multialignment="center")

    # below: the legend and what is on chip at this step
    y0 = 8 + gap + w + 0.45
    ax.text(-1.6, y0, "$S = \\tau QK^\\top$ ($N \\times N$) is never stored. Orange: the one "
            "tile\nthat exists now. Hatched: tiles already done.", ha="left", va="top",
            fontsize=_SMALL, color="0.25")
    y1 = y0 + 1.0
    ax.add_patch(FancyBboxPatch((-1.6, y1), 13.2, 3.2, boxstyle="round,pad=0.1",
                                fc=_SRAM_FILL, ec=_BLUE, lw=1.5))
    ax.text(-1.4, y1 + 0.4, f"on chip at step i = {i}, j = {j}", ha="left", va="center",
            fontsize=_BODY, fontweight="bold", color=_BLUE)
    sram = [
        (f"$K_{j}, V_{j}$: {Bc}×{d} each", _SKY),
        (f"$Q_{i}$: {Br}×{d}", _SKY),
        (f"$O_{i}$: {Br}×{d}", _GREEN),
        (f"$\\ell_{i}, m_{i}$: {Br} each", _GREEN),
        (f"$S_{{{i}{j}}}$, then $\\tilde P_{{{i}{j}}}$: {Br}×{Bc}", _ORANGE),
    ]
    for k, (text, fc) in enumerate(sram):
        x, y = -1.3 + 6.6 * (k // 3), y1 + 1.05 + 0.75 * (k % 3)
        ax.add_patch(Rectangle((x, y - 0.22), 0.4, 0.44, fc=fc, ec="0.4"))
        ax.text(x + 0.6, y, text, ha="left", va="center", fontsize=_BODY)
    tiles = 2 * Bc * d + 2 * Br * d  # Q_i, K_j, V_j, O_i: what the rule budgets
    ax.text(5.3, y1 + 2.75, f"$Q_{i}, K_{j}, V_{j}, O_{i}$: {tiles:,} ≤ M = {sram_size:,}\n"
            f"$S_{{{i}{j}}}$, $\\ell_{i}$, $m_{i}$: {Br * Bc + 2 * Br:,} more",
            ha="left", va="center", fontsize=_SMALL, color="0.25")

    ax.set_xlim(-1.8, 11.8)
    ax.set_ylim(y1 + 3.4, ya - 1.3)  # inverted: row 1 at the top, as in a matrix
    ax.axis("off")
    ax.set_title(f"Figure 3.2. Tiling in Algorithm 1: N = {n}, d = {d}, M = {sram_size:,}\n"
                 f"→ Br = {Br}, Bc = {Bc}, Tr = {Tr}, Tc = {Tc}", loc="left", fontsize=_TITLE)
    return fig
