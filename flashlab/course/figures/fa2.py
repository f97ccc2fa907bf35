"""Chapter 5 figures: SM utilisation of the v1 and v2 grids (Figure 5.1), the warp
split inside a program (Figure 5.2), flashlab against its peers in the recorded kernel
bench, and the two grids measured against the model on the H200.

Everything drawn comes from :mod:`flashlab.sim.occupancy`, :mod:`flashlab.hardware`
and the recorded results under results/ (:mod:`flashlab.lab.results`). Colours are the
Okabe-Ito palette of :mod:`.timeline`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from flashlab import hardware
from flashlab.lab import results
from flashlab.sim.occupancy import schedule
from flashlab.course.figures.timeline import COLOURS

__all__ = ["warp_split", "occupancy_waves", "grid_measured_vs_predicted", "kernel_bench"]

WARP_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7")
IMPLS = {  # impl column -> (label, colour, marker)
    "flashlab": ("flashlab (Triton, FA2 algorithm)", "#0072B2", "o"),
    "flashlab_fa3": ("flashlab FA3 (Gluon, for Hopper)", "#56B4E9", "D"),
    "sdpa_flash": ("torch SDPA flash", "#D55E00", "s"),
    "sdpa_cudnn": ("torch SDPA cuDNN", "#009E73", "^"),
    "naive": ("naive PyTorch (S, P in HBM)", "0.5", "x"),
}


def _matrix(ax, x, y, w, h, label, split=None, n=4, shared=False, fontsize=10):
    """A matrix as a rectangle; ``split`` = "rows" or "cols" colours it by warp."""
    if split is None:
        ax.add_patch(Rectangle((x, y), w, h, fc="0.88" if shared else "white", ec="0.2", lw=1.2))
    for k in range(n if split else 0):
        if split == "rows":
            r = Rectangle((x, y + h - (k + 1) * h / n), w, h / n, fc=WARP_COLOURS[k], alpha=0.55, ec="0.2")
        else:
            r = Rectangle((x + k * w / n, y), w / n, h, fc=WARP_COLOURS[k], alpha=0.55, ec="0.2")
        ax.add_patch(r)
    ax.text(x + w / 2, y + h + 0.1, label, ha="center", va="bottom", fontsize=fontsize)


def _arrow(ax, start, end, colour):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, color=colour, lw=2))


def warp_split(warps: int = 4) -> Figure:
    """Figure 5.2: how the warps of one program divide a tile, drawn for the text column
    (7.5 inches wide, no text under 9 pt).

    (a) split-K (v1's forward): each warp takes a slice of K_j and V_j, all share Q_i; each
    produces a partial O for every row, summed through shared memory with barriers.
    (b) split-Q (v2's forward): each warp takes a slice of the rows of Q_i and owns the same
    rows of O_i; K_j and V_j are shared; no warp needs another's result.
    (c) the backward pass of one key block: each warp owns a slice of the keys, so its rows
    of dK_j and dV_j are its own for the whole loop; dQ_i sums over the keys, so the warps'
    partial dQ_i are combined through shared memory every tile.
    """
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 8.6), layout="constrained")
    for ax in axes:
        ax.set_xlim(0, 10.6)
        ax.set_ylim(-1.25, 3.55)
        ax.axis("off")
    a, b, c = axes
    h = 2.2  # the height of a B_r-row matrix
    # (a) split-K: Q shared, K^T split by columns, V split by rows, partial O summed
    _matrix(a, 0.2, 0.4, 1.1, h, "$Q_i$ (shared)", shared=True)
    _matrix(a, 1.8, 1.5, 2.9, 1.1, "$K_j^T$ split by keys", split="cols", n=warps)
    _matrix(a, 5.1, 0.4, 1.1, h, "$V_j$ split by keys", split="rows", n=warps)
    for k in range(warps):
        a.add_patch(Rectangle((7.0 + 0.16 * k, 0.4 - 0.12 * k), 1.1, h, fc=WARP_COLOURS[k], alpha=0.35, ec="0.2"))
    a.text(7.8, h + 0.5, "partial $O_i$, one per warp", ha="center", va="bottom", fontsize=10)
    a.add_patch(Rectangle((9.4, -1.15), 1.0, 1.2, fc="white", ec="0.2", lw=1.2))
    a.text(9.9, -0.55, "$O_i$", ha="center", va="center", fontsize=10)
    _arrow(a, (8.6, -0.1), (9.4, -0.55), "#D55E00")
    a.text(4.3, -0.75, f"write {warps} partial O, max, sum to shared memory;\nbarrier, read, add, barrier",
           ha="center", va="center", fontsize=9.5, color="#D55E00")
    a.set_title("(a) split-K (FlashAttention v1, forward): warps exchange partial results",
                loc="left", fontsize=10.5)
    # (b) split-Q: Q split by rows, K^T and V shared, O split by rows
    _matrix(b, 0.2, 0.4, 1.1, h, "$Q_i$ split by rows", split="rows", n=warps)
    _matrix(b, 1.8, 1.5, 2.9, 1.1, "$K_j^T$ (shared)", shared=True)
    _matrix(b, 5.1, 0.4, 1.1, h, "$V_j$ (shared)", shared=True)
    _matrix(b, 7.0, 0.4, 1.1, h, "$O_i$ split by rows", split="rows", n=warps)
    for k in range(warps):
        b.text(8.3, 0.4 + h - (k + 0.5) * h / warps, f"warp {k}", va="center", fontsize=9.5,
               color=WARP_COLOURS[k])
    b.text(4.3, -0.75, "each warp finishes its own rows:\nno exchange, no extra barrier",
           ha="center", va="center", fontsize=9.5, color="#009E73")
    b.set_title("(b) split-Q (FlashAttention-2, forward): warps work alone", loc="left", fontsize=10.5)
    # (c) backward of one key block: keys split; dK_j, dV_j private; dQ_i summed
    _matrix(c, 0.2, 0.4, 1.1, h, "$Q_i$, $dO_i$\n(shared)", shared=True)
    _matrix(c, 1.8, 0.4, 2.9, h, "$dS_{ij}$: columns = keys", split="cols", n=warps)
    _matrix(c, 5.3, 0.4, 1.1, h, "$dK_j$, $dV_j$\nsplit by keys", split="rows", n=warps)
    c.text(6.55, 0.4 + h / 2, "each warp's\nown rows,\nkept for the\nwhole loop", va="center",
           fontsize=9.5, color="#009E73")
    c.add_patch(Rectangle((9.4, 0.4), 1.0, h, fc="white", ec="0.2", lw=1.2))
    c.text(9.9, 0.4 + h + 0.1, "$dQ_i$", ha="center", va="bottom", fontsize=10)
    _arrow(c, (4.75, 0.25), (9.4, 0.6), "#D55E00")
    c.text(4.3, -0.7, "$dQ_i$ sums over the keys of every warp: $dS_{ij}$ through shared memory,\n"
           "one barrier per tile; across programs, atomic adds (or a second kernel)",
           ha="center", va="center", fontsize=9.5, color="#D55E00")
    c.set_title("(c) backward of one key block: warps own keys", loc="left", fontsize=10.5)
    fig.suptitle(f"Inside one program: {warps} warps share a tile (colour = warp)", fontsize=11)
    return fig


def occupancy_waves(N: int = 4096, Br: int = 128, max_bh: int = 300) -> Figure:
    """SM utilisation against batch x heads for the v1 grid (one program per head) and
    the v2 grid (one per head and query block), on the A100 (108 SMs) and H200 (132).

    Parameters
    ----------
    N : sequence length; Br : query rows per block (v2 launches ceil(N / Br) per head).
    max_bh : largest batch x heads drawn.
    """
    fig, ax = plt.subplots(figsize=(7.5, 4.6), layout="constrained")
    bh = range(1, max_bh + 1)
    for gpu, style in ((hardware.A100, "-"), (hardware.H200, "--")):
        for part, colour in (("v1", COLOURS[0]), ("v2", COLOURS[1])):
            u = [schedule(part, 1, h, N, Br, gpu.sm_count, 1.0).utilisation for h in bh]
            ax.plot(list(bh), u, style, color=colour, lw=1.6,
                    label=f"{part} grid, {gpu.name.split()[0]} ({gpu.sm_count} SMs)")
    ax.axvline(16, color="0.5", lw=0.8, ls=":")
    ax.text(19, 0.04, "B·H = 16\n(§5.4's example)", fontsize=9, color="0.35")
    ax.set_xlabel("batch × heads (B·H)")
    ax.set_ylabel("SM utilisation (busy SM-time / total)")
    ax.set_ylim(0, 1.05)
    ax.set_xlim(0, max_bh)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=9, loc="lower right")
    ax.set_title(f"Who has work? N = {N}, $B_r$ = {Br}: v2 launches {-(-N // Br)} programs per head;\n"
                 "the saw-teeth are waves (flashlab.sim.occupancy)",
                 fontsize=10, loc="left")
    return fig


def kernel_bench(stem: str = "nvidia-h100-80gb-hbm3/bench",
                 ceilings: tuple[tuple[int, str], ...] = ((64, "nvidia-h100-80gb-hbm3/ceilings_d64"),
                                                          (128, "nvidia-h100-80gb-hbm3/ceilings"))) -> Figure:
    """TFLOP/s against N for flashlab (the teaching kernels and, where recorded, the FA3 kernels
    for Hopper), SDPA flash, SDPA cuDNN and naive attention, from one recorded bench: panels
    d in {64, 128} x {forward, forward+backward}; solid lines non-causal, dashed causal; each
    head dimension's bf16 matmul rate, measured in the call that timed it (``ceilings``: d ->
    record), as a grey line."""
    rec = results.load(stem)
    rate = {d: results.load(c).where(ceiling="matmul_bf16_8192")[0]["value"] / 1e12 for d, c in ceilings}
    fig, axes = plt.subplots(2, 2, figsize=(7.5, 7.2), sharex=True, sharey=True, layout="constrained")
    for row, d in enumerate((64, 128)):
        for col, (pass_, title) in enumerate((("fwd", "forward"), ("fwdbwd", "forward + backward"))):
            ax = axes[row, col]
            ax.axhline(rate[d], color="0.4", lw=1)
            ax.text(rec.rows[0]["N"], rate[d] + 12, f"bf16 matmul {rate[d]:.0f}", fontsize=9, color="0.3")
            for impl, (label, colour, marker) in IMPLS.items():
                for causal, ls in ((False, "-"), (True, "--")):
                    pts = sorted((r["N"], r["tflops"]) for r in rec.where(impl=impl, d=d, causal=causal, **{"pass": pass_}))
                    if pts:
                        ax.plot(*zip(*pts), ls, color=colour, marker=marker, ms=4, lw=1.4,
                                label=label if causal is False else None)
            ax.set_xscale("log", base=2)
            ax.set_title(f"d = {d}, {title}", fontsize=10, loc="left")
            ax.set_ylim(0, max(rate.values()) * 1.12)
            ax.spines[["top", "right"]].set_visible(False)
            if row == 1:
                ax.set_xlabel("sequence length N")
            if col == 0:
                ax.set_ylabel("TFLOP/s (bf16)")
    gpu = rec.meta["gpu"].removeprefix("NVIDIA ").split()[0]
    fig.legend(*axes[1, 1].get_legend_handles_labels(), loc="outside upper center", ncols=2, fontsize=9,
               title=f"Attention on the {gpu} (solid: non-causal, dashed: causal)",
               title_fontsize=10)
    fig.get_layout_engine().set(h_pad=0.08)
    folder = stem.rpartition("/")[0]
    beside = all(c.rpartition("/")[0] == folder for _, c in ceilings)  # name the ceilings briefly
    sources = ", ".join(f"d = {d}: " + (c.rpartition("/")[2] if beside else f"results/{c}") for d, c in ceilings)
    fig.supxlabel(rec.short.replace("; results/", ";\nresults/") + f"; matmul: {sources}",
                  fontsize=9, color="0.35")
    return fig


def grid_measured_vs_predicted(stem: str = "grid_h200", d: int = 128, N: int = 4096, max_bh: int = 300) -> Figure:
    """The v1 grid (one program per batch x head) against the v2 grid (one per query block),
    measured on the H200 with the same kernel and block configuration, beside
    :func:`flashlab.sim.occupancy.schedule`'s prediction.

    The model's one free number, the time of one tile on one SM, is calibrated on a single
    measured v2 run (B = 1, H = 16, N = 16384, non-causal, head dimension ``d``); every
    other prediction follows from it. Top: run time against B x H at sequence length ``N``;
    bottom: the v1 / v2 time ratio. Left non-causal, right causal.
    """
    rec = results.load(stem)
    cal = rec.where(grid="v2", B=1, H=16, N=16384, d=d, causal=False)[0]
    block_m, block_n, sms = cal["BLOCK_M"], cal["BLOCK_N"], cal["sms"]

    def predict(part: str, bh: int, n: int, causal: bool, tile_time: float = 1.0) -> float:
        return schedule(part, 1, bh, n, block_m, sms, tile_time, Bc=block_n, causal=causal).time_s

    tile_ms = cal["ms"] / predict("v2", 16, 16384, False)  # ms per tile per SM
    bh = list(range(1, max_bh + 1))
    fig, axes = plt.subplots(2, 2, figsize=(7.5, 7.4), sharex=True, layout="constrained")
    for col, causal in enumerate((False, True)):
        model = {part: [predict(part, h, N, causal, tile_ms) for h in bh] for part in ("v1", "v2")}
        meas = {part: sorted((r["B"] * r["H"], r["ms"]) for r in rec.where(grid=part, d=d, N=N, causal=causal))
                for part in ("v1", "v2")}
        top, bottom = axes[0, col], axes[1, col]
        for part, colour, marker in (("v1", COLOURS[0], "o"), ("v2", COLOURS[1], "s")):
            top.plot(bh, model[part], "-", color=colour, lw=1.3, label=f"{part} grid, model")
            top.plot(*zip(*meas[part]), marker, color=colour, ms=7, mfc="white", mew=1.8,
                     label=f"{part} grid, measured")
        top.set_yscale("log")
        top.set_title(f"{'causal' if causal else 'non-causal'}, d = {d}, N = {N}",
                      loc="left", fontsize=10)
        top.set_ylabel("forward time (ms)")
        bottom.plot(bh, [a / b for a, b in zip(model["v1"], model["v2"])], "-", color="0.2", lw=1.3,
                    label=f"model, N = {N}")
        ratio = [(h1, t1 / t2) for (h1, t1), (_, t2) in zip(meas["v1"], meas["v2"])]
        bottom.plot(*zip(*ratio), "o", color=COLOURS[0], ms=7, mfc="white", mew=1.8,
                    label=f"measured, N = {N}")
        long = {r["grid"]: r["ms"] for r in rec.where(B=1, H=16, N=16384, d=d, causal=causal)}
        bottom.plot(16, long["v1"] / long["v2"], "D", color=COLOURS[2], ms=7, mfc="white", mew=1.8,
                    label="measured, N = 16384")
        bottom.set_yscale("log")
        bottom.set_yticks([1, 1.25, 2, 4, 8], labels=["1", "1.25", "2", "4", "8"])
        bottom.minorticks_off()
        bottom.set_ylim(0.8, 12)
        bottom.set_title("how many times slower v1 is", loc="left", fontsize=10)
        bottom.set_ylabel("v1 time / v2 time")
        bottom.set_xlabel("B·H = programs of the v1 grid")
        for ax in (top, bottom):
            ax.axvline(sms, color="0.5", lw=0.8, ls=":")
            ax.spines[["top", "right"]].set_visible(False)
            ax.set_xlim(0, max_bh)
        bottom.text(sms + 4, 9, f"{sms} SMs", fontsize=9, color="0.35")
    top.legend(*axes[0, 0].get_legend_handles_labels(), fontsize=9, loc="lower right")
    fig.legend(*axes[1, 0].get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=9)
    fig.suptitle("One program per head (v1 grid) or per query block (v2 grid) on the H200:\n"
                 "the model (tile time from one v2 run, B·H = 16, N = 16384) against the measurements",
                 fontsize=10.5)
    return fig
