"""Tile-cycle model: how many clock cycles each unit of one SM needs for one attention tile.

FlashAttention-4 (Zadouri et al., 2026, §2-3) starts
with a "feeds and speeds" count. For one tile (a Q block of Br rows against a K/V
block of Bc rows, head dimension d) each unit of an SM needs

    cycles(unit) = work of the tile / work the unit does per SM per cycle

and the slowest unit sets the pace, if the others overlap with it perfectly:

    MMA  : matmul FLOPs / mma_flops_per_cycle          (tensor cores)
    exp  : Br * Bc exponentials / mufu_exp_per_cycle    (MUFU)
    SMEM : bytes read and written in shared memory / smem_bytes_per_cycle

The per-cycle rates come from :mod:`flashlab.hardware` (each with its source). The
matmul FLOPs follow from the shapes. The shared-memory bytes follow from the
*operand table* below: for each matmul, which operand the tensor core reads from
shared memory (SMEM) and which from tensor memory (TMEM, Blackwell only). On
Blackwell (tcgen05.mma) the accumulator lives in TMEM, the B operand is always read
from SMEM, and the A operand from SMEM or TMEM. On Hopper, read "tmem" as
"registers" (wgmma takes A from registers or SMEM), so the same table applies.

The backward operand table is our reconstruction: the sources give only the totals
(3328 SMEM cycles, 2688 with 2-CTA, 2560 MMA cycles for B200, Br = Bc = d = 128).
The table below is the simplest assignment consistent with FA4's dataflow that
reproduces both totals from bytes and rates; treat the individual rows as a model.

2-CTA mode (FlashAttention-4 paper): two CTAs on neighbouring SMs run one M = 256 MMA together;
each CTA keeps its own A (its 128 rows) and holds half of B, so each SM reads half of
every B operand.

Glossary: MMA = matrix multiply-accumulate on tensor cores (矩阵乘); MUFU = special
function unit (特殊函数单元); SMEM = shared memory (共享内存); TMEM = tensor memory
(张量内存); CTA = thread block (线程块); operand A is M x K, B is K x N (of C = A B).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._validate import positive_int
from .hardware import GPU

__all__ = ["Matmul", "forward_matmuls", "backward_matmuls", "forward_tile_cycles",
           "backward_tile_cycles", "exp_split_cycles", "FMA_PER_CYCLE", "FMA_SOURCE",
           "ALU_PER_CYCLE", "ALU_SOURCE"]

BF16_BYTES = 2  # P, dS, Q, K, V, dO are 16-bit operands
FP32_BYTES = 4  # the dQ partial sum is float32

# Not in flashlab.hardware (it would be a new GPU attribute): ordinary fp32 FMA lanes per SM.
FMA_PER_CYCLE = 128
FMA_SOURCE = ("CUDA C++ Programming Guide, 'Arithmetic Instructions' throughput table: 128 results "
              "per clock per SM for 32-bit floating-point add/multiply/multiply-add on compute capability 9.0 and 10.x")
# Integer lanes per SM: shifts and integer adds run on the ALU pipe, not the FMA pipe.
ALU_PER_CYCLE = 64
ALU_SOURCE = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper: 64 INT32 lanes per SM (16 in each "
              "of its four partitions) beside 128 FP32; Nsight Compute's Kernel Profiling Guide, "
              "'Pipelines': the ALU pipe executes integer instructions except IMAD and IMUL, the FMA "
              "pipe FADD, FMUL and FFMA. B200 is assumed to have the same integer rate")


@dataclass(frozen=True)
class Matmul:
    """One matmul C (M x N) += A (M x K) B (K x N) of a tile, and where its operands live.

    a_from, b_from : "smem" or "tmem" (B is always "smem" on Blackwell)
    extra_smem_bytes : other shared-memory traffic this step causes (stores, TMA reads)
    note : what the extra traffic is
    """

    name: str
    M: int
    N: int
    K: int
    a: str
    b: str
    a_from: str
    b_from: str = "smem"
    extra_smem_bytes: int = 0
    note: str = ""

    @property
    def flops(self) -> int:
        """2 M N K: one multiply and one add per term."""
        return 2 * self.M * self.N * self.K

    def smem_bytes(self, two_cta: bool = False) -> float:
        """Bytes this matmul moves through SMEM on one SM (A: M x K, B: K x N, 16-bit)."""
        a = self.M * self.K * BF16_BYTES if self.a_from == "smem" else 0
        b = self.K * self.N * BF16_BYTES if self.b_from == "smem" else 0
        if two_cta:
            b = b / 2  # 2-CTA: each SM holds and reads half of B
        return a + b + self.extra_smem_bytes


def forward_matmuls(Br: int = 128, Bc: int = 128, d: int = 128) -> list[Matmul]:
    """The two matmuls of a forward tile (FA4 forward; FlashAttention Algorithm 1 lines 9, 12)."""
    return [
        Matmul("S = Q K^T", Br, Bc, d, "Q", "K^T", "smem"),  # Q and K loaded by TMA into SMEM
        Matmul("O += P V", Br, d, Bc, "P", "V", "tmem"),  # P written to TMEM by the softmax warps
    ]


def backward_matmuls(Br: int = 128, Bc: int = 128, d: int = 128) -> list[Matmul]:
    """The five matmuls of a backward tile, K_j, V_j stationary (Bc rows) and Q_i, dO_i streamed (Br rows).

    Reconstructed operand table (see the module docstring): S^T and dP^T are computed
    transposed so that the stationary K, V are the A operands; P^T and dS^T go to TMEM
    as A operands of dV and dK; dS is also stored to SMEM for dQ = dS K; the float32 dQ
    partial is staged in SMEM (written, then read by the TMA reduce-add to global memory).
    """
    return [
        Matmul("S^T = K Q^T", Bc, Br, d, "K", "Q^T", "smem"),
        Matmul("dP^T = V dO^T", Bc, Br, d, "V", "dO^T", "smem"),
        Matmul("dV += P^T dO", Bc, d, Br, "P^T", "dO", "tmem"),
        Matmul("dK += dS^T Q", Bc, d, Br, "dS^T", "Q", "tmem",
               extra_smem_bytes=Br * Bc * BF16_BYTES, note="dS stored to SMEM for dQ"),
        Matmul("dQ = dS K", Br, d, Bc, "dS", "K", "smem",
               extra_smem_bytes=2 * Br * d * FP32_BYTES, note="fp32 dQ staged in SMEM: write + TMA read"),
    ]


def _tile(Br: int, Bc: int, d: int) -> tuple[int, int, int]:
    return positive_int("Br", Br), positive_int("Bc", Bc), positive_int("d", d)


def _cycles(gpu: GPU, matmuls, exps: int, two_cta: bool) -> dict[str, float]:
    """Cycles of each unit for one tile: work divided by the unit's per-SM per-cycle rate."""
    flops = sum(m.flops for m in matmuls)
    smem_bytes = sum(m.smem_bytes(two_cta) for m in matmuls)
    out = {
        "mma": flops / gpu.mma_flops_per_cycle,
        "exp": exps / gpu.mufu_exp_per_cycle,
        "smem": smem_bytes / gpu.smem_bytes_per_cycle,
        "flops": flops,
        "exps": exps,
        "smem_bytes": smem_bytes,
    }
    out["bound"] = max(("mma", "exp", "smem"), key=lambda u: out[u])
    return out


def forward_tile_cycles(gpu: GPU, Br: int = 128, Bc: int = 128, d: int = 128) -> dict[str, float]:
    """Cycles per forward tile on one SM: MMA, exp (MUFU) and SMEM.

    Returns
    -------
    dict with "mma", "exp", "smem" (cycles), "flops", "exps", "smem_bytes" and
    "bound" (the name of the slowest unit; "mma" on a tie).
    """
    Br, Bc, d = _tile(Br, Bc, d)
    # 2 matmuls x 2 Br Bc d FLOPs; one exp2 per score
    return _cycles(gpu, forward_matmuls(Br, Bc, d), exps=Br * Bc, two_cta=False)


def backward_tile_cycles(gpu: GPU, Br: int = 128, Bc: int = 128, d: int = 128,
                         two_cta: bool = False) -> dict[str, float]:
    """Cycles per backward tile on one SM: MMA (5 matmuls), exp (recomputing P) and SMEM.

    Parameters
    ----------
    two_cta : Blackwell's 2-CTA MMA mode, in which each SM reads half of every B operand.

    Returns
    -------
    dict as :func:`forward_tile_cycles`.
    """
    Br, Bc, d = _tile(Br, Bc, d)
    if two_cta and gpu.tmem_per_sm == 0:
        raise ValueError(f"two_cta needs a Blackwell GPU (tmem_per_sm > 0); got {gpu.name} with tmem_per_sm=0")
    # 5 matmuls x 2 Br Bc d FLOPs; P = exp2(S - LSE) recomputed, one exp2 per score
    return _cycles(gpu, backward_matmuls(Br, Bc, d), exps=Br * Bc, two_cta=two_cta)


def exp_split_cycles(gpu: GPU, fraction: float, Br: int = 128, Bc: int = 128,
                     fma_ops: int = 6, alu_ops: int = 2, fma_per_cycle: int = FMA_PER_CYCLE,
                     alu_per_cycle: int = ALU_PER_CYCLE) -> dict[str, float]:
    """Split a tile's exponentials between MUFU and a software polynomial on the FMA and ALU pipes.

    ``fraction`` of the Br * Bc exps use the polynomial; the rest use MUFU. Each software
    exp2 costs ``fma_ops`` FMA-pipe instructions and ``alu_ops`` ALU-pipe instructions. The
    defaults are FA4's ``ex2_emulation``: three fp32 adds (range reduction by a rounding add)
    and three Horner FMAs on the FMA pipe; a shift and an integer add (n << 23 into the
    exponent field) on the ALU pipe. The pipes run side by side, so the exp stage takes
    max(mufu, fma, alu) cycles. This model ignores the other softmax work (scaling, row max
    and sum, conversion to bf16) on the same pipes, and that all pipes share the SM's issue
    slots.

    Returns
    -------
    dict with "mufu", "fma", "alu" and "exp" = the largest of the three (cycles)
    """
    if not 0.0 <= float(fraction) <= 1.0:
        raise ValueError(f"fraction must be in [0, 1]; got {fraction!r}")
    exps = _tile(Br, Bc, 1)[0] * Bc
    mufu = (1.0 - fraction) * exps / gpu.mufu_exp_per_cycle
    soft = fraction * exps  # exponentials computed by the polynomial
    fma = soft * _count("fma_ops", fma_ops) / positive_int("fma_per_cycle", fma_per_cycle)
    alu = soft * _count("alu_ops", alu_ops) / positive_int("alu_per_cycle", alu_per_cycle)
    return {"mufu": mufu, "fma": fma, "alu": alu, "exp": max(mufu, fma, alu)}


def _count(name: str, value: int) -> int:
    """A non-negative whole number of instructions."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0; got {value!r}")
    return value
