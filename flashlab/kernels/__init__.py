"""Triton FlashAttention-2 kernels with autograd.

    from flashlab.kernels import flash_attention
    o = flash_attention(q, k, v, causal=True)        # q (B, H, N_q, d), k and v (B, H_kv, N_k, d)

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
    check_head_dim,
    check_runnable,
    check_scale,
    check_tensors,
)
from .backward import backward as _backward
from .decoding import choose_num_splits, combine_splits, flash_decode
from .forward import forward as _forward

__all__ = [
    "flash_attention",
    "FlashAttentionFunction",
    "flash_decode",
    "combine_splits",
    "choose_num_splits",
    "INTERPRET",
    "SUPPORTED_DTYPES",
    "MAX_HEAD_DIM",
]

def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> float:
    layout = "(batch, heads, seq_len, head_dim)"
    check_tensors(q, layout, k=(k, layout), v=(v, layout))
    B, H, _, d = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"q, k and v must have the same batch size; got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[3] != d:
        raise ValueError(f"q and k must have the same head dimension d; got q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}")
    check_head_dim(d)
    if k.shape[1] < 1 or H % k.shape[1] != 0:
        raise ValueError(
            f"the number of K/V heads must divide the number of query heads (GQA/MQA); got {H} query heads and {k.shape[1]} K/V heads"
        )
    check_runnable(q.device)
    return check_scale(scale, d)


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """The kernels take any strides except along the head dimension, which must be 1."""
    return t if t.stride(-1) == 1 else t.contiguous()


class FlashAttentionFunction(torch.autograd.Function):
    """o = softmax(scale * q k^T (+ causal mask)) v, with the FlashAttention-2 backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float):
        q, k, v = (_unit_last_stride(t) for t in (q, k, v))
        o, lse2 = _forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale = causal, scale
        return o, lse2

    @staticmethod
    def backward(ctx, do, _dlse2):
        q, k, v, o, lse2 = ctx.saved_tensors
        dq, dk, dv = _backward(_unit_last_stride(do), q, k, v, o, lse2, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
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

    Returns
    -------
    o : (B, H, N_q, d) in q's dtype, or ``(o, lse)``.
    """
    scale = _check(q, k, v, scale)
    o, lse2 = FlashAttentionFunction.apply(q, k, v, bool(causal), scale)
    if return_lse:
        return o, lse2 * LN2  # log2 units -> natural log
    return o
