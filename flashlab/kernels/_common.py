"""What the kernels share: the interpreter switch, autotune configurations, the dot precision,
stride lists, input checks, and the key-block ranges of causal and sliding-window block
skipping (:func:`visible_range`).
"""

from __future__ import annotations

import math
import numbers
import os

import torch
import triton
import triton.language as tl

# Read once, when flashlab.kernels is imported: @triton.jit reads it at decoration time.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# FLASHLAB_AUTOTUNE=0 keeps only the first candidate of each kernel: no tuning runs (tests and
# profiling, where tuning would add compile time or extra kernel launches).
AUTOTUNE = os.environ.get("FLASHLAB_AUTOTUNE", "1") != "0"


def _no_bench(kernel_call, quantiles=None) -> list[float]:
    """A stand-in for the autotuner's timer: times nothing, runs nothing."""
    return [0.0, 0.0, 0.0]


# Keyword arguments for @triton.autotune: with FLASHLAB_AUTOTUNE=0 the timer is replaced, so even
# a key's first call launches no trial runs (some Triton versions time a lone surviving config,
# allocating do_bench's 256 MB cache-flush buffer on the way).
AUTOTUNE_OPTIONS: dict = {} if AUTOTUNE else {"do_bench": _no_bench}

LOG2E = 1.4426950408889634  # 1/ln 2: exp(x) = exp2(x * log2(e))
LN2 = 0.6931471805599453


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input_precision for inputs of ``dtype``: "ieee" for float32 (the teaching path,
    exact to fp32 rounding), "tf32" otherwise (Triton's default; 16-bit operands ignore it)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def strides_of(t: torch.Tensor, varlen: bool, dims: int) -> tuple[int, ...]:
    """The first ``dims`` strides of a (batch, head, row, d) tensor. Packed varlen input is one
    (1, H, total, d) "batch" whose sequences are found through cu_seqlens: batch stride 0."""
    strides = t.stride()[:dims]
    return (0, *strides[1:]) if varlen else tuple(strides)


# (BLOCK_M, BLOCK_N, num_warps, num_stages), optionally with a fifth entry: a register cap per
# thread (ptxas maxnreg), which lets more programs share an SM when their registers are what limits it.
Candidate = tuple[int, ...]


def configs(candidates: list[Candidate], wide: list[Candidate], interpret_config: dict, pre_hook=None) -> list[triton.Config]:
    """Autotune configurations: ``candidates`` serve head dimensions up to 128, ``wide`` the
    padded head dimension 256, whose tiles must be smaller to fit shared memory (see
    :func:`pruner`). Under the interpreter: a single small one (it would run every config,
    and timing means nothing there). With FLASHLAB_AUTOTUNE=0: the first of each list."""
    if INTERPRET:
        return [triton.Config(interpret_config, num_warps=4, num_stages=1)]
    chosen = [*candidates, *wide] if AUTOTUNE else [candidates[0], *wide[:1]]
    return [triton.Config({"BLOCK_M": c[0], "BLOCK_N": c[1]}, num_warps=c[2], num_stages=c[3],
                          maxnreg=c[4] if len(c) > 4 else None, pre_hook=pre_hook) for c in chosen]


def pruner(wide: list[Candidate]):
    """An ``early_config_prune`` that keeps the ``wide`` configurations for BLOCK_D = 256
    and the others for smaller head dimensions."""
    wide_set = {c[:4] for c in wide}

    def prune(configs_, named_args, **kwargs):
        d = kwargs["BLOCK_D"] if "BLOCK_D" in kwargs else named_args["BLOCK_D"]  # constexprs come in kwargs
        key = lambda c: (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)  # noqa: E731
        kept = [c for c in configs_ if (key(c) in wide_set) == (d >= 256)]
        return kept or configs_

    return prune


def launch_options(config: Candidate | None) -> dict:
    """Keyword arguments that launch a kernel with one explicit configuration."""
    if config is None:
        return {}
    bm, bn, w, s = config[:4]
    options = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}
    if len(config) > 4:
        options["maxnreg"] = config[4]  # a register cap (see Candidate)
    return options


def causal_key_range(start_m: int, block_m: int, block_n: int, n_q: int, n_k: int) -> tuple[int, int]:
    """The key ranges ``(lo, hi)`` of causal query block ``start_m``, as the kernels compute them.

    Query block ``start_m`` holds rows ``start_m * block_m`` to ``start_m * block_m + block_m - 1``;
    with bottom-right alignment row i sees key j iff j <= i + (n_k - n_q). Then

        [0, lo)     every row of the block sees these keys: no mask (whole blocks only)
        [lo, hi)    the diagonal, and the ragged last key block: masked
        [hi, n_k)   no row of the block sees these keys: skipped

    The causal case of :func:`visible_range` (a band unbounded on the left, right edge 0), whose
    lines the kernels compute with :func:`visible_range_tl`. Pure Python, for teaching and tests.
    """
    left, right = window_bounds(True, None, n_q, n_k)
    causal_offset = n_k - n_q  # bottom-right alignment
    _, _, lo, hi = visible_range(start_m * block_m, block_m, n_q, causal_offset - left, causal_offset + right,
                                 n_k, block_n)
    return lo, hi


def window_bounds(causal: bool, window: tuple[int, int] | None, n_q: int, n_k: int) -> tuple[int, int]:
    """The band of visible diagonals as the kernels take it: ``(left, right)`` with row i
    seeing key j iff ``i + off - left <= j <= i + off + right``, ``off = n_k - n_q``
    (bottom-right alignment). An unbounded side becomes ``n_q + n_k`` (wider than any
    shape, small enough for int32 arithmetic); causal caps ``right`` at 0, as flash-attn does."""
    big = n_q + n_k
    left, right = (-1, -1) if window is None else window
    left = big if left == -1 else left
    right = big if right == -1 else right
    if causal:
        right = min(right, 0)
    return left, right


def visible_range(a0: int, a_block: int, n_self: int, lo_shift: int, hi_shift: int, n_other: int,
                  b_block: int) -> tuple[int, int, int, int]:
    """Block ranges of a banded mask, seen from one block of the *fixed* axis.

    The fixed block holds indices ``a0 .. min(a0 + a_block, n_self) - 1``; index a sees the other axis's
    indices b with ``a + lo_shift <= b <= a + hi_shift``. The other axis (length ``n_other``,
    visited in blocks of ``b_block``) splits into

        [start, in_lo)   seen by some of the block's indices      -> masked
        [in_lo, in_hi)   whole blocks seen by all of them         -> no mask
        [in_hi, end)     seen by some (and the ragged tail)       -> masked
        outside          seen by none                             -> never loaded

    Forward and dQ (rows fixed, keys visited): ``lo_shift = off - left``, ``hi_shift = off + right``.
    dK/dV (keys fixed, rows visited): ``lo_shift = -(off + right)``, ``hi_shift = -(off - left)``.
    Pure Python; the kernels compute the same lines with ``tl.minimum``/``tl.maximum``
    (:func:`visible_range_tl`)."""
    a1 = min(a0 + a_block, n_self) - 1  # the block's last real index
    full = (n_other // b_block) * b_block  # end of the last whole block
    start = (max(a0 + lo_shift, 0) // b_block) * b_block  # first block that any index sees
    end = min(max(a1 + hi_shift + 1, 0), n_other)  # one past the last index any sees
    start = min(start, end)
    in_lo = ((max(a1 + lo_shift, 0) + b_block - 1) // b_block) * b_block  # first whole block all see
    in_hi = min((max(a0 + hi_shift + 1, 0) // b_block) * b_block, full)  # end of the whole blocks all see
    in_lo = min(max(in_lo, start), end)
    in_hi = min(max(in_hi, in_lo), end)
    return start, in_lo, in_hi, end


@triton.jit
def visible_range_tl(a0, A_BLOCK: tl.constexpr, n_self, lo_shift, hi_shift, n_other, B_BLOCK: tl.constexpr):
    """:func:`visible_range` inside a kernel (same lines, tl.minimum/tl.maximum)."""
    a1 = tl.minimum(a0 + A_BLOCK, n_self) - 1
    full = (n_other // B_BLOCK) * B_BLOCK
    start = (tl.maximum(a0 + lo_shift, 0) // B_BLOCK) * B_BLOCK
    end = tl.minimum(tl.maximum(a1 + hi_shift + 1, 0), n_other)
    start = tl.minimum(start, end)
    in_lo = ((tl.maximum(a1 + lo_shift, 0) + B_BLOCK - 1) // B_BLOCK) * B_BLOCK
    in_hi = tl.minimum((tl.maximum(a0 + hi_shift + 1, 0) // B_BLOCK) * B_BLOCK, full)
    in_lo = tl.minimum(tl.maximum(in_lo, start), end)
    in_hi = tl.minimum(tl.maximum(in_hi, in_lo), end)
    return start, in_lo, in_hi, end


@triton.jit
def causal_range_tl(start_m, BLOCK_M: tl.constexpr, N_Q, N_K, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """:func:`causal_key_range`'s (lo, hi) inside a kernel, for kernels with two key loops
    ([0, lo) unmasked, [lo, hi) masked): the causal case of :func:`visible_range_tl`.
    Without CAUSAL, lo is the end of the last whole key block and hi = N_K."""
    big = N_Q + N_K  # an unbounded side (see window_bounds)
    if CAUSAL:
        right = 0
    else:
        right = big
    _, _, lo, hi = visible_range_tl(start_m * BLOCK_M, BLOCK_M, N_Q, N_K - N_Q - big, N_K - N_Q + right, N_K, BLOCK_N)
    return lo, hi


@triton.jit
def load_k_tile(k_ptrs, n_ok, d_ok, MASKED: tl.constexpr, PADDED_D: tl.constexpr, UPCAST: tl.constexpr):
    """K_j^T (BLOCK_D, BLOCK_N) through pointers: masked by the key bound ``n_ok`` (BLOCK_N,) in
    MASKED blocks, by the head dimension ``d_ok`` (BLOCK_D,) where it is padded to a power of two,
    a plain load otherwise; upcast to fp32 under the interpreter (UPCAST), whose bf16 dots are wrong."""
    if MASKED:
        k = tl.load(k_ptrs, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
    elif PADDED_D:
        k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
    if UPCAST:
        k = k.to(tl.float32)
    return k


@triton.jit
def load_v_tile(v_ptrs, n_ok, d_ok, MASKED: tl.constexpr, PADDED_D: tl.constexpr, UPCAST: tl.constexpr):
    """V_j (BLOCK_N, BLOCK_D) through pointers, masked like :func:`load_k_tile`."""
    if MASKED:
        v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    elif PADDED_D:
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
    else:
        v = tl.load(v_ptrs)
    if UPCAST:
        v = v.to(tl.float32)
    return v


@triton.jit
def load_kv_tiles(k_ptrs, v_ptrs, n_ok, d_ok, MASKED: tl.constexpr, PADDED_D: tl.constexpr, UPCAST: tl.constexpr):
    """K_j^T (BLOCK_D, BLOCK_N) and V_j (BLOCK_N, BLOCK_D) through pointers, as every kernel's key
    loop reads them (:func:`load_k_tile`, :func:`load_v_tile`)."""
    return (load_k_tile(k_ptrs, n_ok, d_ok, MASKED, PADDED_D, UPCAST),
            load_v_tile(v_ptrs, n_ok, d_ok, MASKED, PADDED_D, UPCAST))


@triton.jit
def sequence_bounds(CU_Q, CU_K, seq, N_Q, N_K, VARLEN: tl.constexpr):
    """(q_start, k_start, n_q, n_k): where sequence ``seq`` starts in the packed rows and how long
    it is, read from cu_seqlens for varlen input; (0, 0, N_Q, N_K) otherwise."""
    q_start = 0
    k_start = 0
    n_q = N_Q
    n_k = N_K
    if VARLEN:
        q_start = tl.load(CU_Q + seq)
        k_start = tl.load(CU_K + seq)
        n_q = tl.load(CU_Q + seq + 1) - q_start
        n_k = tl.load(CU_K + seq + 1) - k_start
    return q_start, k_start, n_q, n_k


# ----------------------------------------------------------------------------- input checks
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def check_tensors(q: torch.Tensor, q_layout: str, dims: int = 4, **others: tuple[torch.Tensor, str]) -> None:
    """q and each named tensor (given with its expected layout) must be ``dims``-D tensors (4 unless said) of a supported
    dtype, on q's device and of q's dtype."""
    for name, (t, layout) in {"q": (q, q_layout), **others}.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != dims:
            raise ValueError(f"{name} must be {dims}-D {layout}; got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must have dtype float16, bfloat16 or float32; got {t.dtype}")
    for name, (t, _) in others.items():
        if t.device != q.device:
            raise ValueError(f"q and {name} must be on the same device; got q on {q.device}, {name} on {t.device}")
        if t.dtype != q.dtype:
            raise TypeError(f"q and {name} must have the same dtype; got q {q.dtype}, {name} {t.dtype}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, varlen: bool = False) -> int:
    """The attention inputs' shapes: q (B, H, N_q, d) with k and v (B, H_kv, N_k, d), or packed
    (total, H, d) and (total_k, H_kv, d) for ``varlen``; same dtype and device; k and v alike;
    a supported d; H_kv dividing H (GQA/MQA). Returns d."""
    layout = "(total_tokens, heads, head_dim)" if varlen else "(batch, heads, seq_len, head_dim)"
    check_tensors(q, layout, dims=3 if varlen else 4, k=(k, layout), v=(v, layout))
    d = q.shape[-1]
    if not varlen and (k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]):
        raise ValueError(f"q, k and v must have the same batch size; got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[-1] != d:
        raise ValueError(f"q and k must have the same head dimension d; got q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}")
    check_head_dim(d)
    H, H_KV = q.shape[1], k.shape[1]
    if H_KV < 1 or H % H_KV != 0:
        raise ValueError(
            f"the number of K/V heads must divide the number of query heads (GQA/MQA); got {H} query heads and {H_KV} K/V heads"
        )
    return d


def check_head_dim(d: int) -> None:
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dimension d must be between 1 and {MAX_HEAD_DIM}; got {d}")


def check_runnable(device: torch.device) -> None:
    """The kernels run on a CUDA GPU, or on the CPU under the interpreter."""
    if device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"the tensors are on {device}: the Triton kernels need a CUDA GPU, or set TRITON_INTERPRET=1 before "
            "importing flashlab.kernels to run them on the CPU under Triton's interpreter"
        )


def has_tma(t: torch.Tensor) -> bool:
    """Whether tiles of ``t`` can be read through TMA tensor descriptors: ``t`` lives on a Hopper
    (sm_90) or newer GPU, or Triton's interpreter emulates the descriptors."""
    return INTERPRET or (t.is_cuda and torch.cuda.get_device_capability(t.device)[0] >= 9)


def check_scale(scale: float | None, d: int) -> float:
    """The softmax scale: 1/sqrt(d) by default, else a positive finite number."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number; got {scale!r}")
    return float(scale)


def check_rescale_threshold(theta: object, upper: float, why: str) -> float | None:
    """``rescale_threshold`` (conditional rescaling, FlashAttention-4): None, or a number theta in
    [0, upper] in log2 units; ``why`` says what bounds it (P <= 2^theta must fit the type of P)."""
    if theta is None:
        return None
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0.0 <= float(theta) <= upper:
        raise ValueError(f"rescale_threshold must be None or a number in [0, {upper:g}] (log2 units; {why}); "
                         f"got {theta!r}")
    return float(theta)


def check_window(window: object) -> tuple[int, int] | None:
    """``window`` = None or a pair (left, right) of ints >= -1 (-1: unbounded on that side)."""
    if window is None:
        return None
    ok = isinstance(window, (tuple, list)) and len(window) == 2
    ok = ok and all(isinstance(w, int) and not isinstance(w, bool) for w in window)
    if not ok or min(window) < -1:
        raise ValueError(f"window must be None or a pair (left, right) of integers >= -1 (-1 = unbounded); got {window!r}")
    return int(window[0]), int(window[1])


def check_cu_seqlens(name: str, cu: object, total: int, max_seqlen: object, max_name: str, device: torch.device) -> torch.Tensor:
    """cu_seqlens: a 1-D int32 tensor [0, ..., total], non-decreasing, on ``device``; max_seqlen an
    int at least the longest sequence. Returns it (int32, contiguous). Reads it back to the host
    once to check it: a wrong cu_seqlens would otherwise read or write out of bounds silently."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be a 1-D tensor of B + 1 sequence starts; got {cu!r:.80}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int32 tensor; got {cu.dtype}")
    if cu.device != device:
        raise ValueError(f"{name} must be on q's device {device}; got {cu.device}")
    host = cu.tolist()
    if host[0] != 0 or host[-1] != total or any(b < a for a, b in zip(host, host[1:])):
        raise ValueError(f"{name} must start at 0, never decrease and end at the token count {total}; got {host[:8]}{'...' if len(host) > 8 else ''}")
    longest = max(b - a for a, b in zip(host, host[1:]))
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, numbers.Integral) or max_seqlen < longest:
        raise ValueError(f"{max_name} must be an int >= the longest sequence ({longest}); got {max_seqlen!r}")
    return cu.to(torch.int32).contiguous()
