"""Chapter 1's figures: the memory pyramid (Figure 1.1), the H200 roofline with naive
attention on it (Figure 1.2), and the recorded naive-versus-fused benchmark (Figure 1.3).

``memory_pyramid`` draws the GPU's storage levels, from the registers beside the
arithmetic units down to the host CPU's DRAM, each with its capacity and its
bandwidth: the A100 as the FlashAttention paper draws it (Fig. 1, left) and the
H200 from :mod:`flashlab.hardware`. Every level gets faster as it gets smaller.

``roofline`` draws attainable FLOP/s against arithmetic intensity (FLOP per byte of
HBM traffic) for the H200, twice: the datasheet's roof and the roof *measured* on
an NVIDIA H200 (``results/ceilings_h200``). On it sit the three steps of naive
attention and the fused kernels, as measured in ``results/naive_steps_h200`` and
``results/naive_vs_fused_h200``.

``naive_vs_fused_h200`` plots the achieved TFLOP/s of naive attention, SDPA flash
and SDPA cuDNN against N (``results/naive_vs_fused_h200``), one panel per head
dimension and pass, under the measured matmul ceiling.

Intensities are those of the *fewest* bytes each operation must move: every input
read once from HBM, every output written once. A kernel that moves more than that
(as FlashAttention does, re-reading K and V for each block of Q; chapter 4 counts
it) really sits further left.

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
from matplotlib.patches import Polygon

from flashlab import hardware
from flashlab.lab.results import load

__all__ = ["Level", "pyramid_levels", "memory_pyramid", "roofline", "naive_vs_fused_h200", "HOST"]

# Okabe & Ito (2008): blue, sky blue, bluish green, orange, vermilion, reddish purple, yellow
_BLUE, _SKY, _GREEN, _ORANGE, _VERMILION, _PURPLE, _YELLOW = (
    "#0072B2", "#56B4E9", "#009E73", "#E69F00", "#D55E00", "#CC79A7", "#F0E442")
_INK = "#222222"
_LEVEL_FILL = {"registers": _VERMILION, "SRAM": _ORANGE, "HBM": _SKY, "CPU": "#BBBBBB"}

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
    """One level of the memory pyramid: capacity (bytes) and bandwidth (bytes/s).

    ``None`` means the number is not published (registers' bandwidth) or belongs to
    the host machine rather than the GPU (host DRAM's size)."""

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


def _per_sm(per_sm: int, gpu: hardware.GPU, note: str = "") -> str:
    return f"{_size(per_sm * gpu.sm_count)}\n({per_sm // 1024} KB x {gpu.sm_count} SMs){note}"


def pyramid_levels(gpu: hardware.GPU) -> list[Level]:
    """The levels of ``gpu``'s memory pyramid, fastest first: registers, SRAM, HBM, host DRAM."""
    host_bw, host_cap, host_label, host_src = HOST.get(gpu.name, (None, None, "", ""))
    levels = []
    if gpu.register_file_per_sm:
        levels.append(Level("registers", gpu.register_total, None, _per_sm(gpu.register_file_per_sm, gpu),
                            gpu.source("register_file_per_sm")))
    levels += [
        Level("SRAM (L1 + shared memory)", gpu.sram_total, gpu.sram_bandwidth,
              _per_sm(gpu.sram_per_sm, gpu, f"\n≤ {gpu.smem_max_per_sm // 1024} KB/SM as shared"),
              gpu.source("sram_per_sm") + "; " + gpu.source("smem_max_per_sm") + "; " + gpu.source("sram_bandwidth")),
        Level("HBM (GPU memory)", gpu.hbm_capacity, gpu.hbm_bandwidth, _size(gpu.hbm_capacity),
              gpu.source("hbm_capacity") + "; " + gpu.source("hbm_bandwidth")),
    ]
    if host_bw is not None:
        levels.append(Level("CPU DRAM (host)", host_cap, host_bw, host_label, host_src))
    return levels


def _draw_pyramid(ax, gpu: hardware.GPU, title: str) -> None:
    levels = pyramid_levels(gpu)
    n = len(levels)
    height, gap = 1.0, 0.12
    apex, slope = n + 0.55, 1.05  # half-width = slope * (apex - y): one triangle cut into bands
    for i, level in enumerate(levels):
        top = n - i * (height + gap)
        bottom = top - height
        w_top, w_bottom = slope * (apex - top), slope * (apex - bottom)
        ax.add_patch(Polygon([(-w_bottom, bottom), (w_bottom, bottom), (w_top, top), (-w_top, top)],
                             closed=True, fc=_LEVEL_FILL[level.name.split()[0]], ec="white", lw=1.5, alpha=0.9))
        mid = (top + bottom) / 2
        ax.text(0, mid - (0.08 if i == 0 else 0), level.name, ha="center", va="center", fontsize=10,
                fontweight="bold", color=_INK)
        bw = "not published" if level.bandwidth is None else _rate(level.bandwidth)
        ax.text(-4.3, mid, bw, ha="center", va="center", fontsize=10, color=_INK)
        ax.text(4.3, mid, level.capacity_label, ha="center", va="center", fontsize=10, color=_INK)
    ax.text(-4.3, n + 0.25, "bandwidth", ha="center", va="bottom", fontsize=10, fontstyle="italic", color="0.35")
    ax.text(4.3, n + 0.25, "capacity", ha="center", va="bottom", fontsize=10, fontstyle="italic", color="0.35")
    low = n - (n - 1) * (height + gap) - height
    ax.annotate("", xy=(-5.6, n), xytext=(-5.6, low), arrowprops=dict(arrowstyle="->", color="0.45", lw=1.3))
    ax.text(-5.8, (n + low) / 2, "faster", rotation=90, ha="center", va="center", fontsize=9, color="0.45")
    sram = next(lv for lv in levels if lv.name.startswith("SRAM"))
    hbm = next(lv for lv in levels if lv.name.startswith("HBM"))
    ax.text(0, low - 0.3,
            f"SRAM against HBM: {sram.bandwidth / hbm.bandwidth:.0f}x the bandwidth, "
            f"1/{hbm.capacity / sram.capacity:,.0f} of the capacity",
            ha="center", va="top", fontsize=9.5, color=_INK)
    ax.set_title(title, fontsize=11, loc="center")
    ax.set_xlim(-6.1, 6.1)
    ax.set_ylim(low - 0.9, n + 0.7)
    ax.axis("off")


def memory_pyramid(gpus: tuple[str, ...] = ("A100", "H200")) -> Figure:
    """The GPU memory hierarchy as a pyramid, one panel per GPU.

    Parameters
    ----------
    gpus : names understood by :func:`flashlab.hardware.get`. The A100 panel is the
        FlashAttention paper's Fig. 1 (left) (its SRAM and HBM read from
        :mod:`flashlab.hardware`, which quotes the paper), with the register file
        added from the A100 whitepaper.
    """
    fig = plt.figure(figsize=(6.2 * len(gpus), 5.0), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(gpus)))
    for ax, name in zip(axes, gpus):
        gpu = hardware.get(name)
        where = ("as in the FlashAttention paper, Fig. 1 (left)" if gpu.name == "A100"
                 else "from flashlab.hardware (datasheet, whitepaper)")
        _draw_pyramid(ax, gpu, f"{gpu.name} ({gpu.year}), {where}")
    fig.suptitle("The GPU memory pyramid: faster towards the top, and the on-chip levels are "
                 "thousands of times smaller than HBM", fontsize=12.5)
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
    fig, ax = plt.subplots(figsize=(10, 6.4), layout="constrained")
    x = np.logspace(-0.5, 4, 400)  # FLOP/byte
    ax.loglog(x, gpu.attainable_flops(x) / 1e12, color=_INK, lw=2.2,
              label=f"datasheet roof: {gpu.peak_flops() / 1e12:.0f} TFLOP/s bf16, {gpu.hbm_bandwidth / 1e12:.1f} TB/s")
    ax.loglog(x, hardware.roofline(x, peak_mm, peak_bw) / 1e12, color=_INK, lw=1.6, ls="--",
              label=f"measured roof: {peak_mm / 1e12:.0f} TFLOP/s (8192³ matmul), {peak_bw / 1e12:.2f} TB/s (copy)"
                    "\n  — results/ceilings_h200, measured on an NVIDIA H200")
    for ridge, ls in ((gpu.ridge_point(), "-"), (peak_mm / peak_bw, "--")):
        ax.axvline(ridge, color="0.6", lw=0.9, ls=ls, zorder=0)
    ax.text(gpu.ridge_point() * 1.06, 2.0, f"ridge {gpu.ridge_point():.0f}", fontsize=8.5, color="0.4", rotation=90)
    ax.text(peak_mm / peak_bw / 1.06, 2.0, f"ridge {peak_mm / peak_bw:.0f}", fontsize=8.5, color="0.4",
            rotation=90, ha="right")

    kinds = []  # (colour, marker, label) for the legend, one entry per kind of point
    for k, d in enumerate(ds):
        for step, (colour, marker, label) in _STEP_STYLE.items():
            (row,) = steps.where(step=step, N=n, d=d)
            ax.scatter(row["intensity"], row["tflops"], s=70, marker=marker, zorder=4, lw=1.6,
                       facecolor=colour if k == 0 else "white", edgecolor=colour)
            kinds += [(colour, marker, f"{label} (one step)")] if k == 0 else []
    if show_fused:
        fused = load("naive_vs_fused_h200")
        styles = {"naive": (_INK, "*", "naive attention, whole forward"), "flash": (_PURPLE, "^", "SDPA flash"),
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
    first = ax.legend(handles=roofs, fontsize=8.5, loc="upper left", frameon=False)
    ax.add_artist(first)
    ax.legend(handles=handles, fontsize=8.5, loc="lower right", frameon=True, framealpha=0.95,
              title="measured on an NVIDIA H200", title_fontsize=8.5)

    (soft,) = steps.where(step="P = softmax(S)", N=n, d=ds[0])
    ax.annotate(f"softmax: {soft['intensity']:.2f} FLOP/B, {soft['tflops']:.1f} TFLOP/s,\n"
                f"{peak_mm / 1e12 / soft['tflops']:.0f}x below the measured matmul ceiling",
                xy=(soft["intensity"], soft["tflops"]), xytext=(soft["intensity"] * 2.2, soft["tflops"] * 0.42),
                fontsize=9, color=_VERMILION, va="center",
                arrowprops=dict(arrowstyle="->", color=_VERMILION, shrinkB=6))
    (mm,) = steps.where(step="S = QK^T", N=n, d=ds[0])
    ax.annotate("naive attention's matmuls: intensity ≈ d,\nstill left of the ridge, because\n"
                "their N×N output is large", xy=(mm["intensity"], mm["tflops"]),
                xytext=(mm["intensity"] / 22, mm["tflops"] * 2.3), fontsize=9, color=_BLUE, va="center",
                arrowprops=dict(arrowstyle="->", color=_BLUE, shrinkB=6))
    if show_fused:
        ax.text(n / 2, 150, f"fused kernels: Q, K, V read once,\nO written once: N/2 = {n // 2} FLOP/B",
                fontsize=8.5, color=_PURPLE, ha="center", va="top")
    ax.text(0.42, 14, "memory-bound:\ntime = bytes / bandwidth", fontsize=9, color="0.4")
    ax.text(900, 1.2 * gpu.peak_flops() / 1e12, "compute-bound: time = FLOPs / peak", fontsize=9,
            color="0.4", ha="center")
    ax.set_xlim(x[0], x[-1])
    ax.set_ylim(0.3, 3000)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved to or from HBM)")
    ax.set_ylabel("attainable (lines) or achieved (points) TFLOP/s")
    ax.set_title(f"H200 roofline, bf16, with naive attention measured at N = {n} "
                 f"(results/naive_steps_h200, results/naive_vs_fused_h200)", fontsize=10.5, loc="left")
    ax.grid(True, which="major", color="0.9", lw=0.8)
    ax.spines[["top", "right"]].set_visible(False)
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
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5), sharex=True, sharey=True, layout="constrained")
    for ax, (d, pas) in zip(axes.flat, [(64, "fwd"), (64, "fwdbwd"), (128, "fwd"), (128, "fwdbwd")]):
        for backend, colour in _BACKEND_COLOURS.items():
            sel = dict(backend=backend, d=d, **{"pass": pas})
            ax.plot(runs.column("N", **sel), runs.column("tflops", **sel), "o-", color=colour, label=backend)
        ax.axhline(peak_mm / 1e12, color="0.5", ls="--", lw=1, label="measured matmul ceiling")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
        ax.set_title(f"d = {d}, {'forward' if pas == 'fwd' else 'forward + backward'}", fontsize=10)
    axes[0, 0].set(ylabel="TFLOP/s", ylim=(0, 760))
    axes[1, 0].set(ylabel="TFLOP/s", xlabel="sequence length N")
    axes[1, 1].set_xlabel("sequence length N")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside upper center", ncol=4)
    return fig
