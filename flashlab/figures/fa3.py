"""Chapter 6 figures: FlashAttention-3's schedules and FP8 incoherent processing.

- :func:`pingpong` (seed figure 7): Gantt charts from :mod:`flashlab.sim.events`, one
  consumer warpgroup with a producer, then two warpgroups in ping-pong.
- :func:`schedules_utilisation`: tensor-core utilisation of the five schedules, d = 64, 128, 256.
- :func:`fp8_incoherent`: a row with an outlier before/after the random Hadamard rotation,
  and the RMSE of FP8 attention per method (:func:`flashlab.reference.fp8.outlier_rmse_experiment`).
- :func:`pipelining_h200`: flashlab's Triton forward on the H200 across ``num_stages`` (the
  depth of the K/V ring buffer) with Triton's warp specialisation on and off
  (``results/pipelining_h200``), failed configurations marked.
- :func:`fp8_speed_h200`: the FP8 forward against the bf16 one and torch SDPA flash on the
  H200 (``results/fp8_bench_h200``), d = 128, non-causal and causal.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .. import results
from ..reference import fp8
from ..sim.events import SCHEDULES, Tile, Timeline, pingpong as pingpong_schedule, producer_consumer
from .timeline import COLOURS

__all__ = ["pingpong", "schedules_utilisation", "fp8_incoherent", "pipelining_h200", "fp8_speed_h200"]

_LANES = {"tma": "load (TMA)", "tensor": "tensor core", "mufu": "exp unit (MUFU)"}
_OWNER = {"producer": "0.55", "WG1": COLOURS[0], "WG2": COLOURS[1]}
_HATCH = {"load": "", "G0": "", "softmax": "///", "G1": ""}
_ALPHA = {"load": 0.85, "G0": 0.95, "softmax": 0.85, "G1": 0.6}


def _gantt(ax, timeline: Timeline, title: str) -> None:
    lanes = list(_LANES)
    for e in timeline.events:
        y = len(lanes) - 1 - lanes.index(e.resource)
        ax.barh(y, e.end - e.start, left=e.start, height=0.7, color=_OWNER[e.owner], alpha=_ALPHA[e.kind],
                hatch=_HATCH[e.kind], edgecolor="white", lw=0.8)
        label = e.kind if e.kind != "load" else "K,V"
        ax.text((e.start + e.end) / 2, y, f"{label}\n{e.task.split('_')[-1]}", ha="center", va="center",
                fontsize=6.5, color="black" if e.kind == "G1" else "white")
    ax.set_yticks(range(len(lanes)), [_LANES[r] for r in reversed(lanes)])
    ax.set_title(f"{title}: tensor core busy {timeline.utilisation():.0%} of the time", loc="left", fontsize=10.5)


def pingpong(n_blocks: int = 4) -> Figure:
    """Seed figure 7: one consumer (its softmax leaves the tensor core idle) against two
    consumers in ping-pong (one's softmax hides under the other's GEMMs); H100, 128x128x128."""
    fig, axes = plt.subplots(2, 1, figsize=(11, 5.2), sharex=True, layout="constrained")
    _gantt(axes[0], producer_consumer(Tile(), n_blocks).run(), "producer + one consumer warpgroup")
    _gantt(axes[1], pingpong_schedule(Tile(), n_blocks).run(), "producer + two consumers, ping-pong")
    for owner, colour in _OWNER.items():
        axes[0].bar(0, 0, color=colour, label={"producer": "producer warp"}.get(owner, f"consumer {owner}"))
    axes[0].legend(loc="upper right", fontsize=8, ncol=3)
    axes[1].set_xlabel("cycles on one SM  (G0: S = QKᵀ, softmax: exp, G1: O += PV; number = K/V block j)")
    return fig


def schedules_utilisation(n_blocks: int = 64, dims: tuple[int, ...] = (64, 128, 256)) -> Figure:
    """Grouped bars: tensor-core utilisation predicted by the simulator for each schedule and d."""
    fig, ax = plt.subplots(figsize=(9, 4.2), layout="constrained")
    width = 0.8 / len(dims)
    for i, (d, colour) in enumerate(zip(dims, COLOURS)):
        util = [build(Tile(d=d), n_blocks).run().utilisation() for build in SCHEDULES.values()]
        x = np.arange(len(SCHEDULES)) + (i - (len(dims) - 1) / 2) * width
        ax.bar(x, util, width, color=colour, label=f"d = {d}")
        for xi, u in zip(x, util):
            ax.text(xi, u + 0.01, f"{u:.2f}", ha="center", fontsize=7)
    ax.set_xticks(range(len(SCHEDULES)), [s.replace("_", "\n") for s in SCHEDULES])
    ax.set_ylabel("tensor-core utilisation")
    ax.set_ylim(0, 1.1)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title(f"Simulated H100 SM, Br = Bc = 128, {n_blocks} K/V blocks", loc="left", fontsize=10.5)
    return fig


def fp8_incoherent(seeds: tuple[int, ...] = (0, 1, 2), n: int = 1024, d: int = 128) -> Figure:
    """Left: a row of K with an outlier, before and after x -> x D H. Right: FP8 attention RMSE per method."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained", width_ratios=[1.4, 1])
    _, k, _ = fp8.outlier_inputs(n, d, seeds[0])
    row = k[np.argmax(np.abs(k).max(axis=1))]                        # the row with the largest outlier
    rotated = fp8.random_orthogonal(d, seeds[0])(row)
    left.stem(row, linefmt=COLOURS[1], markerfmt="o", basefmt=" ", label=f"before: amax {np.abs(row).max():.1f}")
    left.stem(rotated, linefmt=COLOURS[0], markerfmt=".", basefmt=" ",
              label=f"after rotation R: amax {np.abs(rotated).max():.1f}")
    left.set_xlabel("coordinate of the head dimension")
    left.set_title("one row of K with an outlier, before and after rotation", loc="left", fontsize=10.5)
    left.legend(fontsize=8)
    result = fp8.outlier_rmse_experiment(n, d, seeds)
    names = list(result)
    means = [result[k].mean() for k in names]
    right.bar(range(len(names)), means, color=[COLOURS[1], COLOURS[3], COLOURS[2], COLOURS[0]])
    for i, k in enumerate(names):
        right.scatter([i] * len(seeds), result[k], color="black", s=10, zorder=3)
    right.set_xticks(range(len(names)), [k.replace("_", "\n") for k in names], fontsize=8)
    right.set_ylabel("RMSE against exact attention")
    right.set_title(f"FP8 e4m3 attention, N = {n}, d = {d}, {len(seeds)} seeds", loc="left", fontsize=10.5)
    return fig


def _provenance_footer(fig: Figure, text: str) -> None:
    """Small grey provenance text in a strip kept free at the bottom of a constrained layout."""
    lines = 1 + len(text) // int(fig.get_figwidth() * 19)  # about 19 characters of 7-point text per inch
    strip = (0.05 + 0.13 * lines) / fig.get_figheight()  # each line is about 0.13 inch high
    fig.get_layout_engine().set(rect=(0, strip, 1, 1 - strip))
    fig.text(0.01, 0.01, text, fontsize=7, color="0.35", ha="left", va="bottom", wrap=True)


def pipelining_h200(stem: str = "pipelining_h200", ceiling_stem: str = "ceilings_h200") -> Figure:
    """Forward TFLOP/s against ``num_stages`` (K/V tiles in flight; 1 = no software pipelining),
    one panel per (d, causal) recorded, one colour per (BLOCK_M, BLOCK_N, warps), Triton's
    warp specialisation off (solid) and on (dashed, open markers). A configuration that did not
    run is an x at the bottom of the panel with the reason (shared memory, or a compile error);
    the measured bf16 matmul ceiling is the dashed grey line."""
    rec = results.load(stem)
    ceiling = results.load(ceiling_stem).where(ceiling="matmul_bf16_8192")[0]["value"] / 1e12
    panels = sorted({(r["d"], r["causal"]) for r in rec.rows}, key=lambda p: (-p[0], p[1]))
    blocks = sorted({(r["BLOCK_M"], r["BLOCK_N"], r["warps"]) for r in rec.rows}, reverse=True)
    colour = dict(zip(blocks, COLOURS))
    pointer_loads = {"tma": False} if "tma" in rec.rows[0] else {}  # later runs also time TMA loads: not drawn here
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), sharey=True, layout="constrained")
    for ax, (d, causal) in zip(np.atleast_1d(axes), panels):
        ax.axhline(ceiling, color="0.4", lw=1.1, ls="--")
        ax.text(0.8, ceiling + 10, f"measured bf16 matmul {ceiling:.0f}", fontsize=7.5, color="0.3")
        for i, blk in enumerate(blocks):
            failed: dict[int, str] = {}
            for ws, ls, face in ((False, "-", colour[blk]), (True, "--", "white")):
                rows = sorted(rec.where(d=d, causal=causal, BLOCK_M=blk[0], BLOCK_N=blk[1], warps=blk[2],
                                        warp_specialize=ws, **pointer_loads), key=lambda r: r["stages"])
                ok = [(r["stages"], r["tflops"]) for r in rows if r["status"] == "ok"]
                if ok:
                    ax.plot(*zip(*ok), ls, color=colour[blk], marker="o", mfc=face, ms=5, lw=1.4,
                            label=f"{blk[0]}×{blk[1]}, {blk[2]} warps, warp_specialize={ws}")
                for r in rows:
                    if r["status"] != "ok":
                        reason = "out of shared memory" if r["status"].startswith("OutOfResources") else \
                            "warp_specialize: compile error"
                        failed.setdefault(r["stages"], reason)
            y = 22 + 62 * i  # one row of x marks per block configuration, its reason above it
            for stages, reason in failed.items():
                ax.plot(stages, y, "x", color=colour[blk], ms=7, mew=2)
            for reason in dict.fromkeys(failed.values()):
                first = min(s for s, why in failed.items() if why == reason)
                ax.text(first - 0.2, y + 14, reason, fontsize=7.5, color=colour[blk], ha="left")
        ax.set_xticks(sorted({r["stages"] for r in rec.rows}))
        ax.set_xlim(0.6, 5.6)
        ax.set_ylim(0, ceiling * 1.1)
        ax.set_xlabel("num_stages (K/V tiles in flight)")
        ax.set_title(f"d = {d}, {'causal' if causal else 'non-causal'}, N = {rec.rows[0]['N']}", loc="left",
                     fontsize=10.5)
        ax.spines[["top", "right"]].set_visible(False)
    np.atleast_1d(axes)[0].set_ylabel("forward TFLOP/s (bf16)")
    handles = {}
    for ax in np.atleast_1d(axes):
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(handles.values(), handles.keys(), loc="outside upper center", ncols=2, fontsize=8,
               title="flashlab's Triton forward on the H200 (x: did not run)", title_fontsize=9.5)
    _provenance_footer(fig, rec.provenance)
    return fig


_FP8_IMPLS = {  # impl column of fp8_bench -> (label, colour, marker, line style)
    "flashlab": ("flashlab bf16", COLOURS[0], "o", "-"),
    "flashlab_fp8": ("flashlab FP8 (inputs quantised beforehand)", COLOURS[2], "^", "-"),
    "flashlab_fp8_incl_quant": ("flashlab FP8 incl. quantisation", COLOURS[2], "v", ":"),
    "sdpa_flash": ("torch SDPA flash, bf16", COLOURS[1], "s", "-"),
}


def fp8_speed_h200(stem: str = "fp8_bench_h200", d: int = 128) -> Figure:
    """Forward TFLOP/s against N at head dimension d for flashlab bf16, flashlab FP8 (with and
    without the quantisation timed) and torch SDPA flash; non-causal (left) and causal (right).
    The thin dotted line is 1.5x flashlab's bf16 forward, the speed-up the FP8 kernel aimed at."""
    rec = results.load(stem)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True, layout="constrained")
    for ax, causal in zip(axes, (False, True)):
        for impl, (label, colour, marker, ls) in _FP8_IMPLS.items():
            pts = sorted((r["N"], r["tflops"]) for r in rec.where(impl=impl, d=d, causal=causal))
            ax.plot(*zip(*pts), ls, color=colour, marker=marker, ms=5, lw=1.5, label=label)
        bf16 = sorted((r["N"], r["tflops"]) for r in rec.where(impl="flashlab", d=d, causal=causal))
        ax.plot([n for n, _ in bf16], [1.5 * t for _, t in bf16], ":", color=COLOURS[0], lw=1,
                label="1.5 × flashlab bf16 (the goal)")
        ax.set_xscale("log", base=2)
        ax.set_xticks([n for n, _ in bf16], [str(n) for n, _ in bf16])
        ax.set_xlabel("sequence length N (B·N = 16k tokens)")
        ax.set_title(f"d = {d}, {'causal' if causal else 'non-causal'}, forward", loc="left", fontsize=10.5)
        ax.set_ylim(0, None)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_ylabel("TFLOP/s")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncols=3, fontsize=8.5,
               title="FP8 (e4m3, per-block descales) against bf16 on the H200", title_fontsize=9.5)
    _provenance_footer(fig, rec.provenance + " " + str(rec.meta.get("note", "")))
    return fig
