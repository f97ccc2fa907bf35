"""Context parallelism: one sequence shared out among several GPUs.

    import torch.distributed as dist
    from flashlab.parallel import ring_attention, shard
    dist.init_process_group("nccl")                      # one process per GPU ("gloo" on CPU)
    r, P = dist.get_rank(), dist.get_world_size()
    q_r, k_r, v_r = (shard(t, r, P) for t in (q, k, v))  # this rank's N/P tokens (zig-zag)
    o_r = ring_attention(q_r, k_r, v_r, causal=True)     # differentiable; o_r = shard(o, r, P)

- :mod:`.ring`  — ring attention on torch.distributed: K/V blocks passed around the ring with
                  ``batch_isend_irecv`` while the flashlab kernels compute; dK/dV travel back
- :mod:`.model` — bytes and time of one ring step, and the tokens per GPU that hide the transfer

The exact NumPy version of the same schedule is :mod:`flashlab.reference.ring`.
"""

from .model import (
    NVLINK_H200_BYTES_PER_S,
    NVLINK_H200_ONE_WAY,
    hiding_length,
    ring_step_bytes,
    ring_step_flops,
    ring_step_time,
)
from .ring import RingAttention, ring_attention, shard, unshard

__all__ = [
    "ring_attention",
    "shard",
    "unshard",
    "RingAttention",
    "NVLINK_H200_BYTES_PER_S",
    "NVLINK_H200_ONE_WAY",
    "ring_step_bytes",
    "ring_step_flops",
    "ring_step_time",
    "hiding_length",
]
