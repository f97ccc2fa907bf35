"""How long one ring step takes: the transfer of a K/V block against the attention computed
while it travels.

One rank, one step, n = N / P tokens per rank, H query heads and H_kv key/value heads of
dimension d, batch B:

    bytes   = 2 n d H_kv b B                         K and V of the block       (forward)
            + 2 n d H_kv g B                         the dK, dV accumulators     (backward)
    FLOPs   = 4 n^2 d H B * f                        Q K^T and P V, 2 FLOPs per multiply-add
            * 2.5 for the backward                   (five matmuls instead of two)

with b bytes per element of K and V (2 in bf16), g bytes per accumulator element (4: float32),
and f the fraction of the n x n pairs a step computes: 1 without a mask, 1/2 for causal with
the zig-zag layout (every step after the first is a 2C x C block, C = n / 2; see
:mod:`flashlab.reference.ring`). The transfer is hidden when the compute takes at least as long:

    FLOPs / R  >=  bytes / W    <=>    n  >=  n* = c_b R / (c_f W)                   (hiding)

(R the kernel's FLOP/s, W the link's bytes/s one way, c_b and c_f the coefficients of n d H
above, G = H / H_kv). d, H and B cancel: both sides grow with them alike. Only n is left,
because compute grows as n^2 and bytes as n: a long enough shard always hides its transfer.

The link: an H200 SXM has 18 NVLink 4 links, 900 GB/s in total, which NVIDIA's H200
datasheet counts over both directions (450 GB/s each way). A ring step sends one block to
rank r + 1 while it receives one from rank r - 1: each direction carries one block, so the
model uses 450 GB/s, a peak that real transfers approach but do not reach.

Glossary: n = tokens per rank (每卡序列长度); W = link bandwidth one way (单向带宽);
R = attention throughput of the kernel (算力); n* = the shard length at which the ring hides
its transfers (掩盖传输的长度).
"""

from __future__ import annotations

from .._validate import positive_float, positive_int

__all__ = [
    "NVLINK_H200_BYTES_PER_S",
    "NVLINK_H200_ONE_WAY",
    "ring_step_bytes",
    "ring_step_flops",
    "ring_step_time",
    "hiding_length",
]

# NVIDIA H200 datasheet (H200 SXM): "NVLink: 900GB/s", both directions together.
NVLINK_H200_BYTES_PER_S = 900e9
NVLINK_H200_ONE_WAY = NVLINK_H200_BYTES_PER_S / 2  # what one ring direction can carry

BACKWARD_MATMULS = 2.5  # the backward's five matmuls over the forward's two


def ring_step_bytes(n: int, d: int, kv_heads: int, element_bytes: int = 2, backward: bool = False,
                    grad_bytes: int = 4, batch: int = 1) -> int:
    """Bytes one rank sends (and receives) in one ring step: K and V of n tokens, and in the
    backward also their dK, dV accumulators (``grad_bytes`` per element)."""
    n, d, kv_heads, batch = (positive_int(a, x) for a, x in (("n", n), ("d", d), ("kv_heads", kv_heads), ("batch", batch)))
    per_element = element_bytes + (grad_bytes if backward else 0)
    return 2 * n * d * kv_heads * batch * per_element  # 2: K and V (or dK and dV)


def ring_step_flops(n: int, d: int, heads: int, causal: bool = False, backward: bool = False, batch: int = 1) -> float:
    """Attention FLOPs of one ring step on one rank: n queries against a block of n keys;
    causal (zig-zag) computes half the pairs; the backward 2.5 times the forward."""
    n, d, heads, batch = (positive_int(a, x) for a, x in (("n", n), ("d", d), ("heads", heads), ("batch", batch)))
    flops = 4.0 * n * n * d * heads * batch * (0.5 if causal else 1.0)
    return flops * BACKWARD_MATMULS if backward else flops


def ring_step_time(n: int, d: int, heads: int, tflops: float, kv_heads: int | None = None,
                   link_bytes_per_s: float = NVLINK_H200_ONE_WAY, element_bytes: int = 2,
                   causal: bool = False, backward: bool = False, grad_bytes: int = 4) -> dict[str, float]:
    """Seconds of one ring step: ``compute`` at ``tflops`` (the kernel's measured TFLOP/s for
    that pass), ``transfer`` over the link, and ``step`` = their maximum (they overlap)."""
    tflops, link = positive_float("tflops", tflops), positive_float("link_bytes_per_s", link_bytes_per_s)
    kv_heads = heads if kv_heads is None else kv_heads
    compute = ring_step_flops(n, d, heads, causal, backward) / (tflops * 1e12)
    transfer = ring_step_bytes(n, d, kv_heads, element_bytes, backward, grad_bytes) / link
    return {"compute": compute, "transfer": transfer, "step": max(compute, transfer)}


def hiding_length(tflops: float, link_bytes_per_s: float = NVLINK_H200_ONE_WAY, element_bytes: int = 2,
                  causal: bool = False, backward: bool = False, grad_bytes: int = 4, group: int = 1) -> float:
    """n*, the tokens per rank from which one step's compute outlasts its transfer (equation
    (hiding)); ``group`` = H / H_kv query heads per K/V head (GQA divides n* by it)."""
    R = positive_float("tflops", tflops) * 1e12
    W = positive_float("link_bytes_per_s", link_bytes_per_s)
    c_b = 2.0 * (element_bytes + (grad_bytes if backward else 0)) / positive_int("group", group)
    c_f = 4.0 * (0.5 if causal else 1.0) * (BACKWARD_MATMULS if backward else 1.0)
    return c_b * R / (c_f * W)
