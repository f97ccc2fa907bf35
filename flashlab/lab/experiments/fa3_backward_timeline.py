"""Where a step of the Gluon FlashAttention-3 backward spends its time: time stamps of each phase
of each query block, in one program, from inside the kernel (chapter 5's lab notes §3b).

    python -m flashlab.lab.experiments fa3bwdtimeline --out results

The kernel (:mod:`flashlab.kernels.fa3_backward`) is built with ``STAMPS=True``: one thread of
each consumer warpgroup reads the SM's cycle counter and the GPU's nanosecond timer where each
phase (:data:`~flashlab.kernels.fa3_backward.STAMP_PHASES`) of each step begins, in the stamped
program only. A phase ends where the next one begins; a step's "done" ends where the next step's
"wait_q" begins. Cycles are turned into microseconds with a least-squares fit against the timer,
as in :mod:`flashlab.lab.experiments.fa3_timeline`.

Shape: bf16, d = 128, N = 16384, non-causal, B = 1, H = 16 (the bench's shape); the stamped
program is key block 64 of head 8, in the middle of the run with the GPU full around it. Writes
``fa3_backward_timeline_<gpu>.csv`` (partition, block: the step's query block t, phase, start_us,
end_us; the forward's columns, so :func:`~flashlab.lab.experiments.fa3_timeline.phase_means`
serves both) and ``.json``
(provenance, the clock rate, the stamped and unstamped backward's median time, whether dK and dV
are bit-identical to the unstamped kernel's, the mean step, each phase's mean duration, and the
tensor cores' share of a step: the step's products at the matmul rate measured in the same run).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import triton

from flashlab.kernels import fa3_backward
from flashlab.lab.experiments.fa3_timeline import _ns_per_cycle, phase_means
from flashlab.lab.measure import gpu_tag, provenance, time_ms

__all__ = ["COLUMNS", "phase_means", "phases", "run", "stamped_backward", "step_period", "step_products_us"]

D, N, B, H = 128, 16384, 1, 16
COLUMNS = ("partition", "block", "phase", "start_us", "end_us")  # block: step t, query block lo + t


def stamped_backward(do, q, k, v, o, lse2, causal: bool, at: tuple[int, int]):
    """:func:`flashlab.kernels.fa3_backward.backward` built with time stamps, program ``at`` =
    (key block, batch-head) stamping. Returns (dq, dk, dv, stamps): int64 (query blocks,
    len(STAMP_PHASES), 2 consumers, 2) of (%globaltimer ns, %clock64 cycles), 0 where none."""
    n_key_blocks = triton.cdiv(k.shape[2], 2 * fa3_backward.BLOCK_M)
    block, bh = at
    if not (0 <= block < n_key_blocks and 0 <= bh < q.shape[0] * q.shape[1]):
        raise ValueError(f"at must name a program (key block, batch-head) of ({n_key_blocks}, "
                         f"{q.shape[0] * q.shape[1]}); got {at}")
    steps = triton.cdiv(q.shape[2], fa3_backward.BLOCK_M)
    stamps = torch.zeros((steps, len(fa3_backward.STAMP_PHASES), 2, 2), device=q.device, dtype=torch.int64)
    dq, dk, dv = fa3_backward.backward(do, q, k, v, o, lse2, causal, q.shape[-1] ** -0.5, stamps=stamps,
                                       stamp_at=block + bh * n_key_blocks)
    return dq, dk, dv, stamps


def phases(stamps: torch.Tensor | np.ndarray, ns_per_cycle: float | None = None) -> list[dict[str, object]]:
    """The stamps as rows of :data:`COLUMNS`, every phase of every step the program took, in the
    order the consumer takes them; microseconds from the program's first stamp. Raises if a step
    lacks one of its stamps."""
    s = stamps.cpu().numpy() if isinstance(stamps, torch.Tensor) else np.asarray(stamps)
    taken = s[:, 0, 0, 1] > 0  # steps whose first phase consumer 0 stamped
    n_steps = int(taken.sum())
    if n_steps == 0 or not taken[:n_steps].all():
        raise ValueError("stamps must hold steps 0, 1, ... of one program; got none, or gaps")
    rate = _ns_per_cycle(s[:n_steps]) if ns_per_cycle is None else ns_per_cycle
    c0 = s[:n_steps, ..., 1][s[:n_steps, ..., 1] > 0].min()
    rows: list[dict[str, object]] = []
    for part, name in enumerate(fa3_backward.STAMP_PARTS):
        order = [(t, p) for t in range(n_steps) for p in range(len(fa3_backward.STAMP_PHASES))]
        cycles = [int(s[t, p, part, 1]) for t, p in order]
        missing = [(t, fa3_backward.STAMP_PHASES[p]) for (t, p), c in zip(order, cycles) if c == 0]
        if missing:
            raise ValueError(f"{name}: the stamps must hold every phase of every step; missing {missing[:4]}")
        us = [(c - c0) * rate / 1e3 for c in cycles]
        for (t, p), start, end in zip(order, us, us[1:]):
            rows.append({"partition": name, "block": t, "phase": fa3_backward.STAMP_PHASES[p],
                         "start_us": round(float(start), 4), "end_us": round(float(end), 4)})
    return rows


def step_period(rows: list[dict[str, object]], skip: int = 2) -> float:
    """Mean microseconds from one step to the next on the steady steps (consumer 0's wait_q)."""
    starts = sorted(r["start_us"] for r in rows
                    if r["partition"] == fa3_backward.STAMP_PARTS[0] and r["phase"] == "wait_q")
    steady = starts[skip:len(starts) - skip]
    if len(steady) < 2:
        raise ValueError(f"rows must hold at least {2 * skip + 2} steps; got {len(starts)}")
    return float(np.mean(np.diff(steady)))


def step_products_us(tflops: float, d: int = D, sm_count: int = 132) -> float:
    """Microseconds one step's products take on one SM of a GPU running ``tflops`` TFLOP/s over
    ``sm_count`` SMs: per consumer S^T, dP^T, dV, dK and its share of dQ, five Br x Br x d products
    (2 * 64 * 64 * d FLOPs each), for two consumers."""
    flops = 2 * 5 * 2 * fa3_backward.BLOCK_M * fa3_backward.BLOCK_M * d
    return flops / (tflops * 1e12 / sm_count) * 1e6


def run(out: Path) -> list[Path]:
    """Stamp one program at the bench's shape, check dK and dV against the unstamped kernel, time
    both and a bf16 matmul, and write ``fa3_backward_timeline_<gpu>.csv/.json`` under ``out``."""
    from flashlab.kernels.fa3 import forward
    from flashlab.lab.bench import ceilings
    from flashlab.lab.experiments import COMMAND, require_gpu
    from flashlab.lab.results import write

    require_gpu()
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, D, generator=g).to("cuda", torch.bfloat16) for _ in range(4))
    o, lse2 = forward(q, k, v, False)
    at = (N // (4 * fa3_backward.BLOCK_M), B * H // 2)
    for _ in range(3):  # compile, then warm the clocks and caches; the last run's stamps are kept
        _, dk, dv, stamps = stamped_backward(do, q, k, v, o, lse2, False, at)
    torch.cuda.synchronize()
    _, dk_plain, dv_plain = fa3_backward.backward(do, q, k, v, o, lse2, False, D**-0.5)
    s = stamps.cpu().numpy()
    rate = _ns_per_cycle(s[s[:, 0, 0, 1] > 0])
    rows = phases(s, rate)
    matmul = [c for c in ceilings() if c["ceiling"].startswith("matmul")][0]
    tflops = matmul["value"] / 1e12
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    period = step_period(rows)
    argv = sys.argv[1:] if sys.argv and sys.argv[0].endswith("__main__.py") else ["fa3bwdtimeline", "--out", str(out)]
    meta = provenance(" ".join([COMMAND, *argv]))
    meta.update({
        "shape": {"B": B, "H": H, "N": N, "d": D, "dtype": "bfloat16", "causal": False},
        "stamped_program": {"key_block": at[0], "batch_head": at[1]},
        "ns_per_cycle": round(rate, 5), "sm_clock_ghz": round(1 / rate, 3),
        "stamped_ms": round(time_ms(lambda: stamped_backward(do, q, k, v, o, lse2, False, at), "cuda"), 4),
        "unstamped_ms": round(time_ms(lambda: fa3_backward.backward(do, q, k, v, o, lse2, False, D**-0.5),
                                      "cuda"), 4),
        "dk_dv_equal_unstamped": bool(torch.equal(dk, dk_plain) and torch.equal(dv, dv_plain)),
        "matmul_tflops": round(tflops, 1),
        "step_us": round(period, 4),
        "step_products_us": round(step_products_us(tflops, D, sm_count), 4),
        "phase_means_us": {f"{p}/{ph}": round(v, 4) for (p, ph), v in phase_means(rows).items()},
    })
    paths = write(f"fa3_backward_timeline_{gpu_tag()}", rows, meta, out)
    for p in paths:
        print(p, flush=True)
    print({k: meta[k] for k in ("sm_clock_ghz", "stamped_ms", "unstamped_ms", "dk_dv_equal_unstamped",
                                 "step_us", "step_products_us")}, flush=True)
    for key, v in meta["phase_means_us"].items():
        print(f"{key:34s} {v:8.3f}", flush=True)
    return paths
