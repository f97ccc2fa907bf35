"""Chapter 10 figure: when a ring of H200s hides its transfers (:func:`ring_overlap_h200`).

One ring step moves a K/V block over NVLink while the kernel computes attention with the
block in hand. The time of each comes from :mod:`flashlab.parallel.model`: bytes over the
link's 450 GB/s one way, FLOPs at flashlab's throughput recorded on an H200
(``results/nvidia-h200/bench``, bf16, d = 128, non-causal: every zig-zag step after the first
is an unmasked block). The recorded throughput at N tokens stands for a step of N queries
against N keys; between recorded lengths it is interpolated in log N, beyond them held at
the nearest one. :func:`measured_tflops` and :func:`crossing` are the numbers the chapter prints.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from flashlab.lab import results
from flashlab.parallel.model import BACKWARD_MATMULS, NVLINK_H200_ONE_WAY, ring_step_time
from flashlab.course.figures.timeline import COLOURS

__all__ = ["ring_overlap_h200", "measured_tflops", "crossing"]

STEM = "nvidia-h200/bench"
D, HEADS = 128, 16  # the recorded shape: H x d = 2048


def measured_tflops(n: float, backward: bool = False, rec=None) -> float:
    """flashlab's recorded bf16 TFLOP/s at N = ``n`` (d = 128, non-causal), forward or the
    backward alone (2.5 forward FLOPs in the forward+backward time less the forward's)."""
    rec = results.load(STEM) if rec is None else rec
    fwd = {r["N"]: r for r in rec.where(impl="flashlab", dtype="bfloat16", causal=False, d=D, **{"pass": "fwd"})}
    both = {r["N"]: r for r in rec.where(impl="flashlab", dtype="bfloat16", causal=False, d=D, **{"pass": "fwdbwd"})}
    ns = sorted(fwd)
    if backward:
        rates = [BACKWARD_MATMULS * fwd[m]["tflops"] * fwd[m]["ms"] / (both[m]["ms"] - fwd[m]["ms"]) for m in ns]
    else:
        rates = [fwd[m]["tflops"] for m in ns]
    return float(np.interp(np.log2(n), np.log2(ns), rates))


def _times(ns: np.ndarray, causal: bool, backward: bool, rec) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of compute and transfer of one ring step at each tokens-per-GPU n."""
    t = [ring_step_time(int(n), D, HEADS, measured_tflops(n, backward, rec), causal=causal, backward=backward)
         for n in ns]
    return np.array([x["compute"] for x in t]), np.array([x["transfer"] for x in t])


def crossing(causal: bool = False, backward: bool = False, rec=None) -> int:
    """The smallest tokens per GPU (to 1 %) at which a step's compute outlasts its transfer."""
    rec = results.load(STEM) if rec is None else rec
    ns = np.unique(np.round(np.geomspace(64, 65536, 1001)).astype(int))
    compute, transfer = _times(ns, causal, backward, rec)
    return int(ns[np.argmax(compute >= transfer)])


def ring_overlap_h200(n_min: int = 256, n_max: int = 65536) -> Figure:
    """Time of one ring step against tokens per GPU, (a) forward and (b) backward: the
    K/V transfer (and, backward, the dK/dV accumulators in fp32) over NVLink, and the
    attention computed meanwhile, non-causal and causal with the zig-zag layout. Where the
    compute line passes above the transfer line the ring hides its communication."""
    rec = results.load(STEM)
    ns = np.geomspace(n_min, n_max, 200)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True, layout="constrained")
    for ax, backward, title in ((axes[0], False, "(a) forward"), (axes[1], True, "(b) backward")):
        compute, transfer = _times(ns, False, backward, rec)
        causal_compute, _ = _times(ns, True, backward, rec)
        ax.loglog(ns, transfer * 1e6, color=COLOURS[1], lw=2.2,
                  label="transfer: " + ("K, V + dK, dV (fp32)" if backward else "K, V (bf16)"))
        ax.loglog(ns, compute * 1e6, color=COLOURS[0], lw=2, label="compute, non-causal")
        ax.loglog(ns, causal_compute * 1e6, "--", color=COLOURS[0], lw=2, label="compute, causal (zig-zag)")
        for causal in (False, True):
            n_star = crossing(causal, backward, rec)
            t = ring_step_time(n_star, D, HEADS, measured_tflops(n_star, backward, rec), causal=causal,
                               backward=backward)["transfer"] * 1e6
            ax.plot([n_star], [t], "o", color="0.15", ms=5)
            ax.annotate(f"{n_star:,}", (n_star, t), textcoords="offset points", xytext=(6, -14 if causal else 6),
                        fontsize=9)
        ax.set_title(title, loc="left", fontsize=10.5)
        ax.set_xlabel("tokens per GPU  n = N / P")
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(True, which="major", color="0.92")
    axes[0].set_ylabel("time of one ring step (µs)")
    axes[0].legend(fontsize=9, frameon=False, loc="upper left")
    axes[1].legend(fontsize=9, frameon=False, loc="upper left")
    fig.suptitle(f"One ring step on H200s (d = {D}, {HEADS} heads, NVLink {NVLINK_H200_ONE_WAY / 1e9:.0f} GB/s "
                 "one way): the transfer is hidden right of each dot", fontsize=11.5)
    fig.text(0.01, -0.01, "compute: " + rec.short, fontsize=7.5, color="0.35", ha="left", va="top")
    return fig
