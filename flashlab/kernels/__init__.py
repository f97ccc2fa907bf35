"""Triton FlashAttention-2 kernels with autograd, as PyTorch custom operators.

    from flashlab.kernels import flash_attention
    o = flash_attention(q, k, v, causal=True)        # q (B, H, N_q, d), k and v (B, H_kv, N_k, d)
    o = flash_attention(q, k, v, window=(256, 0))    # sliding window: 256 keys back, none ahead
    o = flash_attention(q, k, v, impl="gluon")       # the Gluon FlashAttention-3 forward (sm_90)
    o = flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)   # packed (total, H, d), no padding
    model = torch.compile(model, fullgraph=True)     # each call is one node of the graph (ops.py)

- :mod:`.forward`  — the forward kernel (one program per query block and head)
- :mod:`.backward` — preprocess D, a dK/dV kernel over key blocks, a dQ kernel over query blocks
- :mod:`.decoding` — decoding against a long (optionally paged) KV cache with split-KV (flash-decoding)
- :mod:`.fa3`      — FlashAttention-3's warp-specialised forward in Gluon, for Hopper
- :mod:`.ops`      — the kernels registered with ``torch.library``, for torch.compile

On a CPU the same kernels run under Triton's interpreter: set ``TRITON_INTERPRET=1``
*before* importing this module (the variable is read when the kernels are defined).
The interpreter is slow and meant for small sizes and for teaching.
"""

from __future__ import annotations

import numbers

import torch

from . import ops
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
from .decoding import choose_num_splits, combine_splits
from .decoding import flash_decode as _flash_decode_eager

__all__ = [
    "flash_attention",
    "flash_attention_varlen",
    "flash_decode",
    "combine_splits",
    "choose_num_splits",
    "IMPLS",
    "INTERPRET",
    "SUPPORTED_DTYPES",
    "MAX_HEAD_DIM",
]

IMPLS = ops.IMPLS


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, varlen: bool = False) -> float:
    return check_scale(scale, check_qkv(q, k, v, varlen))


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    window: tuple[int, int] | None = None,
    deterministic: bool = True,
    impl: str = "triton",
):
    """Exact attention by the FlashAttention-2 algorithm, differentiable.

    Parameters
    ----------
    q : (B, H, N_q, d) float16, bfloat16 or float32 (fp32 uses IEEE dot products; for teaching)
    k, v : (B, H_kv, N_k, d), H_kv dividing H (GQA; H_kv = 1 is MQA)
    causal : mask keys after the query, aligned bottom-right when N_q != N_k
        (query i sees key j iff j <= i + N_k - N_q); a row that sees no key gives 0.
    scale : multiplies q k^T; default 1/sqrt(d)
    return_lse : also return the row log-sum-exp (B, H, N_q), float32, natural log; it is not
        differentiable (lse.requires_grad is False: gradients flow through o only)
    window : (left, right) sliding window, flash-attn's convention: query i sees key j iff
        i + off - left <= j <= i + off + right (off = N_k - N_q); -1 leaves a side unbounded.
        Key blocks outside the window are never loaded. With causal, right is capped at 0.
    deterministic : True (default) computes dQ in its own kernel, bit-identical from run to run;
        False adds dQ contributions with atomic adds inside the dK/dV loop (the paper's
        single loop), whose summation order, and so whose last bits, vary between runs. On a
        Hopper GPU, for bfloat16/float16, d = 64 or 128, equal heads, no window and no varlen,
        False runs the Gluon FlashAttention-3 backward (fa3_backward.py); elsewhere the
        Triton kernel's atomic path.
    impl : which forward kernel runs; the backward (backward.py, or fa3_backward.py as above)
        takes the forward's lse whichever kernel wrote it.

        - "triton" (default): forward.py, every input above, on any CUDA GPU or the interpreter;
        - "gluon": fa3.py, FlashAttention-3's warp-specialised forward, on a Hopper GPU (sm_90)
          only, for bfloat16/float16, d = 64, 128 or 256, without window or GQA (non-contiguous
          inputs are copied first); anything else raises ValueError saying what it needs;
        - "auto": "gluon" where it can run the inputs and d = 64 or 128 (fa3.AUTO_HEAD_DIMS: where
          it was checked and timed in its present form), otherwise "triton" (so on a CPU, another
          GPU, fp32, d = 256 and other head dimensions, windows and GQA: "triton").

    Returns
    -------
    o : (B, H, N_q, d) in q's dtype, or ``(o, lse)``.

    Conventions, and where they differ from ``flash_attn_func`` (flash-attn 2) and
    ``torch.nn.functional.scaled_dot_product_attention`` (SDPA)
    ------------------------------------------------------------------------------------
    - Layout (B, H, N, d), as SDPA; flash_attn_func takes (B, N, H, d).
    - ``deterministic=True`` by default; flash_attn_func defaults to ``deterministic=False``
      (atomic dQ), and SDPA's flash backward has no such switch.
    - Causal is aligned bottom-right (the last query sees the last key), as flash_attn_func
      since 2.1. SDPA's ``is_causal=True`` is aligned top-left (query i sees keys j <= i), so with
      N_q != N_k swapping SDPA for flashlab changes the result; SDPA's equivalent of flashlab's
      causal is ``attn_mask=torch.nn.attention.bias.causal_lower_right(N_q, N_k)`` (or the bool
      mask ``ones(N_q, N_k).tril(N_k - N_q)``).
    - A row that sees no key (causal with N_q > N_k, or a window) gives o = 0, lse = -inf (the
      log of an empty sum), and zero gradients. flash_attn_func also gives o = 0 but lse = +inf;
      SDPA's result there depends on its backend.
    - Bad arguments raise before any kernel runs: TypeError for a wrong type (not a tensor, an
      unsupported dtype, dtypes that differ), ValueError for wrong shapes, devices or values
      (head dimension, heads, scale, window, impl), each naming the argument, what it expects and
      what it got. flash_attn_func and SDPA raise RuntimeError from their C++ checks.
    - torch.compile: the kernels are custom operators (:mod:`.ops`), so ``torch.compile(...,
      fullgraph=True)`` traces a call without a graph break and runs the same kernels.
    """
    scale = _check(q, k, v, scale)
    window = check_window(window)
    chosen = ops.resolve_impl(impl, q, k, window)
    check_runnable(q.device)  # last: every argument is checked wherever the tensors live
    if chosen == "gluon":  # fa3 reads (B * H * N, d) views through TMA
        q, k, v = (t.contiguous() for t in (q, k, v))
    else:
        q, k, v = (ops.unit_last_stride(t) for t in (q, k, v))
    o, lse2 = ops.attention_forward(q, k, v, bool(causal), scale, _listed(window), bool(deterministic), chosen,
                                    None, None, 0, 0)
    if return_lse:
        return o, lse2 * LN2  # log2 units -> natural log
    return o


def _listed(window: tuple[int, int] | None) -> list[int] | None:
    """The window as the operators' schema takes it (int[]?)."""
    return None if window is None else list(window)


def _check_cu_seqlens_arguments(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> None:
    """What can be checked without reading cu_seqlens' values (the operator reads and checks those):
    tensors and integers. A wrong one is reported by :func:`check_cu_seqlens`, in full."""
    for name, cu, total, max_seqlen, max_name in (("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q"),
                                                  ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k")):
        if (not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64)
                or cu.device != q.device or isinstance(max_seqlen, bool) or not isinstance(max_seqlen, numbers.Integral)):
            check_cu_seqlens(name, cu, total, max_seqlen, max_name, q.device)  # raises, saying what is wrong


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
    The Triton kernels only (the Gluon forward takes no packed input).

    Parameters
    ----------
    q : (total_q, H, d); k, v : (total_k, H_kv, d), H_kv dividing H
    cu_seqlens_q, cu_seqlens_k : (B + 1,) int32 on q's device, [0, ..., total]; their values are
        read back to the host and checked once per call, when the kernel runs
    max_seqlen_q, max_seqlen_k : the longest sequence of each (ints; checked)
    causal, scale, window, deterministic : as in :func:`flash_attention`

    Returns
    -------
    o : (total_q, H, d), or ``(o, lse)`` with lse (H, total_q) float32, natural log (not differentiable).

    Conventions: those of :func:`flash_attention`. Beside ``flash_attn_varlen_func`` the layout
    (total, H, d), int32 cu_seqlens, bottom-right causal per sequence and lse (H, total_q) agree;
    ``deterministic=True`` by default (flash-attn: False); a row that sees no key gives o = 0 and
    lse = -inf (flash-attn: +inf); a wrong cu_seqlens raises ValueError (TypeError for a
    non-integer dtype) naming it. Under torch.compile the values of cu_seqlens are checked when
    the compiled graph runs (a trace cannot read them).
    """
    scale = _check(q, k, v, scale, varlen=True)
    window = check_window(window)
    _check_cu_seqlens_arguments(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    check_runnable(q.device)
    packed = lambda t: ops.unit_last_stride(t).permute(1, 0, 2).unsqueeze(0)  # noqa: E731  (total, H, d) -> (1, H, total, d) view
    o, lse2 = ops.attention_forward(packed(q), packed(k), packed(v), bool(causal), scale, _listed(window),
                                    bool(deterministic), "triton", cu_seqlens_q, cu_seqlens_k,
                                    int(max_seqlen_q), int(max_seqlen_k))
    o = o.squeeze(0).permute(1, 0, 2)  # back to (total_q, H, d)
    if return_lse:
        return o, lse2 * LN2
    return o


def flash_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    num_splits: int | None = None,
    scale: float | None = None,
    block_table: torch.Tensor | None = None,
    page_size: int | None = None,
    return_lse: bool = False,
    validate: bool = True,
    fuse_combine: bool = True,
):
    # Eager calls go straight to the kernels: a decoding step is short, and the operator
    # dispatcher's extra host time per call (tens of microseconds) would show in it.
    if not torch.compiler.is_compiling():
        return _flash_decode_eager(q, k_cache, v_cache, cache_seqlens, num_splits, scale, block_table, page_size,
                                   return_lse=return_lse, validate=validate, fuse_combine=fuse_combine)
    o, lse = ops.decode(q, k_cache, v_cache, cache_seqlens, num_splits, scale, block_table, page_size,
                        bool(validate), bool(fuse_combine))
    return (o, lse) if return_lse else o


flash_decode.__doc__ = (_flash_decode_eager.__doc__ or "") + """
    Under torch.compile the call is one node of the graph (the custom operator
    ``flashlab::decode``, :mod:`.ops`): every argument is checked when the compiled graph runs.
    """
