"""Exact NumPy references: the specification every faster algorithm is tested against.

Float64 by default. One module per idea:

- :mod:`.common`  — input checks, the softmax scale, the causal mask, block ranges, LOG2E
- :mod:`.softmax` — softmax, online softmax and its (m, l, o_tilde) state
- :mod:`.naive`   — standard attention with S and P materialised, and its backward
- :mod:`.flash1`  — FlashAttention v1 (Algorithm 1 forward, Algorithm 4 backward by recomputation)
- :mod:`.flash2`  — FlashAttention-2 (Q-block outer loop, deferred normalisation, lse; Algorithms 1-2)
- :mod:`.counting` — the non-matmul operations of v1 and v2, counted while they run
- :mod:`.fp8`     — FP8 rounding, block scaling, incoherent processing (FlashAttention-3)
- :mod:`.softexp` — exp2 from a polynomial and bit tricks (FlashAttention-4)
- :mod:`.rescale` — online softmax with conditional rescaling (FlashAttention-4)
- :mod:`.beyond`  — causal block skipping, sliding window, GQA/MQA, variable length, split-KV
                   decoding (flash-decoding), paged KV cache
- :mod:`.ring`    — ring attention over P simulated ranks (context parallelism), zig-zag layout
"""

from .beyond import (
    PagedKVCache,
    attention_gqa,
    attention_paged,
    attention_varlen,
    attention_window,
    causal_block_counts,
    combine,
    decode_split_kv,
    kv_cache_bytes,
    pad_and_mask_cost,
    split_heuristic,
    window_block_counts,
    window_mask,
)
from .flash1 import block_sizes, flash1_backward, flash1_block_counts, flash1_flops, flash1_forward
from .flash2 import flash2_backward, flash2_forward
from .common import causal_mask
from .naive import attention, attention_backward, attention_flops, scores
from .ring import ring_attention, ring_attention_backward, ring_work, shard_positions
from .softmax import OnlineSoftmaxState, naive_softmax, online_attention, online_softmax, softmax

__all__ = [
    "attention",
    "attention_backward",
    "attention_flops",
    "causal_mask",
    "scores",
    "softmax",
    "naive_softmax",
    "online_softmax",
    "online_attention",
    "OnlineSoftmaxState",
    "block_sizes",
    "flash1_forward",
    "flash1_backward",
    "flash1_block_counts",
    "flash1_flops",
    "flash2_forward",
    "flash2_backward",
    "attention_gqa",
    "kv_cache_bytes",
    "causal_block_counts",
    "window_mask",
    "attention_window",
    "window_block_counts",
    "attention_varlen",
    "pad_and_mask_cost",
    "decode_split_kv",
    "combine",
    "split_heuristic",
    "PagedKVCache",
    "attention_paged",
    "ring_attention",
    "ring_attention_backward",
    "ring_work",
    "shard_positions",
]
