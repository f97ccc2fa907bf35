"""The FlashAttention-2 forward of :mod:`flashlab.kernels.forward` on other schedules, for the
experiments of chapters 5 and 6 (:mod:`flashlab.lab.experiments.kernels`):

- ``grid="v1"``: one program per (batch, head), looping over its query blocks, the
  FlashAttention-1 partitioning, against FlashAttention-2's (query blocks x heads) of §3.2;
- ``warp_specialize=True``: Triton splits the unmasked key loop into producer (load) and
  consumer (compute) warps, ``tl.range(..., warp_specialize=True)``.

Both reuse the teaching kernel's own functions: the v1 grid calls its query-block function
``_forward_block`` once per query block; warp specialisation compiles that same function with
its key loop ``_attend`` replaced by :func:`_attend_warp_specialized`, which calls the teaching
kernel's ``_attend_block`` for each key block. grid="v2" without warp specialisation is the
teaching kernel itself.
"""

from __future__ import annotations

import types

import torch
import triton
import triton.language as tl

from flashlab.kernels import forward as kf
from flashlab.kernels._common import Candidate, launch_options

__all__ = ["forward"]


@triton.jit
def _attend_warp_specialized(
    acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, kv_row0,
    offs_m, offs_n, offs_d, lo, hi, qk_scale, N_K, diag_lo, diag_hi,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """:func:`flashlab.kernels.forward._attend` (same arguments) with its loop over unmasked key
    blocks warp-specialised; the masked edge loops stay as they are."""
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    d_ok = offs_d < D_HEAD
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=not MASKED):
        acc, l_i, m_i = kf._attend_block(acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, kv_row0, start_n,
                                         offs_m, offs_n, d_ok, qk_scale, N_K, diag_lo, diag_hi,
                                         D_HEAD, BLOCK_D, MASKED, UPCAST, DOT_PRECISION, TMA)
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


def _rebound(fn, **names):
    """The Python function under @triton.jit ``fn``, its global ``names`` bound to other objects: the
    same source, compiled (or interpreted) with other functions behind those names."""
    source = getattr(fn, "fn", fn)
    copy = types.FunctionType(source.__code__, {**source.__globals__, **names}, source.__name__)
    copy.__qualname__ = f"{source.__qualname__}[{', '.join(names)} rebound]"
    return triton.jit(copy)


# The teaching kernel's query-block function with its key loop warp-specialised.
_forward_block_warp_specialized = _rebound(kf._forward_block, _attend=_attend_warp_specialized)


@triton.jit
def _forward_schedule_kernel(
    Q, K, V, O, LSE, DESC_K, DESC_V,  # as flashlab.kernels.forward._forward_kernel, without varlen
    q_strides, k_strides, v_strides, o_strides, lse_strides,
    H, GROUP, N_Q, N_K, qk_scale, band,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr, UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PER_HEAD: tl.constexpr, FORWARD_BLOCK: tl.constexpr,
):
    """_forward_kernel's program with FORWARD_BLOCK for its query-block function; with PER_HEAD on
    grid (1, Z * H), each program looping over all query blocks of its head."""
    off_zh = tl.program_id(1)
    off_z = off_zh // H
    off_h = off_zh % H
    off_hkv = off_h // GROUP
    bounds = (0, 0, N_Q, N_K)  # (q_start, k_start, N_Q, N_K): one sequence per batch entry
    kv_row0 = (off_z * (H // GROUP) + off_hkv) * N_K
    if PER_HEAD:
        for start_m in range(0, tl.cdiv(N_Q, BLOCK_M)):
            FORWARD_BLOCK(start_m, off_z, off_h, off_hkv, Q, K, V, O, LSE, DESC_K, DESC_V, kv_row0,
                          q_strides, k_strides, v_strides, o_strides, lse_strides, bounds, qk_scale, band,
                          D_HEAD, BLOCK_D, WINDOW, UPCAST, DOT_PRECISION, TMA, BLOCK_M, BLOCK_N)
    else:
        start_m = tl.program_id(0)
        if start_m * BLOCK_M < N_Q:
            FORWARD_BLOCK(start_m, off_z, off_h, off_hkv, Q, K, V, O, LSE, DESC_K, DESC_V, kv_row0,
                          q_strides, k_strides, v_strides, o_strides, lse_strides, bounds, qk_scale, band,
                          D_HEAD, BLOCK_D, WINDOW, UPCAST, DOT_PRECISION, TMA, BLOCK_M, BLOCK_N)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, config: Candidate,
            *, grid: str = "v2", warp_specialize: bool = False, window: tuple[int, int] | None = None,
            tma: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`flashlab.kernels.forward.forward` with one fixed ``config`` = (BLOCK_M, BLOCK_N,
    warps, stages) on ``grid`` "v2" (query blocks x heads) or "v1" (one program per head), with
    or without ``warp_specialize``. Returns (o, lse2) as the teaching kernel does."""
    if grid not in ("v1", "v2"):
        raise ValueError(f"grid must be 'v1' or 'v2'; got {grid!r}")
    if config is None or len(config) < 4:
        raise ValueError(f"config must be (BLOCK_M, BLOCK_N, warps, stages); got {config!r}")
    per_head = grid == "v1"
    if not per_head and not warp_specialize:  # the teaching kernel itself
        return kf.forward(q, k, v, causal, scale, config, window=window, tma=tma)
    args, constexprs, (n_q, heads, o, lse2) = kf.kernel_arguments(q, k, v, causal, scale, config, window, tma, None)
    args = args[:5] + args[7:]  # no cu_seqlens
    del constexprs["CAUSAL"], constexprs["VARLEN"]  # folded into band; not varlen
    block = _forward_block_warp_specialized if warp_specialize else kf._forward_block
    launch = (1 if per_head else triton.cdiv(n_q, config[0]), heads)
    _forward_schedule_kernel[launch](*args, **constexprs, PER_HEAD=per_head, FORWARD_BLOCK=block,
                                     **launch_options(config))
    return o, lse2
