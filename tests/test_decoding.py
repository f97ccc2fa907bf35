"""The decoding kernels (split-KV + combine, contiguous and paged caches) against the float64 reference.

Each sequence b is checked on the valid part of its cache: flashlab.reference.attention with
q[b] (H, n_q, d), the first cache_seqlens[b] keys (K/V heads repeated GROUP times for GQA),
causal, aligned bottom-right (token i sees key j iff j <= seqlen - n_q + i).
Cache positions beyond seqlen, and pool pages no sequence owns, are filled with NaN: one
stray read would poison the output.

Tolerance: fp32 (IEEE dots) 1e-5 · max(1, |o|); fp16/bf16 the flash-attn rule —
max error at most 2x that of plain PyTorch attention in the same dtype, plus 1e-5.
Under the interpreter (CPU) the kernels take BLOCK_N = 16, so caches of <= 288 tokens
already span up to 18 key blocks and several splits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashlab.kernels import INTERPRET
from flashlab.kernels.decoding import MAX_SPLITS, choose_num_splits, combine_splits, flash_decode
from flashlab.reference import attention
from tiers import DEVICE, GPU, needs_gpu, runs_somewhere


N_MAX = 288  # cache capacity: 18 key blocks of 16, 9 pages of 32, 18 of 16
SEQLENS = [1, N_MAX, 141]  # ragged: one key, the full cache, and a length on no block or page boundary


def torch_attention(q, k, v, scale):
    """Plain attention of n_q new tokens to n keys, in q's dtype (the low-precision baseline),
    GQA by repetition, causal bottom-right; a row seeing no key gives 0. q (H, n_q, d), k, v (H_kv, n, d)."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    s = (q @ k.transpose(-2, -1)) * scale  # (H, n_q, n)
    n_q, n = s.shape[-2:]
    visible = torch.ones(n_q, n, dtype=torch.bool, device=q.device).tril(n - n_q)
    p = torch.softmax(s.float().masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0).to(q.dtype)
    return p @ v


def make_inputs(B, H, H_KV, n_q, d, seqlens, page_size, g):
    """Float32 inputs: q (B, H, n_q, d); contiguous caches k, v (B, H_kv, N_MAX, d) with NaN past
    each seqlen; and, if page_size, the same keys scattered over a pool of randomly permuted pages
    (num_pages, page_size, H_kv, d) with 3 spare NaN pages and -1 in unused block_table slots."""
    q = torch.randn(B, H, n_q, d, generator=g)
    k, v = torch.randn(B, H_KV, N_MAX, d, generator=g), torch.randn(B, H_KV, N_MAX, d, generator=g)
    for b, n in enumerate(seqlens):
        k[b, :, n:], v[b, :, n:] = float("nan"), float("nan")
    if page_size is None:
        return q, k, v, None, None, None
    max_pages = N_MAX // page_size
    num_pages = B * max_pages + 3
    perm = torch.randperm(num_pages, generator=g)[: B * max_pages].view(B, max_pages)  # (B, max_pages) physical pages
    k_pool = torch.full((num_pages, page_size, H_KV, d), float("nan"))
    v_pool = torch.full((num_pages, page_size, H_KV, d), float("nan"))
    k_pool[perm] = k.view(B, H_KV, max_pages, page_size, d).permute(0, 2, 3, 1, 4)  # (B, max_pages, page_size, H_kv, d)
    v_pool[perm] = v.view(B, H_KV, max_pages, page_size, d).permute(0, 2, 3, 1, 4)
    pages_used = torch.tensor([math.ceil(n / page_size) for n in seqlens])
    block_table = torch.where(torch.arange(max_pages)[None, :] < pages_used[:, None], perm, -1).to(torch.int32)
    return q, k, v, k_pool, v_pool, block_table


CASES = [  # (n_q, H_kv, d, num_splits, page_size, dtype, layout)
    (1, 2, 64, 1, None, torch.float32, "bhnd"),
    (4, 2, 64, 3, None, torch.float32, "bnhd"),
    (4, 1, 128, 3, 16, torch.float32, "bhnd"),
    (4, 2, 96, 24, 32, torch.float32, "bhnd"),
    (1, 2, 64, None, None, torch.float32, "bhnd"),
    (1, 8, 96, 3, 32, torch.bfloat16, "bhnd"),
    (4, 8, 64, 1, 16, torch.bfloat16, "bhnd"),
    (1, 1, 128, 24, None, torch.bfloat16, "bnhd"),
    (4, 2, 128, 3, 16, torch.float16, "bhnd"),
]


@runs_somewhere
@pytest.mark.parametrize("n_q, H_KV, d, num_splits, page_size, dtype, layout", CASES)
def test_matches_reference(n_q, H_KV, d, num_splits, page_size, dtype, layout):
    """num_splits 24 exceeds the 18 key blocks (some splits are empty); None takes the heuristic.
    layout "bnhd": q and the contiguous cache are (B, N, H, d) in memory, viewed as (B, H, N, d)."""
    B, H = 3, 8
    g = torch.Generator().manual_seed(n_q * 1000 + H_KV * 100 + d)
    q, k, v, k_pool, v_pool, block_table = make_inputs(B, H, H_KV, n_q, d, SEQLENS, page_size, g)
    q_in, k_in, v_in = (q, k, v) if page_size is None else (q, k_pool, v_pool)
    if layout == "bnhd":
        q_in, k_in, v_in = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q_in, k_in, v_in))
    scale = 1.0 / math.sqrt(d)
    o, lse = flash_decode(*(t.to(DEVICE, dtype) for t in (q_in, k_in, v_in)),
                          torch.tensor(SEQLENS, dtype=torch.int32, device=DEVICE), num_splits=num_splits,
                          block_table=None if block_table is None else block_table.to(DEVICE),
                          page_size=page_size, return_lse=True)
    assert o.dtype == dtype and o.shape == (B, H, n_q, d) and lse.shape == (B, H, n_q)

    # Each sequence on its own, against float64 (and, for fp16/bf16, plain attention in that dtype).
    group = H // H_KV
    for b, n in enumerate(SEQLENS):
        qb, kb, vb = q[b], k[b, :, :n], v[b, :, :n]  # (H, n_q, d), (H_kv, n, d)
        ref = torch.from_numpy(attention(qb.double().numpy(), kb.repeat_interleave(group, 0).double().numpy(),
                                         vb.repeat_interleave(group, 0).double().numpy(), causal=True, scale=scale))
        err = (o[b].cpu().double() - ref).abs().max().item()
        if dtype == torch.float32:
            bound = 1e-5 * max(1.0, ref.abs().max().item())
        else:
            base = torch_attention(*(t.to(DEVICE, dtype) for t in (qb, kb, vb)), scale)
            bound = 2 * (base.cpu().double() - ref).abs().max().item() + 1e-5
        assert err <= bound, f"sequence {b} (seqlen {n}): max error {err:.2e} > {bound:.2e}"
        # lse = log sum_j exp(S_ij) over the visible keys (natural log), -inf for a row that sees none
        s = (qb.double() @ kb.repeat_interleave(group, 0).double().transpose(-2, -1)) * scale
        s = s.masked_fill(~torch.ones(n_q, n, dtype=torch.bool).tril(n - n_q), float("-inf"))
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(lse[b].cpu().double(), torch.logsumexp(s, -1), rtol=tol, atol=tol)


@runs_somewhere
@pytest.mark.parametrize("page_size", [None, 16])
def test_fused_combine_matches_separate_combine_and_resets_its_counters(page_size):
    """The combine inside the split kernel (the last program of a tile merges every split) gives
    the separate combine kernel's answer, leaves its arrival counters at 0, and so gives the same
    bits when called again. 5 splits over 18 key blocks; sequence 0 has a single key, so most of
    its splits are empty (lse_s = -inf) and must still be counted in."""
    from flashlab.kernels import decoding

    B, H, H_KV, n_q, d = 3, 8, 2, 2, 32
    g = torch.Generator().manual_seed(7)
    q, k, v, k_pool, v_pool, block_table = make_inputs(B, H, H_KV, n_q, d, SEQLENS, page_size, g)
    k_in, v_in = (k, v) if page_size is None else (k_pool, v_pool)
    args = [t.to(DEVICE) for t in (q, k_in, v_in)] + [torch.tensor(SEQLENS, dtype=torch.int32, device=DEVICE)]
    kw = dict(num_splits=5, block_table=None if block_table is None else block_table.to(DEVICE),
              page_size=page_size, return_lse=True)
    o_sep, lse_sep = flash_decode(*args, **kw, fuse_combine=False)
    o_fused, lse_fused = flash_decode(*args, **kw)
    torch.testing.assert_close(o_fused, o_sep, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse_fused, lse_sep, rtol=1e-6, atol=1e-6)
    assert all(int(buf.abs().sum()) == 0 for buf in decoding._LOCKS.values())  # every counter back at 0
    o_again, _ = flash_decode(*args, **kw)
    assert torch.equal(o_again, o_fused)


@runs_somewhere
def test_combine_matches_numpy_logsumexp():
    """lse = log2 sum_s 2^{lse_s} and o = sum_s 2^{lse_s - lse} o_s, with empty chunks (lse_s = -inf)
    contributing nothing and a row whose chunks are all empty giving o = 0, lse = -inf."""
    g = torch.Generator().manual_seed(7)
    B, H, n_s, n_q, d = 2, 3, 5, 2, 40
    o_parts = torch.randn(B, H, n_s, n_q, d, generator=g)
    lse2_parts = 8 * torch.randn(B, H, n_s, n_q, generator=g)
    lse2_parts[0, 1, 2:, 0] = float("-inf")  # some chunks empty
    lse2_parts[1, 2, :, 1] = float("-inf")  # every chunk empty
    o_parts[lse2_parts == float("-inf")] = 0.0  # what the split kernel writes for an empty chunk
    o, lse2 = combine_splits(o_parts.to(DEVICE), lse2_parts.to(DEVICE))

    lse_np = lse2_parts.double().numpy()
    ref_lse = np.logaddexp2.reduce(lse_np, axis=2)  # (B, H, n_q)
    weight = np.where(np.isneginf(lse_np), 0.0, np.exp2(lse_np - np.where(np.isneginf(ref_lse), 0.0, ref_lse)[:, :, None]))
    ref_o = (weight[..., None] * o_parts.double().numpy()).sum(axis=2)
    torch.testing.assert_close(lse2.cpu().double(), torch.from_numpy(ref_lse), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(o.cpu().double(), torch.from_numpy(ref_o), rtol=1e-6, atol=1e-6)
    assert lse2[1, 2, 1] == float("-inf") and (o[1, 2, 1] == 0).all()


def test_choose_num_splits():
    assert choose_num_splits(programs=32, key_blocks=512, num_sms=132) == 8  # 256 programs: one wave of 2 per SM
    assert choose_num_splits(programs=300, key_blocks=512, num_sms=132) == 1  # already fills the GPU
    assert choose_num_splits(programs=1, key_blocks=5, num_sms=132) == 5  # never more splits than key blocks
    assert choose_num_splits(programs=1, key_blocks=10_000, num_sms=1000) <= MAX_SPLITS
    # the CPU tests' caches: 6 programs; s = 16 fills 96 slots, within 85 % of the best (s = 18: 108 slots)
    assert choose_num_splits(programs=6, key_blocks=18, num_sms=132) == 16


def _bad(**overrides):
    """Valid small inputs (contiguous: q (1, 4, 1, 8), cache (1, 2, 32, 8)), with some replaced."""
    args = dict(q=torch.zeros(1, 4, 1, 8), k_cache=torch.zeros(1, 2, 32, 8), v_cache=torch.zeros(1, 2, 32, 8),
                cache_seqlens=torch.tensor([5], dtype=torch.int32))
    args.update(overrides)
    return args


POOL = torch.zeros(6, 16, 2, 8)  # paged: 6 pages of 16 slots, H_kv = 2, d = 8
BAD_INPUTS = [
    (_bad(q=torch.zeros(4, 1, 8)), ValueError, ["q must be 4-D", "(4, 1, 8)"]),
    (_bad(q=torch.zeros(1, 4, 1, 8, dtype=torch.float16)), TypeError, ["same dtype", "float16"]),
    (_bad(q=torch.zeros(1, 4, 1, 8, dtype=torch.int32)), TypeError, ["q must have dtype", "int32"]),
    (_bad(k_cache=torch.zeros(1, 2, 32, 8, device="meta")), ValueError, ["same device", "meta"]),
    (_bad(v_cache=torch.zeros(1, 2, 31, 8)), ValueError, ["same shape", "(1, 2, 32, 8)", "(1, 2, 31, 8)"]),
    (_bad(k_cache=torch.zeros(1, 2, 32, 4), v_cache=torch.zeros(1, 2, 32, 4)), ValueError, ["head dimension", "(1, 4, 1, 8)", "(1, 2, 32, 4)"]),
    (_bad(k_cache=torch.zeros(1, 3, 32, 8), v_cache=torch.zeros(1, 3, 32, 8)), ValueError, ["must divide", "4 query heads", "3 K/V heads"]),
    (_bad(q=torch.zeros(2, 4, 1, 8), cache_seqlens=torch.tensor([5, 5], dtype=torch.int32)), ValueError, ["batch size"]),
    (_bad(cache_seqlens=torch.tensor([5])), ValueError, ["cache_seqlens must be an int32", "int64"]),
    (_bad(cache_seqlens=torch.tensor([5, 6], dtype=torch.int32)), ValueError, ["shape (B,) = (1,)", "(2,)"]),
    (_bad(cache_seqlens=torch.tensor([33], dtype=torch.int32)), ValueError, ["[0, 32]", "33"]),
    (_bad(cache_seqlens=torch.tensor([-1], dtype=torch.int32)), ValueError, ["[0, 32]", "-1"]),
    (_bad(block_table=torch.zeros(1, 2, dtype=torch.int32)), ValueError, ["given together", "page_size=None"]),
    (_bad(page_size=16), ValueError, ["given together", "page_size=16"]),
    (_bad(k_cache=POOL, v_cache=POOL, block_table=torch.zeros(1, 2, dtype=torch.int32), page_size=32), ValueError,
     ["page_size=32", "(6, 16, 2, 8)"]),
    (_bad(k_cache=POOL, v_cache=POOL, block_table=torch.zeros(1, 2), page_size=16), ValueError, ["block_table must be an int32", "float32"]),
    (_bad(k_cache=POOL, v_cache=POOL, block_table=torch.zeros(1, 2, dtype=torch.int32), page_size=16,
          cache_seqlens=torch.tensor([40], dtype=torch.int32)), ValueError, ["[0, 32]", "2 * 16", "40"]),
    (_bad(k_cache=POOL, v_cache=POOL, block_table=torch.tensor([[0, 6]], dtype=torch.int32), page_size=16,
          cache_seqlens=torch.tensor([20], dtype=torch.int32)), ValueError, ["num_pages = 6", "block_table[0, 1] = 6"]),
    (_bad(num_splits=0), ValueError, ["num_splits must be an integer >= 1", "0"]),
    (_bad(scale=-1.0), ValueError, ["scale must be a positive", "-1.0"]),
    (_bad(q=torch.zeros(1, 4, 1, 512), k_cache=torch.zeros(1, 2, 32, 512), v_cache=torch.zeros(1, 2, 32, 512)), ValueError,
     ["between 1 and 256", "512"]),
]


@pytest.mark.parametrize("kwargs, exc, words", BAD_INPUTS)
def test_bad_input(kwargs, exc, words):
    with pytest.raises(exc) as info:
        flash_decode(**kwargs)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


def test_unused_block_table_slots_are_not_checked():
    """Slots past a sequence's last page may hold anything (here -1): they are never read."""
    if not GPU and not INTERPRET:
        pytest.skip("needs a GPU or TRITON_INTERPRET=1")
    pool = torch.randn(4, 16, 1, 16, device=DEVICE)
    o = flash_decode(torch.randn(1, 1, 1, 16, device=DEVICE), pool, pool, torch.tensor([16], dtype=torch.int32, device=DEVICE),
                     block_table=torch.tensor([[3, -1]], dtype=torch.int32, device=DEVICE), page_size=16)
    assert torch.isfinite(o).all()


# --------------------------------------------------------------- full size, real GPU only
@needs_gpu
@pytest.mark.parametrize("n_q", [1, 4])
@pytest.mark.parametrize("page_size", [None, 256])
def test_gpu_realistic_size(n_q, page_size):
    """B = 4, H = 32, H_kv = 8, a 32k-token cache, d = 128, bf16, against torch SDPA: float64 as
    the reference, bf16 as the baseline of the flash-attn tolerance rule."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    B, H, H_KV, N, d = 4, 32, 8, 32768, 128
    seqlens = [N, 20000, 1, 12345]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, n_q, d, device="cuda", generator=g)
    k, v = (torch.randn(B, H_KV, N, d, device="cuda", generator=g) for _ in range(2))
    args = dict(num_splits=None, return_lse=False)
    if page_size is None:
        o = flash_decode(q.bfloat16(), k.bfloat16(), v.bfloat16(), torch.tensor(seqlens, dtype=torch.int32, device="cuda"), **args)
    else:
        max_pages = N // page_size
        perm = torch.randperm(B * max_pages, device="cuda", generator=g).view(B, max_pages)
        pool_k, pool_v = (torch.empty(B * max_pages, page_size, H_KV, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        pool_k[perm] = k.bfloat16().view(B, H_KV, max_pages, page_size, d).permute(0, 2, 3, 1, 4)
        pool_v[perm] = v.bfloat16().view(B, H_KV, max_pages, page_size, d).permute(0, 2, 3, 1, 4)
        o = flash_decode(q.bfloat16(), pool_k, pool_v, torch.tensor(seqlens, dtype=torch.int32, device="cuda"),
                         block_table=perm.to(torch.int32), page_size=page_size, **args)
    for b, n in enumerate(seqlens):
        mask = torch.ones(n_q, n, dtype=torch.bool, device="cuda").tril(n - n_q)
        qb, kb, vb = q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n]
        ref = sdpa(qb.double(), kb.double(), vb.double(), attn_mask=mask, enable_gqa=True).nan_to_num(0.0)
        base = sdpa(qb.bfloat16(), kb.bfloat16(), vb.bfloat16(), attn_mask=mask, enable_gqa=True).nan_to_num(0.0)
        err = (o[b : b + 1].double() - ref).abs().max().item()
        bound = 2 * (base.double() - ref).abs().max().item() + 1e-5
        assert err <= bound, f"sequence {b} (seqlen {n}): max error {err:.2e} > {bound:.2e}"


@runs_somewhere
def test_package_flash_decode_is_the_kernel_eagerly_and_the_operator_when_compiled():
    """flashlab.kernels.flash_decode takes decoding.flash_decode's arguments; called eagerly it is
    that function (no operator dispatch in a decoding step), and the custom operator that
    torch.compile records (flashlab::decode) gives the same bits."""
    import inspect

    from flashlab import kernels

    assert inspect.signature(kernels.flash_decode) == inspect.signature(flash_decode)
    g = torch.Generator().manual_seed(3)
    q, k, v, k_pool, v_pool, block_table = make_inputs(2, 4, 2, 1, 16, [70, 33], 16, g)  # short caches: fast
    seqlens = torch.tensor([70, 33], dtype=torch.int32, device=DEVICE)
    args = [t.to(DEVICE) for t in (q, k_pool, v_pool)] + [seqlens]
    kw = dict(num_splits=3, block_table=block_table.to(DEVICE), page_size=16)
    o, lse = flash_decode(*args, **kw, return_lse=True)
    o_pkg, lse_pkg = kernels.flash_decode(*args, **kw, return_lse=True)
    o_op, lse_op = torch.ops.flashlab.decode(*args, 3, None, kw["block_table"], 16, True, True)
    assert torch.equal(o_pkg, o) and torch.equal(lse_pkg, lse)
    assert torch.equal(o_op, o) and torch.equal(lse_op, lse)
    assert kernels.flash_decode(*args, **kw).shape == o.shape  # return_lse=False: o alone
