"""Chapter 7's figures: FlashAttention-4's cycle budget, software exp2, conditional rescaling.

Figure 7.1 (``cycles_per_tile``) draws the cycles per 128 x 128 x 128 tile from
:mod:`flashlab.cycles`; figure 7.2 (``software_exp2``) the software exp2 pipeline and its
error from :mod:`flashlab.reference.softexp`; figure 7.3 (``conditional_rescaling``) the
running and reference maxima of a row from :mod:`flashlab.reference.rescale`; figure 7.4
(``variants_h200``) the two tricks measured on an H200 (``results/fa4_variants_h200``).
Colours: Okabe-Ito.
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

__all__ = ["cycles_per_tile", "software_exp2", "conditional_rescaling", "variants_h200"]

BLUE, VERMILLION, GREEN, PURPLE = COLOURS
ORANGE, SKY, GREY = "#E69F00", "#56B4E9", "0.55"


def _bars(ax, groups, series, colours, labels):
    width = 0.8 / len(series)
    x = np.arange(len(groups))
    containers = []
    for i, (values, colour, label) in enumerate(zip(series, colours, labels)):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, color=colour, label=label)
        ax.bar_label(bars, labels=[f"{v:.0f}" if v else "" for v in values], fontsize=8.5, padding=2)
        containers.append(bars)
    ax.set_xticks(x, groups)
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
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    names = [g.name.split()[0] for g in gpus]
    _bars(a, names, [[f["mma"] for f in fwd], [f["exp"] for f in fwd], [f["smem"] for f in fwd]],
          [BLUE, VERMILLION, GREEN], ["MMA (tensor cores)", "exp (MUFU)", "SMEM traffic"])
    a.set_title(f"Forward: one {Br}×{Bc}×{d} tile", loc="left")
    a.set_ylabel("cycles per tile on one SM")
    a.legend(frameon=False, loc="upper right")
    _, smem_bars, _ = _bars(b, names, [[f["mma"] for f in bwd], [f["smem"] for f in bwd], two], [BLUE, GREEN, SKY],
                            ["MMA (5 matmuls)", "SMEM traffic", "SMEM with 2-CTA"])
    for bar, gpu in zip(smem_bars, gpus):
        if not gpu.tmem_per_sm:  # no TMEM: Blackwell's operand table does not describe this GPU
            bar.set_facecolor("white")
            bar.set_edgecolor(GREEN)
            bar.set_hatch("///")
    b.set_title("Backward: one tile", loc="left")
    handles = [Patch(color=BLUE, label="MMA (5 matmuls)"), Patch(color=GREEN, label="SMEM traffic"),
               Patch(facecolor="white", edgecolor=GREEN, hatch="///", label="SMEM, Blackwell dataflow, for scale"),
               Patch(color=SKY, label="SMEM with 2-CTA")]
    b.legend(handles=handles, frameon=False, loc="upper right")
    b.text(0.27, 150, "no 2-CTA\non Hopper", ha="center", va="bottom", fontsize=7.5, color="0.3", rotation=90)
    for ax in (a, b):
        ax.set_ylim(0, 1.22 * max(ax.get_ylim()[1], 1))
    fig.suptitle("The tallest bar is the bottleneck: exp ties MMA on B200; "
                 "SMEM needs more cycles than MMA in the backward", fontsize=11)
    return fig


def software_exp2(degree: int = 3) -> Figure:
    """Seed figure 9: the software exp2 pipeline (left) and the relative error of the
    cubic on [0, 1) beside bf16's relative half-ulp (right)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.3), layout="constrained", width_ratios=[1.1, 1])
    x = np.float32(-3.3)
    n, f = softexp.range_reduce(x)
    p = softexp.horner(f, softexp.FA4_COEFFICIENTS)
    y = softexp.insert_exponent(p, n)
    steps = [
        (f"x = {x:.1f}", "input (log2 units)"),
        (f"n = floor(x) = {int(n)}\nf = x − n = {float(f):.1f}", "range reduction (Cody–Waite)"),
        (f"p(f) = 1 + f(c₁ + f(c₂ + f c₃))\n= {float(p):.5f}", "Horner: 3 FMAs"),
        (f"bits(p) + ({int(n)} << 23)\n= {float(y):.6f}", "write n into the exponent field"),
    ]
    a.axis("off")
    a.set_xlim(0, 1)
    a.set_ylim(0, 1)
    ys = np.linspace(0.86, 0.14, len(steps))
    for i, ((text, label), yy) in enumerate(zip(steps, ys)):
        a.text(0.36, yy, text, ha="center", va="center", fontsize=10, family="monospace",
               bbox=dict(boxstyle="round,pad=0.5", fc="white", ec=COLOURS[i], lw=1.5))
        a.text(0.74, yy, label, ha="left", va="center", fontsize=9, color="0.25")
        if i + 1 < len(steps):
            a.annotate("", xy=(0.36, ys[i + 1] + 0.085), xytext=(0.36, yy - 0.085),
                       arrowprops=dict(arrowstyle="->", color="0.4"))
    a.set_title(f"Software exp2, step by step (2^−3.3 = {2**-3.3:.6f})", loc="left")

    grid = softexp.fraction_grid(1 << 14)
    truth = np.exp2(grid.astype(np.float64))
    cubic = softexp.relative_error(softexp.exp2(grid, coefficients=softexp.FA4_COEFFICIENTS), truth)
    library = softexp.relative_error(np.exp2(grid), truth)
    bf16 = softexp.relative_error(softexp.round_to_bf16(np.exp2(grid)), truth)
    half_ulp = 2.0**-8
    b.plot(grid, bf16, color=ORANGE, lw=0.6, alpha=0.7, label="library exp2 rounded to bf16")
    b.plot(grid, cubic, color=BLUE, lw=1.4, label="cubic, fp32")
    b.plot(grid, np.maximum(library, 1e-10), color=GREEN, lw=0.6, alpha=0.8, label="library exp2, fp32")
    b.axhline(half_ulp, color=VERMILLION, ls="--", lw=1.2, label="bf16 relative half-ulp 2⁻⁸")
    b.set_yscale("log")
    b.set_ylim(1e-10, 3.0)
    b.set_xlabel("f (the fractional part; the error is the same for every n)")
    b.set_ylabel("relative error")
    b.set_title(f"bf16 rounding (half a step, 2⁻⁸) is {half_ulp / cubic.max():.0f}×\nthe cubic's worst error",
                loc="left", fontsize=10.5)
    b.legend(frameon=False, loc="upper right", fontsize=8, ncols=2)
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
    fig, ax = plt.subplots(figsize=(9, 4.3), layout="constrained")
    ax.plot(blocks, lazy.block_max, "o", color=GREY, ms=5, label="block max")
    ax.step(edges, extend(eager.running_max), where="post", color=BLUE, lw=2,
            label=f"running max m (chapter 2): {int(eager.rescaled.sum())} rescales")
    ax.step(edges, extend(lazy.m_ref), where="post", color=VERMILLION, lw=2.5,
            label=f"reference m_ref, θ = {threshold:g}: {int(lazy.rescaled.sum())} rescale")
    ax.fill_between(edges, extend(lazy.m_ref), extend(lazy.m_ref) + threshold, step="post", color=VERMILLION, alpha=0.08,
                    label="m_ref + θ: no rescale while the block max stays below")
    ax.plot(blocks[eager.rescaled], eager.running_max[eager.rescaled], "v", color=BLUE, ms=8)
    ax.plot(blocks[lazy.rescaled], lazy.m_ref[lazy.rescaled], "*", color=VERMILLION, ms=16)
    ax.set_xlabel("K/V block j")
    ax.set_ylabel("score (log2 units)")
    ax.set_xticks(blocks)
    ax.set_title("Conditional rescaling: move the reference only when the max outgrows it by more than θ",
                 loc="left", fontsize=11)
    ax.legend(frameon=False, loc="upper left", fontsize=9)
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
    fig, (a, b) = plt.subplots(1, 2, figsize=(11.5, 4.6), layout="constrained", width_ratios=[1.5, 1])
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
            a.plot([p[0] for p in polys], rel, ls, color=colour, marker="o", ms=5, lw=1.7 if big else 1.0,
                   label=f"{kind}, N = {N}")
            a.plot(theta_x + dx, theta_row["ms"] / polys[0][1], "*", color=colour, ms=14 if big else 9,
                   alpha=1.0 if big else 0.55)
    a.set_xticks(fractions + [theta_x], ["0", "1/8", "1/4", "1/2", "θ = 8\n(fraction 0)"])
    a.set_xlabel("share of each P tile's exponentials computed by the cubic (realised)")
    a.set_ylabel("time / time at fraction 0 (same kernel)")
    a.set_title(f"Forward time, d = {d}, bf16: both tricks are slower on Hopper", loc="left", fontsize=10.5)
    a.legend(frameon=False, fontsize=8, loc="upper left")
    a.set_ylim(0.95, 1.3)
    a.set_xlim(-0.04, 0.72)
    a.spines[["top", "right"]].set_visible(False)

    polys, _, _ = _variant_rows(rec, d, 16384, False)
    x = np.arange(len(polys))
    bars = b.bar(x, [p[2] for p in polys], 0.6, color=GREEN, label="MUFU.EX2 in the SASS (measured)")
    b.bar_label(bars, fontsize=9, padding=2)
    b.hlines([4 + 128 * (1 - p[0]) for p in polys], x - 0.38, x + 0.38, color="black", lw=1.5,
             label="4 + 128 (1 − fraction)")
    b.set_xticks(x, ["0", "1/8", "1/4", "1/2"])
    b.set_xlabel("realised poly fraction")
    b.set_ylabel("hardware exp2 instructions in the kernel")
    b.set_title("The cubic really removes MUFU work", loc="left", fontsize=10.5)
    b.set_ylim(0, 180)
    b.legend(frameon=False, fontsize=8, loc="upper right")
    b.spines[["top", "right"]].set_visible(False)
    fig.supxlabel(textwrap.fill(rec.provenance, 170), fontsize=7.5, color="0.35")
    return fig
