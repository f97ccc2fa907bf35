"""Ring attention on torch.distributed: one process per rank, the flashlab kernels for the
math, point-to-point sends for the ring.

Each rank holds its shard of one sequence, q, k, v (B, H, n, d) with n = N / P, laid out
by :func:`shard` (zig-zag for causal: chunks r and 2P-1-r; see
:mod:`flashlab.reference.ring`, whose schedule this module runs). At step s rank r holds
the K/V block of rank src = (r - s) mod P and

    1. posts the transfer of that block to rank r + 1 and the receipt of the next one from
       rank r - 1 (``torch.distributed.batch_isend_irecv``; NCCL runs it on its own stream),
    2. meanwhile runs the forward kernel on the step's pieces, which returns the partial
       (o_s, lse_s), and merges it into the running (o, lse) with the split-KV combine kernel
       (:func:`flashlab.kernels.combine_splits`, rule (C) of the reference),
    3. waits for the transfer: the next block is in hand.

The backward (dK and dV travel back around the ring) runs the same steps with the backward
kernel, given the final o and lse. dQ accumulates on the rank. The partial dK, dV of a step
are computed first; then the accumulators that arrived from rank r - 1 (holding the parts of
the ranks this block visited before) are added and sent on to rank r + 1, while the next
step computes. After P steps every block's dK, dV are home.

Transport is torch.distributed's: gloo on CPU (the tests, under Triton's interpreter), NCCL
on GPUs. Accumulators are float32 whatever the inputs' dtype.

Glossary: rank = this process's index (进程编号); P = world size (进程数); group = the
torch.distributed process group (进程组); lse2 = log-sum-exp in log2 units, as the kernels
write it; pending = transfers posted and not yet waited for (进行中的传输).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from flashlab.kernels import combine_splits
from flashlab.kernels._common import LN2, check_runnable, check_scale
from flashlab.kernels.backward import backward as _kernel_backward
from flashlab.kernels.forward import forward as _kernel_forward
from flashlab.reference.ring import LAYOUTS, shard_positions, step_pieces

__all__ = ["ring_attention", "shard", "unshard", "RingAttention"]

Pending = tuple[list[torch.Tensor], list]  # (tensors being received, their torch.distributed works)


def _neighbours(group) -> tuple[int, int, int, int]:
    """(rank, P, global rank of r + 1, global rank of r - 1) in ``group`` (None: the default group)."""
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    return rank, P, to_global((rank + 1) % P), to_global((rank - 1) % P)


def _start_pass(tensors: list[torch.Tensor], group) -> Pending:
    """Post one ring transfer: send each tensor to rank r + 1, receive as many from r - 1."""
    _, P, nxt, prv = _neighbours(group)
    if P == 1:  # a ring of one: what is sent is what arrives
        return tensors, []
    received = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, prv, group) for t in received]
    return received, dist.batch_isend_irecv(ops)


def _finish_pass(pending: Pending) -> list[torch.Tensor]:
    """Wait for a posted transfer; returns the received tensors."""
    received, works = pending
    for work in works:
        work.wait()
    return received


def _rows(t: torch.Tensor, rows: slice) -> torch.Tensor:
    """Rows ``rows`` of a (B, H, n, ...) tensor as a contiguous tensor (what the kernels read)."""
    return t[:, :, rows].contiguous()


class RingAttention(torch.autograd.Function):
    """Forward and backward of ring attention for this rank's shard (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, layout: str, group):
        rank, P, _, _ = _neighbours(group)
        n = q.shape[2]
        o = torch.zeros(q.shape, device=q.device, dtype=torch.float32)  # the empty state: o = 0,
        lse2 = torch.full(q.shape[:3], float("-inf"), device=q.device, dtype=torch.float32)  # lse = -inf
        kv = [k.contiguous(), v.contiguous()]
        for step in range(P):
            src = (rank - step) % P
            pending = _start_pass(kv, group) if step < P - 1 else None  # 1. the next block travels ...
            for pc in step_pieces(rank, src, P, n, causal, layout):  # 2. ... while this one is used
                o_s, lse2_s = _kernel_forward(q[:, :, pc.q], kv[0][:, :, pc.k], kv[1][:, :, pc.k], pc.causal, scale)
                o[:, :, pc.q], lse2[:, :, pc.q] = combine_splits(  # (C), in log2 units
                    torch.stack([o[:, :, pc.q], o_s.float()], dim=2),  # (B, H, 2, rows, d)
                    torch.stack([lse2[:, :, pc.q], lse2_s], dim=2))  # (B, H, 2, rows)
            if pending is not None:
                kv = _finish_pass(pending)  # 3. the next block is in hand
        o = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.options = (causal, scale, layout, group)
        ctx.mark_non_differentiable(lse2)
        return o, lse2

    @staticmethod
    def backward(ctx, do, _dlse2):
        q, k, v, o, lse2 = ctx.saved_tensors
        causal, scale, layout, group = ctx.options
        rank, P, _, _ = _neighbours(group)
        n = q.shape[2]
        dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)  # stays on this rank
        kv = [k.contiguous(), v.contiguous()]
        travelling = None  # the posted transfer of the dK, dV accumulators
        for step in range(P):
            src = (rank - step) % P
            pending = _start_pass(kv, group) if step < P - 1 else None
            dk_s = torch.zeros(k.shape, device=k.device, dtype=torch.float32)  # this rank's part of dK_src
            dv_s = torch.zeros(v.shape, device=v.device, dtype=torch.float32)
            for pc in step_pieces(rank, src, P, n, causal, layout):
                dq_p, dk_p, dv_p = _kernel_backward(
                    _rows(do, pc.q), _rows(q, pc.q), _rows(kv[0], pc.k), _rows(kv[1], pc.k),
                    _rows(o, pc.q), _rows(lse2, pc.q), pc.causal, scale)  # P = exp2(S - lse2), the final lse
                dq[:, :, pc.q] += dq_p  # dQ_r += dS K
                dk_s[:, :, pc.k] += dk_p  # dK_src += dS^T Q_r
                dv_s[:, :, pc.k] += dv_p  # dV_src += P^T dO_r
            if travelling is not None:  # add the parts of the ranks this block visited before
                dk_before, dv_before = _finish_pass(travelling)
                dk_s += dk_before
                dv_s += dv_before
            travelling = _start_pass([dk_s, dv_s], group)  # on to rank r + 1 while the next step runs
            if pending is not None:
                kv = _finish_pass(pending)
        dk, dv = _finish_pass(travelling)  # after P steps: this rank's own block, every rank's part in it
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   scale: float | None = None, layout: str = "zigzag", return_lse: bool = False,
                   group=None):
    """Attention of one sequence sharded across the ranks of ``group``, differentiable.

    Call it on every rank of the group with that rank's shard (:func:`shard`).

    Parameters
    ----------
    q : (B, H, n, d) this rank's queries, n = N / P tokens (float16, bfloat16 or float32)
    k, v : (B, H_kv, n, d) this rank's keys and values, H_kv dividing H (GQA)
    causal : each query sees the keys at or before its position in the whole sequence
    scale : multiplies q k^T; default 1/sqrt(d)
    layout : how the sequence was sharded, "zigzag" (balanced for causal) or "plain"
    return_lse : also return the row log-sum-exp (B, H, n), float32, natural log
    group : a torch.distributed process group; None: the default one

    Returns
    -------
    o : (B, H, n, d) in q's dtype, this rank's rows of attention(Q, K, V), or ``(o, lse)``.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("ring_attention needs torch.distributed: call torch.distributed.init_process_group "
                         "(backend 'gloo' on CPU, 'nccl' on GPUs) on every rank first")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[2] != k.shape[2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q must be (B, H, n, d) and k, v (B, H_kv, n, d), the same n and d; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if causal and layout == "zigzag" and q.shape[2] % 2:
        raise ValueError(f"a zig-zag shard holds two chunks of equal length: n must be even; got n = {q.shape[2]}")
    scale = check_scale(scale, q.shape[-1])
    check_runnable(q.device)
    o, lse2 = RingAttention.apply(q, k, v, bool(causal), scale, layout, group)
    return (o, lse2 * LN2) if return_lse else o


def shard(x: torch.Tensor, rank: int, world_size: int, layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """The rows of ``x`` (the whole sequence along ``dim``) that rank ``rank`` of ``world_size``
    holds, in its storage order (:func:`flashlab.reference.ring.shard_positions`); contiguous."""
    positions = shard_positions(x.shape[dim], world_size, layout)[rank]
    return x.index_select(dim, torch.as_tensor(positions, device=x.device))


def unshard(parts: list[torch.Tensor], layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """The inverse of :func:`shard`: every rank's part (in rank order) back in sequence order."""
    whole = torch.cat(parts, dim=dim)
    positions = np.concatenate(shard_positions(whole.shape[dim], len(parts), layout))  # of the rows of whole
    return whole.index_select(dim, torch.as_tensor(np.argsort(positions), device=whole.device))
