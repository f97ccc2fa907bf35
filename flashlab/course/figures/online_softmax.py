"""Figure 2.1 (chapter 2): online softmax on the row [1, 3, 2, 5], read in blocks [1, 3] and [2, 5].

Every number on the figure is computed here by :class:`~flashlab.reference.OnlineSoftmaxState`
(the running max m and the running sum l of exp(s - m)); the one-pass value is the
definition l = sum_k exp(s_k - max s). Colours are from the Okabe-Ito palette, which
stays distinguishable under the common forms of colour blindness.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from flashlab.reference.softmax import OnlineSoftmaxState

__all__ = ["online_softmax_example"]

# Okabe-Ito: blue and orange for the two blocks, pale tints for the cell fills.
_BLOCK_COLOURS = ("#0072B2", "#E69F00")
_BLOCK_TINTS = ("#D6E9F5", "#FBEBC7")
_INK = "#222222"


def _fmt(x: float) -> str:
    """Numbers on the figure: 4 decimals, trailing zeros kept so columns line up."""
    return f"{x:.4f}"


def _state_box(ax, x0: float, x1: float, title: str, lines: list[str], colour: str) -> None:
    """A rounded box with a bold title and one line of (math) text per entry."""
    ax.add_patch(
        FancyBboxPatch(
            (x0, 0.4), x1 - x0, 5.0, boxstyle="round,pad=0.02,rounding_size=0.35",
            facecolor="white", edgecolor=colour, linewidth=2.0,
        )
    )
    xc = (x0 + x1) / 2
    ax.text(xc, 4.85, title, ha="center", va="center", fontsize=11.5, fontweight="bold", color=colour)
    for i, line in enumerate(lines):
        ax.text(x0 + 0.45, 3.85 - 1.05 * i, line, ha="left", va="center", fontsize=11.5, color=_INK)


def online_softmax_example() -> Figure:
    """The worked example of online softmax: state (m, l) after each block, the rescale
    factor exp(3 - 5) applied to the old l, and the final l equal to the one-pass value.

    Returns a new figure (two panels: the ledger of states, and the terms of l as
    stacked bars, each term exp(s_k - reference max) coloured by its block).
    """
    s = np.array([1.0, 3.0, 2.0, 5.0])  # (N,) one row of scores
    blocks = [s[:2], s[2:]]  # [1, 3] and [2, 5]
    states = [OnlineSoftmaxState.empty()]
    for block in blocks:
        states.append(states[-1].update(block))  # equations (1)-(2)
    m1, l1 = float(states[1].m), float(states[1].l)
    m2, l2 = float(states[2].m), float(states[2].l)
    alpha = float(np.exp(m1 - m2))  # the rescale factor exp(m - m_new)
    l_one_pass = float(np.sum(np.exp(s - s.max())))  # the definition, whole row at once
    assert abs(l2 - l_one_pass) < 1e-12, "online and one-pass l must agree"

    fig = plt.figure(figsize=(12.5, 8.2))
    fig.suptitle(
        "Online softmax: read the row in blocks, rescale the old sum when the max grows",
        fontsize=14, fontweight="bold", y=0.985,
    )

    # ---- top panel: the row, then the state after each block ----------------------
    ax = fig.add_axes((0.01, 0.43, 0.98, 0.51))
    ax.set_xlim(0, 36)
    ax.set_ylim(0, 10)
    ax.axis("off")
    ax.text(10.2, 8.7, "one row of scores  $s$ =", ha="right", va="center", fontsize=12, color=_INK)
    for k, value in enumerate(s):
        b = k // 2
        x = 11.0 + 2.2 * k + 0.6 * b
        ax.add_patch(Rectangle((x, 7.9), 2.0, 1.6, facecolor=_BLOCK_TINTS[b], edgecolor=_BLOCK_COLOURS[b], lw=2))
        ax.text(x + 1.0, 8.7, f"{value:g}", ha="center", va="center", fontsize=15, fontweight="bold", color=_INK)
    for b in range(2):
        x = 11.0 + 4.4 * b + 0.6 * b
        ax.text(x + 2.1, 7.35, f"block {b + 1}", ha="center", va="center", fontsize=11,
                color=_BLOCK_COLOURS[b], fontweight="bold")

    _state_box(ax, 0.3, 11.3, "after block 1 = [1, 3]", [
        rf"$m = \max(1, 3) = {m1:g}$",
        r"$\ell = e^{1-3} + e^{3-3}$",
        rf"$\;\;\, = {_fmt(l1)}$",
    ], _BLOCK_COLOURS[0])
    _state_box(ax, 12.6, 24.6, "after block 2 = [2, 5]", [
        rf"$m = \max(3,\, 2, 5) = {m2:g}$   (new max!)",
        rf"$\ell = {_fmt(l1)} \cdot e^{{3-5}} + e^{{2-5}} + e^{{5-5}}$",
        rf"$\;\;\, = {_fmt(l1 * alpha)} + {_fmt(np.exp(2 - m2))} + 1 = {_fmt(l2)}$",
    ], _BLOCK_COLOURS[1])
    _state_box(ax, 25.9, 35.7, "one pass over the whole row", [
        rf"$m = \max(1, 3, 2, 5) = {s.max():g}$",
        r"$\ell = e^{1-5} + e^{3-5} + e^{2-5} + e^{5-5}$",
        rf"$\;\;\, = {_fmt(l_one_pass)}$   (identical)",
    ], "#555555")
    ax.add_patch(FancyArrowPatch((11.3, 2.9), (12.6, 2.9), arrowstyle="-|>", mutation_scale=18, color=_INK, lw=1.5))
    ax.text(18.6, 6.35,
            rf"the old $\ell$ is multiplied by the rescale factor $e^{{m - m_\mathrm{{new}}}} = e^{{3-5}} = {_fmt(alpha)}$",
            ha="center", va="center", fontsize=11.5, color=_INK,
            bbox=dict(boxstyle="round,pad=0.3", facecolor="#F2F2F2", edgecolor="none"))
    ax.text(25.25, 2.9, "=", ha="center", va="center", fontsize=22, color=_INK)

    # ---- bottom panel: the terms of l, stacked, before and after the rescale ------
    bx = fig.add_axes((0.07, 0.08, 0.9, 0.3))
    stages = [  # (label, entries seen, reference max, total l from the state)
        ("after block 1\n(reference max 3)", [0, 1], m1, l1),
        ("old $\\ell$ rescaled\n" + rf"$\times\, e^{{3-5}}$ (reference max 5)", [0, 1], m2, l1 * alpha),
        ("after block 2\n(reference max 5)", [0, 1, 2, 3], m2, l2),
        ("one pass\n(reference max 5)", [0, 1, 2, 3], s.max(), l_one_pass),
    ]
    for i, (_, seen, ref, total) in enumerate(stages):
        bottom = 0.0
        for k in seen:
            term = float(np.exp(s[k] - ref))  # exp(s_k - reference max)
            bx.bar(i, term, bottom=bottom, width=0.55, color=_BLOCK_COLOURS[k // 2], edgecolor="white", lw=1.2)
            bottom += term
        bx.text(i, total + 0.04, rf"$\ell = {_fmt(total)}$", ha="center", va="bottom", fontsize=11.5, color=_INK)
    bx.annotate("", xy=(0.75, l1 * alpha + 0.05), xytext=(0.3, l1 - 0.1),
                arrowprops=dict(arrowstyle="-|>", color=_INK, lw=1.3, connectionstyle="arc3,rad=-0.25"))
    bx.set_xticks(range(len(stages)), [label for label, *_ in stages], fontsize=10.5)
    bx.set_ylim(0, 1.5)
    bx.set_ylabel(r"$\ell = \sum\, e^{s_k - \mathrm{ref}}$", fontsize=11.5)
    bx.spines[["top", "right"]].set_visible(False)
    bx.bar(0, 0, color=_BLOCK_COLOURS[0], label=r"terms from block 1: $e^{1-\mathrm{ref}}$, $e^{3-\mathrm{ref}}$")
    bx.bar(0, 0, color=_BLOCK_COLOURS[1], label=r"terms from block 2: $e^{2-\mathrm{ref}}$, $e^{5-\mathrm{ref}}$")
    bx.legend(loc="upper center", bbox_to_anchor=(0.39, 1.02), frameon=False, fontsize=10.5)
    return fig
