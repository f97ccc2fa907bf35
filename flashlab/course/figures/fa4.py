"""Chapter 7's figures: FlashAttention-4's cycle budget, software exp2, conditional rescaling.

Figure 7.1 (``cycles_per_tile``) draws the cycles per 128 x 128 x 128 tile from
:mod:`flashlab.cycles`; figure 7.2 (``software_exp2``) the software exp2 pipeline and its
error from :mod:`flashlab.reference.softexp`; figure 7.3 (``conditional_rescaling``) the
running and reference maxima of a row from :mod:`flashlab.reference.rescale`; figure 7.4
(``variants_h200``) the two tricks measured on an H200 (``results/fa4_variants_h200``).

Each is drawn :data:`WIDTH` inches wide, the width of the book's text column, with no text
smaller than :data:`MIN_FONT` points; figures with two panels stack them. Colours: Okabe-Ito.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from flashlab import cycles
from flashlab.hardware import B200, B300, H100
from flashlab.reference import rescale, softexp
from flashlab.course.figures.timeline import COLOURS

__all__ = ["cycles_per_tile", "software_exp2", "conditional_rescaling", "variants_h200",
           "WIDTH", "MIN_FONT"]

WIDTH = 7.0  # inches: about 700 px at the notebook's 100 dpi, the text column's width
MIN_FONT = 9.0  # points: the smallest text on these figures
_BODY, _TITLE = 10.0, 11.0  # font sizes in points

BLUE, VERMILLION, GREEN, PURPLE = COLOURS
ORANGE, SKY, GREY = "#E69F00", "#56B4E9", "0.55"


def _bars(ax, groups, series, colours, labels):
    width = 0.8 / len(series)
    x = np.arange(len(groups))
    containers = []
    for i, (values, colour, label) in enumerate(zip(series, colours, labels)):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, color=colour, label=label)
        ax.bar_label(bars, labels=[f"{v:.0f}" if v else "" for v in values], fontsize=MIN_FONT,
                     padding=2)
        containers.append(bars)
    ax.set_xticks(x, groups, fontsize=_BODY)
    ax.tick_params(axis="y", labelsize=MIN_FONT)
    ax.spines[["top", "right"]].set_visible(False)
    return containers


def cycles_per_tile(Br: int = 128, Bc: int = 128, d: int = 128) -> Figure:
    """Seed figure 8: cycles per tile for H100, B200, B300, forward (MMA, exp and SMEM)
    and backward (MMA vs SMEM, and SMEM with 2-CTA on Blackwell). The backward SMEM
    count follows Blackwell's dataflow (operands in TMEM); on the H100 it is drawn
    hatched, for scale only."""
    gpus = [H100, B200, B300]
    fwd = [cycles.forward_tile_cycles(g, Br, Bc, d) for g in gpus]
    bwd = [cycles.backward_tile_cycles(g, Br, Bc, d) for g in gpus]
    two = [cycles.backward_tile_cycles(g, Br, Bc, d, two_cta=True)["smem"] if g.tmem_per_sm else 0.0
           for g in gpus]  # 2-CTA exists only on Blackwell
    fig, (a, b) = plt.subplots(2, 1, figsize=(WIDTH, 7.2), layout="constrained")
    names = [g.name.split()[0] for g in gpus]
    _bars(a, names, [[f["mma"] for f in fwd], [f["exp"] for f in fwd], [f["smem"] for f in fwd]],
          [BLUE, VERMILLION, GREEN], ["MMA (tensor cores)", "exp (MUFU)", "SMEM traffic"])
    a.set_title(f"(a) Forward, one {Br}×{Bc}×{d} tile: exp ties MMA on the B200",
                loc="left", fontsize=_TITLE)
    a.set_ylabel("cycles per tile on one SM", fontsize=_BODY)
    a.legend(frameon=False, loc="upper right", fontsize=MIN_FONT)
    _, smem_bars, _ = _bars(b, names, [[f["mma"] for f in bwd], [f["smem"] for f in bwd], two],
                            [BLUE, GREEN, SKY], ["MMA (5 matmuls)", "SMEM traffic", "SMEM with 2-CTA"])
    for bar, gpu in zip(smem_bars, gpus):
        if not gpu.tmem_per_sm:  # no TMEM: Blackwell's operand table does not describe this GPU
            bar.set_facecolor("white")
            bar.set_edgecolor(GREEN)
            bar.set_hatch("///")
    b.set_title("(b) Backward, one tile: SMEM needs more cycles than MMA",
                loc="left", fontsize=_TITLE)
    b.set_ylabel("cycles per tile on one SM", fontsize=_BODY)
    handles = [Patch(color=BLUE, label="MMA (5 matmuls)"), Patch(color=GREEN, label="SMEM traffic"),
               Patch(facecolor="white", edgecolor=GREEN, hatch="///",
                     label="SMEM, Blackwell's dataflow (scale only)"),
               Patch(color=SKY, label="SMEM with 2-CTA")]
    b.legend(handles=handles, frameon=False, loc="upper left", fontsize=MIN_FONT, ncols=2)
    b.text(0.27, 150, "no 2-CTA\non Hopper", ha="center", va="bottom", fontsize=MIN_FONT,
           color="0.3", rotation=90)
    a.set_ylim(0, 1.25 * a.get_ylim()[1])
    b.set_ylim(0, 1.45 * b.get_ylim()[1])
    return fig


def software_exp2(degree: int = 3) -> Figure:
    """Seed figure 9: the software exp2 pipeline (left) and the relative error of the
    cubic on [0, 1) beside bf16's relative half-ulp (right)."""
    fig, (a, b) = plt.subplots(2, 1, figsize=(WIDTH, 8.0), layout="constrained",
                               height_ratios=[1.0, 1.05])
    x = np.float32(-3.3)
    n, f = softexp.range_reduce(x)
    p = softexp.horner(f, softexp.FA4_COEFFICIENTS)
    y = softexp.insert_exponent(p, n)
    steps = [
        (f"x = {x:.1f}", "input (log2 units)"),
        (f"n = floor(x) = {int(n)}\nf = x − n = {float(f):.1f}", "range reduction\n(Cody–Waite)"),
        (f"p(f) = 1 + f(c₁ + f(c₂ + f c₃))\n= {float(p):.5f}", "Horner: 3 FMAs"),
        (f"bits(p) + ({int(n)} << 23)\n= {float(y):.6f}", "write n into the\nexponent field"),
    ]
    a.axis("off")
    a.set_xlim(0, 1)
    a.set_ylim(0, 1)
    ys = np.linspace(0.88, 0.12, len(steps))
    for i, ((text, label), yy) in enumerate(zip(steps, ys)):
        a.text(0.38, yy, text, ha="center", va="center", fontsize=_BODY, family="monospace",
               bbox=dict(boxstyle="round,pad=0.5", fc="white", ec=COLOURS[i], lw=1.5))
        a.text(0.76, yy, label, ha="left", va="center", fontsize=_BODY, color="0.25")
        if i + 1 < len(steps):
            a.annotate("", xy=(0.38, ys[i + 1] + 0.09), xytext=(0.38, yy - 0.09),
                       arrowprops=dict(arrowstyle="->", color="0.4"))
    a.set_title(f"(a) Software exp2, step by step (2^−3.3 = {2**-3.3:.6f})", loc="left",
                fontsize=_TITLE)

    grid = softexp.fraction_grid(1 << 14)
    truth = np.exp2(grid.astype(np.float64))
    cubic = softexp.relative_error(softexp.exp2(grid, coefficients=softexp.FA4_COEFFICIENTS), truth)
    library = softexp.relative_error(np.exp2(grid), truth)
    bf16 = softexp.relative_error(softexp.round_to_bf16(np.exp2(grid)), truth)
    half_ulp = 2.0**-8
    b.plot(grid, bf16, color=ORANGE, lw=0.6, alpha=0.7, label="library exp2 rounded to bf16")
    b.plot(grid, cubic, color=BLUE, lw=1.4, label="cubic, fp32")
    b.plot(grid, np.maximum(library, 1e-10), color=GREEN, lw=0.6, alpha=0.8,
           label="library exp2, fp32")
    b.axhline(half_ulp, color=VERMILLION, ls="--", lw=1.2, label="bf16 relative half-step 2⁻⁸")
    b.set_yscale("log")
    b.set_ylim(1e-10, 30.0)
    b.set_xlabel("f (the fractional part; the error is the same for every n)", fontsize=_BODY)
    b.set_ylabel("relative error", fontsize=_BODY)
    b.tick_params(labelsize=MIN_FONT)
    b.set_title(f"(b) bf16 rounding (half a step, 2⁻⁸) is {half_ulp / cubic.max():.0f}× "
                "the cubic's worst error", loc="left", fontsize=_TITLE)
    b.legend(frameon=False, loc="upper right", fontsize=MIN_FONT, ncols=2)
    b.spines[["top", "right"]].set_visible(False)
    return fig


def conditional_rescaling(threshold: float = 8.0, block_size: int = 4) -> Figure:
    """Seed figure 10: a row's running max over blocks, and the reference max that moves
    only when a block exceeds it by more than theta. Rescale events are marked."""
    row = rescale.staircase_row(block_size=block_size)
    eager = rescale.trace_row(row, 0.0, block_size)
    lazy = rescale.trace_row(row, threshold, block_size)
    blocks = np.arange(lazy.block_max.size)
    edges = np.arange(lazy.block_max.size + 1)  # step plots need one more edge than blocks

    def extend(values: np.ndarray) -> np.ndarray:
        return np.r_[values, values[-1]]
    fig, ax = plt.subplots(figsize=(WIDTH, 4.6), layout="constrained")
    ax.plot(blocks, lazy.block_max, "o", color=GREY, ms=5, label="block max")
    ax.step(edges, extend(eager.running_max), where="post", color=BLUE, lw=2,
            label=f"running max m (chapter 2): {int(eager.rescaled.sum())} rescales")
    ax.step(edges, extend(lazy.m_ref), where="post", color=VERMILLION, lw=2.5,
            label=f"reference m_ref, θ = {threshold:g}: {int(lazy.rescaled.sum())} rescale")
    ax.fill_between(edges, extend(lazy.m_ref), extend(lazy.m_ref) + threshold, step="post",
                    color=VERMILLION, alpha=0.08, label="up to m_ref + θ: no rescale")
    ax.plot(blocks[eager.rescaled], eager.running_max[eager.rescaled], "v", color=BLUE, ms=8)
    ax.plot(blocks[lazy.rescaled], lazy.m_ref[lazy.rescaled], "*", color=VERMILLION, ms=16)
    ax.set_xlabel("K/V block j", fontsize=_BODY)
    ax.set_ylabel("score (log2 units)", fontsize=_BODY)
    ax.set_xticks(blocks)
    ax.tick_params(labelsize=MIN_FONT)
    ax.set_title("Move the reference only when the max outgrows it by more than θ",
                 loc="left", fontsize=_TITLE)
    ax.legend(frameon=False, loc="upper left", fontsize=MIN_FONT)
    ax.set_ylim(-1.5, 21)
    ax.set_xlim(-0.3, edges[-1])
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def _variant_rows(rec, d: int, N: int, causal: bool) -> tuple[list[tuple[float, float, int]], dict, dict]:
    """(realised fraction, ms, MUFU.EX2 count) of the fa4 variant without conditional rescaling,
    sorted by fraction, and the theta = 8 row and the base row, for one shape."""
    rows = rec.where(d=d, N=N, causal=causal)
    polys = sorted((r["poly_realised"], r["ms"], r["mufu_ex2_sass"]) for r in rows
                   if r["variant"] == "fa4" and r["threshold"] == "")
    theta_row = next(r for r in rows if r["variant"] == "fa4" and r["threshold"] != "")
    base = next(r for r in rows if r["variant"] == "base")
    return polys, theta_row, base


def variants_h200(stem: str = "fa4_variants_h200", d: int = 128) -> Figure:
    """FA4's software tricks measured on the H200 (``results/fa4_variants_h200``), head dimension d.

    Left: forward time relative to the fa4 variant at poly fraction 0 (hardware exp2 only),
    against the realised polynomial fraction, for N = 16384 (solid) and 4096 (dashed),
    non-causal and causal; the theta = 8 runs (conditional rescaling, fraction 0) as stars in
    a column of their own, and the cycle model's prediction for Hopper (no change: the tile
    is MMA-bound) as a grey line. Right: MUFU.EX2 instructions in the compiled SASS against
    the fraction, beside 4 + 128 (1 - fraction) (128 exponentials of P per tile, 4 rescale
    factors)."""
    import textwrap

    from flashlab.lab.results import load

    rec = load(stem)
    fig, (a, b) = plt.subplots(2, 1, figsize=(WIDTH, 8.4), layout="constrained",
                               height_ratios=[1.25, 1])
    fractions = [0, 1 / 8, 1 / 4, 1 / 2]
    theta_x = 0.66  # the column of the theta = 8 runs, right of the fraction axis
    a.axhline(1.0, color=GREY, lw=1.2, ls=":", label="cycle model, H200: MMA-bound, no change")
    a.axvline(0.58, color="0.8", lw=0.8)
    for causal, colour, dx in ((False, BLUE, -0.025), (True, VERMILLION, 0.025)):
        for N, ls in ((16384, "-"), (4096, "--")):
            polys, theta_row, _ = _variant_rows(rec, d, N, causal)
            rel = [p[1] / polys[0][1] for p in polys]
            kind = "causal" if causal else "non-causal"
            big = N == 16384
            a.plot([p[0] for p in polys], rel, ls, color=colour, marker="o", ms=5,
                   lw=1.7 if big else 1.0, label=f"{kind}, N = {N}")
            a.plot(theta_x + dx, theta_row["ms"] / polys[0][1], "*", color=colour,
                   ms=14 if big else 9, alpha=1.0 if big else 0.55)
    a.set_xticks(fractions + [theta_x], ["0", "1/8", "1/4", "1/2", "θ = 8\n(fraction 0)"])
    a.set_xlabel("share of each P tile's exponentials computed by the cubic", fontsize=_BODY)
    a.set_ylabel("time / time at fraction 0", fontsize=_BODY)
    a.set_title(f"(a) Forward time, d = {d}, bf16: both tricks are slower on Hopper",
                loc="left", fontsize=_TITLE)
    a.legend(frameon=False, fontsize=MIN_FONT, loc="upper left", ncols=2)
    a.set_ylim(0.95, 1.36)
    a.set_xlim(-0.04, 0.72)
    a.tick_params(labelsize=MIN_FONT)
    a.spines[["top", "right"]].set_visible(False)

    polys, _, _ = _variant_rows(rec, d, 16384, False)
    x = np.arange(len(polys))
    bars = b.bar(x, [p[2] for p in polys], 0.6, color=GREEN, label="MUFU.EX2 in the SASS (counted)")
    b.bar_label(bars, fontsize=MIN_FONT, padding=2)
    b.hlines([4 + 128 * (1 - p[0]) for p in polys], x - 0.38, x + 0.38, color="black", lw=1.5,
             label="4 + 128 (1 − fraction)")
    b.set_xticks(x, ["0", "1/8", "1/4", "1/2"])
    b.set_xlabel("realised poly fraction", fontsize=_BODY)
    b.set_ylabel("hardware exp2 instructions", fontsize=_BODY)
    b.set_title("(b) The cubic really removes MUFU work (N = 16384, non-causal)", loc="left",
                fontsize=_TITLE)
    b.set_ylim(0, 185)
    b.tick_params(labelsize=MIN_FONT)
    b.legend(frameon=False, fontsize=MIN_FONT, loc="upper right")
    b.spines[["top", "right"]].set_visible(False)
    fig.supxlabel(textwrap.fill(rec.provenance, 105), fontsize=MIN_FONT, color="0.35")
    return fig
