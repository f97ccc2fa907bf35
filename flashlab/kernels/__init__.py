"""Triton FlashAttention-2 kernels with autograd.

    from flashlab.kernels import flash_attention
    o = flash_attention(q, k, v, causal=True)        # q (B, H, N_q, d), k and v (B, H_kv, N_k, d)
    o = flash_attention(q, k, v, window=(256, 0))    # sliding window: 256 keys back, none ahead
    o = flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)   # packed (total, H, d), no padding

- :mod:`.forward`  — the forward kernel (one program per query block and head)
- :mod:`.backward` — preprocess D, a dK/dV kernel over key blocks, a dQ kernel over query blocks
- :mod:`.decoding` — decoding against a long (optionally paged) KV cache with split-KV (flash-decoding)

On a CPU the same kernels run under Triton's interpreter: set ``TRITON_INTERPRET=1``
*before* importing this module (the variable is read when the kernels are defined).
The interpreter is slow and meant for small sizes and for teaching.
"""

from __future__ import annotations


import torch

from ._common import (
    INTERPRET,
    LN2,
    MAX_HEAD_DIM,
    SUPPORTED_DTYPES,
    check_cu_seqlens,
    check_qkv,
    check_runnable,
    check_scale,
    check_window,
)
from .backward import backward as _backward
from .decoding import choose_num_splits, combine_splits, flash_decode
from .forward import forward as _forward

__all__ = [
    "flash_attention",
    "flash_attention_varlen",
    "FlashAttentionFunction",
    "flash_decode",
    "combine_splits",
    "choose_num_splits",
    "INTERPRET",
    "SUPPORTED_DTYPES",
    "MAX_HEAD_DIM",
]

def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, varlen: bool = False) -> float:
    return check_scale(scale, check_qkv(q, k, v, varlen))


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """The kernels take any strides except along the head dimension, which must be 1."""
    return t if t.stride(-1) == 1 else t.contiguous()


class FlashAttentionFunction(torch.autograd.Function):
    """o = softmax(scale * q k^T (+ causal / window mask)) v, with the FlashAttention-2 backward.
    For varlen, q, k, v are packed (1, H, total, d) views and ``cu_seqlens`` says where each
    sequence starts."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, window, deterministic: bool, cu_seqlens):
        q, k, v = (_unit_last_stride(t) for t in (q, k, v))
        o, lse2 = _forward(q, k, v, causal, scale, window=window, cu_seqlens=cu_seqlens)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale, ctx.window, ctx.deterministic, ctx.cu_seqlens = causal, scale, window, deterministic, cu_seqlens
        return o, lse2

    @staticmethod
    def backward(ctx, do, _dlse2):
        q, k, v, o, lse2 = ctx.saved_tensors
        dq, dk, dv = _backward(_unit_last_stride(do), q, k, v, o, lse2, ctx.causal, ctx.scale, window=ctx.window,
                               deterministic=ctx.deterministic, cu_seqlens=ctx.cu_seqlens)
        return dq, dk, dv, None, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    window: tuple[int, int] | None = None,
    deterministic: bool = True,
):
    """Exact attention by the FlashAttention-2 algorithm, differentiable.

    Parameters
    ----------
    q : (B, H, N_q, d) float16, bfloat16 or float32 (fp32 uses IEEE dot products; for teaching)
    k, v : (B, H_kv, N_k, d), H_kv dividing H (GQA; H_kv = 1 is MQA)
    causal : mask keys after the query, aligned bottom-right when N_q != N_k
        (query i sees key j iff j <= i + N_k - N_q); a row that sees no key gives 0.
    scale : multiplies q k^T; default 1/sqrt(d)
    return_lse : also return the row log-sum-exp (B, H, N_q), float32, natural log
    window : (left, right) sliding window, flash-attn's convention: query i sees key j iff
        i + off - left <= j <= i + off + right (off = N_k - N_q); -1 leaves a side unbounded.
        Key blocks outside the window are never loaded. With causal, right is capped at 0.
    deterministic : True (default) computes dQ in its own kernel, bit-identical from run to run;
        False adds dQ contributions with atomic adds inside the dK/dV kernel (the paper's
        single loop), whose summation order, and so whose last bits, vary between runs.

    Returns
    -------
    o : (B, H, N_q, d) in q's dtype, or ``(o, lse)``.
    """
    scale = _check(q, k, v, scale)
    window = check_window(window)
    check_runnable(q.device)  # last: every argument is checked wherever the tensors live
    o, lse2 = FlashAttentionFunction.apply(q, k, v, bool(causal), scale, window, bool(deterministic), None)
    if return_lse:
        return o, lse2 * LN2  # log2 units -> natural log
    return o


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    window: tuple[int, int] | None = None,
    deterministic: bool = True,
):
    """Attention over packed sequences of different lengths, without padding (flash-attn's
    varlen interface), differentiable.

    Sequence b owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and key rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` and attends only within itself; causal and
    window are aligned bottom-right per sequence. The grid has ceil(max_seqlen_q / BLOCK_M)
    query blocks per sequence and head; blocks past a short sequence's end exit at once.

    Parameters
    ----------
    q : (total_q, H, d); k, v : (total_k, H_kv, d), H_kv dividing H
    cu_seqlens_q, cu_seqlens_k : (B + 1,) int32 on q's device, [0, ..., total]
    max_seqlen_q, max_seqlen_k : the longest sequence of each (ints; checked)
    causal, scale, window, deterministic : as in :func:`flash_attention`

    Returns
    -------
    o : (total_q, H, d), or ``(o, lse)`` with lse (H, total_q) float32, natural log.
    """
    scale = _check(q, k, v, scale, varlen=True)
    window = check_window(window)
    cu_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q", q.device)
    cu_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k", q.device)
    if cu_q.numel() != cu_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; got {cu_q.numel() - 1} and {cu_k.numel() - 1}")
    check_runnable(q.device)
    packed = lambda t: t.permute(1, 0, 2).unsqueeze(0)  # noqa: E731  (total, H, d) -> (1, H, total, d) view
    o, lse2 = FlashAttentionFunction.apply(packed(q), packed(k), packed(v), bool(causal), scale, window,
                                           bool(deterministic), (cu_q, cu_k, int(max_seqlen_q), int(max_seqlen_k)))
    o = o.squeeze(0).permute(1, 0, 2)  # back to (total_q, H, d)
    if return_lse:
        return o, lse2 * LN2
    return o
