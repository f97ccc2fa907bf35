"""FlashAttention-3's ping-pong, measured inside the Gluon kernel: when each partition of one tile
begins each phase of each key block (FA3 §3.1, Figure 1; chapter 6).

    python -m flashlab.lab.experiments fa3timeline --out results

The kernel (:mod:`flashlab.kernels.fa3`) is built with ``STAMPS=True``: one thread of each
partition reads the SM's cycle counter (``%clock64``) and the GPU's nanosecond
timer (``%globaltimer``) at the start of every phase (:data:`~flashlab.kernels.fa3.STAMP_PHASES`)
and writes both to a buffer when the tile in hand is the stamped one. A phase ends where the partition's next phase begins, in the order
the kernel runs them (:func:`program_order`). All partitions of a program run on one SM and read
one cycle counter, so the intervals are taken in cycles and turned into microseconds with the
rate that a least-squares line through (cycles, timer) pairs of the whole tile gives: the timer
alone may tick more coarsely than one phase lasts.

Shape: bf16, d = 128, N = 8192, non-causal, the papers' (B, H) = (2, 16); the stamped tile is
query tile 0 of batch-head B H / 2, which a persistent program takes mid-run (its eighth tile on
132 SMs), with the GPU full around it. Writes
``fa3_timeline_<gpu>.csv`` (partition, block, phase, start_us, end_us; time 0 is the tile's first
stamp) and ``.json`` (the provenance, the clock rate, the stamped and unstamped kernel's median
time, and the two ping-pong checks of :func:`interleaving`). About half a minute on an H200,
most of it the two compiles.

    python -m flashlab.lab.experiments fp8timeline --out results

does the same for the FP8 kernel (:mod:`flashlab.kernels.fa3_fp8`, its default switches) on
the same inputs quantised, at 128 keys a block with P in registers: ``fa3_fp8_timeline_<gpu>``;
``fp8timeline256`` for its 256-key build, P through shared memory (d = 128's default):
``fa3_fp8_psmem_timeline_<gpu>``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import triton

from flashlab.kernels import fa3
from flashlab.lab.measure import gpu_tag, paper_shape, provenance, time_ms

__all__ = ["COLUMNS", "D", "N", "gemm_us", "interleaving", "period", "phase_means", "phases", "program_order", "run",
           "run_fp8", "run_fp8_psmem", "stamped_forward", "stamped_fp8_forward"]

D, N = 128, 8192  # the paper's ablation shape (FA3 §4.3)
COLUMNS = ("partition", "block", "phase", "start_us", "end_us")
_PHASE = {name: p for p, name in enumerate(fa3.STAMP_PHASES)}


def stamped_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    at: tuple[int, int] = (0, 0)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`flashlab.kernels.fa3.forward` (non-causal, ping-pong and overlap on) built with time
    stamps, tile ``at`` = (query tile, batch-head) stamping. Returns o and lse2 as ``forward``
    does, and the stamps, int64 (n_blocks + 1, len(STAMP_PHASES), 3 partitions, 2): (%globaltimer
    ns, %clock64 cycles) where the partition began that phase of that key block, 0 where none."""
    stamps, stamp_at = _stamp_buffer(q, k, fa3.config(q.shape[-1]), at)
    o, lse2 = fa3.forward(q, k, v, False, pingpong=True, overlap=True, stamps=stamps, stamp_at=stamp_at)
    return o, lse2, stamps


def _stamp_buffer(q: torch.Tensor, k: torch.Tensor, c: dict, at: tuple[int, int]) -> tuple[torch.Tensor, int]:
    """A zeroed int64 stamp buffer (n_blocks + 1, len(STAMP_PHASES), 3, 2) for q (B, H, N_q, d)
    and k (B, H, N_k, d) in tiles of ``c`` (a kernel's config), and the persistent kernels'
    number of tile ``at`` = (query tile, batch-head), which must be one of the grid's."""
    B, H, N_Q, _ = q.shape
    grid = (triton.cdiv(N_Q, 2 * c["BLOCK_M"]), B * H)
    tile, bh = at
    if not (0 <= tile < grid[0] and 0 <= bh < grid[1]):
        raise ValueError(f"at must name a tile (query tile, batch-head) of {grid}; got {at}")
    n_blocks = triton.cdiv(k.shape[2], c["BLOCK_N"])
    stamps = torch.zeros((n_blocks + 1, len(fa3.STAMP_PHASES), 3, 2), device=q.device, dtype=torch.int64)
    return stamps, tile + bh * grid[0]


def stamped_fp8_forward(pre: dict[str, object], at: tuple[int, int] = (0, 0), p_smem: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`flashlab.kernels.fa3_fp8.forward` (non-causal, its default switches) built with time
    stamps, ``pre`` the inputs as :func:`flashlab.kernels.fp8.quantize_qkv` returns them, tile
    ``at`` = (query tile, batch-head) stamping; ``p_smem`` as ``forward`` takes it (False: 128-key
    blocks, P in registers; True: 256-key blocks, P through shared memory). Returns o, lse2 and
    the stamps as :func:`stamped_forward` does, in the same phases (P becomes e4m3 inside
    "issue_pv", or is stored to shared memory inside "convert")."""
    from flashlab.kernels import fa3_fp8

    shape = fa3_fp8._build_config(pre["q"].shape[-1], p_smem, None, None, stamps=True)  # the stamped build's tile
    stamps, stamp_at = _stamp_buffer(pre["q"], pre["k"], shape, at)
    o, lse2 = fa3_fp8.forward(**pre, causal=False, p_smem=p_smem, stamps=stamps, stamp_at=stamp_at)
    return o, lse2, stamps


def program_order(n_blocks: int, part: int) -> list[tuple[int, str]]:
    """(block, phase) of every stamp of partition ``part`` (0, 1: the consumers; 2: the producer)
    in the order :mod:`flashlab.kernels.fa3` takes them, "done" last."""
    if part == 2:
        order = [(0, "load_q")]
        for j in range(n_blocks):
            order += [(j, "wait_slot_k"), (j, "load_k"), (j, "wait_slot_v"), (j, "load_v")]
        return order + [(n_blocks, "done")]
    order = [(0, "wait_k"), (0, "wait_turn"), (0, "issue_s"), (0, "wait_s"), (0, "softmax"), (0, "convert")]
    for j in range(1, n_blocks):  # S_j issued, then P_{j-1} V_{j-1}; softmax of S_j under it
        order += [(j, "wait_k"), (j, "wait_turn"), (j, "issue_s"), (j - 1, "rescale"), (j - 1, "wait_v"),
                  (j - 1, "issue_pv"), (j, "wait_s"), (j, "softmax"), (j - 1, "wait_pv"), (j, "convert")]
    last = n_blocks - 1
    return order + [(last, "rescale"), (last, "wait_v"), (n_blocks, "wait_turn"), (last, "issue_pv"),
                    (last, "wait_pv"), (last, "write"), (n_blocks, "done")]


def _ns_per_cycle(stamps: np.ndarray) -> float:
    """Slope of %globaltimer (ns) against %clock64 (cycles) over every stamp taken."""
    taken = stamps[..., 1] > 0
    ns, cycles = stamps[..., 0][taken].astype(np.float64), stamps[..., 1][taken].astype(np.float64)
    if np.ptp(ns) <= 0 or np.ptp(cycles) <= 0:
        raise ValueError("the stamps must span some time to give a clock rate; got one instant")
    return float(np.polyfit(cycles - cycles.min(), ns - ns.min(), 1)[0])


def phases(stamps: torch.Tensor | np.ndarray, ns_per_cycle: float | None = None) -> list[dict[str, object]]:
    """The stamps of :func:`stamped_forward` as rows of :data:`COLUMNS`, one per phase, each
    partition's in :func:`program_order`; microseconds from the tile's first stamp, through
    the SM's cycle counter at ``ns_per_cycle`` (default: fitted against the timer). Raises if a
    stamp the kernel takes is missing."""
    s = stamps.cpu().numpy() if isinstance(stamps, torch.Tensor) else np.asarray(stamps)
    n_blocks = s.shape[0] - 1
    rate = _ns_per_cycle(s) if ns_per_cycle is None else ns_per_cycle
    c0 = s[..., 1][s[..., 1] > 0].min()
    rows: list[dict[str, object]] = []
    for part, name in enumerate(fa3.STAMP_PARTS):
        order = program_order(n_blocks, part)
        cycles = [int(s[j, _PHASE[phase], part, 1]) for j, phase in order]
        missing = [order[i] for i, c in enumerate(cycles) if c == 0]
        if missing:
            raise ValueError(f"{name}: the stamps must hold every phase the kernel takes; missing {missing[:4]}")
        us = [(c - c0) * rate / 1e3 for c in cycles]
        for (j, phase), start, end in zip(order, us, us[1:]):
            rows.append({"partition": name, "block": j, "phase": phase, "start_us": round(float(start), 4),
                         "end_us": round(float(end), 4)})
    return rows


def _spans(rows: list[dict[str, object]], partition: str, phase: str) -> dict[int, tuple[float, float]]:
    return {r["block"]: (r["start_us"], r["end_us"]) for r in rows
            if r["partition"] == partition and r["phase"] == phase}


def interleaving(rows: list[dict[str, object]], skip: int = 2) -> dict[str, float]:
    """Two measures of ping-pong on the steady blocks (the first and last ``skip`` left out):

    - ``softmax_alternation``: the two consumers' softmax phases, sorted by start, change
      consumer from one to the next in this share of the steps (1: c0, c1, c0, c1, ...);
    - ``softmax_under_other_gemm``: the share of softmax phases during which the other consumer
      has a GEMM of S in flight (from its issue to the end of its wait for it)."""
    c0, c1 = fa3.STAMP_PARTS[:2]
    soft = {p: _spans(rows, p, "softmax") for p in (c0, c1)}
    blocks = sorted(set(soft[c0]) & set(soft[c1]))
    steady = blocks[skip:len(blocks) - skip]
    if len(steady) < 2:
        raise ValueError(f"rows must hold at least {2 * skip + 2} key blocks of softmax; got {len(blocks)}")
    order = sorted((soft[p][j][0], p) for p in (c0, c1) for j in steady)
    changes = sum(a[1] != b[1] for a, b in zip(order, order[1:])) / (len(order) - 1)
    covered = []
    for me, other in ((c0, c1), (c1, c0)):
        issue, wait = _spans(rows, other, "issue_s"), _spans(rows, other, "wait_s")
        in_flight = [(issue[j][0], wait[j][1]) for j in issue if j in wait]
        for j in steady:
            a, b = soft[me][j]
            covered.append(any(s < b and e > a for s, e in in_flight))
    return {"softmax_alternation": round(changes, 3), "softmax_under_other_gemm": round(float(np.mean(covered)), 3)}


def softmax_overlap(rows: list[dict[str, object]], skip: int = 2) -> float:
    """The share of consumer 0's softmax time, over its steady blocks (the first and last ``skip``
    left out), during which consumer 1 is in a softmax of its own (any of its blocks): 0 when
    the two take turns, 1 when they run in lockstep."""
    c0, c1 = fa3.STAMP_PARTS[:2]
    mine, other = _spans(rows, c0, "softmax"), list(_spans(rows, c1, "softmax").values())
    blocks = sorted(mine)
    steady = [mine[j] for j in blocks[skip:len(blocks) - skip]]
    if not steady:
        raise ValueError(f"rows must hold at least {2 * skip + 1} key blocks of softmax; got {len(blocks)}")
    both = sum(max(0.0, min(b, d) - max(a, c)) for a, b in steady for c, d in other)
    return round(float(both / sum(b - a for a, b in steady)), 3)


def phase_means(rows: list[dict[str, object]], skip: int = 2) -> dict[tuple[str, str], float]:
    """Mean duration in microseconds of each (partition, phase) over the steady key blocks
    (the first and last ``skip`` left out)."""
    last = max(int(r["block"]) for r in rows)
    spans: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if skip <= int(r["block"]) <= last - skip:
            spans.setdefault((r["partition"], r["phase"]), []).append(r["end_us"] - r["start_us"])
    return {key: float(np.mean(v)) for key, v in spans.items()}


def period(rows: list[dict[str, object]], skip: int = 2) -> float:
    """Microseconds from one key block to the next on the steady blocks: the mean step between
    consumer 0's issues of S (in that time each consumer takes one block)."""
    starts = sorted(start for start, _ in _spans(rows, fa3.STAMP_PARTS[0], "issue_s").values())
    steady = starts[skip:len(starts) - skip]
    if len(steady) < 2:
        raise ValueError(f"rows must hold at least {2 * skip + 2} key blocks; got {len(starts)}")
    return float(np.mean(np.diff(steady)))


def gemm_us(tflops: float, gemms: int = 1, sm_count: int = 132) -> float:
    """Microseconds that ``gemms`` GEMMs of one consumer's tile (BLOCK_M x BLOCK_N x d, as
    S = Q K^T or O += P V: 2 * 64 * 128 * 128 FLOPs each) take on one SM of a GPU that runs
    ``tflops`` TFLOP/s over ``sm_count`` SMs."""
    flops = 2 * fa3.BLOCK_M * fa3.BLOCK_N * D
    return gemms * flops / (tflops * 1e12 / sm_count) * 1e6


def run(out: Path, fp8: bool = False, p_smem: bool = False) -> list[Path]:
    """Stamp one tile at the paper's shape, check the output against the unstamped kernel, time
    both, and write ``fa3_timeline_<gpu>.csv/.json`` under ``out`` (``fp8``: the FP8 kernel on
    the same inputs quantised, one descale per 128 rows of Q and K and per head of V, with its
    default switches: ``fa3_fp8_timeline_<gpu>``; with ``p_smem``, its 256-key build, P through
    shared memory: ``fa3_fp8_psmem_timeline_<gpu>``)."""
    from flashlab.kernels import fa3_fp8
    from flashlab.kernels.fp8 import quantize_qkv
    from flashlab.lab.experiments import COMMAND, require_gpu
    from flashlab.lab.results import write

    require_gpu()
    B, H = paper_shape(N, D)
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    at = (0, B * H // 2)
    if fp8:
        pre = quantize_qkv(q, k, v, block=128, v_block=None)
        stamped = lambda: stamped_fp8_forward(pre, at=at, p_smem=p_smem)  # noqa: E731
        # unstamped, at the stamped build's tile (two consumers; Bc = 128, P in registers, or 256)
        plain = lambda: fa3_fp8.forward(**pre, causal=False, p_smem=p_smem)  # noqa: E731
        name = "fa3_fp8_psmem_timeline" if p_smem else "fa3_fp8_timeline"
        kernel = {"dtype": "float8_e4m3fn", "switches": fa3_fp8.SWITCHES[D],
                  "BLOCK_N": fa3_fp8._build_config(D, p_smem, None, None, stamps=True)["BLOCK_N"]}
    else:
        stamped = lambda: stamped_forward(q, k, v, at=at)  # noqa: E731
        plain = lambda: fa3.forward(q, k, v, False, pingpong=True, overlap=True)  # noqa: E731
        name, kernel = "fa3_timeline", {"dtype": "bfloat16"}
    for _ in range(3):  # compile, then warm the clocks and caches; the last run's stamps are kept
        o, lse2, stamps = stamped()
    torch.cuda.synchronize()
    o_plain, lse_plain = plain()
    same = bool(torch.equal(o, o_plain)) and bool(torch.equal(lse2, lse_plain))
    s = stamps.cpu().numpy()
    rate = _ns_per_cycle(s)
    rows = phases(s, rate)
    ticks = np.diff(np.unique(s[..., 0][s[..., 0] > 0]))
    command = ("fp8timeline256" if p_smem else "fp8timeline") if fp8 else "fa3timeline"
    argv = sys.argv[1:] if sys.argv and sys.argv[0].endswith("__main__.py") else [command, "--out", str(out)]
    meta = provenance(" ".join([COMMAND, *argv]))
    meta.update({
        "shape": {"B": B, "H": H, "N": N, "d": D, **kernel, "causal": False},
        "stamped_program": {"query_tile": at[0], "batch_head": at[1], "key_blocks": s.shape[0] - 1},
        "clock": "%clock64 of the SM (one counter for all partitions), scaled by a least-squares fit "
                 "against %globaltimer over the tile's stamps",
        "ns_per_cycle": round(rate, 5), "sm_clock_ghz": round(1 / rate, 3),
        "globaltimer_smallest_step_ns": int(ticks.min()) if ticks.size else None,
        "stamped_ms": round(time_ms(stamped, "cuda"), 4),
        "unstamped_ms": round(time_ms(plain, "cuda"), 4),
        "output_equals_unstamped": same,
        **interleaving(rows),
    })
    paths = write(f"{name}_{gpu_tag()}", rows, meta, out)
    for p in paths:
        print(p, flush=True)
    print({k: meta[k] for k in ("sm_clock_ghz", "stamped_ms", "unstamped_ms", "output_equals_unstamped",
                                 "softmax_alternation", "softmax_under_other_gemm")}, flush=True)
    return paths


def run_fp8(out: Path) -> list[Path]:
    """:func:`run` for the FP8 kernel (``python -m flashlab.lab.experiments fp8timeline``)."""
    return run(out, fp8=True)


def run_fp8_psmem(out: Path) -> list[Path]:
    """:func:`run` for the FP8 kernel's 256-key build, P through shared memory
    (``python -m flashlab.lab.experiments fp8timeline256``)."""
    return run(out, fp8=True, p_smem=True)
