"""FP8 (e4m3) FlashAttention forward kernel (FlashAttention-3 §3.3) in Triton.

Q, K and V arrive as float8_e4m3fn numbers with float32 *descales*: x ~ x8 * descale, one
descale per (batch, head) or per block of rows (:func:`quantize_fp8`). One program computes
one block of BLOCK_M query rows of one (batch, head), with the FlashAttention-2 structure of
:mod:`.forward`:

    r_i   = scale * log2(e) * dq_i                     one factor per query row (Q's descale)
    for each key block j (K8_j, V8_j streamed from HBM):
        S_ij  = (Q8_i K8_j^T) * r_i * dk_j            fp8 x fp8 tensor-core dot, fp32 accumulator;
                                                       the descales scale the fp32 result (§3.3)
        m_new = max(m, rowmax(S_ij))                   running max, log2 units
        P_ij  = exp2(S_ij - m_new + 8)                 = 2^8 exp2(S_ij - m_new), in (0, 256]
        l     = exp2(m - m_new) l + rowsum(P_ij)       the row sum of the *unrounded* P
        O     = exp2(m - m_new) (u/dv_j) O + fp8(P_ij) V8_j   u: the V descale O is kept in
        u     = dv_j                                   (O's rows are true values / u)
    O = O * u / l                                      divide once, at the end; the 2^8 cancels

P is cast to FP8 for the second tensor-core dot. e4m3 has normal numbers only down to 2^-6,
so P is computed 2^8 times larger (FA3's softmax subtracts ``Max_offset = 8`` from the max):
entries down to 2^-14 of the row max keep their 3-bit mantissa, and l, which sums the same
scaled values, cancels the 2^8 in O / l.

Incoherent processing (非相干处理, §3.3): :func:`rotate` multiplies Q and K by the same random
orthogonal R = diag(sigma) H_d / sqrt(d), so (Q R)(K R)^T = Q K^T while an outlier in one
coordinate spreads over all d of them.

Glossary: 量化 quantisation; 反量化 dequantisation (x8 * descale); descale = 缩放因子 (the
inverse of the factor that scaled x into FP8 range); amax = 绝对值最大值; e4m3 = 4 exponent
bits, 3 mantissa bits (指数位, 尾数位); block quantisation = 分块量化; outlier = 离群值;
BLOCK_M = B_r (行块); BLOCK_N = B_c (列块); m = running max (当前最大值); l = running sum
(分母); acc = unnormalised O (累加器); u = V's descale that O is kept in; tensor core = 张量核心.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from triton.tools.tensor_descriptor import TensorDescriptor

from ._common import (
    INTERPRET,
    LOG2E,
    SUPPORTED_DTYPES,
    Candidate,
    causal_range_tl,
    check_head_dim,
    check_runnable,
    check_scale,
    check_tensors,
    configs,
    has_tma,
    launch_options,
    pruner,
)

__all__ = ["CANDIDATES", "FP8_MAX", "P_SHIFT", "WIDE_CANDIDATES", "dequantize_fp8", "flash_attention_fp8",
           "flash_attention_fp8_from", "fp8_tma_eligible", "launch_fp8", "quantize_fp8", "quantize_qkv", "rotate"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn number, 1.75 x 2^8
P_SHIFT = 8.0  # P is computed as 2^P_SHIFT exp2(S - m): (0, 256] instead of (0, 1]
_SHIFT = tl.constexpr(P_SHIFT)  # the same number, readable inside the kernel
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# (BLOCK_M, BLOCK_N, warps, stages[, max registers]) for sm_90; few, so that autotuning compiles
# little. The first serves FLASHLAB_AUTOTUNE=0. 64 query rows by 128 keys with one warp group
# computes the same scores per step as 128 x 64 with fewer instructions per score (O is rescaled
# once per 128 keys, not per 64). A cap of 168 registers with 2 stages (72 KB of shared memory)
# lets three programs share an SM, so that one's tensor-core work overlaps another's exponentials.
CANDIDATES: list[Candidate] = [(64, 128, 4, 3), (64, 128, 4, 2, 168), (128, 64, 4, 3), (64, 64, 4, 3, 128)]
WIDE_CANDIDATES: list[Candidate] = [(128, 64, 8, 2), (64, 64, 4, 2)]  # d = 256


def _descriptor_blocks(nargs: dict) -> None:
    """Autotune pre-hook: the TMA descriptors' block shapes follow the configuration's tiles."""
    if isinstance(nargs["Q"], TensorDescriptor):
        nargs["Q"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_D"]]  # Q_i: queries x d
    if isinstance(nargs["K"], TensorDescriptor):
        nargs["K"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_D"]]  # K_j: keys x d
        nargs["V"].block_shape = [nargs["BLOCK_D"], nargs["BLOCK_N"]]  # V_j^T: d x keys


_CONFIGS = configs(CANDIDATES, WIDE_CANDIDATES, interpret_config={"BLOCK_M": 16, "BLOCK_N": 16},
                   pre_hook=_descriptor_blocks)
_by_width = pruner(WIDE_CANDIDATES)


def _prune(configs_, named_args, **kwargs):
    """Configurations for the head dimension (see _common.pruner) whose BLOCK_N divides
    v_block: V's descale must be one scalar per key tile."""
    kept = _by_width(configs_, named_args, **kwargs)
    v_sb = kwargs["V_SB"] if "V_SB" in kwargs else named_args["V_SB"]
    return [c for c in kept if v_sb == 0 or v_sb % c.kwargs["BLOCK_N"] == 0]


@triton.jit
def round_e4m3(x):
    """x >= 0 rounded to the nearest e4m3 number, ties to even (no saturation: here x <= 256).

    Under the interpreter (TRITON_INTERPRET=1) fp8 loads and fp8 ``tl.dot`` are exact, but the
    fp32 -> fp8 cast rounds wrongly when rounding carries into the next binade (7.9 -> 4
    instead of 8) and in the subnormal range; the kernel rounds P with this function first,
    after which the cast is exact. On a GPU it casts directly (cvt.rn, the same rounding).

    The arithmetic of reference.fp8.round_to_fp8: the binade's exponent e (never below the
    subnormal range's -6) gives the grid spacing 2^(e-3); x / 2^(e-3) < 16 is rounded to an
    integer by adding and subtracting 2^23 in fp32 (round to nearest even)."""
    bits = x.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # floor(log2 x), at least 1 - bias
    quantum = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(e - 3): 3 mantissa bits
    y = x / quantum  # exact: a power of two
    r = (y + 8388608.0) - 8388608.0  # nearest integer, ties to even (0 <= y < 2^23)
    return r * quantum


@triton.jit
def _tile_factor(qk, row_factor, kd_ptr, start_n, n, N_K,
                 BLOCK_N: tl.constexpr, K_SB: tl.constexpr, ROW_SCALAR: tl.constexpr):
    """S_ij = qk * r_i * dk_j in log2 units: the descales scale the fp32 result. Returns (qk, f,
    f_rows): qk with any per-key descale applied, and the factor f_i that turns it into S, as
    computed (a scalar or (BLOCK_M,)) and ready to broadcast over the tile. When one factor f_i
    serves a whole row, S is never formed: max(S) = f_i max(qk) (f_i > 0), and the exponent takes
    qk * f_i - (m - 8) as one fused multiply-add, as in forward.py."""
    if K_SB == 0:  # dk per (batch, head): already folded into row_factor
        f = row_factor
    elif K_SB % BLOCK_N == 0:  # the whole key tile shares one descale
        f = row_factor * tl.load(kd_ptr + start_n // K_SB)
    else:  # quantisation blocks cut through the tile: one descale per key
        kd = tl.load(kd_ptr + n // K_SB, mask=n < N_K, other=1.0)
        qk = qk * kd[None, :]  # the per-key factor first; f_i then scales whole rows
        f = row_factor
    if ROW_SCALAR:  # one factor for the whole tile (a scalar): broadcasts as it is
        f_rows = f
    else:  # one factor per query row: a column
        f_rows = f[:, None]
    return qk, f, f_rows


@triton.jit
def _softmax_fp8(l_i, m_i, v_unit, qk, row_factor, kd_ptr, vd_ptr, start_n, n, offs_m, N_K, causal_offset,
                 BLOCK_N: tl.constexpr, K_SB: tl.constexpr, V_SB: tl.constexpr, MASKED: tl.constexpr,
                 CAUSAL: tl.constexpr, EMULATE_CAST: tl.constexpr, ROW_SCALAR: tl.constexpr):
    """One online-softmax step for key tile j (keys n = start_n + [0, BLOCK_N)): the module
    docstring's loop body up to the P V dot. Returns P_ij (fp32, on e4m3's grid when
    EMULATE_CAST), the factor o_scale (BLOCK_M,) that O is multiplied by before fp8(P_ij) V8_j
    is added (alpha, times u / dv_j when V has a descale per block), and the new l, m and u.
    MASKED tiles (the causal diagonal, the ragged end of N_k) form S and mask it."""
    qk, f, f_rows = _tile_factor(qk, row_factor, kd_ptr, start_n, n, N_K, BLOCK_N, K_SB, ROW_SCALAR)
    if MASKED:
        visible = n[None, :] < N_K
        if CAUSAL:
            visible = visible & (n[None, :] <= offs_m[:, None] + causal_offset)
        s = tl.where(visible, qk * f_rows, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # m_new = max(m, rowmax(S_ij))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing: exp2 -> 0, not NaN
        p = tl.math.exp2(s - (m_ref - _SHIFT)[:, None])  # P_ij = 2^8 exp2(S_ij - m_new)
    else:  # every key visible; descales are positive, so rowmax(qk f) = f rowmax(qk)
        m_new = tl.maximum(m_i, tl.max(qk, 1) * f)  # m_new = max(m, rowmax(S_ij))
        m_ref = m_new
        p = tl.math.exp2(qk * f_rows - (m_ref - _SHIFT)[:, None])  # P_ij = 2^8 exp2(S_ij - m_new), one FMA
    alpha = tl.math.exp2(m_i - m_ref)  # exp2(m - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)  # l = alpha l + rowsum(P_ij), before rounding
    if EMULATE_CAST:
        p = round_e4m3(p)  # the interpreter's own cast rounds carries wrongly
    if V_SB == 0:  # one dv for every key: applied once, at the end
        o_scale = alpha
    else:  # keep O in units of V_j's descale dv_j
        vd = tl.load(vd_ptr + start_n // V_SB)
        o_scale = alpha * (v_unit / vd)
        v_unit = vd
    return p, o_scale, l_i, m_new, v_unit


@triton.jit
def _k_tile(K, k_at, start_n, n_ok, d_ok, MASKED: tl.constexpr, PADDED_D: tl.constexpr, TMA: tl.constexpr):
    """K8_j^T (BLOCK_D, BLOCK_N) for keys start_n + [0, BLOCK_N). TMA: K is a descriptor of the
    (Z*H*N_K, d) view and k_at this head's first row; whole rows are read (rows past N_K belong
    to the next head; S masks them). Otherwise K points at K_0^T's tile and k_at is the stride
    between keys; loads are masked by the key bound n_ok where MASKED and by the head dimension
    d_ok where it is padded. Kept in fp8: fp8 loads and dots are exact under the interpreter."""
    if TMA:
        k = K.load([k_at + start_n, 0]).T
    elif MASKED:
        k = tl.load(K + start_n * k_at, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
    elif PADDED_D:
        k = tl.load(K + start_n * k_at, mask=d_ok[:, None], other=0.0)
    else:
        k = tl.load(K + start_n * k_at)
    return k


@triton.jit
def _v_tile(V, v_at, start_n, n_ok, d_ok, MASKED: tl.constexpr, PADDED_D: tl.constexpr, TMA: tl.constexpr):
    """V8_j (BLOCK_N, BLOCK_D) for keys start_n + [0, BLOCK_N). TMA: V is a descriptor of the
    keys-contiguous (Z*H*d, N_K) view and v_at this head's first row (columns past N_K are
    zero-filled). Otherwise V points at V_0's tile and v_at is the stride between keys."""
    if TMA:
        v = V.load([v_at, start_n]).T
    elif MASKED:
        v = tl.load(V + start_n * v_at, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    elif PADDED_D:
        v = tl.load(V + start_n * v_at, mask=d_ok[None, :], other=0.0)
    else:
        v = tl.load(V + start_n * v_at)
    return v


@triton.jit
def _attend_fp8(
    acc, l_i, m_i, v_unit, q, row_factor,  # running state; Q8_i; r_i: (BLOCK_M,) or a scalar
    K, V, k_at, v_at, kd_ptr, vd_ptr,  # K, V tiles (see _k_tile); this head's descales
    offs_m, lo, hi, N_K, causal_offset,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, K_SB: tl.constexpr, V_SB: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EMULATE_CAST: tl.constexpr, TMA: tl.constexpr,
    ROW_SCALAR: tl.constexpr,
):
    """Fold key blocks [lo, hi) into (acc, l_i, m_i, v_unit). MASKED blocks check key bounds
    (and the causal diagonal); unmasked ones are known to be fully visible."""
    d_ok = tl.arange(0, BLOCK_D) < D_HEAD
    PADDED_D: tl.constexpr = BLOCK_D != D_HEAD
    for start_n in tl.range(lo, hi, BLOCK_N):
        n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key indices
        k = _k_tile(K, k_at, start_n, n < N_K, d_ok, MASKED, PADDED_D, TMA)
        v = _v_tile(V, v_at, start_n, n < N_K, d_ok, MASKED, PADDED_D, TMA)
        qk = tl.dot(q, k)  # Q8_i K8_j^T: fp8 x fp8 on the tensor cores, fp32 accumulator
        p, o_scale, l_i, m_i, v_unit = _softmax_fp8(l_i, m_i, v_unit, qk, row_factor, kd_ptr, vd_ptr, start_n, n,
                                                    offs_m, N_K, causal_offset, BLOCK_N, K_SB, V_SB, MASKED,
                                                    CAUSAL, EMULATE_CAST, ROW_SCALAR)
        acc = acc * o_scale[:, None]  # O = alpha (u / dv_j) O ...
        acc = tl.dot(p.to(tl.float8e4nv), v, acc)  # ... + fp8(P_ij) V8_j: round to nearest even, fp8 x fp8
    return acc, l_i, m_i, v_unit


@triton.jit
def _descale_row(D, strides, off_z, off_h):
    """This (batch, head)'s row of a descale tensor (Z, H, nb) with ``strides``."""
    return D + off_z * strides[0] + off_h * strides[1]


@triton.jit
def _query_tile(Q, q_strides, off_z, off_h, off_zh, start_m, N_Q,
                D_HEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, TMA_Q: tl.constexpr):
    """Q8_i (BLOCK_M, BLOCK_D), which stays on chip for the whole key loop. TMA_Q: Q is a
    descriptor of the (Z*H*N_Q, d) view; rows past N_Q (the next head's, or zero-filled) give
    rows that the store leaves out. Otherwise a masked pointer load."""
    if TMA_Q:
        q = Q.load([off_zh * N_Q + start_m * BLOCK_M, 0])
    else:
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q_ptrs = Q + off_z * q_strides[0] + off_h * q_strides[1] + offs_m[:, None] * q_strides[2] \
            + offs_d[None, :] * q_strides[3]
        q = tl.load(q_ptrs, mask=(offs_m < N_Q)[:, None] & (offs_d < D_HEAD)[None, :], other=0.0)
    return q


@triton.jit
def _factors(QD, KD, VD, descale_strides, off_z, off_h, start_m, N_Q, qk_scale,
             Q_SB: tl.constexpr, K_SB: tl.constexpr, V_SB: tl.constexpr, BLOCK_M: tl.constexpr):
    """The descales of this program: r_i = scale * log2(e) * dq_i (times dk when K has one
    descale per head), this head's rows of K's and V's descales, and the initial u.

    r_i is a scalar when the whole query tile shares one descale (Q_SB = 0 or a multiple of
    BLOCK_M), which holds no register per row; else a (BLOCK_M,) gather."""
    qd_ptr = _descale_row(QD, descale_strides[0], off_z, off_h)
    kd_ptr = _descale_row(KD, descale_strides[1], off_z, off_h)
    vd_ptr = _descale_row(VD, descale_strides[2], off_z, off_h)
    if Q_SB == 0:
        row_factor = qk_scale * tl.load(qd_ptr)
    elif Q_SB % BLOCK_M == 0:
        row_factor = qk_scale * tl.load(qd_ptr + start_m * BLOCK_M // Q_SB)
    else:
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_factor = qk_scale * tl.load(qd_ptr + offs_m // Q_SB, mask=offs_m < N_Q, other=1.0)
    if K_SB == 0:
        row_factor = row_factor * tl.load(kd_ptr)  # one dk for every key
    if V_SB == 0:
        v_unit = tl.load(vd_ptr)  # one dv for every key: applied once, at the end
    else:
        v_unit = tl.load(vd_ptr) * 0.0 + 1.0  # replaced by the first tile's dv (fp32 scalar)
    return row_factor, kd_ptr, vd_ptr, v_unit


@triton.jit
def _store_o(O, o_strides, acc, l_i, v_unit, off_z, off_h, start_m, N_Q,
             D_HEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """O = O * u / l: dequantises V and divides by the row sum (the 2^8 of P cancels). Rows
    that saw no key (causal with N_Q > N_K) have l = 0: output 0."""
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    acc = acc * (v_unit / l_safe)[:, None]
    o_ptrs = O + off_z * o_strides[0] + off_h * o_strides[1] + offs_m[:, None] * o_strides[2] \
        + offs_d[None, :] * o_strides[3]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m < N_Q)[:, None] & (offs_d < D_HEAD)[None, :])


@triton.jit
def _key_tiles(K, V, k_strides, v_strides, off_z, off_h, off_zh, N_K,
               D_HEAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, TMA: tl.constexpr):
    """(K, V, k_at, v_at) as _k_tile and _v_tile take them: the descriptors and this head's
    first row in each view (TMA), or pointers to K_0^T's and V_0's tiles and the strides between
    keys."""
    if TMA:
        k_src = K
        v_src = V
        k_at = off_zh * N_K  # row of K_0 in the (Z*H*N_K, d) view
        v_at = off_zh * D_HEAD  # row of V^T's first dimension in the (Z*H*d, N_K) view
    else:
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        k_src = K + off_z * k_strides[0] + off_h * k_strides[1] + offs_n[None, :] * k_strides[2] \
            + offs_d[:, None] * k_strides[3]
        v_src = V + off_z * v_strides[0] + off_h * v_strides[1] + offs_n[:, None] * v_strides[2] \
            + offs_d[None, :] * v_strides[3]
        k_at = k_strides[2]
        v_at = v_strides[2]
    return k_src, v_src, k_at, v_at


@triton.autotune(configs=_CONFIGS, key=["N_Q", "N_K", "BLOCK_D", "CAUSAL", "Q_SB", "K_SB", "V_SB", "TMA"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _fp8_forward_kernel(
    Q, K, V, O,  # fp8 (Z, H, N, d), any strides, or (TMA) descriptors (see _query_tile, _k_tile); O (Z, H, N_Q, d)
    QD, KD, VD,  # descales, fp32 (Z, H, nb)
    q_strides, k_strides, v_strides, o_strides,  # each (batch, head, row, d)
    descale_strides,  # (QD's, KD's, VD's), each (batch, head, block)
    H, N_Q, N_K, qk_scale,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
    Q_SB: tl.constexpr, K_SB: tl.constexpr, V_SB: tl.constexpr,  # rows per descale; 0: one per (batch, head)
    EMULATE_CAST: tl.constexpr, TMA: tl.constexpr, TMA_Q: tl.constexpr,
    EVEN_N: tl.constexpr,  # no causal mask and N_K a multiple of every BLOCK_N: no masked key block
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_zh = tl.program_id(1)
    off_z = off_zh // H
    off_h = off_zh % H
    causal_offset = N_K - N_Q  # bottom-right alignment
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)

    q = _query_tile(Q, q_strides, off_z, off_h, off_zh, start_m, N_Q, D_HEAD, BLOCK_M, BLOCK_D, TMA_Q)
    row_factor, kd_ptr, vd_ptr, v_unit = _factors(QD, KD, VD, descale_strides, off_z, off_h, start_m, N_Q, qk_scale,
                                                  Q_SB, K_SB, V_SB, BLOCK_M)
    ROW_SCALAR: tl.constexpr = Q_SB == 0 or Q_SB % BLOCK_M == 0  # r_i is one scalar
    k_src, v_src, k_at, v_at = _key_tiles(K, V, k_strides, v_strides, off_z, off_h, off_zh, N_K,
                                          D_HEAD, BLOCK_N, BLOCK_D, TMA)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Which key blocks to visit (_common.causal_key_range): [0, lo) unmasked, [lo, hi) masked.
    lo, hi = causal_range_tl(start_m, BLOCK_M, N_Q, N_K, BLOCK_N, CAUSAL)
    acc, l_i, m_i, v_unit = _attend_fp8(acc, l_i, m_i, v_unit, q, row_factor, k_src, v_src, k_at, v_at, kd_ptr,
                                        vd_ptr, offs_m, 0, lo, N_K, causal_offset, D_HEAD, BLOCK_D, BLOCK_N, K_SB, V_SB,
                                        False, CAUSAL, EMULATE_CAST, TMA, ROW_SCALAR)
    if not EVEN_N:
        acc, l_i, m_i, v_unit = _attend_fp8(acc, l_i, m_i, v_unit, q, row_factor, k_src, v_src, k_at, v_at, kd_ptr,
                                            vd_ptr, offs_m, lo, hi, N_K, causal_offset, D_HEAD, BLOCK_D, BLOCK_N, K_SB, V_SB,
                                            True, CAUSAL, EMULATE_CAST, TMA, ROW_SCALAR)
    _store_o(O, o_strides, acc, l_i, v_unit, off_z, off_h, start_m, N_Q, D_HEAD, BLOCK_M, BLOCK_D)


# ----------------------------------------------------------------------------- host side
def _check_block(name: str, block) -> int | None:
    if block is None:
        return None
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"{name} must be None or a positive int; got {block!r}")
    return block


def _check_float_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{name} must be 4-D (batch, heads, seq_len, head_dim); got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must have dtype float16, bfloat16 or float32; got {x.dtype}")


def quantize_fp8(x: torch.Tensor, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and round ``x`` (B, H, N, d) to float8_e4m3fn: ``x ~ x8 * descale``.

    descale = amax(|x|) / 448 over each (batch, head) (``block=None``: shape (B, H, 1)) or over
    each block of ``block`` rows along N (shape (B, H, ceil(N / block)), the last block ragged);
    an all-zero block gets descale 1. The division runs in float32 and torch's own cast rounds
    (to nearest, ties to even; correct on CPU and GPU). For one (batch, head) this is
    reference.fp8.quantize.

    Returns ``(x8, descale)``: x8 float8_e4m3fn (B, H, N, d) contiguous, descale float32.
    """
    _check_float_tensor("x", x)
    block = _check_block("block", block)
    B, H, N, d = x.shape
    rows = N if block is None else block
    nb = max(1, -(-N // rows))
    pad = nb * rows - N
    if pad:  # zero rows: no effect on amax
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
    blocks = x.reshape(B, H, nb, rows, d)  # a view when x is contiguous
    # Few passes over memory (timed in the experiment's flashlab_fp8_incl_quant): max |x| in one
    # reduction (no |x| temporary), x / descale in float32, the cast.
    amax = torch.linalg.vector_norm(blocks, ord=float("inf"), dim=(-2, -1)).float()  # (B, H, nb)
    descale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    scaled = torch.div(blocks, descale[..., None, None])  # float32 (bf16 / fp32 promotes)
    # |scaled| <= amax / fl(amax / 448) < 448 (1 + 2^-22): beyond 448 by an ulp at most, which
    # rounds back to 448 (the midpoint to the next binade is 464), so no clamp is needed.
    x8 = scaled.to(FP8_DTYPE).view(B, H, nb * rows, d)
    if pad:
        x8 = x8[:, :, :N].contiguous()
    return x8, descale.contiguous()


def dequantize_fp8(x8: torch.Tensor, descale: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """``x8 * descale`` in float32, each descale broadcast over its rows (see :func:`quantize_fp8`)."""
    block = _check_block("block", block)
    N = x8.shape[-2]
    rows = descale.repeat_interleave(N if block is None else block, dim=-1)[..., :N]  # (B, H, N)
    return x8.float() * rows[..., None].float()


@functools.lru_cache(maxsize=16)
def _orthogonal(d: int, seed: int):
    from ..reference.fp8 import random_orthogonal

    return random_orthogonal(d, seed).matrix  # float64 numpy (d, d): D H / sqrt(d)


def rotate(q: torch.Tensor, k: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Incoherent processing: ``(q M, k M)`` in float32, M = D H / sqrt(d) the random orthogonal
    matrix of reference.fp8.random_orthogonal(d, seed) (d a power of two). M M^T = I, so
    (q M)(k M)^T = q k^T; an outlier of one coordinate is spread over all d of them.
    A dense (d, d) product on q's device: 2 d^2 flops a row, small beside attention's 4 N d."""
    _check_float_tensor("q", q)
    _check_float_tensor("k", k)
    d = q.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"q and k must have the same head dimension d; got q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}")
    if d & (d - 1):
        raise ValueError(f"rotate needs a head dimension d that is a power of two; got d={d}")
    m = torch.from_numpy(_orthogonal(d, int(seed))).to(device=q.device, dtype=torch.float32)
    return q.float() @ m, k.float() @ m


def _n_contiguous(v: torch.Tensor) -> torch.Tensor:
    """The same (B, H, N, d) values stored as (B, H, d, N): keys contiguous, the layout the fp8
    P V dot wants (see :func:`flash_attention_fp8`), as the Triton tutorial stores V for fp8."""
    return v.transpose(-2, -1).contiguous().transpose(-2, -1)


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int | None = 128,
                 hadamard: bool = False, seed: int = 0, *, v_block: int | None | str = "same") -> dict:
    """Quantise q, k, v for :func:`flash_attention_fp8`: ``flash_attention_fp8(**quantize_qkv(q, k, v))``.

    ``block`` rows share a descale (None: one per batch and head); ``v_block`` overrides it for V
    ("same": ``block``; None: one descale per batch and head, as FlashAttention-3 scales V);
    ``hadamard`` first rotates q and k (:func:`rotate`). V is returned in the keys-contiguous
    layout the fp8 P V dot wants. Returns a dict with q, k, v, q_descale, k_descale, v_descale,
    q_block, k_block, v_block."""
    if isinstance(v_block, str):
        if v_block != "same":
            raise ValueError(f"v_block must be 'same', None or a positive int; got {v_block!r}")
        v_block = block
    if hadamard:
        q, k = rotate(q, k, seed)
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(t, b) for t, b in ((q, block), (k, block), (v, v_block)))
    return {"q": q8, "k": k8, "v": _n_contiguous(v8), "q_descale": qd, "k_descale": kd, "v_descale": vd,
            "q_block": block, "k_block": block, "v_block": v_block}


def _check_fp8_inputs(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq_len, head_dim); got shape {tuple(t.shape)}")
        if t.dtype != FP8_DTYPE:
            raise TypeError(f"{name} must have dtype torch.float8_e4m3fn (quantise it with quantize_fp8); got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"q and {name} must be on the same device; got q on {q.device}, {name} on {t.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[:2] != q.shape[:2]:
        raise ValueError(f"q, k and v must have the same batch size and number of heads; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"q and k must have the same head dimension d; got q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}")


def _descale(name: str, descale, block: int | None, B: int, H: int, N: int, device) -> torch.Tensor:
    nb = 1 if block is None else -(-N // block)
    if descale is None:
        if block is not None:
            raise ValueError(f"{name} must be given when its block is set; got None with block {block}")
        return torch.ones(B, H, 1, device=device, dtype=torch.float32)
    if not isinstance(descale, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None; got {type(descale).__name__}")
    if descale.dtype != torch.float32:
        raise TypeError(f"{name} must have dtype float32; got {descale.dtype}")
    if descale.device != device:
        raise ValueError(f"{name} must be on the inputs' device {device}; got {descale.device}")
    if tuple(descale.shape) != (B, H, nb):
        what = "(B, H, 1) for one descale per batch and head" if block is None else f"(B, H, ceil({N} / {block}))"
        raise ValueError(f"{name} must have shape {what} = {(B, H, nb)}; got {tuple(descale.shape)}")
    return descale


def fp8_tma_eligible(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the FP8 kernel can read K and V through tensor descriptors: a Hopper-or-newer GPU
    (or the interpreter, which emulates them), K contiguous (B, H, N, d), V keys-contiguous
    (the layout :func:`quantize_qkv` returns), d a power of two >= 32 (a tile row is whole
    16-byte units and never runs into the next head), and N a multiple of 16 (V's rows of N
    bytes must start 16-byte aligned)."""
    d, n = k.shape[-1], k.shape[-2]
    return (has_tma(k) and k.is_contiguous() and v.transpose(-2, -1).is_contiguous()
            and d >= 32 and d & (d - 1) == 0 and n % 16 == 0)


def _check_fp8_device(device: torch.device) -> None:
    check_runnable(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise ValueError(f"the FP8 kernel needs FP8 tensor cores (compute capability 8.9 or newer); got {name} "
                         f"with {torch.cuda.get_device_capability(device)}")


def flash_attention_fp8(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None,
    q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None, *, q_block: int | None = None, k_block: int | None = None,
    v_block: int | None = None, out_dtype: torch.dtype = torch.bfloat16, config: Candidate | None = None,
    tma: bool | None = None, impl: str = "triton",
) -> torch.Tensor:
    """softmax(scale * Q K^T (+ causal mask)) V from FP8 inputs, forward only.

    Parameters
    ----------
    q : float8_e4m3fn (B, H, N_q, d); k, v : float8_e4m3fn (B, H, N_k, d), any strides; d <= 256.
        V is best stored keys-contiguous, as :func:`quantize_qkv` returns it: on Hopper an fp8
        wgmma reads its B operand from shared memory in K-major order only, and for O = P V the
        reduction runs over keys. A (B, H, N, d) V with d contiguous gives the same answer,
        more slowly.
    causal : mask keys after the query, aligned bottom-right when N_q != N_k.
    scale : softmax scale, default 1/sqrt(d).
    q_descale, k_descale, v_descale : float32 (B, H, ceil(N / block)), or (B, H, 1) when the
        block is None; None means 1 (the fp8 values are the true values). Positive, as
        :func:`quantize_fp8` makes them (amax / 448, or 1 for an all-zero block): the kernel
        takes rowmax(qk · descale) as descale · rowmax(qk).
    q_block, k_block, v_block : rows per descale (None: one per batch and head). The blocks need
        not match the kernel's tiles: Q's descale is one scalar per program when q_block is a
        multiple of BLOCK_M, else one per row; K's one scalar per key tile when k_block is a
        multiple of BLOCK_N, else one per key. v_block must be a multiple of BLOCK_N (64 or 128
        on a GPU, 16 under the interpreter): V's descale cannot scale P's columns before the fp8
        cast, so the kernel keeps O in units of the current tile's descale u and rescales it by
        u_old / u_new together with alpha.
    out_dtype : bfloat16 (default), float16 or float32.
    config : (BLOCK_M, BLOCK_N, warps, stages[, max registers]) to bypass autotuning.
    tma : read K and V through tensor descriptors (and Q, when contiguous): None (default) when
        :func:`fp8_tma_eligible`, True to require it, False for pointer loads.
    impl : "triton" (default): this module's kernel, on any GPU with FP8 tensor cores (or the
        interpreter); "gluon": FlashAttention-3's warp-specialised FP8 forward
        (:func:`flashlab.kernels.fa3_fp8.fa3_fp8_forward`), on a Hopper GPU, d = 64 or 128,
        q_block a multiple of 64, k_block of 128, v_block None; config and tma do not apply.

    Returns o (B, H, N_q, d) in ``out_dtype``.
    """
    if impl not in ("triton", "gluon"):
        raise ValueError(f"impl must be 'triton' or 'gluon'; got {impl!r}")
    if impl == "gluon":
        from .fa3_fp8 import fa3_fp8_forward

        if config is not None or tma is not None:
            raise ValueError("config and tma apply to impl='triton' only")
        return fa3_fp8_forward(q, k, v, causal, scale, q_descale, k_descale, v_descale, q_block=q_block,
                               k_block=k_block, v_block=v_block, out_dtype=out_dtype)[0]
    return launch_fp8(_fp8_forward_kernel, q, k, v, causal, scale, q_descale, k_descale, v_descale, q_block=q_block,
                      k_block=k_block, v_block=v_block, out_dtype=out_dtype, config=config, tma=tma)


def launch_fp8(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
               q_descale: torch.Tensor | None, k_descale: torch.Tensor | None, v_descale: torch.Tensor | None, *,
               q_block: int | None, k_block: int | None, v_block: int | None, out_dtype: torch.dtype,
               config: Candidate | None, tma: bool | None, **constexprs) -> torch.Tensor:
    """Check the arguments of :func:`flash_attention_fp8` and launch ``kernel`` (the autotuned
    :func:`_fp8_forward_kernel`, or a @triton.jit kernel with its parameters and ``constexprs``
    beside them, which then needs ``config``) on them. Returns o."""
    _check_fp8_inputs(q, k, v)
    B, H, N_Q, D = q.shape
    N_K = k.shape[2]
    check_head_dim(D)
    _check_fp8_device(q.device)
    scale = check_scale(scale, D)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16, torch.float16 or torch.float32; got {out_dtype}")
    q_block, k_block, v_block = (_check_block(n, b) for n, b in (("q_block", q_block), ("k_block", k_block),
                                                                  ("v_block", v_block)))
    qd = _descale("q_descale", q_descale, q_block, B, H, N_Q, q.device)
    kd = _descale("k_descale", k_descale, k_block, B, H, N_K, q.device)
    vd = _descale("v_descale", v_descale, v_block, B, H, N_K, q.device)
    block_d = max(32, triton.next_power_of_2(D))  # fp8 dots reduce over at least 32
    if v_block is not None:
        if config is not None:
            tiles = {config[1]}
        else:  # the configurations the autotuner may use here (one per width with FLASHLAB_AUTOTUNE=0)
            tiles = {c.kwargs["BLOCK_N"] for c in _by_width(_CONFIGS, {"BLOCK_D": block_d})}
        if not any(v_block % bn == 0 for bn in tiles):
            raise ValueError(f"v_block must be a multiple of the kernel's BLOCK_N (one of {sorted(tiles)}); got {v_block}")
    eligible = fp8_tma_eligible(k, v)
    if tma and not eligible:
        raise ValueError("tma=True needs a Hopper GPU, K contiguous, V keys-contiguous (as quantize_qkv returns it), "
                         f"d a power of two >= 32 and N_k a multiple of 16; got device {k.device}, d = {D}, N_k = {N_K}, "
                         f"K contiguous {k.is_contiguous()}, V keys-contiguous {v.transpose(-2, -1).is_contiguous()}")
    use_tma = eligible if tma is None else bool(tma)
    o = torch.empty((B, H, N_Q, D), device=q.device, dtype=out_dtype)
    if B * H * N_Q == 0:
        return o
    # One key loop when no block needs a mask: no causal diagonal, N_k a multiple of every BLOCK_N tried.
    widest = config[1] if config is not None else max(c.kwargs["BLOCK_N"] for c in _CONFIGS)
    even_n = not causal and N_K % widest == 0
    tma_q = use_tma and q.is_contiguous() and q.data_ptr() % 16 == 0
    q_src, k_src, v_src = q, k, v
    if use_tma:  # block shapes follow the configuration (the autotuner's pre-hook sets them per config)
        bm, bn = (config[0], config[1]) if config is not None else (16, 16)
        k_src = TensorDescriptor.from_tensor(k.view(-1, D), [bn, block_d])  # K as (Z*H*N_K, d) rows
        v_src = TensorDescriptor.from_tensor(v.transpose(-2, -1).view(-1, N_K), [block_d, bn])  # V^T: (Z*H*d, N_K)
        if tma_q:
            q_src = TensorDescriptor.from_tensor(q.view(-1, D), [bm, block_d])  # Q as (Z*H*N_Q, d) rows
    grid = lambda meta: (triton.cdiv(N_Q, meta["BLOCK_M"]), B * H)  # noqa: E731
    if config is not None and isinstance(kernel, triton.runtime.Autotuner):
        kernel = kernel.fn  # the jit function under the autotuner: one explicit configuration
    kernel[grid](
        q_src, k_src, v_src, o, qd, kd, vd, q.stride(), k.stride(), v.stride(), o.stride(),
        (qd.stride(), kd.stride(), vd.stride()),
        H, N_Q, N_K, scale * LOG2E,  # scale * log2(e): scores in log2 units
        D_HEAD=D, BLOCK_D=block_d, CAUSAL=causal, Q_SB=q_block or 0, K_SB=k_block or 0, V_SB=v_block or 0,
        EMULATE_CAST=INTERPRET, TMA=use_tma, TMA_Q=tma_q, EVEN_N=even_n, **constexprs, **launch_options(config),
    )
    return o


def flash_attention_fp8_from(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None, *,
    block: int | None = 128, hadamard: bool = False, seed: int = 0, out_dtype: torch.dtype | None = None,
    config: Candidate | None = None, v_block: int | None | str = "same", impl: str = "triton",
) -> torch.Tensor:
    """FP8 attention of bf16/fp16/fp32 inputs (B, H, N, d): quantise (per ``block`` rows, None: per
    batch and head; ``v_block`` for V if different; ``hadamard``: rotate q and k first, d a power
    of two; see :func:`quantize_qkv`), then :func:`flash_attention_fp8` (``impl`` "triton" or "gluon", as there). Output in ``out_dtype``, default
    q's dtype (bfloat16 for float32)."""
    layout = "(batch, heads, seq_len, head_dim)"
    check_tensors(q, layout, k=(k, layout), v=(v, layout))
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    check_runnable(q.device)
    if out_dtype is None:
        out_dtype = q.dtype if q.dtype != torch.float32 else torch.bfloat16
    return flash_attention_fp8(**quantize_qkv(q, k, v, block, hadamard, seed, v_block=v_block), causal=causal,
                               scale=scale, out_dtype=out_dtype, config=config, impl=impl)

