"""flashlab's kernels as PyTorch custom operators (``torch.library``), so that torch.compile sees them.

torch.compile traces Python into a graph of operators it knows. A Triton launch is not one of
them (nor are the autotuner and the host-side checks around it), so without help the trace
breaks at every call. Registered as custom operators, the kernels become opaque nodes:

    flashlab::attention_forward   (q, k, v, ...)                 -> (o, lse2)     forward.py, or fa3.py
    flashlab::attention_backward  (do, q, k, v, o, lse2, ...)    -> (dq, dk, dv)  backward.py
    flashlab::decode              (q, k_cache, v_cache, ...)     -> (o, lse)      decoding.py

Each operator has a *fake* implementation: its outputs' shapes, dtypes, strides and device
computed from its inputs' without running a kernel. The compiler propagates shapes through
the node with it (on FakeTensors). The forward's derivative is the backward operator
(``register_autograd``), so AOTAutograd traces the backward graph as well; lse is marked
non-differentiable (its gradient is not computed: lse.requires_grad is False).

lse2 is the row log-sum-exp in log2 units, float32, (B, H, N_q), or (H, total_q) for varlen:
the layout forward.py and fa3.py write and backward.py reads.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._common import check_cu_seqlens
from .backward import backward as _backward
from .decoding import flash_decode as _flash_decode
from .forward import forward as _forward

__all__ = ["IMPLS", "attention_forward", "attention_backward", "decode", "gluon_refusal", "hopper_backward",
           "resolve_impl"]

# flash_attention(impl=...): the Triton FA2 forward (forward.py), the Gluon FA3 forward (fa3.py,
# sm_90), or the Gluon one where it can run the inputs and the Triton one elsewhere.
IMPLS = ("triton", "gluon", "auto")


def unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """The kernels take any strides except along the head dimension, which must be 1."""
    return t if t.stride(-1) == 1 else t.contiguous()


# ----------------------------------------------------------------------------- which forward
def gluon_refusal(q: torch.Tensor, k: torch.Tensor, window: tuple[int, int] | None, varlen: bool) -> str | None:
    """Why the Gluon FA3 forward (:mod:`flashlab.kernels.fa3`) cannot run these inputs, as
    "needs X; got Y" — or None when it can. Only metadata is read (device, dtype, shapes), so a
    torch.compile trace decides this once, when it traces the call."""
    if q.device.type != "cuda":
        return f"a CUDA GPU; got tensors on {q.device}"
    props = torch.cuda.get_device_properties(q.device)  # torch.compile folds this to a constant
    if props.major != 9:
        return f"a Hopper GPU (sm_90: H100, H200); got sm_{props.major}{props.minor}"
    from . import fa3  # Gluon is imported only where it can run

    if q.dtype not in fa3.DTYPES:
        return f"bfloat16 or float16; got {q.dtype}"
    if q.shape[-1] not in fa3.HEAD_DIMS:
        return f"a head dimension d in {fa3.HEAD_DIMS}; got d = {q.shape[-1]}"
    if varlen:
        return "padded (B, H, N, d) input; got packed varlen sequences"
    if window is not None:
        return f"no sliding window; got window = {window}"
    if k.shape[1] != q.shape[1]:
        return f"as many K/V heads as query heads (no GQA/MQA); got {q.shape[1]} query heads and {k.shape[1]} K/V heads"
    if q.shape[2] == 0 or k.shape[2] == 0:
        return f"N_q and N_k > 0; got N_q = {q.shape[2]}, N_k = {k.shape[2]}"
    return None


def resolve_impl(impl: object, q: torch.Tensor, k: torch.Tensor, window: tuple[int, int] | None,
                 varlen: bool = False) -> str:
    """"triton" or "gluon" for ``impl`` in :data:`IMPLS`: "auto" takes "gluon" where
    :func:`gluon_refusal` finds nothing wrong and d is in ``fa3.AUTO_HEAD_DIMS``; an explicit
    "gluon" that cannot run raises."""
    if not isinstance(impl, str) or impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}; got {impl!r}")
    if impl == "triton":
        return impl
    why = gluon_refusal(q, k, window, varlen)
    if impl == "auto":
        if why:
            return "triton"
        from . import fa3  # Gluon is imported only where it can run

        # the Gluon forward at the head dimensions where it was checked and timed as it is (fa3.AUTO_HEAD_DIMS)
        return "gluon" if q.shape[-1] in fa3.AUTO_HEAD_DIMS else "triton"
    if why:
        raise ValueError(f"impl='gluon' (the FlashAttention-3 forward, flashlab.kernels.fa3) needs {why}; "
                         "impl='triton' or 'auto' runs these inputs")
    return impl


# ----------------------------------------------------------------------------- attention
def _varlen(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
            max_seqlen_q: int, max_seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
    """The kernels' cu_seqlens tuple from the operator's arguments, its *values* checked here, on the
    host (a device sync, once per forward): the one check a torch.compile trace cannot make."""
    if cu_seqlens_q is None:
        return None
    cu_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[2], max_seqlen_q, "max_seqlen_q", q.device)
    cu_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[2], max_seqlen_k, "max_seqlen_k", q.device)
    if cu_q.numel() != cu_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; "
                         f"got {cu_q.numel() - 1} and {cu_k.numel() - 1}")
    return cu_q, cu_k, max_seqlen_q, max_seqlen_k


@torch.library.custom_op("flashlab::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                      window: Optional[list[int]], deterministic: bool, impl: str,
                      cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
                      max_seqlen_q: int, max_seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse2) = attention of q (Z, H, N_q, d) to k, v (Z, H_kv, N_k, d), unit stride along d;
    varlen: packed (1, H, total, d) views and cu_seqlens. impl "triton" (forward.py) or "gluon"
    (fa3.py: contiguous inputs, no window, varlen or GQA). ``deterministic`` is the backward's
    choice, passed along so that the derivative can read it."""
    window_ = None if window is None else (window[0], window[1])
    if impl == "gluon":
        from . import fa3

        return fa3.forward(q, k, v, causal, scale)
    cu = _varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return _forward(q, k, v, causal, scale, window=window_, cu_seqlens=cu)


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, causal, scale, window, deterministic, impl,
                            cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    Z, H, N_Q, _ = q.shape
    lse2_shape = (H, N_Q) if cu_seqlens_q is not None else (Z, H, N_Q)  # varlen: (H, total_q)
    return torch.empty_like(q), q.new_empty(lse2_shape, dtype=torch.float32)  # as forward.py and fa3.py allocate


def hopper_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the Gluon FA3 backward (fa3_backward.py, dQ added atomically by TMA) takes these inputs: a
    Hopper GPU, bfloat16/float16, d = 64 or 128, as many K/V heads as query heads."""
    if not q.is_cuda:
        return False
    try:
        from . import fa3_backward
    except ImportError:  # a triton without Gluon for Hopper
        return False
    return fa3_backward.supported(q, k, v)


def _like(t: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` (contiguous, t's shape) in the memory layout torch.empty_like(t) has: as it is
    where t is contiguous, else copied into that layout."""
    return value if t.is_contiguous() else torch.empty_like(t).copy_(value)


def _fa3_backward(*args):
    from .fa3_backward import backward

    return backward(*args)


@torch.library.custom_op("flashlab::attention_backward", mutates_args=())
def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse2: torch.Tensor, causal: bool, scale: float, window: Optional[list[int]],
                       deterministic: bool, cu_seqlens_q: Optional[torch.Tensor],
                       cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int,
                       max_seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) from dO, whatever forward produced (o, lse2): backward.py, or, with
    ``deterministic=False`` where it runs (:func:`hopper_backward`), the Gluon FA3 backward."""
    window_ = None if window is None else (window[0], window[1])
    if not deterministic and window is None and cu_seqlens_q is None and hopper_backward(q, k, v):
        dq, dk, dv = _fa3_backward(*(t.contiguous() for t in (do, q, k, v, o)), lse2, causal, scale)
        # dk and dv in the layout the fake implementation promises (empty_like of k, v made unit-stride)
        return dq, _like(unit_last_stride(k), dk), _like(unit_last_stride(v), dv)
    do, q, k, v, o = (unit_last_stride(t) for t in (do, q, k, v, o))
    cu = None
    if cu_seqlens_q is not None:  # checked by the forward
        cu = (cu_seqlens_q.to(torch.int32).contiguous(), cu_seqlens_k.to(torch.int32).contiguous(),
              max_seqlen_q, max_seqlen_k)
    return _backward(do, q, k, v, o, lse2, causal, scale, window=window_, deterministic=deterministic, cu_seqlens=cu)


@attention_backward.register_fake
def _attention_backward_fake(do, q, k, v, o, lse2, causal, scale, window, deterministic,
                             cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    q, k, v = (unit_last_stride(t) for t in (q, k, v))
    # as backward.py allocates: dQ like q, or the atomic path's contiguous fp32 buffer cast to q's dtype
    dq = torch.empty_like(q) if deterministic else q.new_empty(q.shape)
    return dq, torch.empty_like(k), torch.empty_like(v)


def _save_for_backward(ctx, inputs, output) -> None:
    q, k, v, causal, scale, window, deterministic, _impl, cu_q, cu_k, max_q, max_k = inputs
    o, lse2 = output
    ctx.save_for_backward(q, k, v, o, lse2, cu_q, cu_k)
    ctx.options = (causal, scale, window, deterministic, max_q, max_k)
    ctx.mark_non_differentiable(lse2)


def _derivative(ctx, do, _dlse2):
    q, k, v, o, lse2, cu_q, cu_k = ctx.saved_tensors
    causal, scale, window, deterministic, max_q, max_k = ctx.options
    dq, dk, dv = attention_backward(do, q, k, v, o, lse2, causal, scale, window, deterministic, cu_q, cu_k, max_q, max_k)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("flashlab::attention_forward", _derivative, setup_context=_save_for_backward)


# ----------------------------------------------------------------------------- decoding
@torch.library.custom_op("flashlab::decode", mutates_args=())
def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
           num_splits: Optional[int], scale: Optional[float], block_table: Optional[torch.Tensor],
           page_size: Optional[int], validate: bool, fuse_combine: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) of :func:`flashlab.kernels.decoding.flash_decode` (lse in natural-log units),
    which checks every argument when the operator runs."""
    return _flash_decode(q, k_cache, v_cache, cache_seqlens, num_splits, scale, block_table, page_size,
                         return_lse=True, validate=validate, fuse_combine=fuse_combine)


@decode.register_fake
def _decode_fake(q, k_cache, v_cache, cache_seqlens, num_splits, scale, block_table, page_size, validate, fuse_combine):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)  # (B, H, n_q, d), (B, H, n_q)
