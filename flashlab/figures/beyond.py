"""Chapter 9 figure: which tiles of the score matrix a kernel computes, masks or skips
under a causal mask (square and N_q < N_k, both bottom-right aligned) and a sliding
window.

Everything drawn comes from :func:`flashlab.reference.beyond.window_mask` (the mask)
and :func:`flashlab.reference.beyond.window_block_counts` (the tile counts in the
titles). A tile is *skipped* when the mask is False everywhere in it, *masked* (a
diagonal tile) when it is partly True, and *full* when it is True everywhere: the same
classification as ``window_block_counts``. Colours are the Okabe-Ito palette of
:mod:`.timeline`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..reference.beyond import window_block_counts, window_mask
from .timeline import COLOURS

__all__ = ["block_masks"]

TILE_COLOURS = {"full": COLOURS[0], "masked": COLOURS[1], "skipped": "0.93"}


def _panel(ax, n_q: int, n_k: int, block: int, window: tuple[int, int], title: str) -> None:
    """One score matrix: the mask in light shading, each tile outlined in its class colour."""
    mask = window_mask(n_q, n_k, window)  # (n_q, n_k), True = query i sees key j
    ax.imshow(mask, cmap=ListedColormap(["white", "#BBD7EA"]), extent=(0, n_k, n_q, 0), interpolation="nearest")
    for r0 in range(0, n_q, block):
        for c0 in range(0, n_k, block):
            tile = mask[r0:r0 + block, c0:c0 + block]
            kind = "full" if tile.all() else "masked" if tile.any() else "skipped"
            fill = kind == "skipped"
            ax.add_patch(Rectangle((c0, r0), block, block, fill=fill, fc=TILE_COLOURS["skipped"], ec=TILE_COLOURS[kind],
                                   lw=0.6 if fill else 2.0, zorder={"skipped": 1, "full": 2, "masked": 3}[kind]))
    c = window_block_counts(n_q, n_k, block, block, window)
    ax.set_title(f"{title}\ncomputed {c['computed']} of {c['total']} tiles "
                 f"({c['diagonal']} masked), skipped {c['skipped']}", fontsize=10, loc="left")
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.set_xlim(0, n_k)
    ax.set_ylim(n_q, 0)
    ax.set_aspect("equal")


def block_masks(n: int = 512, block: int = 64, left: int = 128) -> Figure:
    """Three score matrices cut into ``block`` x ``block`` tiles.

    (a) causal, N_q = N_k = n; (b) causal, N_q = n / 2 new queries against N_k = n keys,
    bottom-right aligned (query i sees key j iff j <= i + N_k - N_q); (c) causal sliding
    window of ``left`` keys to the left, N_q = N_k = n. Shaded cells are the (i, j) the
    mask allows; blue tiles are computed without a mask, vermillion tiles with the mask,
    grey tiles are never loaded.
    """
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 5.2), layout="constrained",
                             gridspec_kw={"width_ratios": [1, 1, 1]})
    _panel(axes[0], n, n, block, (-1, 0), f"(a) causal, $N_q = N_k = {n}$")
    _panel(axes[1], n // 2, n, block, (-1, 0), f"(b) causal, $N_q = {n // 2}$, $N_k = {n}$ (bottom-right)")
    _panel(axes[2], n, n, block, (left, 0), f"(c) sliding window, {left} keys back")
    handles = [Patch(fc="white", ec=TILE_COLOURS["full"], lw=2, label="computed, no mask"),
               Patch(fc="white", ec=TILE_COLOURS["masked"], lw=2, label="computed with the mask (diagonal tile)"),
               Patch(fc=TILE_COLOURS["skipped"], ec="0.6", label="skipped: K_j, V_j never loaded"),
               Patch(fc="#BBD7EA", ec="none", label="allowed (i, j)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=9.5, frameon=False)
    fig.suptitle(f"Tiles of {block} x {block} scores: the mask decides which tiles a kernel visits",
                 fontsize=12)
    return fig
