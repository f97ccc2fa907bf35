"""Chapter 6 figures: FlashAttention-3's schedules and FP8 incoherent processing.

- :func:`pingpong` (seed figure 7): Gantt charts from :mod:`flashlab.sim.events`, one
  consumer warpgroup with a producer, then two warpgroups in ping-pong.
- :func:`schedules_utilisation`: tensor-core utilisation of the five schedules, d = 64, 128, 256.
- :func:`fp8_incoherent`: a row with an outlier before/after the random Hadamard rotation,
  and the RMSE of FP8 attention per method (:func:`flashlab.reference.fp8.outlier_rmse_experiment`).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..reference import fp8
from ..sim.events import SCHEDULES, Tile, Timeline, pingpong as pingpong_schedule, producer_consumer
from .timeline import COLOURS

__all__ = ["pingpong", "schedules_utilisation", "fp8_incoherent"]

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
              label=f"after D·H: amax {np.abs(rotated).max():.1f}")
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
