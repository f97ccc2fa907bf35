"""How the work of attention is divided among SMs, and among the warps of one SM.

Two models for chapter 5 (FlashAttention-2 §3.2-3.3):

1. **The grid** (:func:`schedule`). A kernel launches programs (thread blocks); the
   GPU places each on a free slot of an SM and gives the next one to the first slot
   that frees up. FlashAttention v1 launches one program per (batch, head), which
   loops over all Tr = ceil(N / Br) query blocks of its head; FlashAttention-2 launches
   one program per (batch, head, query block). With B x H smaller than the number of
   SMs, v1 leaves SMs idle however long the sequence is. When the programs do not
   divide evenly into the slots, the last *wave* runs partly empty: wave quantisation.

       programs  P = B * H (v1)   or   B * H * Tr (v2)
       slots     = sm_count * programs_per_sm
       waves     = ceil(P / slots)                     (equal programs)
       time      = waves * (tiles per program) * tile_time
       utilisation = busy slot-time / (slots * time)  <= 1

   With ``causal=True`` the programs differ in length (query block i visits about
   i + 1 key blocks); the schedule is then simulated program by program.

2. **Inside one program** (:func:`warp_exchange`, :func:`operand_reads`). The program's warps split a
   Br x Bc tile. v1 splits K/V across warps ("split-K"): each warp produces partial
   row maxima, sums and a partial O for *all* Br rows, which must be exchanged through
   shared memory and summed, with barriers in between. v2 splits Q ("split-Q"): each
   warp owns Br / warps rows and finishes them alone; nothing is exchanged.

These are models, not measurements: they leave out memory bandwidth, caches, the
tail effect of the last wave's partially filled SMs on clock speed, and anything the
compiler does. Their job is to make the two effects visible and countable.

Glossary: SM = streaming multiprocessor (流式多处理器); program = thread block, CTA
(线程块); slot = room for one resident program on an SM; wave = one round of programs
filling the slots (一波); warp = 32 threads executing in lockstep (线程束); barrier =
__syncthreads, every warp waits for all (同步); Br, Bc = query rows, keys per block.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from .._validate import positive_float, positive_int

__all__ = ["Schedule", "programs", "schedule", "warp_exchange", "operand_reads"]


@dataclass(frozen=True)
class Schedule:
    """Predicted execution of one kernel launch.

    Attributes
    ----------
    partition : "v1" (one program per batch x head) or "v2" (per batch x head x query block).
    programs : number of programs launched.
    slots : sm_count x programs_per_sm, programs that can run at once.
    busy_sms : SMs that receive at least one program.
    waves : ceil(programs / slots), rounds of programs.
    time_s : predicted run time (the last program's end).
    utilisation : busy slot-time / (slots x time_s), in (0, 1].
    """

    partition: str
    programs: int
    slots: int
    busy_sms: int
    waves: int
    time_s: float
    utilisation: float


def programs(partition: str, batch: int, heads: int, N: int, Br: int, Bc: int | None = None,
             causal: bool = False) -> list[int]:
    """Tiles (Br x Bc blocks of scores) each program computes, in launch order.

    Parameters
    ----------
    partition : "v1" or "v2".
    batch, heads : B and H.
    N : sequence length (N_q = N_k).
    Br, Bc : query rows per block and keys per block (Bc defaults to Br).
    causal : if True, query block i visits only key blocks that start at or before its
        last row.
    """
    if partition not in ("v1", "v2"):
        raise ValueError(f"partition must be 'v1' or 'v2'; got {partition!r}")
    batch, heads, N, Br = (positive_int(n, x) for n, x in (("batch", batch), ("heads", heads), ("N", N), ("Br", Br)))
    Bc = Br if Bc is None else positive_int("Bc", Bc)
    Tr, Tc = math.ceil(N / Br), math.ceil(N / Bc)  # query blocks, key blocks
    per_block = [min(Tc, math.ceil(min(N, (i + 1) * Br) / Bc)) if causal else Tc for i in range(Tr)]
    if partition == "v1":
        return [sum(per_block)] * (batch * heads)  # one program loops over all Tr query blocks
    return per_block * (batch * heads)  # one program per query block


def schedule(partition: str, batch: int, heads: int, N: int, Br: int, sm_count: int, tile_time: float,
             Bc: int | None = None, causal: bool = False, programs_per_sm: int = 1) -> Schedule:
    """Predict the run time and SM utilisation of a FlashAttention forward launch.

    Programs are handed out in launch order, each to the slot that frees up first
    (a list schedule, as the GPU's block scheduler does).

    Parameters
    ----------
    partition, batch, heads, N, Br, Bc, causal : as for :func:`programs`.
    sm_count : SMs on the GPU (A100: 108; H100/H200: 132).
    tile_time : seconds one program spends on one Br x Bc tile.
    programs_per_sm : programs resident on one SM at once (``tile_time`` is the time
        per tile at that occupancy).
    """
    sm_count = positive_int("sm_count", sm_count)
    programs_per_sm = positive_int("programs_per_sm", programs_per_sm)
    tile_time = positive_float("tile_time", tile_time)
    work = programs(partition, batch, heads, N, Br, Bc, causal)
    slots = sm_count * programs_per_sm
    free = [0.0] * min(slots, len(work))  # finish time of each slot in use; a heap
    for tiles in work:  # launch order
        start = heapq.heappop(free)
        heapq.heappush(free, start + tiles * tile_time)
    time_s = max(free)
    busy = sum(work) * tile_time
    return Schedule(
        partition=partition,
        programs=len(work),
        slots=slots,
        busy_sms=min(len(work), sm_count),
        waves=math.ceil(len(work) / slots),
        time_s=time_s,
        utilisation=busy / (slots * time_s),
    )


def warp_exchange(scheme: str, Br: int, d: int, warps: int = 4, bytes_per_number: int = 4) -> dict[str, int]:
    """Shared-memory traffic and barriers per K/V block spent on *exchanging* results
    between the warps of one program.

    split-K (FlashAttention v1): warps split the Bc keys; every warp holds partial
    statistics for all Br rows. Per K/V block:

        row max   each warp writes Br numbers; barrier; each warp reads all warps' Br
                  (it needs the common max to rescale its own exponentials)
        row sum   each warp writes Br partial sums; partial O: each writes Br x d;
                  barrier; the sums and partial O are read once and added
        reuse     barrier before the buffers are overwritten by the next block

    split-Q (FlashAttention-2): warps split the Br rows; each finishes its rows alone.
    Nothing is exchanged. Loading the K_j, V_j tiles into shared memory (and its barrier)
    is the same in both and left out.

    Parameters
    ----------
    scheme : "split_k" or "split_q".
    Br : query rows of the tile; d : head dimension; warps : warps per program.
    bytes_per_number : 4 for fp32 partial results.

    Returns
    -------
    dict with "bytes_written", "bytes_read", "barriers".
    """
    if scheme not in ("split_k", "split_q"):
        raise ValueError(f"scheme must be 'split_k' or 'split_q'; got {scheme!r}")
    Br, d, warps, nb = (positive_int(n, x) for n, x in (("Br", Br), ("d", d), ("warps", warps),
                                                          ("bytes_per_number", bytes_per_number)))
    if scheme == "split_q":
        if Br % warps:
            raise ValueError(f"split-Q gives each warp Br / warps rows: Br must be a multiple of warps={warps}; got Br={Br}")
        return {"bytes_written": 0, "bytes_read": 0, "barriers": 0}
    written = warps * Br + warps * Br + warps * Br * d  # partial max, partial sum, partial O
    read = warps * (warps * Br) + warps * Br + warps * Br * d  # every warp reads all maxima; sums, O once
    return {"bytes_written": written * nb, "bytes_read": read * nb, "barriers": 3}


def operand_reads(scheme: str, Br: int, Bc: int, d: int, warps: int = 4, bytes_per_number: int = 2) -> int:
    """Shared-memory bytes the warps of one program read as matmul *operands* per K/V block.

    Both schemes read their operands from shared memory; only split-K also exchanges
    results (:func:`warp_exchange`). Per K/V block:

        split-K   every warp reads all of Q_i (Br x d) for its slice of S = Q_i K_j^T,
                  plus its own 1/warps of K_j and of V_j      -> warps Br d + 2 Bc d
        split-Q   every warp keeps its Br / warps rows of Q_i in registers for the
                  whole loop, and reads all of K_j and V_j     -> warps 2 Bc d

    Parameters
    ----------
    scheme : "split_k" or "split_q".
    Br, Bc : query rows and keys of the tile; d : head dimension; warps : warps per program.
    bytes_per_number : 2 for 16-bit operands.
    """
    if scheme not in ("split_k", "split_q"):
        raise ValueError(f"scheme must be 'split_k' or 'split_q'; got {scheme!r}")
    Br, Bc, d, warps, nb = (positive_int(n, x) for n, x in (("Br", Br), ("Bc", Bc), ("d", d), ("warps", warps),
                                                              ("bytes_per_number", bytes_per_number)))
    if scheme == "split_k":
        return (warps * Br * d + 2 * Bc * d) * nb
    return warps * 2 * Bc * d * nb
