"""The FP8 forward kernel (flashlab.kernels.fp8) against float64 references.

What is checked, and the bounds (the tolerance policy: fp8 is judged by RMSE against
a baseline, never by a bare allclose):

- Against exact float64 attention of the *dequantised* inputs (x8 * descale), the only
  errors left are the kernel's own: fp8(P) before the P V dot, the fp32 arithmetic and the
  output's rounding. The baseline is a float64 emulation that rounds 2^8 P (P relative to
  the row's final max) to e4m3 and the result to the output dtype. The kernel rounds P
  relative to the *running* max, so its values differ, but not its error statistics:
  bound RMSE <= 1.5x and max error <= 2x the emulation's (+1e-5). Seen here: ratios 0.9-1.2.
- P's 2^8 scaling: on scores where most probabilities lie below e4m3's smallest normal
  number 2^-6, the same bound holds and is 3x tighter than the error of rounding P unscaled.
- Against exact attention of the original inputs drawn from
  reference.fp8.outlier_inputs (N(0,1) + N(0,100) Bernoulli(0.001)): per-block scaling
  has a lower RMSE than the per-(batch, head) baseline, incoherent processing (Hadamard)
  lower still (< 0.9x), and each RMSE is within 10 % of the NumPy emulation
  reference.fp8.fp8_attention(quantize_p=True) of the same quantisation.
- quantize_fp8 matches reference.fp8.quantize; round_e4m3 (the interpreter's P rounding)
  matches torch's cast bit for bit; rotate preserves Q K^T to fp32 accuracy (1e-5).

On a CPU the kernel runs under TRITON_INTERPRET=1 (tests/conftest.py) with 16 x 16 tiles
and small N; fp8 loads and fp8 tl.dot are exact there, and P's cast is rounded by
round_e4m3 (the interpreter's own cast rounds carries into the next binade wrongly).
On a GPU the same tests run 8x longer sequences, plus the full-size ones.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flashlab.kernels import INTERPRET, fp8 as kfp8
from flashlab.lab.variants.fp8_schedules import flash_attention_fp8_scheduled
from flashlab.kernels.fp8 import (
    dequantize_fp8,
    flash_attention_fp8,
    flash_attention_fp8_from,
    quantize_fp8,
    quantize_qkv,
    rotate,
)
from flashlab.reference import attention, scores
from flashlab.reference.fp8 import (
    fp8_attention,
    outlier_inputs,
    quantize,
    rmse,
    round_to_fp8,
)
from tiers import DEVICE, GPU, SIZE, needs_gpu, runs_somewhere

needs_fp8 = pytest.mark.skipif(GPU and torch.cuda.get_device_capability() < (8, 9), reason="needs FP8 tensor cores")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _emulate(q, k, v, causal: bool, shift: float = kfp8.P_SHIFT) -> np.ndarray:
    """Float64 attention with 2^shift P (relative to the row's final max) rounded to e4m3."""
    s = scores(q, k, causal)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    pr = round_to_fp8(p * 2.0**shift) / 2.0**shift
    return np.where(l > 0, pr @ v / np.where(l > 0, l, 1.0), 0.0)


def _round_to(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return torch.from_numpy(x).to(dtype).double().numpy()


def _check_against_dequantised(q, k, v, causal, blocks, out_dtype=torch.bfloat16, transpose_v=True, config=None,
                               shift_check=False, **options):
    """Quantise, run the kernel (``options``: a schedule of the lab variant
    flashlab.lab.variants.fp8_schedules), compare with float64 attention of the dequantised inputs."""
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(t, b) for t, b in zip((q, k, v), blocks))
    v_in = v8.transpose(-2, -1).contiguous().transpose(-2, -1) if transpose_v else v8
    run = flash_attention_fp8_scheduled if options else flash_attention_fp8  # a schedule's switches: the variant
    if options and config is None:
        config = (16, 16, 4, 1) if INTERPRET else (64, 128, 4, 3)
    o = run(q8, k8, v_in, causal, None, qd, kd, vd, q_block=blocks[0], k_block=blocks[1],
            v_block=blocks[2], out_dtype=out_dtype, config=config, **options)
    assert o.dtype == out_dtype and o.shape == q.shape
    Q, K, V = (_np(dequantize_fp8(t8, d, b)) for t8, d, b in zip((q8, k8, v8), (qd, kd, vd), blocks))
    ref = attention(Q, K, V, causal)
    # With rescale_threshold theta, P = 2^(8 - theta) exp2(S - m_ref) with m_ref within theta of the
    # max: the emulation rounds 2^(8 - theta) P, the range the kernel is sure to keep.
    emu = _round_to(_emulate(Q, K, V, causal, shift=kfp8.P_SHIFT - (options.get("rescale_threshold") or 0.0)), out_dtype)
    got = _np(o)
    err_rmse, err_max = rmse(got, ref), np.abs(got - ref).max()
    emu_rmse, emu_max = rmse(emu, ref), np.abs(emu - ref).max()
    what = f"{tuple(q.shape)=}, {tuple(k.shape)=}, {causal=}, {blocks=}, {config=}, {options=}"
    assert err_rmse <= 1.5 * emu_rmse + 1e-5, f"RMSE {err_rmse:.2e} > 1.5 x emulation's {emu_rmse:.2e} ({what})"
    assert err_max <= 2 * emu_max + 1e-5, f"max error {err_max:.2e} > 2 x emulation's {emu_max:.2e} ({what})"
    if shift_check:  # the inputs must make P's scaling matter, or the test proves nothing
        unscaled = rmse(_round_to(_emulate(Q, K, V, causal, shift=0.0), out_dtype), ref)
        assert unscaled > 3 * 1.5 * emu_rmse, f"inputs do not separate scaled from unscaled P ({unscaled:.2e})"
    return got, ref


def _randn(*shape, seed: int, std: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(*shape, generator=g) * std).to(DEVICE)


# --------------------------------------------------------------- interpreter-sized (run everywhere)
CASES = [  # (N_q, N_k, d, causal, (q_block, k_block, v_block))
    (37, 37, 32, False, (None, None, None)),  # ragged N, one descale per (batch, head)
    (37, 37, 32, True, (16, 16, 16)),  # per block, tiles aligned with the blocks
    (80, 80, 64, True, (32, 24, 32)),  # K blocks cut through key tiles: one descale per key
    (20, 45, 16, True, (None, 16, None)),  # N_q < N_k (bottom-right causal), d padded to 32
    (45, 20, 32, True, (16, None, 16)),  # N_q > N_k: the first rows see no key -> 0
    (48, 48, 32, False, (8, 40, 32)),  # N a multiple of the tile (no masked tile without causal)
]


@runs_somewhere
@needs_fp8
@pytest.mark.parametrize("n_q, n_k, d, causal, blocks", CASES)
def test_matches_dequantised_reference(n_q, n_k, d, causal, blocks):
    n_q, n_k = n_q * SIZE, n_k * SIZE
    blocks = tuple(None if b is None else b * SIZE for b in blocks)
    q, k, v = _randn(1, 2, n_q, d, seed=1), _randn(1, 2, n_k, d, seed=2), _randn(1, 2, n_k, d, seed=3)
    got, _ = _check_against_dequantised(q, k, v, causal, blocks)
    if causal and n_q > n_k:
        assert np.all(got[:, :, : n_q - n_k] == 0.0)  # rows that see no key


@runs_somewhere
@needs_fp8
@pytest.mark.parametrize("n_q, n_k, causal, blocks", [(48, 80, True, (16, 32, 32)), (64, 64, False, (None, 24, None)),
                                                      (80, 48, True, (32, 16, 16))])
def test_tma_loads_match_pointer_loads(n_q, n_k, causal, blocks):
    """K and V through tensor descriptors (the default where eligible) give the pointer path's
    answer bit for bit: K rows past N_k (the next head's) are masked, V's columns there read 0."""
    n_q, n_k = n_q * SIZE, n_k * SIZE
    blocks = tuple(None if b is None else b * SIZE for b in blocks)
    q, k, v = _randn(1, 2, n_q, 32, seed=4), _randn(1, 2, n_k, 32, seed=5), _randn(1, 2, n_k, 32, seed=6)
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(t, b) for t, b in zip((q, k, v), blocks))
    v8 = v8.transpose(-2, -1).contiguous().transpose(-2, -1)
    assert kfp8.fp8_tma_eligible(k8, v8)
    args = (q8, k8, v8, causal, None, qd, kd, vd)
    # one configuration for both (autotuning each could pick different tiles, which round P differently)
    kw = {"q_block": blocks[0], "k_block": blocks[1], "v_block": blocks[2], "config": None if INTERPRET else (64, 128, 4, 3)}
    o_tma = flash_attention_fp8(*args, **kw, tma=True)
    o_ptr = flash_attention_fp8(*args, **kw, tma=False)
    assert torch.equal(o_tma, o_ptr)


@runs_somewhere
@needs_fp8
@pytest.mark.parametrize("mode", ["qk", "pv"])
@pytest.mark.parametrize("config", [None, "capped"])
def test_pipelined_loop_gives_the_same_answer(config, mode):
    """pipeline changes when a tile's dots are issued, not what the loop computes; also with a
    register cap (a candidate's fifth entry), which only changes how ptxas allocates."""
    n = 64 * SIZE
    q, k, v = (_randn(1, 2, n, 32, seed=s) for s in (7, 8, 9))
    pre = quantize_qkv(q, k, v, block=16 * SIZE, v_block=None if mode == "pv" else "same")  # both V descale paths
    if INTERPRET:
        config = (16, 16, 4, 1)
    else:
        config = (64, 128, 4, 2, 168) if config == "capped" else (64, 128, 4, 3)
    o_opt = flash_attention_fp8_scheduled(**pre, config=config, pipeline=mode)
    o = flash_attention_fp8(**pre, config=config)
    assert (o_opt.float() - o.float()).abs().max().item() <= 2**-7 * max(1.0, o.float().abs().max().item())


@runs_somewhere
@needs_fp8
def test_pipeline_with_a_ragged_causal_tail():
    """The software-pipelined loop folds the unmasked blocks; the masked ones (causal diagonal,
    ragged N_k) still follow: same answer as the plain loop."""
    q, k, v = _randn(1, 2, 80 * SIZE, 32, seed=10), _randn(1, 2, 72 * SIZE, 32, seed=11), _randn(1, 2, 72 * SIZE, 32, seed=12)
    pre = quantize_qkv(q, k, v, block=16 * SIZE)
    config = (16, 16, 4, 1) if INTERPRET else (128, 64, 4, 3)
    for causal, mode in ((False, "qk"), (True, "qk"), (False, "pv"), (True, "pv")):
        o_p = flash_attention_fp8_scheduled(**pre, causal=causal, config=config, pipeline=mode)
        o = flash_attention_fp8(**pre, causal=causal, config=config)
        assert (o_p.float() - o.float()).abs().max().item() <= 2**-7 * max(1.0, o.float().abs().max().item())


def test_tma_eligibility():
    k = torch.zeros(1, 2, 64, 32, dtype=kfp8.FP8_DTYPE, device=DEVICE)
    v_keys = k.transpose(-2, -1).contiguous().transpose(-2, -1)
    on_hopper = INTERPRET or GPU and torch.cuda.get_device_capability()[0] >= 9
    assert kfp8.fp8_tma_eligible(k, v_keys) == on_hopper
    assert not kfp8.fp8_tma_eligible(k, k)  # V (N, d) row-major: keys not contiguous
    assert not kfp8.fp8_tma_eligible(k[:, :, :40], v_keys[:, :, :40])  # N = 40: V rows not 16-byte aligned
    k16 = torch.zeros(1, 2, 64, 16, dtype=kfp8.FP8_DTYPE, device=DEVICE)
    assert not kfp8.fp8_tma_eligible(k16, k16.transpose(-2, -1).contiguous().transpose(-2, -1))  # d < 32


@runs_somewhere
@needs_fp8
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_out_dtype_and_plain_v_layout(out_dtype):
    """V stored (N, d) row-major (not keys-contiguous) gives the same answer, in any output dtype."""
    n = 40 * SIZE
    q, k, v = (_randn(1, 2, n, 32, seed=s) for s in (4, 5, 6))
    _check_against_dequantised(q, k, v, True, (None, None, None), out_dtype=out_dtype, transpose_v=False)


@runs_somewhere
@needs_fp8
def test_p_scaling_keeps_small_probabilities():
    """One key per row at score 0, all others near -5.2 (p ~ 2^-7.5, below e4m3's smallest
    normal 2^-6): P is rounded to fp8 as 2^8 P. Output in float32, so P's rounding is all
    that is measured; the unscaled rounding's error is asserted to be 3x beyond the bound."""
    n, d = 64 * SIZE, 32
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.zeros(1, 2, n, d)
    q[..., 0] = math.sqrt(d) * (1 + 0.2 * torch.rand(1, 2, n, generator=g))  # scale 1/sqrt(d) cancels
    k = torch.zeros(1, 2, n, d)
    k[..., 0] = -5.2 + 0.3 * torch.randn(1, 2, n, generator=g)
    k[:, :, 0, 0] = 0.0  # the row max, seen in the first key tile
    v = torch.randn(1, 2, n, d, generator=g)
    _check_against_dequantised(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), False, (None, None, None),
                               out_dtype=torch.float32, shift_check=True)


@runs_somewhere
@needs_fp8
def test_outliers_per_block_and_hadamard_beat_per_tensor():
    """RMSE against exact attention of the original inputs, two seeds as two heads."""
    n, d, block = (256, 64, 32) if INTERPRET else (1024, 128, 128)  # 128: a multiple of every BLOCK_N
    seeds = (0, 1)
    inputs = [outlier_inputs(n, d, s) for s in seeds]
    q, k, v = (torch.from_numpy(np.stack([x[i] for x in inputs]))[None].float().to(DEVICE) for i in range(3))
    exact = [attention(*x) for x in inputs]
    methods = {"per_tensor": (None, False), "per_block": (block, False), "per_block_hadamard": (block, True)}
    mean = {}
    for name, (blk, had) in methods.items():
        o = _np(flash_attention_fp8_from(q, k, v, block=blk, hadamard=had, seed=0))[0]
        errs = [rmse(o[i], exact[i]) for i in range(len(seeds))]
        emus = [rmse(fp8_attention(*inputs[i], block=blk, incoherent=had, seed=0, quantize_p=True), exact[i])
                for i in range(len(seeds))]
        for e, r in zip(errs, emus):
            assert 0.9 * r <= e <= 1.1 * r, f"{name}: kernel RMSE {e:.4f} vs NumPy emulation {r:.4f}"
        mean[name] = float(np.mean(errs))
    assert 1e-3 < mean["per_tensor"] < 5e-2
    assert mean["per_block"] < mean["per_tensor"], mean
    assert mean["per_block_hadamard"] < 0.9 * mean["per_tensor"], mean


def test_quantize_matches_reference():
    """Per (batch, head) and per block with a ragged last block; an all-zero block gets descale 1."""
    x = _randn(2, 3, 45, 16, seed=7, std=3.0)
    x[0, 1, 32:] = 0.0  # the last block of one head is zero
    for block in (None, 16):
        x8, descale = quantize_fp8(x, block)
        assert x8.dtype == torch.float8_e4m3fn and x8.shape == x.shape and x8.is_contiguous()
        assert descale.dtype == torch.float32 and descale.shape == (2, 3, 1 if block is None else 3)
        for b in range(2):
            for h in range(3):
                values, scale = quantize(_np(x[b, h]), "e4m3", block)
                np.testing.assert_allclose(_np(descale[b, h]).ravel(), np.ravel(scale), rtol=1e-6)
                got = _np(x8[b, h])
                mismatch = got != values  # fp32 vs float64 division: a tie can flip, one ulp at most
                assert mismatch.mean() <= 1e-3, f"{mismatch.sum()} of {got.size} differ ({block=})"
                assert np.all(np.abs(got - values)[mismatch] <= np.abs(values[mismatch]) / 8 + 2**-9)
    assert quantize_fp8(x, 16)[1][0, 1, 2].item() == 1.0
    strided = x.transpose(1, 2).contiguous().transpose(1, 2)  # (B, N, H, d) memory
    assert torch.equal(quantize_fp8(strided, 16)[0].float(), quantize_fp8(x, 16)[0].float())


@runs_somewhere
def test_round_e4m3_matches_torch_cast():
    """The interpreter's P rounding: every value class in [0, 256] (carries, subnormals, ties)."""
    grid = torch.arange(0, 121, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # codes 0..240
    mids = (grid[1:] + grid[:-1]) / 2  # ties: must go to the even code
    rng = torch.Generator().manual_seed(0)
    x = torch.cat([grid, mids, torch.rand(4096, generator=rng) * 256, torch.exp2(-20 * torch.rand(4096, generator=rng))])
    n = triton.next_power_of_2(x.numel())
    x = torch.nn.functional.pad(x, (0, n - x.numel())).to(DEVICE)
    y = torch.empty_like(x)
    _round_kernel[(1,)](x, y, N=n)
    expected = x.to(torch.float8_e4m3fn).float()
    bad = y != expected
    assert not bad.any(), f"{bad.sum().item()} differ, e.g. {x[bad][:4].tolist()} -> {y[bad][:4].tolist()}"


@triton.jit
def _round_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, kfp8.round_e4m3(tl.load(X + offs)))


def test_rotate_preserves_scores_and_spreads_outliers():
    q, k = _randn(1, 2, 20, 64, seed=8), _randn(1, 2, 30, 64, seed=9)
    q[0, 0, 3, 5] = 100.0  # an outlier
    qm, km = rotate(q, k, seed=3)
    assert qm.dtype == torch.float32
    exact = q.double() @ k.double().transpose(-2, -1)
    err = ((qm.double() @ km.double().transpose(-2, -1)) - exact).abs().max().item()
    assert err <= 1e-5 * exact.abs().max().item()
    assert qm.abs().max().item() < 0.25 * q.abs().max().item()  # 100 spread over 64 coordinates: 12.5 + noise


RESCALE_CASES = [  # (N_q, N_k, causal, (q_block, k_block, v_block), theta)
    (64, 64, False, (16, 16, None), 2.0),  # V per head: the case where skipping saves work
    (48, 80, True, (16, 32, None), 2.0),  # causal, N_q < N_k: masked tiles take the same decision
    (80, 48, True, (16, 16, 16), 0.0),  # V per block: O is rescaled by dv ratios on every tile
    (37, 37, False, (None, None, None), 4.0),  # P = 2^4 exp2(S - m_ref); ragged N
]


def _rising_keys(n_k: int, d: int, seed: int, batch: tuple[int, int] = (1, 2)) -> torch.Tensor:
    """Keys (*batch, n_k, d) whose size grows along N (0.5x to 4x): each row's max rises tile
    after tile, by less than theta on some tiles and by more on others."""
    return _randn(*batch, n_k, d, seed=seed) * torch.linspace(0.5, 4.0, n_k, device=DEVICE)[:, None]


@runs_somewhere
@needs_fp8
@pytest.mark.parametrize("n_q, n_k, causal, blocks, theta", RESCALE_CASES)
def test_conditional_rescaling_matches_dequantised_reference(n_q, n_k, causal, blocks, theta):
    """rescale_threshold (FlashAttention-4's conditional rescaling in the FP8 kernel) keeps the
    reference max until some row rises past theta; the answer meets the same bounds."""
    n_q, n_k = n_q * SIZE, n_k * SIZE
    blocks = tuple(None if b is None else b * SIZE for b in blocks)
    q, k, v = _randn(1, 2, n_q, 32, seed=21), _rising_keys(n_k, 32, seed=22), _randn(1, 2, n_k, 32, seed=23)
    _check_against_dequantised(q, k, v, causal, blocks, rescale_threshold=theta)


# --------------------------------------------------------------- bad input
def _fp8(*shape):
    return torch.zeros(*shape).to(torch.float8_e4m3fn)


GOOD = (_fp8(1, 2, 8, 16), _fp8(1, 2, 8, 16), _fp8(1, 2, 8, 16))


@pytest.mark.parametrize(
    "args, kwargs, exc, words",
    [
        ((torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16), *GOOD[1:]), {}, TypeError, ["q must have dtype torch.float8_e4m3fn", "bfloat16"]),
        ((GOOD[0], GOOD[1], torch.zeros(1, 2, 8, 16)), {}, TypeError, ["v must have dtype torch.float8_e4m3fn"]),
        ((_fp8(2, 8, 16), *GOOD[1:]), {}, ValueError, ["q must be 4-D", "(2, 8, 16)"]),
        (([[1.0]], *GOOD[1:]), {}, TypeError, ["q must be a torch.Tensor", "list"]),
        ((GOOD[0], _fp8(1, 2, 9, 16), GOOD[2]), {}, ValueError, ["k and v must have the same shape"]),
        ((GOOD[0], _fp8(1, 2, 8, 32), _fp8(1, 2, 8, 32)), {}, ValueError, ["same head dimension"]),
        ((GOOD[0], _fp8(1, 3, 8, 16), _fp8(1, 3, 8, 16)), {}, ValueError, ["same batch size and number of heads"]),
        ((_fp8(1, 2, 8, 512),) * 3, {}, ValueError, ["between 1 and 256", "512"]),
        (GOOD, {"scale": -1.0}, ValueError, ["scale must be a positive", "-1.0"]),
        (GOOD, {"q_descale": torch.ones(1, 2, 2)}, ValueError, ["q_descale must have shape", "(1, 2, 1)", "(1, 2, 2)"]),
        (GOOD, {"k_descale": torch.ones(1, 2, 3), "k_block": 4}, ValueError, ["k_descale must have shape", "ceil(8 / 4)", "(1, 2, 2)"]),
        (GOOD, {"v_descale": torch.ones(1, 2, 1, dtype=torch.float16)}, TypeError, ["v_descale must have dtype float32"]),
        (GOOD, {"q_descale": [1.0]}, TypeError, ["q_descale must be a torch.Tensor"]),
        (GOOD, {"q_block": 8}, ValueError, ["q_descale must be given"]),
        (GOOD, {"k_block": 0, "k_descale": torch.ones(1, 2, 1)}, ValueError, ["k_block must be None or a positive int", "0"]),
        (GOOD, {"q_block": True}, ValueError, ["q_block must be None or a positive int"]),
        (GOOD, {"v_block": 24, "v_descale": torch.ones(1, 2, 1)}, ValueError, ["v_block must be a multiple of the kernel's BLOCK_N", "24"]),
        (GOOD, {"out_dtype": torch.int8}, TypeError, ["out_dtype must be"]),
        (GOOD, {"causal": "yes"}, TypeError, ["causal must be a bool"]),
        (GOOD, {"pipeline": "pv"}, TypeError, ["pipeline"]),  # a schedule of the lab variant only
    ],
)
def test_bad_input(args, kwargs, exc, words):
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {n: a.to(DEVICE) if isinstance(a, torch.Tensor) else a for n, a in kwargs.items()}
    with pytest.raises(exc) as info:
        flash_attention_fp8(*args, **kwargs)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"pipeline": "yes"}, ["pipeline must be False, True, 'qk' or 'pv'", "'yes'"]),
        ({"pipeline": 1}, ["pipeline must be False, True, 'qk' or 'pv'", "1"]),
        ({"pipeline": "pv", "rescale_threshold": 2.0}, ["cannot be combined with rescale_threshold"]),
        ({"rescale_threshold": 9.0}, ["rescale_threshold must be None or a number in [0, 8]", "9.0"]),
        ({"rescale_threshold": -1}, ["rescale_threshold must be", "-1"]),
        ({"rescale_threshold": True}, ["rescale_threshold must be", "True"]),
        ({"config": None}, ["config must be given"]),
    ],
)
def test_bad_schedule(kwargs, words):
    """The lab variant's switches are checked before anything runs."""
    args = tuple(a.to(DEVICE) for a in GOOD)
    with pytest.raises(ValueError) as info:
        flash_attention_fp8_scheduled(*args, **{"config": (16, 16, 4, 1), **kwargs})
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


@pytest.mark.parametrize(
    "fn, args, kwargs, exc, words",
    [
        (quantize_fp8, (torch.zeros(1, 2, 8, 16, dtype=torch.int32),), {}, TypeError, ["x must have dtype"]),
        (quantize_fp8, (torch.zeros(2, 8, 16),), {}, ValueError, ["x must be 4-D"]),
        (quantize_fp8, (torch.zeros(1, 2, 8, 16),), {"block": -4}, ValueError, ["block must be None or a positive int"]),
        (rotate, (torch.zeros(1, 2, 8, 24), torch.zeros(1, 2, 8, 24)), {}, ValueError, ["power of two", "24"]),
        (rotate, (torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 32)), {}, ValueError, ["same head dimension"]),
        (quantize_qkv, (torch.zeros(1, 2, 8, 16),) * 3, {"block": 2.5}, ValueError, ["block must be None or a positive int"]),
        (quantize_qkv, (torch.zeros(1, 2, 8, 16),) * 3, {"v_block": "per-head"}, ValueError,
         ["v_block must be 'same', None or a positive int", "per-head"]),
        (quantize_qkv, (torch.zeros(1, 2, 8, 16),) * 3, {"v_block": 0}, ValueError, ["block must be None or a positive int"]),
        (flash_attention_fp8_from, (torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 16, dtype=torch.float16),
                                    torch.zeros(1, 2, 8, 16)), {}, TypeError, ["same dtype"]),
    ],
)
def test_bad_input_host_side(fn, args, kwargs, exc, words):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


@pytest.mark.skipif(GPU or INTERPRET, reason="only meaningful on a CPU without the interpreter")
def test_cpu_without_interpreter_is_refused():
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        flash_attention_fp8(*GOOD)


# --------------------------------------------------------------- full size, real GPU only
@needs_gpu
@needs_fp8
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_full_size(causal, d):
    n = 1000 if d == 256 else 2048
    q, k, v = (_randn(2, 4, n, d, seed=s).to(torch.bfloat16) for s in (10, 11, 12))
    _check_against_dequantised(q, k, v, causal, (128, 128, 128))


@needs_gpu
@needs_fp8
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_conditional_rescaling_full_size(causal):
    """The bench's shape of the threshold path: d = 128, Q and K per block, V per head."""
    q, v = (_randn(2, 4, 2048, 128, seed=s).to(torch.bfloat16) for s in (16, 17))
    k = _rising_keys(2048, 128, seed=18, batch=(2, 4)).to(torch.bfloat16)
    _check_against_dequantised(q, k, v, causal, (128, 128, None), rescale_threshold=2.0)


@needs_gpu
@needs_fp8
@pytest.mark.parametrize("config", kfp8.CANDIDATES + kfp8.WIDE_CANDIDATES)
def test_gpu_every_autotune_candidate(config):
    d = 256 if config in kfp8.WIDE_CANDIDATES else 128
    q, k, v = (_randn(1, 4, 777, d, seed=s) for s in (13, 14, 15))
    _check_against_dequantised(q, k, v, True, (64, 192, 128), config=config)
