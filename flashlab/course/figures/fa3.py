"""Chapter 6 figures: FlashAttention-3's schedules and FP8 incoherent processing.

- :func:`pingpong` (Figure 6.1 of the book): Gantt charts from :mod:`flashlab.sim.events`, one
  consumer warpgroup with a producer, then two warpgroups in ping-pong.
- :func:`schedules_utilisation` (Figure 6.2): tensor-core utilisation of the five schedules,
  d = 64, 128, 256.
- :func:`fp8_incoherent` (Figure 6.3): a row with an outlier before/after the random Hadamard
  rotation, and the RMSE of FP8 attention per method
  (:func:`flashlab.reference.fp8.outlier_rmse_experiment`).
- :func:`fp8_speed_h200` (Figure 6.4): the FP8 forward against the bf16 one, cuDNN and torch
  SDPA flash on the H200, d = 128, from one run of the bench suite
  (``results/nvidia-h200/bench_fp8``: V with one descale per head).
- :func:`pipelining_h200` (the chapter's lab notes): flashlab's Triton forward on the H200
  across ``num_stages`` (the depth of the K/V ring buffer), pointer loads against TMA loads,
  and Triton's warp specialisation on and off (``results/pipelining_h200``).

The chapter's figures are drawn :data:`WIDTH` inches wide, the text column's width, with no
text smaller than :data:`MIN_FONT` points.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from flashlab.lab import results
from flashlab.reference import fp8
from flashlab.sim.events import SCHEDULES, Tile, Timeline, pingpong as pingpong_schedule, producer_consumer
from flashlab.course.figures.timeline import COLOURS

__all__ = ["pingpong", "schedules_utilisation", "fp8_incoherent", "pipelining_h200", "fp8_speed_h200",
           "WIDTH", "MIN_FONT"]

WIDTH = 7.0  # inches: about 700 px at the notebook's 100 dpi, the text column's width
MIN_FONT = 9.0  # points: the smallest text on the chapter's figures
_TITLE = 10.5

_LANES = {"tma": "load\n(TMA)", "tensor": "tensor\ncore", "mufu": "exp\n(MUFU)"}
_OWNER = {"producer": "0.55", "WG1": COLOURS[0], "WG2": COLOURS[1]}
_HATCH = {"load": "", "G0": "", "softmax": "///", "G1": ""}
_ALPHA = {"load": 0.85, "G0": 0.95, "softmax": 0.85, "G1": 0.6}
_SHORT = {"load": "", "G0": "S", "softmax": "e", "G1": "O"}  # bar labels: S = QK^T, e = exp, O += PV
# Colours by phase (by_phase=True): loads, the two GEMMs, the softmax, and what only a measured
# warpgroup shows: issuing wgmma instructions and waiting on a barrier or a GEMM
PHASE_COLOURS = {"load": "0.55", "G0": COLOURS[0], "softmax": COLOURS[1], "G1": COLOURS[2], "issue": "0.2",
                 "wait": "0.86"}


def _gantt(ax, timeline: Timeline, title: str, lanes: dict[str, str] = _LANES, by_phase: bool = False,
           busy: bool = True, min_label: float = 0.0) -> None:
    """One bar per event on the lane of its resource (``lanes``: resource -> label, top to bottom),
    coloured by owner, or by phase (``by_phase``, :data:`PHASE_COLOURS`); labelled S/e/O + block
    where at least ``min_label`` long; ``busy``: the tensor core's utilisation in the title."""
    keys = list(lanes)
    for e in timeline.events:
        y = len(keys) - 1 - keys.index(e.resource)
        colour = PHASE_COLOURS[e.kind] if by_phase else _OWNER[e.owner]
        ax.barh(y, e.end - e.start, left=e.start, height=0.7, color=colour, alpha=_ALPHA.get(e.kind, 1.0),
                hatch=_HATCH.get(e.kind, ""), edgecolor="white", lw=0.8)
        if e.kind in _SHORT and e.end - e.start >= min_label:
            ax.text((e.start + e.end) / 2, y, f"{_SHORT[e.kind]}{e.task.split('_')[-1]}", ha="center",
                    va="center", fontsize=MIN_FONT, color="black" if e.kind == "G1" else "white")
    ax.set_yticks(range(len(keys)), [lanes[r] for r in reversed(keys)], fontsize=MIN_FONT)
    ax.tick_params(axis="x", labelsize=MIN_FONT)
    util = f": tensor core busy {timeline.utilisation():.0%}" if busy else ""
    ax.set_title(f"{title}{util}", loc="left", fontsize=_TITLE)
    ax.spines[["top", "right"]].set_visible(False)


def pingpong(n_blocks: int = 4) -> Figure:
    """Figure 6.1: one consumer (its softmax leaves the tensor core idle) against two
    consumers in ping-pong (one's softmax hides under the other's GEMMs); H100, 128x128x128.
    Bar labels: Sj = the GEMM S = Q K_j^T, ej = its exponentials, Oj = the GEMM O += P V_j,
    j = the K/V block; grey bars are the producer's loads of K_j, V_j."""
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH, 4.6), sharex=True, layout="constrained")
    _gantt(axes[0], producer_consumer(Tile(), n_blocks).run(), "producer + one consumer")
    _gantt(axes[1], pingpong_schedule(Tile(), n_blocks).run(), "producer + two consumers, ping-pong")
    for owner, colour in _OWNER.items():
        axes[0].bar(0, 0, color=colour, label={"producer": "producer (loads)"}.get(owner, f"consumer {owner}"))
    axes[0].legend(loc="upper right", fontsize=MIN_FONT, ncol=3, frameon=False, bbox_to_anchor=(1, 1.32))
    axes[1].set_xlabel("cycles on one SM (S: S = QKᵀ, e: exp, O: O += PV; number: K/V block)",
                       fontsize=MIN_FONT)
    return fig


def schedules_utilisation(n_blocks: int = 64, dims: tuple[int, ...] = (64, 128, 256)) -> Figure:
    """Figure 6.2: tensor-core utilisation predicted by the simulator for each schedule and d."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.8), layout="constrained")
    width = 0.8 / len(dims)
    for i, (d, colour) in enumerate(zip(dims, COLOURS)):
        util = [build(Tile(d=d), n_blocks).run().utilisation() for build in SCHEDULES.values()]
        x = np.arange(len(SCHEDULES)) + (i - (len(dims) - 1) / 2) * width
        bars = ax.bar(x, util, width, color=colour, label=f"d = {d}")
        ax.bar_label(bars, labels=[f"{u:.2f}" for u in util], fontsize=MIN_FONT, padding=1,
                     rotation=90)
    ax.set_xticks(range(len(SCHEDULES)), [s.replace("_", "\n") for s in SCHEDULES], fontsize=MIN_FONT)
    ax.tick_params(axis="y", labelsize=MIN_FONT)
    ax.set_ylabel("tensor-core utilisation", fontsize=MIN_FONT)
    ax.set_ylim(0, 1.22)
    ax.legend(loc="upper left", fontsize=MIN_FONT, ncols=3, frameon=False)
    ax.set_title(f"Simulated H100 SM, Br = Bc = 128, {n_blocks} K/V blocks", loc="left", fontsize=_TITLE)
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def fp8_incoherent(seeds: tuple[int, ...] = (0, 1, 2), n: int = 1024, d: int = 128) -> Figure:
    """Figure 6.3. Left: a row of K with an outlier, before and after x -> x D H. Right: FP8
    attention RMSE per method, the mean as a bar and each seed as a dot."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(WIDTH, 3.6), layout="constrained", width_ratios=[1.2, 1])
    _, k, _ = fp8.outlier_inputs(n, d, seeds[0])
    row = k[np.argmax(np.abs(k).max(axis=1))]                        # the row with the largest outlier
    rotated = fp8.random_orthogonal(d, seeds[0])(row)
    left.stem(row, linefmt=COLOURS[1], markerfmt="o", basefmt=" ", label=f"before: max |x| {np.abs(row).max():.1f}")
    left.stem(rotated, linefmt=COLOURS[0], markerfmt=".", basefmt=" ",
              label=f"rotated: max |x| {np.abs(rotated).max():.1f}")
    left.set_xlabel("coordinate of the head dimension", fontsize=MIN_FONT)
    left.set_title("one row of K with an outlier", loc="left", fontsize=_TITLE)
    left.legend(fontsize=MIN_FONT, frameon=False)
    result = fp8.outlier_rmse_experiment(n, d, seeds)
    names = list(result)
    means = [result[k].mean() for k in names]
    right.bar(range(len(names)), means, color=[COLOURS[1], COLOURS[3], COLOURS[2], COLOURS[0]])
    for i, k in enumerate(names):
        right.scatter([i] * len(seeds), result[k], color="black", s=10, zorder=3)
    labels = {"per_tensor": "per\ntensor", "per_block": "per\nblock", "incoherent": "rotated",
              "per_block_incoherent": "rotated,\nper block"}
    right.set_xticks(range(len(names)), [labels.get(k, k) for k in names], fontsize=MIN_FONT)
    right.set_ylabel("RMSE against exact attention", fontsize=MIN_FONT)
    right.set_title(f"FP8 attention, N = {n}, d = {d}", loc="left", fontsize=_TITLE)
    for ax in (left, right):
        ax.tick_params(labelsize=MIN_FONT)
        ax.spines[["top", "right"]].set_visible(False)
    return fig


def _provenance_footer(fig: Figure, text: str) -> None:
    """Small grey provenance text in a strip kept free at the bottom of a constrained layout."""
    lines = 1 + len(text) // int(fig.get_figwidth() * 15)  # about 15 characters of 9-point text per inch
    strip = (0.05 + 0.16 * lines) / fig.get_figheight()  # each line is about 0.16 inch high
    fig.get_layout_engine().set(rect=(0, strip, 1, 1 - strip))
    fig.text(0.01, 0.01, text, fontsize=MIN_FONT, color="0.35", ha="left", va="bottom", wrap=True)


def _pipelining_tflops(rec: results.Recorded, **where: object) -> tuple[float | None, bool]:
    """(TFLOP/s, failed) of the one recorded configuration matching ``where``; (None, False) if not measured."""
    rows = rec.where(**where)
    if not rows:
        return None, False
    ok = [r["tflops"] for r in rows if r["status"] == "ok"]
    return (max(ok), False) if ok else (None, True)


_LOADS = {  # (tma, warp_specialize) -> label, colour, hatch
    (False, False): ("pointer loads", COLOURS[0], ""),
    (False, True): ("pointer loads + WS", COLOURS[0], "///"),
    (True, False): ("TMA", COLOURS[1], ""),
    (True, True): ("TMA + WS", COLOURS[1], "///"),
}


def pipelining_h200(stem: str = "pipelining_h200", ceiling_stem: str = "ceilings_h200",
                    main: tuple[int, int, int, int] = (128, 128, 128, 8), stages: int = 3) -> Figure:
    """flashlab's bf16 forward on the H200 with three switches: ``num_stages`` (K/V tiles in
    flight, the ring buffer's k), TMA descriptor loads against pointer loads, and Triton's warp
    specialisation (WS) off and on.

    Left: the ``main`` configuration (d, BLOCK_M, BLOCK_N, warps), non-causal, TFLOP/s against
    num_stages, one line per (loads, WS); the grey dashes are the producer/consumer simulator's
    tensor-core utilisation for k slots times the measured bf16 matmul ceiling (dashed line).
    Right: every recorded (d, causal, N, tile, warps) at ``stages`` stages, one bar per
    (loads, WS); a configuration that did not compile is an x on the axis, one not measured is
    left out."""
    rec = results.load(stem)
    ceiling = results.load(ceiling_stem).where(ceiling="matmul_bf16_8192")[0]["value"] / 1e12
    d, bm, bn, warps = main
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.6, 4.8), layout="constrained", width_ratios=[1, 2.1],
                                      sharey=True)
    ks = sorted({r["stages"] for r in rec.where(d=d, causal=False, BLOCK_M=bm, BLOCK_N=bn, warps=warps)})
    model = [producer_consumer(Tile(), 64, stages=k).run().utilisation() * ceiling for k in ks]
    left.plot(ks, model, "_", color="0.45", ms=26, mew=2.5, label="simulator: producer/consumer, k slots × ceiling")
    left.axhline(ceiling, color="0.4", lw=1.1, ls="--")
    left.text(ks[0] - 0.4, ceiling + 10, f"measured bf16 matmul {ceiling:.0f}", fontsize=7.5, color="0.3")
    for (tma, ws), (label, colour, _) in _LOADS.items():
        pts = [(k, t) for k in ks if (t := _pipelining_tflops(rec, d=d, causal=False, BLOCK_M=bm, BLOCK_N=bn,
                                                             warps=warps, stages=k, tma=tma, warp_specialize=ws)[0])]
        if pts:
            left.plot(*zip(*pts), "--" if ws else "-", color=colour, marker="o", ms=5, lw=1.4,
                      mfc="white" if ws else colour, label=label)
    left.set_xticks(ks)
    left.set_xlim(ks[0] - 0.5, ks[-1] + 0.6)
    left.set_xlabel("num_stages (K/V tiles in flight)")
    left.set_ylabel("forward TFLOP/s (bf16)")
    n = rec.where(d=d, causal=False, BLOCK_M=bm, BLOCK_N=bn, warps=warps)[0]["N"]
    left.set_title(f"d = {d}, N = {n}, {bm}×{bn}, {warps} warps", loc="left", fontsize=10)
    left.legend(fontsize=7.5, loc="lower right")

    groups = sorted({(r["d"], r["causal"], r["N"], r["BLOCK_M"], r["BLOCK_N"], r["warps"])
                     for r in rec.where(stages=stages)}, key=lambda g: (-g[0], g[1], -g[5], -g[4]))
    width = 0.8 / len(_LOADS)
    for i, (gd, causal, n, gm, gn, gw) in enumerate(groups):
        for j, ((tma, ws), (label, colour, hatch)) in enumerate(_LOADS.items()):
            x = i + (j - (len(_LOADS) - 1) / 2) * width
            t, failed = _pipelining_tflops(rec, d=gd, causal=causal, N=n, BLOCK_M=gm, BLOCK_N=gn, warps=gw,
                                           stages=stages, tma=tma, warp_specialize=ws)
            if t is not None:
                right.bar(x, t, width, color=colour, hatch=hatch, edgecolor="white", lw=0.5,
                          label=label if i == 0 else None)
                right.text(x, t + 6, f"{t:.0f}", ha="center", fontsize=6.5, rotation=90, va="bottom")
            elif failed:
                right.plot(x, 12, "x", color=colour, ms=7, mew=2)
    right.plot([], [], "x", color="0.3", ms=7, mew=2, label="did not compile (WS with 4 warps)")
    right.axhline(ceiling, color="0.4", lw=1.1, ls="--")
    right.set_xticks(range(len(groups)), [f"d = {g[0]}{', causal' if g[1] else ''}\nN = {g[2]}\n{g[3]}×{g[4]}, {g[5]} warps"
                                          for g in groups], fontsize=7.5)
    right.set_title(f"every recorded configuration at {stages} stages (none drawn: not measured)", loc="left",
                    fontsize=10)
    right.set_ylim(0, ceiling * 1.12)
    right.legend(fontsize=7.5, ncols=3, loc="upper right")
    for ax in (left, right):
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle("flashlab's Triton forward on the H200: software pipelining, TMA loads, warp specialisation (WS)",
                 x=0.01, ha="left", fontsize=10.5)
    _provenance_footer(fig, f"{rec.short}; ceiling: {results.load(ceiling_stem).short}")
    return fig


_FP8_IMPLS = {  # impl column of the bench suite -> (label, colour, marker, line style)
    "flashlab_fp8": ("flashlab FP8", COLOURS[2], "^", "-"),
    "sdpa_cudnn": ("cuDNN bf16", COLOURS[3], "D", "-"),
    "flashlab": ("flashlab bf16", COLOURS[0], "o", "-"),
    "sdpa_flash": ("SDPA flash bf16", COLOURS[1], "s", "-"),
}


def fp8_speed_h200(stem: str = "nvidia-h200/bench_fp8", d: int = 128) -> Figure:
    """Figure 6.4: forward TFLOP/s against N at head dimension d for flashlab's FP8 forward
    (e4m3; Q, K one descale per 128 rows, V one per head; inputs quantised beforehand), its bf16
    forward, SDPA cuDNN and SDPA flash in bf16, all from one run (``stem``); non-causal (left)
    and causal (right). The dotted line is 1.5x flashlab's bf16 forward, the most FP8 can gain
    over it in the producer/consumer model of the chapter."""
    rec = results.load(stem)
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.9), sharey=True, layout="constrained")
    for ax, causal in zip(axes, (False, True)):
        for impl, (label, colour, marker, ls) in _FP8_IMPLS.items():
            pts = sorted((r["N"], r["tflops"]) for r in rec.where(impl=impl, d=d, causal=causal))
            ax.plot(*zip(*pts), ls, color=colour, marker=marker, ms=5, lw=1.5, label=label)
        bf16 = sorted((r["N"], r["tflops"]) for r in rec.where(impl="flashlab", d=d, causal=causal))
        ax.plot([n for n, _ in bf16], [1.5 * t for _, t in bf16], ":", color=COLOURS[0], lw=1.2,
                label="1.5 × flashlab bf16")
        ax.set_xscale("log", base=2)
        ax.set_xticks([n for n, _ in bf16], [f"{n // 1024}k" for n, _ in bf16])
        ax.minorticks_off()
        ax.set_xlabel("sequence length N (B·N = 16k tokens)", fontsize=MIN_FONT)
        ax.set_title(f"d = {d}, {'causal' if causal else 'non-causal'}", loc="left", fontsize=_TITLE)
        ax.set_ylim(0, 900)
        ax.tick_params(labelsize=MIN_FONT)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_ylabel("forward TFLOP/s", fontsize=MIN_FONT)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncols=3,
               fontsize=MIN_FONT, frameon=False)
    _provenance_footer(fig, rec.short)
    return fig
