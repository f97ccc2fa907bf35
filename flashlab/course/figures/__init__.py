"""Every figure of the book, drawn from code.

Each figure is a function in a submodule that takes no required arguments and
returns a :class:`matplotlib.figure.Figure`. :data:`FIGURES` maps the file stem
written under ``figures/`` to ``"module:function"``; ``python -m flashlab.course.figures
OUTDIR`` (``make figures``) writes every one as PNG and SVG.

Chapters call the same functions, so the book and ``figures/`` never disagree.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

import matplotlib
from matplotlib.figure import Figure

__all__ = ["FIGURES", "get", "save", "save_all"]

# stem -> "submodule:function", in book order (named by content; chapters number their figures N.k)
FIGURES: dict[str, str] = {
    "timeline": "timeline:timeline",
    "memory_pyramid": "memory:memory_pyramid",
    "dataflow": "tiling:dataflow",
    "online_softmax_example": "online_softmax:online_softmax_example",
    "tiling": "tiling:tiling",
    "roofline_h200": "memory:roofline",
    "naive_step_shares_h200": "memory:naive_step_shares",
    "naive_vs_fused_h200": "memory:naive_vs_fused_h200",
    "io_vs_n": "io:io_vs_n",
    "io_vs_m": "io:io_vs_m",
    "warp_split": "fa2:warp_split",
    "occupancy_waves": "fa2:occupancy_waves",
    "flashlab_vs_peers": "fa2:kernel_bench",
    "grid_v1_v2_h200": "fa2:grid_measured_vs_predicted",
    "cycles_per_tile": "fa4:cycles_per_tile",
    "software_exp2": "fa4:software_exp2",
    "conditional_rescaling": "fa4:conditional_rescaling",
    "fa4_variants_h200": "fa4:variants_h200",
    "pingpong": "fa3:pingpong",
    "pingpong_measured_h200": "fa3_timeline:pingpong_measured",
    "schedules_utilisation": "fa3:schedules_utilisation",
    "fp8_incoherent": "fa3:fp8_incoherent",
    "pipelining_h200": "fa3:pipelining_h200",
    "fp8_speed_h200": "fa3:fp8_speed_h200",
    "bottleneck_migration": "epilogue:bottleneck_migration",
    "beyond_block_masks": "beyond:block_masks",
    "beyond_features_h200": "beyond:features_h200",
    "ring_overlap_h200": "ring:ring_overlap_h200",
}


def get(stem: str) -> Callable[..., Figure]:
    """The function that draws figure ``stem`` (a key of :data:`FIGURES`)."""
    if stem not in FIGURES:
        raise ValueError(f"stem must be one of {sorted(FIGURES)}; got {stem!r}")
    module, func = FIGURES[stem].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), func)


def save(fig: Figure, outdir: str | Path, stem: str) -> list[Path]:
    """Write ``fig`` as OUTDIR/STEM.png (150 dpi) and OUTDIR/STEM.svg, reproducibly
    (no timestamps, fixed SVG ids)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = [outdir / f"{stem}.png", outdir / f"{stem}.svg"]
    with matplotlib.rc_context({"svg.hashsalt": "flashlab"}):
        fig.savefig(paths[0], dpi=150, metadata={"Software": None})
        fig.savefig(paths[1], metadata={"Date": None, "Creator": None})
    return paths


def save_all(outdir: str | Path) -> list[Path]:
    """Draw every figure in :data:`FIGURES` and write it under ``outdir``."""
    import matplotlib.pyplot as plt

    written: list[Path] = []
    for stem in FIGURES:
        fig = get(stem)()
        written += save(fig, outdir, stem)
        plt.close(fig)
    return written
