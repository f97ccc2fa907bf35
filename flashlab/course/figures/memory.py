"""Chapter 1's figures: the memory hierarchy (Figure 1.1), the H200 roofline with naive
attention on it (Figure 1.2), where naive attention's time goes (Figure 1.3) and the
recorded naive-versus-fused benchmark (Figure 1.4).

``memory_pyramid`` draws the GPU's storage levels, from the registers beside the
arithmetic units down to the host CPU's DRAM, each with its bandwidth and its capacity
as bars on log scales: the A100 (the host level as the FlashAttention paper draws it,
Fig. 1, left) and the H200, from :mod:`flashlab.hardware`.

``roofline`` draws attainable FLOP/s against arithmetic intensity (FLOP per byte of
HBM traffic) for the H200, twice: the datasheet's roof and the roof *measured* on
an NVIDIA H200 (``results/ceilings_h200``). On it sit the three steps of naive
attention and the fused kernels, as measured in ``results/naive_steps_h200`` and
``results/naive_vs_fused_h200``.

``naive_step_shares`` sets each step's share of the FLOPs against its share of the time
(``results/naive_steps_h200``): the softmax does 1-2 % of the arithmetic and takes most
of the time.

``naive_vs_fused_h200`` plots the achieved TFLOP/s of naive attention, SDPA flash
and SDPA cuDNN against N (``results/naive_vs_fused_h200``), one panel per head
dimension and pass, under the measured matmul ceiling.

Intensities are those of the *fewest* bytes each operation must move: every input
read once from HBM, every output written once. A kernel that moves more than that
(as FlashAttention does, re-reading K and V for each block of Q; chapter 4 counts
it) really sits further left.

Every figure is COLUMN_IN inches wide, the width of the site's text column (about
750 px), so a font size in points is the size the reader sees; no text is under 9 pt.

Glossary: roofline (屋顶线模型); arithmetic intensity (算术强度); ridge point (屋脊点);
memory-bound (访存受限); compute-bound (计算受限); register (寄存器).
Colours are the Okabe-Ito palette, which stays distinguishable under the common
forms of colour blindness.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from flashlab import hardware
from flashlab.lab.results import load

__all__ = ["Level", "pyramid_levels", "memory_pyramid", "roofline", "naive_step_shares",
           "naive_vs_fused_h200", "HOST", "COLUMN_IN"]

# Okabe & Ito (2008): blue, sky blue, bluish green, orange, vermilion, reddish purple, yellow
_BLUE, _SKY, _GREEN, _ORANGE, _VERMILION, _PURPLE, _YELLOW = (
    "#0072B2", "#56B4E9", "#009E73", "#E69F00", "#D55E00", "#CC79A7", "#F0E442")
_INK = "#222222"
COLUMN_IN = 7.5  # inches: the text column of the site (about 750 px), so points are points

# The host level is not part of the GPU, so it is not in flashlab.hardware:
# (bandwidth in bytes/s, capacity in bytes or None, label of the capacity, source)
HOST: dict[str, tuple[float, float | None, str, str]] = {
    "A100": (12.8e9, 1e12, "> 1 TB",
             "FlashAttention paper (Dao et al., 2022), Fig. 1 (left): CPU DRAM 12.8 GB/s, > 1 TB"),
    "H200 SXM": (128e9, None, "the server's\n(not the GPU's)",
                 "NVIDIA H200 datasheet: PCIe Gen5 128 GB/s (both directions together)"),
}


@dataclass(frozen=True)
class Level:
    """One level of the memory hierarchy: capacity (bytes) and bandwidth (bytes/s).

    ``None`` means the number is not published (the registers' bandwidth, the H200's L2
    bandwidth) or belongs to the host machine rather than the GPU (host DRAM's size)."""

    name: str
    capacity: float | None
    bandwidth: float | None
    capacity_label: str
    source: str


def _size(x: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if x >= scale:
            return f"{x / scale:.0f} {unit}" if x >= 10 * scale else f"{x / scale:.1f} {unit}"
    return f"{x:.0f} B"


def _rate(x: float) -> str:
    return f"{x / 1e12:.3g} TB/s" if x >= 1e12 else f"{x / 1e9:.3g} GB/s"


def pyramid_levels(gpu: hardware.GPU) -> list[Level]:
    """The levels of ``gpu``'s memory hierarchy, fastest first: registers, SRAM, the L2
    cache (where its size is published), HBM and host DRAM. Registers and SRAM count
    every SM together (SMs x the size per SM)."""
    host_bw, host_cap, host_label, host_src = HOST.get(gpu.name, (None, None, "", ""))
    levels = []
    if gpu.register_file_per_sm:
        levels.append(Level("registers", gpu.register_total, None, _size(gpu.register_total),
                            gpu.source("register_file_per_sm")))
    levels.append(Level("SRAM (L1 + shared memory)", gpu.sram_total, gpu.sram_bandwidth,
                        _size(gpu.sram_total),
                        "; ".join(gpu.source(a) for a in ("sram_per_sm", "smem_max_per_sm",
                                                          "sram_bandwidth"))))
    if gpu.l2_cache:
        levels.append(Level("L2 cache", gpu.l2_cache, gpu.l2_bandwidth or None,
                            _size(gpu.l2_cache),
                            gpu.source("l2_cache") + "; " + gpu.source("l2_bandwidth")))
    levels.append(Level("HBM (GPU memory)", gpu.hbm_capacity, gpu.hbm_bandwidth,
                        _size(gpu.hbm_capacity),
                        gpu.source("hbm_capacity") + "; " + gpu.source("hbm_bandwidth")))
    if host_bw is not None:
        levels.append(Level("host DRAM (CPU)", host_cap, host_bw, host_label, host_src))
    return levels


_GPU_COLOURS = (_SKY, _BLUE)


def memory_pyramid(gpus: tuple[str, ...] = ("A100", "H200")) -> Figure:
    """The GPU memory hierarchy, fastest level at the top: each level's bandwidth (bars to
    the left) and capacity (bars to the right), both on log scales, one bar per GPU.

    The bars' lengths are the numbers, so the drawing and its labels cannot disagree:
    the register files of all SMs together hold a little *more* than their SRAM, and the
    register bar is the longer one. The A100's host level is the FlashAttention paper's
    Fig. 1 (left); everything else comes from :mod:`flashlab.hardware`.

    Parameters
    ----------
    gpus : two names understood by :func:`flashlab.hardware.get`, drawn as the upper and
        the lower bar of each level.
    """
    chips = [hardware.get(name) for name in gpus]
    per_gpu = [pyramid_levels(gpu) for gpu in chips]
    names = [lv.name for lv in per_gpu[0]]
    fig = plt.figure(figsize=(COLUMN_IN, 4.6), layout="constrained")
    grid = fig.add_gridspec(1, 3, width_ratios=[1.0, 0.5, 1.0])
    ax_bw, ax_mid, ax_cap = (fig.add_subplot(grid[0, i]) for i in range(3))
    bw_lim, cap_lim = (3e14, 4e9), (4e6, 8e13)
    height = 0.36
    for k, (gpu, levels) in enumerate(zip(chips, per_gpu)):
        colour = _GPU_COLOURS[k % 2]
        by_name = {lv.name: lv for lv in levels}
        for y, name in enumerate(names):
            yk = y + (k - 0.5) * (height + 0.04)
            lv = by_name.get(name)
            bw = lv.bandwidth if lv else None
            cap = lv.capacity if lv else None
            if bw:
                ax_bw.barh(yk, bw - bw_lim[1], left=bw_lim[1], height=height, color=colour)
                ax_bw.text(bw * 1.3, yk, _rate(bw), ha="right", va="center", fontsize=9)
            else:
                ax_bw.text(bw_lim[1] * 1.3, yk, "not published", ha="right", va="center",
                           fontsize=9, color="0.4", fontstyle="italic")
            if cap:
                ax_cap.barh(yk, cap - cap_lim[0], left=cap_lim[0], height=height, color=colour,
                            label=gpu.name if y == 0 else None)
                ax_cap.text(cap * 1.3, yk, lv.capacity_label, ha="left", va="center", fontsize=9)
            else:
                label = lv.capacity_label.replace("\n", " ") if lv else "not published"
                ax_cap.text(cap_lim[0] * 1.3, yk, label, ha="left", va="center", fontsize=9,
                            color="0.4", fontstyle="italic")
    for y, name in enumerate(names):
        ax_mid.text(0.5, y, name.replace(" (", "\n("), ha="center", va="center", fontsize=9.5,
                    fontweight="bold", color=_INK)
    for ax, lim, title in ((ax_bw, bw_lim, "bandwidth (log scale)"),
                           (ax_cap, cap_lim, "capacity (log scale)"), (ax_mid, None, "")):
        ax.set_ylim(len(names) - 0.45, -0.55)
        if lim is None:
            ax.axis("off")
            continue
        ax.set_xscale("log")
        ax.set_xlim(*lim)
        ax.set_yticks([])
        ax.set_title(title, fontsize=10)
        ax.spines[["top", "left", "right"]].set_visible(False)
    ax_bw.set_xticks([1e10, 1e12, 1e14], ["10 GB/s", "1 TB/s", "100 TB/s"], fontsize=9)
    ax_cap.set_xticks([1e7, 1e9, 1e11, 1e13], ["10 MB", "1 GB", "100 GB", "10 TB"], fontsize=9)
    ax_bw.minorticks_off()
    ax_cap.minorticks_off()
    ax_bw.legend(*ax_cap.get_legend_handles_labels(), loc="lower left", fontsize=9, frameon=False)
    fig.suptitle("The memory hierarchy, fastest level at the top; a bar's length is its number",
                 fontsize=10.5)
    fig.supxlabel("registers and SRAM: all SMs together; host: FlashAttention Fig. 1 (A100) "
                  "and the H200 datasheet's PCIe link;\nthe rest: flashlab.hardware (datasheets, "
                  "whitepapers)", fontsize=9, color="0.35")
    return fig


# ------------------------------------------------------------------------ roofline

_STEP_STYLE = {  # step -> (colour, marker, short label)
    "S = QK^T": (_BLUE, "o", r"$S = QK^\top$"),
    "P = softmax(S)": (_VERMILION, "s", r"$P = \mathrm{softmax}(S)$"),
    "O = PV": (_GREEN, "D", r"$O = PV$"),
}


def _measured_ceilings(stem: str = "ceilings_h200") -> tuple[float, float]:
    rec = load(stem)
    return rec.column("value", ceiling="matmul_bf16_8192")[0], rec.column("value", ceiling="copy_4GiB")[0]


def roofline(n: int = 4096, ds: tuple[int, ...] = (64, 128), show_fused: bool = True) -> Figure:
    """Log-log roofline of the H200 with naive attention's three steps placed on it.

    Parameters
    ----------
    n : sequence length of the recorded rows to place (one of 512 ... 16384).
    ds : head dimensions to place; the first is drawn with filled markers, the
        second with hollow ones.
    show_fused : also place the whole naive forward pass and torch SDPA's flash and
        cuDNN kernels (``results/naive_vs_fused_h200``) at the intensity of the
        fewest bytes they must move.
    """
    gpu = hardware.H200
    peak_mm, peak_bw = _measured_ceilings()
    steps = load("naive_steps_h200")
    fig, ax = plt.subplots(figsize=(COLUMN_IN, 5.6), layout="constrained")
    x = np.logspace(-0.5, 4, 400)  # FLOP/byte
    ax.loglog(x, gpu.attainable_flops(x) / 1e12, color=_INK, lw=2.2,
              label=f"datasheet: {gpu.peak_flops() / 1e12:.0f} TFLOP/s bf16, "
                    f"{gpu.hbm_bandwidth / 1e12:.1f} TB/s")
    ax.loglog(x, hardware.roofline(x, peak_mm, peak_bw) / 1e12, color=_INK, lw=1.6, ls="--",
              label=f"measured: {peak_mm / 1e12:.0f} TFLOP/s (8192³ matmul),\n"
                    f"{peak_bw / 1e12:.2f} TB/s (copy); results/ceilings_h200")
    for ridge, ls in ((gpu.ridge_point(), "-"), (peak_mm / peak_bw, "--")):
        ax.axvline(ridge, color="0.6", lw=0.9, ls=ls, zorder=0)
    ax.text(gpu.ridge_point() * 1.06, 1.0, f"ridge {gpu.ridge_point():.0f}", fontsize=9, color="0.4",
            rotation=90)
    ax.text(peak_mm / peak_bw / 1.06, 1.0, f"ridge {peak_mm / peak_bw:.0f}", fontsize=9, color="0.4",
            rotation=90, ha="right")

    kinds = []  # (colour, marker, label) for the legend, one entry per kind of point
    for k, d in enumerate(ds):
        for step, (colour, marker, label) in _STEP_STYLE.items():
            (row,) = steps.where(step=step, N=n, d=d)
            ax.scatter(row["intensity"], row["tflops"], s=70, marker=marker, zorder=4, lw=1.6,
                       facecolor=colour if k == 0 else "white", edgecolor=colour)
            kinds += [(colour, marker, label)] if k == 0 else []
    if show_fused:
        fused = load("naive_vs_fused_h200")
        styles = {"naive": (_INK, "*", "naive, whole forward"), "flash": (_PURPLE, "^", "SDPA flash"),
                  "cudnn": (_ORANGE, "v", "SDPA cuDNN")}
        for k, d in enumerate(ds):
            for backend, (colour, marker, label) in styles.items():
                (row,) = fused.where(backend=backend, N=n, d=d, **{"pass": "fwd"})
                flops = 4.0 * n * n * d  # per head: two matmuls of 2 N^2 d
                elements = 4 * n * d + (4 * n * n if backend == "naive" else 0)  # Q,K,V,O (+ S, P twice)
                ax.scatter(flops / (2 * elements), row["tflops"], s=130 if marker == "*" else 70, marker=marker,
                           zorder=4, lw=1.6, facecolor=colour if k == 0 else "white", edgecolor=colour)
                kinds += [(colour, marker, label)] if k == 0 else []
    handles = [ax.scatter([], [], s=60, marker=m, facecolor=c, edgecolor=c, label=lab) for c, m, lab in kinds]
    handles += [ax.scatter([], [], s=60, marker="o", facecolor="0.3", edgecolor="0.3", label=f"filled: d = {ds[0]}")]
    if len(ds) > 1:
        handles += [ax.scatter([], [], s=60, marker="o", facecolor="white", edgecolor="0.3",
                               label=f"hollow: d = {ds[1]}")]
    roofs = ax.get_lines()[:2]
    first = ax.legend(handles=roofs, fontsize=9, loc="upper left", frameon=False, title="roofs",
                      title_fontsize=9)
    ax.add_artist(first)
    ax.legend(handles=handles, fontsize=9, loc="lower right", frameon=True, framealpha=0.95,
              title="measured on an NVIDIA H200", title_fontsize=9)

    (soft,) = steps.where(step="P = softmax(S)", N=n, d=ds[0])
    ax.annotate(f"softmax: {soft['intensity']:.2f} FLOP/B,\n{soft['tflops']:.1f} TFLOP/s, "
                f"{peak_mm / 1e12 / soft['tflops']:.0f}x below\nthe measured matmul ceiling",
                xy=(soft["intensity"], soft["tflops"]), xytext=(soft["intensity"] * 2.0, soft["tflops"] * 0.3),
                fontsize=9, color=_VERMILION, va="center",
                arrowprops=dict(arrowstyle="->", color=_VERMILION, shrinkB=6))
    (mm,) = steps.where(step="S = QK^T", N=n, d=ds[0])
    ax.annotate("naive matmuls: intensity ≈ d,\nleft of the ridge: their\nN×N output is large",
                xy=(mm["intensity"], mm["tflops"]),
                xytext=(mm["intensity"] / 14, mm["tflops"] / 25), fontsize=9, color=_BLUE, va="center",
                arrowprops=dict(arrowstyle="->", color=_BLUE, shrinkB=6))
    if show_fused:
        ax.text(n / 2, 150, f"fused: Q, K, V read\nonce, O written once:\nN/2 = {n // 2} FLOP/B",
                fontsize=9, color=_PURPLE, ha="center", va="top")
    ax.text(5, 2.2, "memory-bound:\ntime = bytes / bandwidth", fontsize=9, color="0.4")
    ax.text(1500, 1.2 * gpu.peak_flops() / 1e12, "compute-bound:\ntime = FLOPs / peak", fontsize=9,
            color="0.4", ha="center", va="bottom")
    ax.set_xlim(x[0], x[-1])
    ax.set_ylim(0.3, 3000)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved to or from HBM)", fontsize=10)
    ax.set_ylabel("attainable (lines) or achieved (points) TFLOP/s", fontsize=10)
    ax.tick_params(labelsize=9)
    ax.set_title(f"H200 roofline, bf16, naive attention at N = {n}\n"
                 "(results/naive_steps_h200, results/naive_vs_fused_h200)", fontsize=10, loc="left")
    ax.grid(True, which="major", color="0.9", lw=0.8)
    ax.spines[["top", "right"]].set_visible(False)
    return fig


# ------------------------------------------------------- where the time goes

_STEP_COLOURS = {step: colour for step, (colour, _, _) in _STEP_STYLE.items()}
_STEP_LABELS = {"S = QK^T": "S = QKᵀ", "P = softmax(S)": "softmax", "O = PV": "O = PV"}


def step_shares(stem: str = "naive_steps_h200") -> dict[tuple[int, int], dict[str, tuple[float, float]]]:
    """Each naive step's share of the FLOPs and of the time, from ``results/STEM``.

    Returns ``{(N, d): {step: (FLOP share, time share)}}``, the shares of the three steps
    timed one at a time (``flashlab.lab.bench.naive_step_costs``): S = QK^T, the softmax
    and O = PV. Each pair sums to 1 over the steps of one (N, d)."""
    rows = load(stem).rows
    shares: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}
    for key in sorted({(r["N"], r["d"]) for r in rows}):
        mine = [r for r in rows if (r["N"], r["d"]) == key]
        flops, ms = sum(r["flops"] for r in mine), sum(r["ms"] for r in mine)
        shares[key] = {r["step"]: (r["flops"] / flops, r["ms"] / ms) for r in mine}
    return shares


def naive_step_shares(n: int = 4096, stem: str = "naive_steps_h200") -> Figure:
    """Where naive attention's time goes: (a) each step's share of the FLOPs against its
    share of the time at sequence length ``n``, for d = 64 and 128; (b) the softmax's
    share of the time against N, beside its (constant) share of the FLOPs.

    Data: ``results/STEM`` (the three steps timed one at a time on an NVIDIA H200, bf16,
    batch x N = 16384 tokens, 2048/d heads); the FLOPs are the benchmark's counts
    (2 N^2 d per matmul, 5 N^2 for the softmax)."""
    shares = step_shares(stem)
    ds = sorted({d for _, d in shares})
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(COLUMN_IN, 3.9), layout="constrained",
                                 gridspec_kw={"width_ratios": [1.25, 1.0]})
    bars = [(d, what) for d in ds for what in ("FLOPs", "time")]
    for y, (d, what) in enumerate(bars):
        left = 0.0
        for step, (f, t) in shares[(n, d)].items():
            w = f if what == "FLOPs" else t
            ax.barh(y, w, left=left, height=0.7, color=_STEP_COLOURS[step], edgecolor="white",
                    label=_STEP_LABELS[step] if y == 0 else None)
            if w >= 0.1:
                ax.text(left + w / 2, y, f"{w:.0%}", ha="center", va="center", fontsize=9,
                        color="white", fontweight="bold")
            left += w
    ax.set_yticks(range(len(bars)), [f"d = {d}: {what}" for d, what in bars], fontsize=9)
    ax.set_ylim(len(bars) - 0.5, -0.5)
    ax.set_xlim(0, 1)
    ax.set_xticks([0, 0.5, 1], ["0", "50 %", "100 %"], fontsize=9)
    ax.set_title(f"(a) shares at N = {n:,}", fontsize=10, loc="left")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize=9,
              frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    soft = "P = softmax(S)"
    sizes = sorted({m for m, _ in shares})
    for d, marker in zip(ds, "os"):
        ns = sorted(m for m, dd in shares if dd == d)
        colour = _VERMILION if d == ds[0] else _PURPLE
        bx.plot(ns, [100 * shares[(m, d)][soft][1] for m in ns], marker=marker, color=colour,
                label=f"time, d = {d}")
        bx.plot(ns, [100 * shares[(m, d)][soft][0] for m in ns], ls="--", color=colour,
                label=f"FLOPs, d = {d}")
    bx.set_xscale("log", base=2)
    bx.set_xticks(sizes, [f"{m // 1024}k" if m >= 1024 else str(m) for m in sizes], fontsize=9)
    bx.set_ylim(0, 100)
    bx.set_yticks([0, 25, 50, 75, 100], ["0", "25 %", "50 %", "75 %", "100 %"], fontsize=9)
    bx.set_xlabel("sequence length N", fontsize=9)
    bx.set_title("(b) the softmax's share", fontsize=10, loc="left")
    flop_shares = ", ".join(f"{shares[(n, d)][soft][0]:.1%}" for d in ds)
    bx.text(sizes[0], 5, f"FLOP shares: {flop_shares}", fontsize=9, color="0.3", va="bottom")
    bx.legend(fontsize=9, loc="lower right", bbox_to_anchor=(1.0, 0.12), frameon=False)
    bx.grid(True, color="0.9", lw=0.8)
    bx.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Naive attention, step by step: the softmax does 1-2 % of the arithmetic "
                 "and takes most of the time", fontsize=10)
    fig.supxlabel(f"results/{stem}: measured on an NVIDIA H200, bf16, each step timed on its "
                  "own", fontsize=9, color="0.35")
    return fig


# ------------------------------------------------------------- naive against fused

_BACKEND_COLOURS = {"naive": _INK, "flash": _PURPLE, "cudnn": _ORANGE}


def naive_vs_fused_h200(stem: str = "naive_vs_fused_h200") -> Figure:
    """Achieved TFLOP/s against N for naive attention, SDPA flash and SDPA cuDNN, as
    recorded in ``results/STEM``: four panels (d = 64 and 128; forward, and forward +
    backward), each with the measured bf16 matmul ceiling as a dashed line.

    The FLOP count is the benchmark's: 4 x batch x heads x N^2 x d for the forward
    pass, 3.5 times that for forward + backward (batch x N = 16384 tokens, 2048/d heads).
    """
    runs = load(stem)
    peak_mm, _ = _measured_ceilings()
    sizes = sorted(set(runs.column("N")))
    fig, axes = plt.subplots(2, 2, figsize=(COLUMN_IN, 5.6), sharex=True, sharey=True,
                             layout="constrained")
    for ax, (d, pas) in zip(axes.flat, [(64, "fwd"), (64, "fwdbwd"), (128, "fwd"), (128, "fwdbwd")]):
        for backend, colour in _BACKEND_COLOURS.items():
            sel = dict(backend=backend, d=d, **{"pass": pas})
            ax.plot(runs.column("N", **sel), runs.column("tflops", **sel), "o-", color=colour, label=backend)
        ax.axhline(peak_mm / 1e12, color="0.5", ls="--", lw=1, label="measured matmul ceiling")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [f"{n // 1024}k" if n >= 1024 else str(n) for n in sizes])
        ax.tick_params(labelsize=9)
        ax.set_title(f"d = {d}, {'forward' if pas == 'fwd' else 'forward + backward'}", fontsize=10)
    axes[0, 0].set_ylim(0, 760)
    for ax in axes[:, 0]:
        ax.set_ylabel("TFLOP/s", fontsize=10)
    for ax in axes[1]:
        ax.set_xlabel("sequence length N", fontsize=10)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside upper center", ncol=4,
               fontsize=9, frameon=False)
    fig.supxlabel(f"results/{stem}: measured on an NVIDIA H200, bf16", fontsize=9, color="0.35")
    return fig
