"""Chapter 6 figures: FlashAttention-3's schedules and FP8 incoherent processing.

- :func:`pingpong` (Figure 6.1 of the book): Gantt charts from :mod:`flashlab.sim.events`, one
  consumer warpgroup with a producer, then two warpgroups in ping-pong.
- :func:`schedules_utilisation`: tensor-core utilisation of the five schedules, d = 64, 128, 256.
- :func:`fp8_incoherent`: a row with an outlier before/after the random Hadamard rotation,
  and the RMSE of FP8 attention per method (:func:`flashlab.reference.fp8.outlier_rmse_experiment`).
- :func:`pipelining_h200`: flashlab's Triton forward on the H200 across ``num_stages`` (the
  depth of the K/V ring buffer), pointer loads against TMA loads, and Triton's warp
  specialisation on and off (``results/pipelining_h200``), failed configurations marked.
- :func:`fp8_speed_h200`: the FP8 forward against the bf16 one and torch SDPA flash on the
  H200 (``results/fp8_bench_h200``), d = 128, with the fastest fixed FP8 tile of
  ``results/fp8_tiles_h200`` as open markers.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from flashlab.lab import results
from flashlab.reference import fp8
from flashlab.sim.events import SCHEDULES, Tile, Timeline, pingpong as pingpong_schedule, producer_consumer
from flashlab.course.figures.timeline import COLOURS

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
    """Figure 6.1: one consumer (its softmax leaves the tensor core idle) against two
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


_FP8_IMPLS = {  # impl column of fp8_bench -> (label, colour, marker, line style)
    "flashlab": ("flashlab bf16", COLOURS[0], "o", "-"),
    "flashlab_fp8": ("flashlab FP8 (inputs quantised beforehand)", COLOURS[2], "^", "-"),
    "flashlab_fp8_incl_quant": ("flashlab FP8 incl. quantisation", COLOURS[2], "v", ":"),
    "sdpa_flash": ("torch SDPA flash, bf16", COLOURS[1], "s", "-"),
}


def fp8_speed_h200(stem: str = "fp8_bench_h200", tiles_stem: str = "fp8_tiles_h200", d: int = 128) -> Figure:
    """Forward TFLOP/s against N at head dimension d for flashlab bf16, flashlab FP8 (autotuned,
    with and without the quantisation timed) and torch SDPA flash, all from ``stem``; non-causal
    (left) and causal (right). The thin dotted line is 1.5x flashlab's bf16 forward, the most FP8
    can gain over it in the producer/consumer model of the chapter. Open markers (non-causal only)
    are the fastest fixed FP8 configuration at each N in ``tiles_stem``, where each tile was timed
    on its own rather than chosen by the autotuner."""
    rec, tiles = results.load(stem), results.load(tiles_stem)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True, layout="constrained")
    for ax, causal in zip(axes, (False, True)):
        for impl, (label, colour, marker, ls) in _FP8_IMPLS.items():
            pts = sorted((r["N"], r["tflops"]) for r in rec.where(impl=impl, d=d, causal=causal))
            ax.plot(*zip(*pts), ls, color=colour, marker=marker, ms=5, lw=1.5, label=label)
        bf16 = sorted((r["N"], r["tflops"]) for r in rec.where(impl="flashlab", d=d, causal=causal))
        ax.plot([n for n, _ in bf16], [1.5 * t for _, t in bf16], ":", color=COLOURS[0], lw=1,
                label="1.5 × flashlab bf16 (producer/consumer model's FP8 gain)")
        if not causal:  # the tile experiment: non-causal only
            fixed = tiles.where(impl="flashlab_fp8", d=d, status="ok")
            pts = sorted({n: max(r["tflops"] for r in fixed if r["N"] == n) for n in {r["N"] for r in fixed}}.items())
            ax.plot(*zip(*pts), "--", color=COLOURS[2], marker="^", mfc="white", ms=7, lw=1.2,
                    label=f"FP8, fastest fixed tile at each N ({tiles_stem})")
        ax.set_xscale("log", base=2)
        ax.set_xticks([n for n, _ in bf16], [str(n) for n, _ in bf16])
        ax.set_xlabel("sequence length N (B·N = 16k tokens)")
        ax.set_title(f"d = {d}, {'causal' if causal else 'non-causal'}, forward", loc="left", fontsize=10.5)
        ax.set_ylim(0, None)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_ylabel("TFLOP/s")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncols=3, fontsize=8.5,
               title="FP8 (e4m3, per-block descales) against bf16 on the H200", title_fontsize=9.5)
    _provenance_footer(fig, f"{rec.short}; open markers: {tiles.short}")
    return fig
