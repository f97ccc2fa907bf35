"""Chapter 6: FlashAttention-3's ping-pong (FA3 Figure 1), simulated and measured in the kernel.

:func:`pingpong_measured` draws one tile's schedule twice on one time axis, in microseconds:

- above, the chapter's simulator, :func:`flashlab.sim.events.pingpong_intra` on the Gluon
  kernel's tiles (Br = 64 rows per consumer, Bc = 128, d = 128, H200 rates, 2 ring stages), its
  cycles turned into microseconds at the H200's clock;
- below, the Gluon kernel's own time stamps for one tile (``results/fa3_timeline_h200``, written
  by :mod:`flashlab.lab.experiments.fa3_timeline`).

Lanes, top to bottom: the producer's loads, then for each consumer warpgroup its GEMMs and what
its threads do. Colours are per phase (:data:`flashlab.course.figures.fa3.PHASE_COLOURS`). A
measured GEMM bar runs from the warpgroup's issue to the end of its wait for the result (the
result of P V may be ready earlier), so it is an upper bound of the tensor core's time.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from flashlab.hardware import H200
from flashlab.lab import results
from flashlab.sim.events import Event, Tile, Timeline, pingpong_intra
from flashlab.course.figures.fa3 import (_ALPHA, _HATCH, MIN_FONT, PHASE_COLOURS, WIDTH, _gantt,
                                         _provenance_footer)

__all__ = ["LANES", "STEM", "measured_timeline", "pingpong_measured", "simulated_timeline"]

STEM = "fa3_timeline_h200"
LANES = {"producer": "producer\nloads", "c0.gemm": "consumer 0\nGEMMs", "c0.threads": "consumer 0\nthreads",
         "c1.gemm": "consumer 1\nGEMMs", "c1.threads": "consumer 1\nthreads"}
TILE = Tile(Br=64, Bc=128, d=128, gpu=H200)  # the kernel's tile per consumer warpgroup
STAGES = 2  # the kernel's ring at d = 128
_SIM_LANE = {"WG1": "c0", "WG2": "c1"}
# measured phase -> bar kind; what is not named is a wait (for a barrier, a turn or a GEMM)
_KIND = {"softmax": "softmax", "rescale": "softmax", "convert": "softmax", "write": "softmax",
         "issue_s": "issue", "issue_pv": "issue", "load_q": "load", "load_k": "load", "load_v": "load"}
_PHASE_LABELS = {"G0": "S = QKᵀ", "softmax": "softmax (e)", "G1": "O += PV", "load": "TMA load (measured: issue)",
                 "issue": "issuing wgmma", "wait": "waiting"}


def _window(events: list[Event], origin: float, span: float) -> Timeline:
    """The events shifted to start at ``origin`` and cut to [0, span]."""
    kept = [Event(e.resource, e.task, max(e.start - origin, 0.0), min(e.end - origin, span), e.owner, e.kind)
            for e in events if e.end > origin and e.start < origin + span]
    return Timeline(tuple(kept))


def simulated_timeline(first: int = 2, blocks: int = 4) -> tuple[list[Event], float, float, float]:
    """The simulator's pingpong_intra on :data:`TILE` in microseconds, events on :data:`LANES`.
    Returns (events, origin, span, tensor-core utilisation): ``origin`` is when consumer 0 starts
    S of block ``first``, ``span`` the time to its S of block ``first + blocks``."""
    timeline = pingpong_intra(TILE, first + blocks + 2, stages=STAGES).run()
    us = 1e6 / TILE.gpu.clock_hz
    events = []
    for e in timeline.events:
        unit = "threads" if e.kind == "softmax" else "gemm"
        lane = "producer" if e.owner == "producer" else f"{_SIM_LANE[e.owner]}.{unit}"
        events.append(Event(lane, e.task, e.start * us, e.end * us, e.owner, e.kind))
    start = {e.task: e.start for e in events}
    origin = start[f"WG1.G0_{first}"]
    return events, origin, start[f"WG1.G0_{first + blocks}"] - origin, timeline.utilisation()


def measured_timeline(rows: list[dict[str, object]], first: int | None = None,
                      blocks: int = 4) -> tuple[list[Event], float, float]:
    """The kernel's phases (rows of ``fa3_timeline``) as events on :data:`LANES`, and the GEMM
    windows they imply: S_j from its issue to the end of the wait for it, P_j V_j from its issue
    (or, if later, the end of the wait for S_{j+1}, which the tensor core finishes first) to the
    end of the wait for it. Returns (events, origin, span) as :func:`simulated_timeline` does;
    ``first`` defaults to the middle key block."""
    events = []
    spans: dict[tuple[str, str, int], tuple[float, float]] = {}
    for r in rows:
        part = str(r["partition"])
        owner = "producer" if part == "producer" else f"c{part.split()[-1]}"
        lane = "producer" if owner == "producer" else f"{owner}.threads"
        j, phase = int(r["block"]), str(r["phase"])
        events.append(Event(lane, f"{owner}.{phase}_{j}", r["start_us"], r["end_us"], owner, _KIND.get(phase, "wait")))
        spans[owner, phase, j] = (float(r["start_us"]), float(r["end_us"]))
    n_blocks = 1 + max(j for (_, phase, j) in spans if phase == "softmax")
    for c in ("c0", "c1"):
        for j in range(n_blocks):
            s_end = spans[c, "wait_s", j][1]
            events.append(Event(f"{c}.gemm", f"{c}.S_{j}", spans[c, "issue_s", j][0], s_end, c, "G0"))
            after = spans[c, "wait_s", j + 1][1] if j + 1 < n_blocks else spans[c, "issue_pv", j][0]
            pv_start = max(spans[c, "issue_pv", j][0], after)
            events.append(Event(f"{c}.gemm", f"{c}.O_{j}", pv_start, spans[c, "wait_pv", j][1], c, "G1"))
    first = n_blocks // 2 if first is None else first
    if not 0 <= first < first + blocks < n_blocks:
        raise ValueError(f"first must leave {blocks} key blocks of the {n_blocks} measured; got first={first}")
    origin = spans["c0", "issue_s", first][0]
    return events, origin, spans["c0", "issue_s", first + blocks][0] - origin


def pingpong_measured(stem: str = STEM, results_dir: str | Path | None = None, blocks: int = 4) -> Figure:
    """FA3's ping-pong on one SM: the simulator's pingpong_intra above, the Gluon kernel's time
    stamps for one tile below (``blocks`` key blocks from the middle of the tile), on one time
    axis. Without the recorded stamps the lower panel says how to take them."""
    base = Path(results_dir) if results_dir is not None else results.RESULTS_DIR
    recorded = results.load(stem, base) if (base / f"{stem}.csv").exists() else None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(WIDTH, 6.4), layout="constrained")
    sim_events, sim_origin, sim_span, util = simulated_timeline(blocks=blocks)
    span = sim_span
    if recorded is not None:
        events, origin, measured_span = measured_timeline(recorded.rows, blocks=blocks)
        span = max(span, measured_span)
    if sim_span < span:  # the simulated blocks are shorter: simulate enough of them to fill the axis
        sim_events, sim_origin, _, util = simulated_timeline(blocks=math.ceil(blocks * span / sim_span))
    min_label = 0.035 * span  # a label such as "S9" fits a bar of about 0.2 inch (6 inches: the span)
    _gantt(top, _window(sim_events, sim_origin, span), f"simulator, pingpong_intra: tensor core busy {util:.0%}",
           LANES, by_phase=True, busy=False, min_label=min_label)
    if recorded is not None:
        _gantt(bottom, _window(events, origin, span), "measured: the Gluon kernel, one tile", LANES,
               by_phase=True, busy=False, min_label=min_label)
        bottom.set_xlabel("µs from consumer 0's issue of S for the first block shown", fontsize=MIN_FONT)
        _provenance_footer(fig, f"{recorded.short}; GEMM bars run from issue to the end of the wait")
    else:
        bottom.axis("off")
        bottom.text(0.5, 0.5, "not measured here: on a Hopper GPU run\n"
                    "python -m flashlab.lab.experiments fa3timeline --out results",
                    ha="center", va="center", fontsize=MIN_FONT + 1, transform=bottom.transAxes)
        top.set_xlabel("µs from consumer 0's issue of S for the first block shown", fontsize=MIN_FONT)
    for ax in (top, bottom):
        ax.set_xlim(0, span)
    handles = [Patch(facecolor=PHASE_COLOURS[k], alpha=_ALPHA.get(k, 1.0), hatch=_HATCH.get(k, ""),
                     edgecolor="white", label=label) for k, label in _PHASE_LABELS.items()]
    fig.legend(handles=handles, loc="outside upper center", ncols=3, fontsize=MIN_FONT, frameon=False)
    return fig
