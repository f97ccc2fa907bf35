"""The FA4 forward variants (flashlab/kernels/fa4.py): software exp2 and conditional rescaling.

Bounds (the tolerance policy):
- fp16/bf16 outputs: max error against the float64 reference at most 2x that of plain PyTorch
  attention in the same precision, plus 1e-5 (the flash-attn rule, as tests/test_kernels.py).
  The cubic's relative error (8.6e-5) is far below P's rounding to bf16 (3.9e-3) or fp16 (4.9e-4),
  so the software exp2 must pass the same rule as the hardware one.
- fp32 outputs (IEEE dots): 1e-5 plus what the cubic can add. Each weight p_i = 2^(s_i - m) gets a
  relative error |d_i| <= eps (eps = the cubic's max relative error on [0, 1]), which moves
  o = sum p_i v_i / sum p_i by at most eps / (1 - eps) * max_i |v_i - o| (a convex combination).
- poly_exp2 against flashlab.reference.softexp.exp2 with the same coefficients: bit-identical
  wherever both take the same integer part (every x whose fractional part is below 1 - 2^-8);
  within eps of 2^x everywhere; exactly 0 at and below -127 (and -inf).
- Rescale counts: exact integers, compared with flashlab.reference.rescale on inputs whose rows
  are identical (the kernel's decision is per tile, the reference's per row; they coincide then).

On a CPU the kernel runs under TRITON_INTERPRET=1 (tests/conftest.py) with blocks of 16; on a
GPU the same tests run at 8x the sequence length, plus compile-level checks of the MUFU work.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from test_kernels import torch_attention  # the low-precision baseline of the tolerance rule

from flashlab.kernels import INTERPRET
from flashlab.kernels.fa4 import (
    COEFFICIENTS,
    fa4_forward,
    flash_attention_fa4,
    mixed_exp2,
    poly_exp2,
    poly_shift,
    realised_poly_fraction,
)
from flashlab.reference import attention as reference_attention, rescale, softexp
from tiers import DEVICE, GPU, SIZE, needs_gpu, runs_somewhere

# Explicit configs: BLOCK_N is then known (the rescale counts depend on it), and the GPU run
# compiles one configuration per variant instead of autotuning each.
CONFIG = (16, 16, 4, 1) if INTERPRET else (64, 64, 4, 2)
BLOCK_N = CONFIG[1]
EPS = softexp.max_relative_error(coefficients=COEFFICIENTS)  # the cubic's max relative error, ~8.6e-5


def _inputs(B, H, H_KV, N_Q, N_K, D, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, N_Q, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H_KV, N_K, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H_KV, N_K, D, generator=g, dtype=torch.float64)
    return q, k, v


def _reference(q, k, v, causal, scale=None):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return torch.from_numpy(reference_attention(q.numpy(), k.numpy(), v.numpy(), causal=causal, scale=scale))


def check(B, H, H_KV, N_Q, N_K, D, causal, dtype, poly, theta, scale=None, config=CONFIG, inputs=None, seed=0):
    """Kernel output vs the float64 reference under the tolerance rule; returns (error, bound)."""
    q, k, v = inputs if inputs is not None else _inputs(B, H, H_KV, N_Q, N_K, D, seed + N_Q * 1000 + N_K + D)
    ref = _reference(q, k, v, causal, scale)  # float64, CPU
    low = [t.to(dtype).to(DEVICE) for t in (q, k, v)]
    o = flash_attention_fa4(*low, causal=causal, scale=scale, poly_fraction=poly, rescale_threshold=theta,
                            config=config)
    assert o.dtype == dtype and o.shape == ref.shape
    err = (o.double().cpu() - ref).abs().max().item()
    if dtype == torch.float32:
        v_full = v.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, N_K, D)
        spread = (v_full.unsqueeze(2) - ref.unsqueeze(3)).abs().amax().item()  # max |v_i - o|
        bound = 1e-5 * max(1.0, ref.abs().max().item()) + (EPS / (1 - EPS) * spread if poly else 0.0)
    else:
        base = torch_attention(*low, causal, scale)
        bound = 2 * (base.double().cpu() - ref).abs().max().item() + 1e-5
    assert err <= bound, f"max error {err:.2e} > bound {bound:.2e} ({N_Q=}, {N_K=}, {D=}, {causal=}, {dtype}, {poly=}, {theta=})"
    return err, bound


# --------------------------------------------------------------- outputs against the reference
@runs_somewhere
@pytest.mark.parametrize("theta", [None, 8.0])
@pytest.mark.parametrize("poly", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_ragged(dtype, causal, poly, theta):
    check(2, 2, 2, 37 * SIZE, 37 * SIZE, 32, causal, dtype, poly, theta)


@runs_somewhere
@pytest.mark.parametrize("theta", [None, 8.0])
@pytest.mark.parametrize("poly", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_bound_includes_the_cubic(causal, poly, theta):
    """fp32: the hardware path is within 1e-5; the cubic adds at most eps * max|v - o|."""
    check(1, 2, 2, 45 * SIZE, 45 * SIZE, 16, causal, torch.float32, poly, theta)


@runs_somewhere
@pytest.mark.parametrize("n_q, n_k", [(20, 45), (45, 20), (1, 33)])
def test_nq_differs_from_nk_causal(n_q, n_k):
    """Bottom-right causal; with N_q > N_k the first rows see no key and give 0 (the cubic gives an
    exact 0 for a masked score, so their l stays 0)."""
    check(1, 2, 2, n_q * SIZE, n_k * SIZE, 32, True, torch.float16, 0.5, 8.0)
    check(1, 2, 2, n_q * SIZE, n_k * SIZE, 32, True, torch.float16, 1.0, None)


@runs_somewhere
@pytest.mark.parametrize("D", [64, 40])
def test_head_dims_gqa_and_scale(D):
    check(2, 4, 2, 33 * SIZE, 33 * SIZE, D, True, torch.bfloat16, 0.25, 8.0, scale=0.3)


@runs_somewhere
def test_non_contiguous_and_autotuned_default():
    q, k, v = _inputs(1, 2, 2, 40 * SIZE, 40 * SIZE, 32, seed=5)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))  # (B, N, H, d) memory
    assert not q.is_contiguous()
    check(1, 2, 2, 40 * SIZE, 40 * SIZE, 32, False, torch.float16, 0.5, 8.0, config=None, inputs=(q, k, v))


@runs_somewhere
def test_poly_really_changes_the_result():
    """The cubic is used: fp32 outputs with and without it differ (by about eps), and with it
    they differ from the reference by more than the fp32 rounding alone (so the check above is
    not vacuous)."""
    q, k, v = (t.float().to(DEVICE) for t in _inputs(1, 2, 2, 32 * SIZE, 32 * SIZE, 16, seed=3))
    hw = flash_attention_fa4(q, k, v, poly_fraction=0.0, config=CONFIG)
    sw = flash_attention_fa4(q, k, v, poly_fraction=1.0, config=CONFIG)
    quarter = flash_attention_fa4(q, k, v, poly_fraction=0.25, config=CONFIG)
    d_sw = (hw - sw).abs().max().item()
    d_quarter = (hw - quarter).abs().max().item()
    assert 1e-6 < d_sw < 10 * EPS and 0 < d_quarter < 10 * EPS


# --------------------------------------------------------------- the software exp2 itself
@triton.jit
def _poly_exp2_kernel(X, Y, N, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < N)
    tl.store(Y + offs, poly_exp2(x, C1, C2, C3), mask=offs < N)


def _kernel_exp2(x: np.ndarray) -> np.ndarray:
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(DEVICE)
    y = torch.empty_like(xt)
    _poly_exp2_kernel[(triton.cdiv(x.size, 1024),)](xt, y, x.size, *COEFFICIENTS[1:], BLOCK=1024)
    return y.cpu().numpy()


@runs_somewhere
def test_poly_exp2_matches_the_numpy_reference():
    x = np.random.default_rng(0).uniform(-126.0, 127.0, 1 << 16).astype(np.float32)
    x[:256] = np.arange(-126, 130)[:256].clip(max=127)  # integers: exact powers of two
    got, ref = _kernel_exp2(x), softexp.exp2(x, coefficients=COEFFICIENTS)
    same_floor = (x - np.floor(x)) < 1 - 2.0**-8  # outside the band where the kernel takes n = floor(x) + 1
    assert same_floor.mean() > 0.99
    assert np.array_equal(got[same_floor].view(np.int32), ref[same_floor].view(np.int32))
    exact = np.exp2(x.astype(np.float64))
    rel = np.abs(got - exact) / exact
    assert rel.max() <= EPS * (1 + 1e-3) + 2.0**-23, f"{rel.max():.3e} vs eps {EPS:.3e}"
    powers = np.ldexp(1.0, x[:254].astype(np.int64)).astype(np.float32)  # 2^n exactly (np.exp2 is 1 ulp off at 127)
    assert np.array_equal(got[:254], powers)  # integer x: p(0) = 1, so 2^n exactly


@runs_somewhere
def test_poly_exp2_clamps_to_exact_zero():
    x = np.array([-np.inf, -1e30, -1000.0, -127.0, -126.0, -0.5, 0.0], dtype=np.float32)
    got = _kernel_exp2(x)
    assert np.all(got[:4] == 0.0)  # a masked score contributes exactly nothing
    assert got[4] == np.float32(2.0**-126) and got[6] == 1.0
    assert abs(got[5] - 2**-0.5) <= EPS * 2**-0.5


@triton.jit
def _mixed_exp2_kernel(X, Y, BM: tl.constexpr, BN: tl.constexpr, POLY_SHIFT: tl.constexpr,
                       C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr):
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    tl.store(Y + offs, mixed_exp2(tl.load(X + offs), BM, BN, POLY_SHIFT, C1, C2, C3))


@runs_somewhere
@pytest.mark.parametrize("poly", [0.0, 0.1, 0.25, 0.5, 1.0])
def test_the_split_tile_uses_the_cubic_on_exactly_the_first_columns(poly):
    """mixed_exp2 on a (16, 64) tile: columns < 64 * realised fraction equal poly_exp2 bit for bit,
    the others the hardware exp2 (which differs from the cubic almost everywhere)."""
    bm, bn, s = 16, 64, poly_shift(poly)
    x = np.random.default_rng(1).uniform(-20.0, 0.0, (bm, bn)).astype(np.float32)
    xt = torch.from_numpy(x).to(DEVICE)
    mixed, hw = torch.empty_like(xt), torch.empty_like(xt)
    _mixed_exp2_kernel[(1,)](xt, mixed, bm, bn, s, *COEFFICIENTS[1:])
    _mixed_exp2_kernel[(1,)](xt, hw, bm, bn, -1, *COEFFICIENTS[1:])
    mixed, hw, sw = mixed.cpu().numpy(), hw.cpu().numpy(), _kernel_exp2(x.ravel()).reshape(bm, bn)
    cols = int(bn * realised_poly_fraction(poly))
    assert np.array_equal(mixed[:, :cols], sw[:, :cols]) and np.array_equal(mixed[:, cols:], hw[:, cols:])
    assert np.mean(sw != hw) > 0.5  # so the two checks above tell the paths apart


def test_poly_fraction_is_realised_as_a_power_of_two():
    assert [realised_poly_fraction(f) for f in (0, 0.1, 0.25, 0.5, 1.0)] == [0.0, 0.125, 0.25, 0.5, 1.0]
    assert [poly_shift(f) for f in (0, 0.1, 0.25, 0.5, 1.0)] == [-1, 3, 2, 1, 0]
    for bad in (-0.1, 1.5, "half", True, float("nan")):
        with pytest.raises(ValueError, match="poly_fraction"):
            poly_shift(bad)


# --------------------------------------------------------------- rescale counts
def _staircase_inputs(rise: float, steps: int, rows: int, d: int = 16, seed: int = 0):
    """q, k, v (1, 1, N, d) in float64 whose scaled scores (log2 units, with scale = ln 2) are the
    same staircase row for every query row: block b of BLOCK_N keys has max b * rise."""
    row = rescale.staircase_row(steps, rise, BLOCK_N, seed)  # (steps * BLOCK_N,) log2 scores
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.zeros(1, 1, rows, d, dtype=torch.float64)
    q[..., 0] = 1.0  # every row picks k[:, 0]
    k = torch.randn(1, 1, row.size, d, generator=g, dtype=torch.float64)
    k[0, 0, :, 0] = torch.from_numpy(row)
    v = torch.randn(1, 1, row.size, d, generator=g, dtype=torch.float64)
    return q, k, v


def _counts(q, k, v, theta, causal=False, scale=math.log(2.0), dtype=torch.float16):
    low = [t.to(dtype).to(DEVICE) for t in (q, k, v)]
    _, counts = flash_attention_fa4(*low, causal=causal, scale=scale, poly_fraction=0.0,
                                    rescale_threshold=theta, return_stats=True, config=CONFIG)
    return counts.cpu()


@runs_somewhere
@pytest.mark.parametrize("rise, theta", [(0.5, 8.0), (10.0, 8.0), (3.0, 8.0), (0.5, 0.0), (3.0, 2.0)])
def test_rescale_counts_match_the_reference(rise, theta):
    """Identical rows: the tile decision equals every row's decision, so the kernel's count per
    program equals the reference's count per row (flashlab.reference.rescale, block_size = BLOCK_N).
    Slow growth (0.5 per block, 5 blocks: 2.5 < theta = 8) takes no rescale; a rise of 10 > theta per
    block takes one per block after the first; 3 per block, one every third block."""
    steps = 6
    q, k, v = _staircase_inputs(rise, steps, rows=2 * CONFIG[0])
    counts = _counts(q, k, v, theta)
    _, ref_counts = rescale.attention(q.numpy(), k.numpy(), v.numpy(), threshold=theta, block_size=BLOCK_N,
                                      scale=math.log(2.0))
    assert np.all(ref_counts == ref_counts.flat[0])
    expected = int(ref_counts.flat[0])
    assert counts.shape == (1, 1, 2) and torch.all(counts == expected), (counts, expected)
    assert expected == {(0.5, 8.0): 0, (10.0, 8.0): steps - 1, (3.0, 8.0): 1, (0.5, 0.0): steps - 1,
                        (3.0, 2.0): steps - 1}[(rise, theta)]
    # and the output stays exact, rescaled or not (P up to 2^8 before the division)
    check(1, 1, 1, q.shape[2], k.shape[2], q.shape[3], False, torch.float16, 0.25, theta, scale=math.log(2.0),
          inputs=(q, k, v))


@runs_somewhere
@pytest.mark.parametrize("causal", [False, True])
def test_random_inputs_rescale_rarely(causal):
    """Random scores: after the first tile the max never rises by 8 (0 rescales at theta = 8), but
    it does rise (theta = 0); the standard path's count (tiles where a max rose) equals theta = 0's."""
    q, k, v = _inputs(2, 2, 2, 64 * SIZE, 64 * SIZE, 32, seed=11)
    at8, at0, standard = (_counts(q, k, v, theta, causal, scale=None) for theta in (8.0, 0.0, None))
    assert at8.shape == (2, 2, triton.cdiv(64 * SIZE, CONFIG[0]))
    assert at8.sum() == 0 and at0.sum() > 0
    assert torch.equal(standard, at0)
    assert int(at0.max()) <= triton.cdiv(64 * SIZE, BLOCK_N) - 1  # at most one per tile after the first


@runs_somewhere
def test_stats_only_when_asked():
    q, k, v = (t.half().to(DEVICE) for t in _inputs(1, 1, 1, 16, 16, 16, seed=1))
    assert isinstance(flash_attention_fa4(q, k, v, rescale_threshold=8.0, config=CONFIG), torch.Tensor)
    o, counts = flash_attention_fa4(q, k, v, return_stats=True, config=CONFIG)
    assert counts.dtype == torch.int32 and counts.shape == (1, 1, 1) and int(counts) == 0


# --------------------------------------------------------------- input checks
@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        ({"poly_fraction": 2.0}, ValueError, ["poly_fraction", "[0, 1]"]),
        ({"rescale_threshold": -1.0}, ValueError, ["rescale_threshold", "-1.0"]),
        ({"rescale_threshold": 40.0}, ValueError, ["rescale_threshold", "fp16"]),
        ({"scale": 0.0}, ValueError, ["scale must be a positive"]),
        ({"k": torch.zeros(1, 3, 4, 8), "v": torch.zeros(1, 3, 4, 8)}, ValueError, ["must divide", "2 query heads"]),
        ({"q": torch.zeros(2, 4, 8)}, ValueError, ["q must be 4-D"]),
        ({"v": torch.zeros(1, 1, 4, 8, dtype=torch.float16)}, TypeError, ["same dtype"]),
    ],
)
def test_bad_input(kwargs, exc, words):
    args = {"q": torch.zeros(1, 2, 4, 8), "k": torch.zeros(1, 1, 4, 8), "v": torch.zeros(1, 1, 4, 8)}
    args.update(kwargs)
    args = {n: a.to(DEVICE) if isinstance(a, torch.Tensor) else a for n, a in args.items()}  # a GPU run refuses CPU tensors first
    with pytest.raises(exc) as info:
        flash_attention_fa4(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


# --------------------------------------------------------------- GPU: compile-level and full-size checks
def _ex2_count(poly: float, config=(128, 128, 8, 3)) -> tuple[int, str]:
    q = torch.randn(1, 2, 1024, 128, device="cuda", dtype=torch.bfloat16)
    _, _, compiled = fa4_forward(q, q, q, False, 0.1, poly, None, config=config)
    return compiled.asm["ptx"].count("ex2.approx"), compiled.asm["ttgir"]


@needs_gpu
def test_poly_fraction_removes_mufu_exps_on_the_gpu():
    """The split tile really issues fewer hardware exp2 (PTX ex2.approx -> SASS MUFU.EX2): the
    P-tile exps fall in proportion to 1 - fraction; the few left at fraction 1 are the per-row
    rescale factors alpha."""
    n = {f: _ex2_count(f)[0] for f in (0.0, 0.125, 0.25, 0.5, 1.0)}
    tile = n[0.0] - n[1.0]
    assert tile > 0 and n[1.0] < n[0.0] / 8
    for f in (0.125, 0.25, 0.5):
        assert n[0.0] - n[f] == pytest.approx(f * tile, abs=2), n


@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_full_size_bf16_experiment_config(causal):
    """The experiment's configuration (128 x 128 tiles, 8 warps, 3 stages), d = 128, 2k tokens."""
    check(1, 4, 4, 2048, 2048, 128, causal, torch.bfloat16, 0.5, 8.0, config=(128, 128, 8, 3))
    check(1, 4, 4, 2048, 2048, 128, causal, torch.bfloat16, 0.125, None, config=(128, 128, 8, 3))
