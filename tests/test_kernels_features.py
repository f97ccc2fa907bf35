"""Sliding windows, variable-length batches, the atomic-dQ backward of the Triton kernels and
the forward's lab schedules (the v1 grid, warp specialisation), against float64 references (tolerance rule of tests/test_kernels.py: max error
at most twice that of plain PyTorch attention in the same low precision, plus 1e-5; fp32 with
IEEE dots: 1e-5 relative to the largest reference value).

The block ranges the kernels visit are checked on their own, exhaustively, by
``test_visible_range_*`` (pure Python; the kernels compute the same lines in Triton).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashlab.kernels import INTERPRET, flash_attention, flash_attention_varlen
from flashlab.kernels._common import visible_range, window_bounds
from flashlab.kernels.forward import forward, tma_eligible
from flashlab.lab.variants import forward_schedules
from flashlab.reference import attention_varlen, window_mask
from tiers import DEVICE, GPU, SIZE, needs_gpu, runs_somewhere


# --------------------------------------------------------------- block ranges (pure Python)
@settings(max_examples=400, deadline=None)
@given(n_a=st.integers(1, 90), n_b=st.integers(1, 90), a_block=st.sampled_from([1, 3, 16, 32]),
       b_block=st.sampled_from([1, 4, 16, 32]), left=st.integers(-1, 40), right=st.integers(-1, 40),
       causal=st.booleans(), keys_fixed=st.booleans())
def test_visible_range_splits_by_visibility(n_a, n_b, a_block, b_block, left, right, causal, keys_fixed):
    """For every block of the fixed axis: indices of the other axis outside [start, end) are seen
    by no index of the block; those in [in_lo, in_hi) by all of them (so no mask is needed)."""
    n_q, n_k = (n_b, n_a) if keys_fixed else (n_a, n_b)
    lf, rt = window_bounds(causal, (left, right), n_q, n_k)
    off = n_k - n_q
    sees = lambda i, j: off - lf <= j - i <= off + rt  # noqa: E731  row i sees key j
    lo_shift, hi_shift = (-(off + rt), -(off - lf)) if keys_fixed else (off - lf, off + rt)
    for a0 in range(0, n_a, a_block):
        start, in_lo, in_hi, end = visible_range(a0, a_block, n_a, lo_shift, hi_shift, n_b, b_block)
        assert 0 <= start <= in_lo <= in_hi <= end <= n_b
        assert in_lo == in_hi or (in_lo % b_block == 0 and in_hi % b_block == 0)
        block = range(a0, min(a0 + a_block, n_a))
        for b in range(n_b):
            seen = [sees(b, a) if keys_fixed else sees(a, b) for a in block]
            if not (start <= b < end):
                assert not any(seen), f"block at {a0}: index {b} is visible but never visited"
            if in_lo <= b < in_hi:
                assert all(seen), f"block at {a0}: index {b} is visited unmasked but hidden from some"


def test_window_bounds_conventions():
    assert window_bounds(False, None, 10, 20) == (30, 30)  # unbounded both sides
    assert window_bounds(True, None, 10, 20) == (30, 0)  # causal: right edge at the diagonal
    assert window_bounds(True, (4, 7), 10, 20) == (4, 0)
    assert window_bounds(False, (4, -1), 10, 20) == (4, 30)


# --------------------------------------------------------------- windows through the kernels
def _mask(n_q: int, n_k: int, causal: bool, window) -> torch.Tensor:
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0 if right == -1 else min(right, 0)
    return torch.from_numpy(window_mask(n_q, n_k, (left, right)))


def masked_attention(q, k, v, causal, window, scale=None):
    """Plain attention in q's dtype with a causal/window mask; rows that see no key give 0."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    s = s.masked_fill(~_mask(s.shape[-2], s.shape[-1], causal, window).to(s.device), float("-inf"))
    p = torch.softmax(s.float(), dim=-1).nan_to_num(0.0).to(q.dtype)
    return p @ v


def _outputs_and_grads(fn, tensors, do):
    q, k, v = (t.detach().clone().requires_grad_() for t in tensors)
    o = fn(q, k, v)
    o.backward(do)
    return [o.detach(), q.grad, k.grad, v.grad]


def check_window(n_q, n_k, d, causal, window, dtype, h=2, h_kv=2, deterministic=True):
    g = torch.Generator(device="cpu").manual_seed(n_q * 7 + n_k + d)
    q, do = (torch.randn(1, h, n_q, d, generator=g).to(DEVICE) for _ in range(2))
    k, v = (torch.randn(1, h_kv, n_k, d, generator=g).to(DEVICE) for _ in range(2))
    ref = _outputs_and_grads(lambda *a: masked_attention(*a, causal, window), [t.double() for t in (q, k, v)], do.double())
    low = [t.to(dtype) for t in (q, k, v)]
    got = _outputs_and_grads(lambda *a: flash_attention(*a, causal=causal, window=window, deterministic=deterministic),
                             low, do.to(dtype))
    if dtype == torch.float32:
        bounds = [1e-5 * max(1.0, r.abs().max().item()) for r in ref]
    else:
        base = _outputs_and_grads(lambda *a: masked_attention(*a, causal, window), low, do.to(dtype))
        bounds = [2 * (b.double() - r).abs().max().item() + 1e-5 for b, r in zip(base, ref)]
    for name, x, r, bound in zip(["o", "dq", "dk", "dv"], got, ref, bounds):
        err = (x.double() - r).abs().max().item()
        assert err <= bound, f"{name}: error {err:.2e} > {bound:.2e} ({n_q=}, {n_k=}, {d=}, {causal=}, {window=}, {dtype})"


@runs_somewhere
@pytest.mark.parametrize("window", [(5, 3), (0, 0), (17, -1), (-1, 9), (40, 40)])
@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window(window, causal):
    check_window(45 * SIZE, 45 * SIZE, 32, causal, tuple(w * SIZE if w > 0 else w for w in window), torch.float32)


@runs_somewhere
@pytest.mark.parametrize("n_q, n_k", [(20, 51), (51, 20)])
def test_sliding_window_rectangular_gqa_bf16(n_q, n_k):
    """Bottom-right alignment with N_q != N_k; some rows see no key at all; GQA; bf16."""
    check_window(n_q * SIZE, n_k * SIZE, 32, True, (6 * SIZE, -1), torch.bfloat16, h=4, h_kv=2)


@runs_somewhere
@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, (9, -1))])
def test_atomic_dq_backward(causal, window, monkeypatch):
    """deterministic=False: dQ added with atomics inside the dK/dV kernel (the paper's loop). The
    Triton kernel's path, also on a Hopper GPU, where the Gluon backward would otherwise take the
    fp16 case (tests/test_kernels_fa3_backward.py tests that one)."""
    from flashlab.kernels import ops

    monkeypatch.setattr(ops, "hopper_backward", lambda q, k, v: False)
    check_window(37 * SIZE, 41 * SIZE, 32, causal, window, torch.float32, h=4, h_kv=2, deterministic=False)
    check_window(37 * SIZE, 37 * SIZE, 64, causal, window, torch.float16, deterministic=False)


# --------------------------------------------------------------- lab schedules of the forward (chapters 5, 6)
@runs_somewhere
@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (False, (7, 2))])
@pytest.mark.parametrize("grid, warp_specialize", [("v1", False), ("v2", True), ("v1", True)])
def test_forward_schedules_give_the_same_bits(causal, window, grid, warp_specialize):
    """One program per head looping over its query blocks (v1), or a warp-specialised key loop,
    computes exactly what the teaching kernel computes: the same blocks, the same order of
    operations inside each block."""
    g = torch.Generator(device="cpu").manual_seed(1)
    q, k, v = (torch.randn(2, 3, 43 * SIZE, 32, generator=g).to(DEVICE).to(torch.float16) for _ in range(3))
    config = (16, 16, 4, 1) if INTERPRET else (64, 64, 4, 3)
    o2, lse2 = forward(q, k, v, causal, 0.2, config, window=window)
    o1, lse1 = forward_schedules.forward(q, k, v, causal, 0.2, config, window=window, grid=grid,
                                         warp_specialize=warp_specialize, tma=False)
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)


def test_warp_specialized_block_is_the_teaching_block_with_another_key_loop():
    """The variant's query-block function runs the teaching kernel's source with only _attend rebound."""
    fn = forward_schedules._forward_block_warp_specialized.fn
    teaching = getattr(forward_schedules.kf._forward_block, "fn", forward_schedules.kf._forward_block)
    assert fn.__code__ is teaching.__code__
    assert fn.__globals__["_attend"] is forward_schedules._attend_warp_specialized
    assert teaching.__globals__["_attend"] is forward_schedules.kf._attend


def test_bad_grid_and_window():
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="grid must be 'v1' or 'v2'"):
        forward_schedules.forward(q, q, q, False, 1.0, (16, 16, 4, 1), grid="v3")
    with pytest.raises(ValueError, match="config must be"):
        forward_schedules.forward(q, q, q, False, 1.0, None)
    for bad in [(3,), (1, -2), (1.5, 2), "left"]:
        with pytest.raises(ValueError, match="window must be None or a pair"):
            flash_attention(q, q, q, window=bad)


# --------------------------------------------------------------- variable-length batches
def _packed(lengths_q, lengths_k, h, h_kv, d, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    cu_q = torch.tensor([0, *np.cumsum(lengths_q)], dtype=torch.int32)
    cu_k = torch.tensor([0, *np.cumsum(lengths_k)], dtype=torch.int32)
    q, do = (torch.randn(int(cu_q[-1]), h, d, generator=g) for _ in range(2))
    k, v = (torch.randn(int(cu_k[-1]), h_kv, d, generator=g) for _ in range(2))
    return q, k, v, do, cu_q, cu_k


@runs_somewhere
@pytest.mark.parametrize("causal, window, deterministic", [(False, None, True), (True, None, True),
                                                           (True, (5, -1), True), (False, None, False)])
def test_varlen_matches_per_sequence_reference(causal, window, deterministic):
    """Packed sequences (one empty, one longer than the rest, N_q != N_k in some) against the
    float64 reference run on each sequence alone: output (reference.attention_varlen) and gradients."""
    lq = [5 * SIZE, 33 * SIZE, 0, 20 * SIZE]
    lk = [9 * SIZE, 30 * SIZE, 4 * SIZE, 20 * SIZE]
    q, k, v, do, cu_q, cu_k = _packed(lq, lk, 4, 2, 32, seed=len(lq))
    dev = [t.to(DEVICE) for t in (q, k, v, do, cu_q, cu_k)]
    o, lse = flash_attention_varlen(*dev[:3], dev[4], dev[5], max(lq), max(lk), causal=causal, window=window,
                                    return_lse=True, deterministic=deterministic)
    ref_o = attention_varlen(*(t.double().numpy() for t in (q, k, v)), cu_q.numpy(), cu_k.numpy(),
                             causal=causal, window=window)
    assert o.shape == q.shape and lse.shape == (4, q.shape[0])
    assert (o.cpu().double() - torch.from_numpy(ref_o)).abs().max().item() < 1e-5
    # gradients: float64 autograd of each sequence alone
    qg, kg, vg = (t.to(DEVICE).clone().requires_grad_() for t in (q, k, v))
    out = flash_attention_varlen(qg, kg, vg, dev[4], dev[5], max(lq), max(lk), causal=causal, window=window,
                                 deterministic=deterministic)
    out.backward(dev[3])
    for b in range(len(lq)):
        (a0, a1), (b0, b1) = (int(cu_q[b]), int(cu_q[b + 1])), (int(cu_k[b]), int(cu_k[b + 1]))
        seq = [t[s0:s1].double().transpose(0, 1)[None].requires_grad_() for t, (s0, s1) in
               zip((q, k, v), ((a0, a1), (b0, b1), (b0, b1)))]
        if a1 > a0:
            masked_attention(*seq, causal, window).backward(do[a0:a1].double().transpose(0, 1)[None])
        for got, ref, (s0, s1) in zip((qg.grad, kg.grad, vg.grad), seq, ((a0, a1), (b0, b1), (b0, b1))):
            want = ref.grad[0].transpose(0, 1) if ref.grad is not None else torch.zeros_like(got[s0:s1].cpu().double())
            err = (got[s0:s1].cpu().double() - want).abs().max().item() if s1 > s0 else 0.0
            assert err < 1e-5, f"sequence {b}: gradient error {err:.1e}"


@pytest.mark.parametrize(
    "change, words",
    [
        ({"cu_seqlens_q": torch.tensor([0, 3, 2, 8], dtype=torch.int32)}, ["cu_seqlens_q must start at 0, never decrease"]),
        ({"cu_seqlens_k": torch.tensor([0, 3, 5, 9], dtype=torch.int32)}, ["cu_seqlens_k", "same number of sequences"]),
        ({"cu_seqlens_q": torch.tensor([0.0, 4.0, 8.0])}, ["cu_seqlens_q must be an int32 tensor"]),
        ({"max_seqlen_q": 3}, ["max_seqlen_q must be an int >= the longest sequence (5)"]),
        ({"max_seqlen_q": np.int64(4)}, ["max_seqlen_q must be an int >= the longest sequence (5)"]),
        ({"max_seqlen_q": 5.0}, ["max_seqlen_q must be an int >= the longest sequence (5)"]),
        ({"q": torch.zeros(1, 8, 2, 16)}, ["q must be 3-D (total_tokens, heads, head_dim)"]),
    ],
)
def test_varlen_bad_input(change, words):
    args = {"q": torch.zeros(8, 2, 16), "k": torch.zeros(9, 2, 16), "v": torch.zeros(9, 2, 16),
            "cu_seqlens_q": torch.tensor([0, 3, 8], dtype=torch.int32), "cu_seqlens_k": torch.tensor([0, 4, 9], dtype=torch.int32),
            "max_seqlen_q": 5, "max_seqlen_k": 5}
    args.update(change)
    with pytest.raises((ValueError, TypeError)) as info:
        flash_attention_varlen(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


# --------------------------------------------------------------- real GPU only
@needs_gpu
@pytest.mark.parametrize("window", [(256, 0), (1000, 1000)])
def test_gpu_sliding_window_full_size(window):
    check_window(3000, 3000, 128, False, window, torch.bfloat16, h=4, h_kv=2)


@needs_gpu
def test_gpu_deterministic_backward_is_bitwise_repeatable():
    """The default backward gives identical bits over 10 runs (no atomics). The atomic path's
    bits may differ between runs; the experiment `determinism` measures how often and by how much."""
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, do = (torch.randn(2, 8, 2048, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(4))
    grads = []
    for _ in range(10):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        flash_attention(qq, kk, vv, causal=True).backward(do)
        grads.append(qq.grad)
    assert all(torch.equal(grads[0], x) for x in grads[1:])


# --------------------------------------------------------------- TMA descriptors (chapter 6)
@runs_somewhere
@pytest.mark.parametrize("causal, window, h_kv", [(False, None, 2), (True, None, 1), (True, (9, -1), 2)])
def test_tma_loads_match_pointer_loads(causal, window, h_kv):
    """K and V read through tensor descriptors of the (Z * H_kv * N_k, d) view: ragged key
    blocks read into the next head's rows (or past the end, zero-filled), and the mask must
    hide them. Same result as pointer loads up to the order of fp32 sums (bf16: TMA serves
    16-bit inputs only)."""
    g = torch.Generator(device="cpu").manual_seed(2)
    q = torch.randn(2, 2, 37 * SIZE, 32, generator=g).to(DEVICE, torch.bfloat16)
    k, v = (torch.randn(2, h_kv, 53 * SIZE, 32, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
    config = (16, 16, 4, 1) if INTERPRET else (64, 64, 4, 3)
    o1, l1 = forward(q, k, v, causal, 0.2, config, window=window, tma=True)
    o2, l2 = forward(q, k, v, causal, 0.2, config, window=window, tma=False)
    assert (o1.float() - o2.float()).abs().max().item() <= 2**-7 and (l1 - l2).abs().max().item() < 1e-4


def test_tma_refused_for_non_contiguous_odd_d_or_fp32():
    q = torch.zeros(1, 1, 8, 40, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="tma=True needs"):
        forward(q, q, q, False, 1.0, tma=True)
    q32 = torch.zeros(1, 1, 8, 32)
    assert not tma_eligible(q32, q32, q32)
    with pytest.raises(ValueError, match="fp16 or bf16"):
        forward(q32, q32, q32, False, 1.0, tma=True)


# --------------------------------------------------------------- FLASHLAB_AUTOTUNE=0
@runs_somewhere
def test_no_bench_stub_launches_no_trial_runs():
    """With FLASHLAB_AUTOTUNE=0 the autotuner's timer is _no_bench: a kernel with several
    configurations runs once (the real launch), with the first configuration."""
    import triton
    import triton.language as tl

    from flashlab.kernels._common import _no_bench

    @triton.autotune(configs=[triton.Config({"V": 1}), triton.Config({"V": 2})], key=["n"], do_bench=_no_bench)
    @triton.jit
    def count(X, n, V: tl.constexpr):
        tl.atomic_add(X + tl.arange(0, 1), V)

    x = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    count[(1,)](x, 7)
    assert int(x[0]) == 1  # one launch, first config (V = 1); a timed trial would have added more


# ------------------------------------------- a ragged key block in the atomic-dQ backward
def _far_scores(n_q: int, n_k: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v, do whose scores all sit near -600 in log2 units: every row's L is that low, so
    exp2(S - L) of a padding key (K masked to 0, S = 0) would be 2^600, inf even in fp32."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = 10 + 0.1 * torch.randn(1, 2, n_q, d, generator=g)
    k = -10 + 0.1 * torch.randn(1, 2, n_k, d, generator=g)
    v, do = (torch.randn(1, 2, n, d, generator=g) for n in (n_k, n_q))
    return q, k, v, do


@runs_somewhere
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("n_k", [1, 3, 16 * SIZE + 5])
def test_ragged_key_block_adds_nothing_to_dq(n_k, deterministic):
    """A key block shorter than BLOCK_N: its padding keys must not reach dQ. With the atomic dQ
    (deterministic=False) each key block adds dS^T K into dQ; a padding key's K row is 0, and if
    its P were not masked, P = exp2(0 - L) overflows and inf * 0 puts NaN into dQ (seen in fp16
    on a GPU with short packed sequences; here fp32 scores far below zero overflow the same way)."""
    q, k, v, do = _far_scores(40 * SIZE, n_k, 16, seed=n_k)
    qg, kg, vg = (t.to(DEVICE).clone().requires_grad_() for t in (q, k, v))
    flash_attention(qg, kg, vg, deterministic=deterministic).backward(do.to(DEVICE))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    masked_attention(*ref, False, None).backward(do.double())
    for name, got, want in zip(("dq", "dk", "dv"), (qg.grad, kg.grad, vg.grad), ref):
        got = got.cpu().double()
        assert torch.isfinite(got).all(), f"{name} has {int((~torch.isfinite(got)).sum())} non-finite entries"
        # fp32 scores of magnitude ~400 keep ~9 bits fewer than unit scores: 1e-3, not fp32's 1e-5
        err = ((got - want.grad).abs().max() / want.grad.abs().max().clamp_min(1.0)).item()
        assert err < 1e-3, f"{name}: error {err:.1e}"


@needs_gpu
@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize("cu_k", [[0, 1, 2, 3], [0, 3]])
def test_gpu_fp16_atomic_dq_with_keys_shorter_than_a_block(d, cu_k):
    """flash-attn's own test case: fp16, deterministic=False, packed sequences whose key lengths
    are shorter than one key block; every gradient finite and within the low-precision rule."""
    cu_q = [0, 76, 110, 256] if len(cu_k) == 4 else [0, 256]
    g = torch.Generator(device="cpu").manual_seed(d)
    q, do = (3 * torch.randn(cu_q[-1], 5, d, generator=g) for _ in range(2))
    k, v = (3 * torch.randn(cu_k[-1], 5, d, generator=g) for _ in range(2))
    cq, ck = (torch.tensor(c, dtype=torch.int32, device="cuda") for c in (cu_q, cu_k))
    lq, lk = max(np.diff(cu_q)), max(np.diff(cu_k))  # numpy integers are accepted
    qg, kg, vg = (t.to("cuda", torch.float16).requires_grad_() for t in (q, k, v))
    flash_attention_varlen(qg, kg, vg, cq, ck, lq, lk, deterministic=False).backward(do.to("cuda", torch.float16))
    for name, got in zip(("dq", "dk", "dv"), (qg.grad, kg.grad, vg.grad)):
        assert torch.isfinite(got).all(), f"{name}: {int((~torch.isfinite(got)).sum())} non-finite entries"
    for b in range(len(cu_q) - 1):  # each sequence against float64 autograd of it alone
        (a0, a1), (b0, b1) = (cu_q[b], cu_q[b + 1]), (cu_k[b], cu_k[b + 1])
        seq = [t[s0:s1].double().transpose(0, 1)[None].requires_grad_() for t, (s0, s1) in
               zip((q, k, v), ((a0, a1), (b0, b1), (b0, b1)))]
        masked_attention(*seq, False, None).backward(do[a0:a1].double().transpose(0, 1)[None])
        for got, ref, (s0, s1) in zip((qg.grad, kg.grad, vg.grad), seq, ((a0, a1), (b0, b1), (b0, b1))):
            want = ref.grad[0].transpose(0, 1)
            err = (got[s0:s1].cpu().double() - want).abs().max().item()
            assert err < 2e-2 * max(1.0, want.abs().max().item()), f"sequence {b}: gradient error {err:.1e}"
