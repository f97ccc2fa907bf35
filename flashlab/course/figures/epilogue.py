"""The epilogue's figure: how the bottleneck migrated, computed from the book's own models.

One forward pass of attention at a fixed shape (B = 1, H = 16, N = 8192, d = 128,
16-bit inputs, 128 x 128 tiles) is run through every model the chapters built, on
the GPU of each generation. Each model answers one question: *if this unit were the
only limit, how long would the pass take?* Every answer is divided by the time the
tensor cores need for the pass's matmul FLOPs at their dense peak, so

    1      = as slow as the tensor cores themselves (the best a pass can do),
    above  = this unit holds the tensor cores back,
    below  = this unit has slack.

The rows and the chapter each comes from:

    HBM traffic        bytes moved / HBM bandwidth. Standard attention and FlashAttention
                       v1: the element moves counted by chapter 4's simulated memory
                       (Algorithms 0 and 1, SRAM M = the SM's shared memory in 16-bit
                       numbers). Later kernels: chapter 4's floor, Q, K, V read once and
                       O written once (4 N d numbers), which Nsight Compute measured
                       flashlab's fused kernel to meet on the H200 (chapter 4, §4.10).
    idle SMs           1 / SM utilisation of chapter 5's grid model (v1: one program per
                       (batch, head); v2: one per query block).
    SMEM, forward      shared-memory bytes of one tile / bytes per cycle, over the tile's
                       MMA cycles. v1 on A100: chapter 5's split-K model (operand reads plus
                       the warps' exchange of partial results); after v2: split-Q operand
                       reads. Hopper and Blackwell: chapter 7's forward operand table.
    SMEM, backward     chapter 7's backward operand table (Blackwell dataflow), B200 only.
    non-matmul ops     chapter 5's counted non-matmul operations (exp included) at the
                       GPU's fp32 rate, over the matmul FLOPs at the tensor peak.
    exp (MUFU)         one exp2 per score on the special-function unit (chapters 6, 7).
    MMA and exp        the tensor cores and the MUFU taking turns, as in a loop that does
      in turn          not overlap them: (MMA + exp cycles) / MMA cycles (chapter 6).

Each stage is the state a generation *found*; the hollow marker on a row is where the
next generation's answer moved it, from the same models. Nothing here is measured or
quoted except where the docstrings of the models say so.

Glossary: bottleneck = the slowest unit (瓶颈); MUFU = special-function unit
(特殊函数单元); SMEM = shared memory (共享内存); SM = streaming multiprocessor (流式多处理器).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from flashlab import cycles
from flashlab.hardware import A100, B200, GPU, H100
from flashlab.memory import count_flash, count_standard
from flashlab.reference.counting import count_nonmatmul, matmul_equivalent
from flashlab.sim.occupancy import operand_reads, schedule, warp_exchange
from flashlab.course.figures.timeline import COLOURS

__all__ = ["ROWS", "Stage", "migration", "migration_rows", "growth_rows", "bottleneck_migration"]

BLUE, VERMILLION, GREEN, PURPLE = COLOURS
ORANGE, SKY = "#E69F00", "#56B4E9"

# row key -> (label, colour), top to bottom
ROWS: dict[str, tuple[str, str]] = {
    "hbm": ("HBM traffic (ch. 4)", BLUE),
    "grid": ("idle SMs (ch. 5)", ORANGE),
    "smem_fwd": ("shared memory, forward (ch. 5, 7)", GREEN),
    "smem_bwd": ("shared memory, backward (ch. 7)", GREEN),
    "nonmatmul": ("non-matmul ops, fp32 (ch. 5)", SKY),
    "exp": ("exponentials, MUFU (ch. 6, 7)", VERMILLION),
    "turns": ("MMA and exp in turn (ch. 6)", PURPLE),
}


@dataclass(frozen=True)
class Stage:
    """What one generation found on its GPU, and what its successor's answer changed.

    Attributes
    ----------
    year, gpu : when, and on which :class:`flashlab.hardware.GPU`.
    kernel : the algorithm running ("standard attention", "FlashAttention", ...).
    answer : the next generation and its answer, a few words.
    before : row key (see :data:`ROWS`) -> time / tensor-core time; rows a chapter did
        not model for this stage are absent.
    after : row key -> the same ratio after the answer, for the rows it changed.
    notes : row key -> why a row is absent, when "not modelled" would mislead.
    """

    year: int
    gpu: GPU
    kernel: str
    answer: str
    before: dict[str, float]
    after: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def bottleneck(self) -> str:
        """The row with the largest ratio: the unit that sets the pace."""
        return max(self.before, key=self.before.get)


def _smem_gpu(gpu: GPU) -> int:
    """Chapter 4's SRAM size M: the SM's largest shared-memory carve-out, in 16-bit numbers."""
    return gpu.smem_max_per_sm // 2


def _hbm(count_elements: int, heads: int, gpu: GPU, t_mma: float) -> float:
    return count_elements * 2 * heads / gpu.hbm_bandwidth / t_mma  # 16-bit numbers


def _split_smem(scheme: str, gpu: GPU, Br: int, Bc: int, d: int) -> float:
    """Chapter 5's shared-memory bytes per K/V block (operands, plus split-K's exchange),
    in cycles, over the tile's MMA cycles."""
    exchange = warp_exchange(scheme, Br, d)
    moved = operand_reads(scheme, Br, Bc, d) + exchange["bytes_written"] + exchange["bytes_read"]
    return moved / gpu.smem_bytes_per_cycle / cycles.forward_tile_cycles(gpu, Br, Bc, d)["mma"]


def migration(B: int = 1, H: int = 16, N: int = 8192, d: int = 128, block: int = 128,
              count_N: int = 1024) -> list[Stage]:
    """The four stages of the book, each as ratios to the tensor-core time (see the module docstring).

    Parameters
    ----------
    B, H, N, d : the shape of the forward pass (batch, heads, sequence length, head dimension).
    block : Br = Bc of the tiles in the grid, shared-memory and cycle models.
    count_N : sequence length on which chapter 5's non-matmul operations are counted (by
        running the loops); the count per tile does not depend on N, except for v2's one
        division per row, whose share only shrinks as N grows.
    """
    heads = B * H
    v1, v2 = (count_nonmatmul(v, count_N, d, block, block) for v in (1, 2))

    def t_mma(gpu: GPU) -> float:  # seconds the tensor cores need for the pass: 2 matmuls x 2 N^2 d
        return 4 * N * N * d * heads / gpu.peak_flops("bf16")

    def nonmatmul(counts: dict, gpu: GPU) -> float:
        cost = matmul_equivalent(counts, gpu, "bf16")
        return cost["nonmatmul_s"] / cost["matmul_s"]

    def idle(partition: str, gpu: GPU) -> float:
        return 1 / schedule(partition, B, H, N, block, sm_count=gpu.sm_count, tile_time=1.0).utilisation

    def tile(gpu: GPU) -> dict:
        return cycles.forward_tile_cycles(gpu, block, block, d)

    def floor(gpu: GPU) -> float:  # Q, K, V read once, O written once
        return _hbm(4 * N * d, heads, gpu, t_mma(gpu))

    a100 = tile(A100)
    standard = Stage(
        2022, A100, "standard attention", "FlashAttention: tiles, one fused pass",
        before={"hbm": _hbm(count_standard(N, d, _smem_gpu(A100)).total, heads, A100, t_mma(A100)),
                "exp": a100["exp"] / a100["mma"]},
        after={"hbm": _hbm(count_flash(N, d, _smem_gpu(A100)).total, heads, A100, t_mma(A100))},
    )
    flash1 = Stage(
        2022, A100, "FlashAttention", "FlashAttention-2: divide the work better",
        before={"hbm": standard.after["hbm"], "grid": idle("v1", A100),
                "smem_fwd": _split_smem("split_k", A100, block, block, d),
                "nonmatmul": nonmatmul(v1, A100), "exp": a100["exp"] / a100["mma"],
                "turns": (a100["mma"] + a100["exp"]) / a100["mma"]},
        after={"hbm": floor(A100), "grid": idle("v2", A100),
               "smem_fwd": _split_smem("split_q", A100, block, block, d), "nonmatmul": nonmatmul(v2, A100)},
    )
    h100 = tile(H100)
    flash2 = Stage(
        2024, H100, "FlashAttention-2", "FlashAttention-3: overlap the units",
        before={"hbm": floor(H100), "grid": idle("v2", H100), "smem_fwd": h100["smem"] / h100["mma"],
                "nonmatmul": nonmatmul(v2, H100), "exp": h100["exp"] / h100["mma"],
                "turns": (h100["mma"] + h100["exp"]) / h100["mma"]},
        after={"turns": max(h100["mma"], h100["exp"]) / h100["mma"]},
    )
    b200 = tile(B200)
    backward = cycles.backward_tile_cycles(B200, block, block, d)
    two_cta = cycles.backward_tile_cycles(B200, block, block, d, two_cta=True)
    flash3 = Stage(
        2026, B200, "FlashAttention-3's schedule", "FlashAttention-4: software exp2, 2-CTA",
        before={"hbm": floor(B200), "grid": idle("v2", B200), "smem_fwd": b200["smem"] / b200["mma"],
                "smem_bwd": backward["smem"] / backward["mma"], "nonmatmul": nonmatmul(v2, B200),
                "exp": b200["exp"] / b200["mma"]},
        after={"smem_bwd": two_cta["smem"] / two_cta["mma"],
               "exp": cycles.exp_split_cycles(B200, 0.25, block, block)["exp"] / b200["mma"]},
        notes={"turns": "overlapped by FA-3's schedule"},
    )
    return [standard, flash1, flash2, flash3]


def migration_rows(stages: list[Stage]) -> list[list[str]]:
    """:func:`migration` as table rows (header first) for ``generations.render_table``: one
    row per unit, one column per stage, "before -> after" where the next answer moved it."""
    short = {"standard attention": "standard", "FlashAttention": "FA", "FlashAttention-2": "FA-2",
             "FlashAttention-3's schedule": "FA-3"}
    unit = {key: label.split(" (")[0] for key, (label, _) in ROWS.items()}
    rows = [["time / tensor-core time"] + [f"{s.gpu.name.split()[0]} {s.year}" for s in stages]]
    for key, (label, _) in ROWS.items():
        rows.append([label] + ["-" if key not in s.before else f"{s.before[key]:.2f}"
                               + (f" → {s.after[key]:.2f}" if key in s.after else "") for s in stages])
    rows.append(["kernel running"] + [short[s.kernel] for s in stages])
    rows.append(["slowest unit"] + [unit[s.bottleneck] for s in stages])
    return rows


def growth_rows(gpus: list[GPU], base: GPU = A100) -> list[list[str]]:
    """Each unit's rate on ``gpus`` relative to ``base``, as table rows (header first):
    tensor cores, HBM, fp32, shared memory and MUFU exponentials (chip totals)."""
    units = {"tensor cores, 16-bit (FLOP/s)": lambda g: g.peak_flops("bf16"),
             "HBM bandwidth (bytes/s)": lambda g: g.hbm_bandwidth,
             "fp32 arithmetic (FLOP/s)": lambda g: g.fp32_flops,
             "shared memory, all SMs (bytes/s)": lambda g: g.sm_count * g.smem_bytes_per_cycle * g.clock_hz,
             "exponentials, MUFU (exp/s)": lambda g: g.exp_per_second}
    rows = [[f"speed relative to the {base.name.split()[0]}"] + [g.name.split()[0] for g in gpus]]
    for label, rate in units.items():
        rows.append([label] + [f"{rate(g) / rate(base):.2f}×" for g in gpus])
    return rows


def bottleneck_migration(B: int = 1, H: int = 16, N: int = 8192, d: int = 128) -> Figure:
    """Four panels, one per stage of :func:`migration`: a bar per unit, the time it alone
    would need divided by the tensor-core time (log scale). The slowest unit is drawn
    solid and named under the panel; hollow markers show the next generation's answer."""
    stages = migration(B, H, N, d)
    keys = list(ROWS)
    fig, axes = plt.subplots(1, len(stages), figsize=(14, 5.4), sharey=True, layout="constrained")
    lo, hi = 0.03, 12.0
    for ax, stage in zip(axes, stages):
        top = stage.bottleneck
        for y, key in enumerate(keys):
            if key not in stage.before:
                ax.text(lo * 1.15, y, stage.notes.get(key, "not modelled"), va="center", fontsize=9, color="0.45")
                continue
            value, colour = stage.before[key], ROWS[key][1]
            ax.barh(y, value - lo, left=lo, height=0.62, color=colour, alpha=1.0 if key == top else 0.38,
                    edgecolor="black" if key == top else "none", linewidth=1.2,
                    hatch="//" if key == "smem_bwd" else None)
            ax.text(value * 1.08, y, f"{value:.2f}", va="center", fontsize=9.5,
                    fontweight="bold" if key == top else "normal")
            if key in stage.after:  # the next generation's answer moves this unit to stage.after[key]
                new = stage.after[key]
                ax.annotate("", xy=(new, y), xytext=(value, y),
                            arrowprops=dict(arrowstyle="->", color="0.1", lw=1.1, shrinkA=0, shrinkB=4))
                ax.plot([new], [y], "o", ms=6.5, mfc="white", mec="0.1", mew=1.3)
        ax.axvline(1.0, color="0.2", ls="--", lw=1.1)
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(FixedLocator([0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels(["0.05", "0.1", "0.25", "0.5", "1", "2", "5", "10"], fontsize=9.5)
        ax.set_title(f"{stage.year} · {stage.gpu.name.split()[0]}\n{stage.kernel}", loc="left", fontsize=11)
        slowest = f"slowest: {ROWS[top][0].split(' (')[0]}, {stage.before[top]:.2f}"
        ax.set_xlabel(textwrap.fill(slowest, 40) + "\n" + textwrap.fill(f"→ {stage.answer}", 38), fontsize=10)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_yticks(range(len(keys)), [ROWS[k][0] for k in keys])
    axes[0].invert_yaxis()
    handles = [Line2D([], [], color="0.2", ls="--", label="1 = the tensor cores' own time for the matmuls"),
               Line2D([], [], marker="o", ls="-", color="0.1", mfc="white", label="after the next generation's answer")]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, frameon=False, fontsize=10)
    fig.suptitle(f"The bottleneck migrates. Time each unit alone would need for one forward pass "
                 f"(B={B}, H={H}, N={N}, d={d}), divided by the tensor-core time", fontsize=11.5)
    return fig
