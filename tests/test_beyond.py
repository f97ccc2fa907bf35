"""Tests of flashlab.reference.beyond: block skipping, sliding window, GQA/MQA, varlen,
split-KV decoding and the paged KV cache, each against a plain definition.

Tolerance: float64 throughout; the variants reorder a few sums and exps (split-KV
combines partial softmaxes, the paged walk folds page by page), which moves results
by a few 1e-16 relative. 1e-12, the float64 tolerance of every reference test, leaves
three orders of magnitude and still catches any algorithmic slip (a missing weight is
off by O(1)).
Block counts, byte counts and split counts are integers and compared exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import strategies

from flashlab.reference import (
    OnlineSoftmaxState,
    PagedKVCache,
    attention,
    attention_gqa,
    attention_paged,
    attention_varlen,
    attention_window,
    block_sizes,
    causal_block_counts,
    causal_mask,
    combine,
    decode_split_kv,
    flash1_block_counts,
    kv_cache_bytes,
    pad_and_mask_cost,
    softmax,
    split_heuristic,
    window_block_counts,
    window_mask,
)

TOL = 1e-12

windows = st.tuples(st.integers(-1, 6), st.integers(-1, 6))


def close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=TOL, atol=TOL)


def attention_with_mask(q, k, v, mask, scale=None):
    """softmax(q k^T tau, masked) v by the textbook steps; a row with no visible key gives 0."""
    if k.shape[-2] == 0:  # no keys at all (an empty sequence of a packed batch)
        return np.zeros(q.shape[:-1] + v.shape[-1:])
    tau = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.where(mask, tau * (q @ np.swapaxes(k, -1, -2)), -np.inf)
    return softmax(s) @ v


def mask_by_definition(n_q, n_k, window, causal=False):
    """The window rule written out entry by entry (left/right = -1: unbounded)."""
    left, right = window
    off = n_k - n_q
    out = np.zeros((n_q, n_k), dtype=bool)
    for i in range(n_q):
        for j in range(n_k):
            out[i, j] = (left == -1 or j >= i + off - left) and (right == -1 or j <= i + off + right)
            out[i, j] &= not causal or j <= i + off
    return out


@st.composite
def gqa_inputs(draw, max_n=8, max_d=5):
    """(q, k, v): q (lead..., H, N_q, d), k/v (lead..., H_kv, N_k, d|d_v), H = G * H_kv."""
    lead = draw(st.sampled_from([(), (2,)]))
    H_kv, G = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n_q, n_k = draw(st.integers(1, max_n)), draw(st.integers(1, max_n))
    d, d_v = draw(st.integers(1, max_d)), draw(st.integers(1, max_d))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    spread = draw(st.sampled_from([0.1, 1.0, 10.0]))
    q = rng.normal(scale=spread, size=lead + (H_kv * G, n_q, d))
    k = rng.normal(scale=spread, size=lead + (H_kv, n_k, d))
    v = rng.normal(size=lead + (H_kv, n_k, d_v))
    return q, k, v


# ---------------------------------------------------------------- GQA / MQA
@settings(max_examples=150, deadline=None)
@given(qkv=gqa_inputs(), causal=st.booleans(), scale=st.sampled_from([None, 0.3]))
def test_gqa_equals_attention_on_repeated_kv(qkv, causal, scale):
    q, k, v = qkv
    G = q.shape[-3] // k.shape[-3]
    expected = attention(q, np.repeat(k, G, axis=-3), np.repeat(v, G, axis=-3), causal, scale)
    close(attention_gqa(q, k, v, causal, scale), expected)


def test_mqa_and_mha_are_the_two_ends():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 8, 5, 4)), rng.normal(size=(2, 8, 7, 4)), rng.normal(size=(2, 8, 7, 3))
    close(attention_gqa(q, k, v, causal=True), attention(q, k, v, causal=True))  # H_kv = H: multi-head
    k1, v1 = k[:, :1], v[:, :1]  # H_kv = 1: every query head reads the one K/V head (MQA)
    close(attention_gqa(q, k1, v1), attention(q, np.broadcast_to(k1, k.shape), np.broadcast_to(v1, v.shape)))


def test_gqa_head_h_reads_kv_head_h_over_g():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(6, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 4))
    o = attention_gqa(q, k, v)
    for h in range(6):
        close(o[h], attention(q[h], k[h // 3], v[h // 3]))


def test_gqa_errors_name_the_heads():
    q, k = np.zeros((6, 3, 4)), np.zeros((4, 5, 4))
    with pytest.raises(ValueError, match=r"H=6, H_kv=4"):
        attention_gqa(q, k, k)
    with pytest.raises(ValueError, match="same head dimension d"):
        attention_gqa(q, np.zeros((2, 5, 3)), np.zeros((2, 5, 3)))


def test_kv_cache_bytes_of_real_models():
    # Llama-2-7B: 32 layers, 32 heads, d = 128, fp16 -> 0.5 MiB per token; 4096 tokens -> 2 GiB.
    assert kv_cache_bytes(1, 32, 1, 128, 32, 2) == 512 * 1024
    assert kv_cache_bytes(1, 32, 4096, 128, 32) == 2 * 1024**3
    # Llama-2-70B: 80 layers, 64 query heads but 8 K/V heads (GQA): 320 KiB per token, 8x less than MHA.
    gqa, mha = kv_cache_bytes(1, 8, 1, 128, 80), kv_cache_bytes(1, 64, 1, 128, 80)
    assert (gqa, mha // gqa) == (320 * 1024, 8)
    with pytest.raises(ValueError, match="n_kv_heads must be an integer >= 1; got 0"):
        kv_cache_bytes(1, 0, 1, 128, 80)


# ---------------------------------------------------------------- sliding window
@settings(max_examples=200, deadline=None)
@given(n_q=st.integers(0, 9), n_k=st.integers(0, 9), window=windows)
def test_window_mask_matches_definition(n_q, n_k, window):
    np.testing.assert_array_equal(window_mask(n_q, n_k, window), mask_by_definition(n_q, n_k, window))


@pytest.mark.parametrize("n_q, n_k", [(1, 1), (4, 4), (3, 7), (7, 3), (1, 9)])
def test_window_special_cases(n_q, n_k):
    np.testing.assert_array_equal(window_mask(n_q, n_k, (-1, 0)), causal_mask(n_q, n_k))
    assert window_mask(n_q, n_k, (-1, -1)).all()
    diag = window_mask(n_q, n_k, (0, 0))  # only the (bottom-right aligned) diagonal
    np.testing.assert_array_equal(diag, np.eye(n_q, n_k, k=n_k - n_q, dtype=bool))


@settings(max_examples=150, deadline=None)
@given(drawn=strategies.qkv(max_n=9, max_d=5), window=windows, scale=st.sampled_from([None, 0.5]))
def test_attention_window_matches_masked_definition(drawn, window, scale):
    q, k, v, _ = drawn
    mask = mask_by_definition(q.shape[-2], k.shape[-2], window)
    close(attention_window(q, k, v, window, scale), attention_with_mask(q, k, v, mask, scale))


def test_attention_window_ends_are_full_and_causal():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(3, 6, 4)), rng.normal(size=(3, 9, 4)), rng.normal(size=(3, 9, 2))
    close(attention_window(q, k, v, (-1, -1)), attention(q, k, v))
    close(attention_window(q, k, v, (-1, 0)), attention(q, k, v, causal=True))


@pytest.mark.parametrize("window", [(2,), (1, -2), (1.0, 2), "ab", (True, 1), None])
def test_window_is_validated(window):
    with pytest.raises(ValueError, match=r"window must be a pair \(left, right\) of integers >= -1"):
        window_mask(3, 3, window)


# ---------------------------------------------------------------- block skipping
@settings(max_examples=300, deadline=None)
@given(
    n_q=st.integers(1, 30),
    n_k=st.integers(1, 30),
    block_q=st.integers(1, 9),
    block_k=st.integers(1, 9),
    window=windows,
)
def test_block_counts_match_the_mask_tile_by_tile(n_q, n_k, block_q, block_k, window):
    """Skipped = tile with no visible entry; diagonal = tile with some, but not all."""
    mask = mask_by_definition(n_q, n_k, window)
    tiles = [
        mask[r : r + block_q, c : c + block_k] for r in range(0, n_q, block_q) for c in range(0, n_k, block_k)
    ]
    expected = {
        "total": len(tiles),
        "computed": sum(t.any() for t in tiles),
        "skipped": sum(not t.any() for t in tiles),
        "diagonal": sum(t.any() and not t.all() for t in tiles),
    }
    assert window_block_counts(n_q, n_k, block_q, block_k, window) == expected
    if window == (-1, 0):
        assert causal_block_counts(n_q, n_k, block_q, block_k) == expected


@pytest.mark.parametrize("T, B", [(1, 16), (2, 8), (7, 4), (64, 128)])
def test_causal_block_counts_closed_form(T, B):
    """Square N = T B: T (T - 1) / 2 tiles above the diagonal, T on it."""
    counts = causal_block_counts(T * B, T * B, B, B)
    assert counts == {"total": T * T, "computed": T * (T + 1) // 2, "skipped": T * (T - 1) // 2, "diagonal": T}


def test_causal_skipping_tends_to_half():
    ratios = []
    for n in [256, 1000, 4096, 16384]:  # 1000: ragged last block
        c = causal_block_counts(n, n, 128, 128)
        ratios.append(c["skipped"] / c["total"])
        T = -(-n // 128)
        assert abs(ratios[-1] - 0.5) <= 1 / (2 * T)
    assert ratios == sorted(ratios) and ratios[-1] > 0.496


@pytest.mark.parametrize("n_q, n_k, d, sram", [(100, 100, 8, 1024), (37, 90, 4, 256), (90, 37, 16, 4096)])
def test_causal_skipping_agrees_with_flash1(n_q, n_k, d, sram):
    Br, Bc = block_sizes(sram, d)
    c = causal_block_counts(n_q, n_k, Br, Bc)
    assert flash1_block_counts(n_q, n_k, d, sram, causal=True) == (c["computed"], c["skipped"])


def test_sliding_window_work_grows_linearly():
    """Causal window of 256 keys, 64x64 tiles: computed tiles ~ N (not N^2)."""
    computed = {n: window_block_counts(n, n, 64, 64, (256, 0))["computed"] for n in [2048, 4096, 8192]}
    assert computed[4096] - 2 * computed[2048] == computed[8192] - 2 * computed[4096]  # affine in N
    # rows 64r..64r+63 see keys 64r-256..64r+63: column tiles r-4..r, 5 per row of tiles,
    # fewer in the first four rows (4 + 3 + 2 + 1 tiles fall off the left edge)
    assert computed[8192] == 5 * (8192 // 64) - 10


# ---------------------------------------------------------------- variable length
@st.composite
def varlen_inputs(draw):
    B = draw(st.integers(1, 4))
    lens_q = draw(st.lists(st.integers(0, 6), min_size=B, max_size=B))
    lens_k = draw(st.lists(st.integers(0, 6), min_size=B, max_size=B))
    H_kv, G, d, d_v = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.normal(size=(sum(lens_q), H_kv * G, d))
    k = rng.normal(size=(sum(lens_k), H_kv, d))
    v = rng.normal(size=(sum(lens_k), H_kv, d_v))
    return q, k, v, np.cumsum([0] + lens_q), np.cumsum([0] + lens_k)


@settings(max_examples=150, deadline=None)
@given(inputs=varlen_inputs(), causal=st.booleans(), window=st.none() | windows)
def test_varlen_equals_attention_per_sequence(inputs, causal, window):
    q, k, v, cu_q, cu_k = inputs
    G = q.shape[1] // k.shape[1]
    o = attention_varlen(q, k, v, cu_q, cu_k, causal=causal, window=window)
    assert o.shape == q.shape[:2] + v.shape[2:]
    for b in range(len(cu_q) - 1):
        q_b = np.swapaxes(q[cu_q[b] : cu_q[b + 1]], 0, 1)  # (H, n_q, d)
        k_b, v_b = (np.repeat(np.swapaxes(x[cu_k[b] : cu_k[b + 1]], 0, 1), G, axis=0) for x in (k, v))  # (H, n_k, .)
        n_q, n_k = q_b.shape[1], k_b.shape[1]
        if window is None and n_k > 0:
            expected = attention(q_b, k_b, v_b, causal)
        else:
            mask = mask_by_definition(n_q, n_k, (-1, -1) if window is None else window, causal)
            expected = attention_with_mask(q_b, k_b, v_b, mask)
        close(np.swapaxes(o[cu_q[b] : cu_q[b + 1]], 0, 1), expected)


@settings(max_examples=50, deadline=None)
@given(inputs=varlen_inputs(), causal=st.booleans())
def test_varlen_is_one_attention_with_a_block_diagonal_mask(inputs, causal):
    """Packing is a block-diagonal mask over all tokens: sequence b's queries see only b's keys."""
    q, k, v, cu_q, cu_k = inputs
    seq_q = np.repeat(np.arange(len(cu_q) - 1), np.diff(cu_q))  # sequence of each packed query
    seq_k = np.repeat(np.arange(len(cu_k) - 1), np.diff(cu_k))  # sequence of each packed key
    pos_q, pos_k = np.arange(len(seq_q)) - cu_q[seq_q], np.arange(len(seq_k)) - cu_k[seq_k]
    mask = seq_q[:, None] == seq_k[None, :]  # (total_q, total_k)
    if causal:  # bottom-right aligned within each sequence
        off = np.diff(cu_k)[seq_q] - np.diff(cu_q)[seq_q]
        mask &= pos_k[None, :] <= pos_q[:, None] + off[:, None]
    G = q.shape[1] // k.shape[1]
    k_all, v_all = (np.repeat(np.swapaxes(x, 0, 1), G, axis=0) for x in (k, v))  # (H, total_k, .)
    expected = attention_with_mask(np.swapaxes(q, 0, 1), k_all, v_all, mask)  # (H, total_q, d_v)
    close(np.swapaxes(attention_varlen(q, k, v, cu_q, cu_k, causal=causal), 0, 1), expected)


@pytest.mark.parametrize(
    "cu_q, cu_k, match",
    [
        ([0, 3, 5], [0, 2, 4, 4], "same number of sequences; got 2 and 3"),
        ([1, 3, 5], [0, 2, 4], r"cu_seqlens_q must start at 0 .* got first=1"),
        ([0, 3, 4], [0, 2, 4], r"end at the number of packed tokens 5; got first=0, last=4"),
        ([0, 4, 3, 5], [0, 2, 2, 4], r"non-decreasing .* cu_seqlens_q\[1\]=4 > cu_seqlens_q\[2\]=3"),
        ([0.0, 3.0, 5.0], [0, 2, 4], "1-D integer array"),
        ([[0, 5]], [0, 4], "1-D integer array"),
        ([5], [4], "at least 2 entries"),
    ],
)
def test_varlen_validates_cu_seqlens(cu_q, cu_k, match):
    q, k = np.zeros((5, 2, 3)), np.zeros((4, 1, 3))
    with pytest.raises(ValueError, match=match):
        attention_varlen(q, k, k, np.array(cu_q), np.array(cu_k))


def test_varlen_rejects_unpacked_layout():
    with pytest.raises(ValueError, match=r"packed as \(total_tokens, heads, d\)"):
        attention_varlen(np.zeros((1, 5, 2, 3)), np.zeros((4, 1, 3)), np.zeros((4, 1, 3)), [0, 5], [0, 4])
    with pytest.raises(ValueError, match=r"H_kv dividing H; got q.shape=\(5, 3, 3\), k.shape=\(4, 2, 3\)"):
        attention_varlen(np.zeros((5, 3, 3)), np.zeros((4, 2, 3)), np.zeros((4, 2, 3)), [0, 5], [0, 4])


def test_pad_and_mask_cost_worked_example():
    """Lengths 1, 2, 3, 10 padded to 10: 40 token slots for 16 tokens; sum n^2 = 114 of 400."""
    c = pad_and_mask_cost([1, 2, 3, 10], n_heads=2, d=4, bytes_per_element=2)
    assert (c["padded_tokens"], c["packed_tokens"]) == (40, 16)
    assert (c["padded_flops"], c["packed_flops"]) == (4 * 400 * 4 * 2, 4 * 114 * 4 * 2)  # 4 n^2 d per head
    assert (c["padded_bytes"], c["packed_bytes"]) == (4 * 40 * 2 * 4 * 2, 4 * 16 * 2 * 4 * 2)
    assert c["useful_fraction"] == pytest.approx(114 / 400, rel=TOL)
    assert pad_and_mask_cost([7, 7, 7], causal=True)["useful_fraction"] == 1.0
    with pytest.raises(ValueError, match="seqlens must be a non-empty 1-D list of integers >= 1"):
        pad_and_mask_cost([3, 0])


# ---------------------------------------------------------------- split-KV decoding
@settings(max_examples=200, deadline=None)
@given(
    drawn=strategies.qkv(max_n=13, max_d=5),
    num_splits=st.integers(1, 16),
    causal=st.booleans(),
    scale=st.sampled_from([None, 0.7]),
)
def test_decode_split_kv_is_exact(drawn, num_splits, causal, scale):
    """Any number of splits, including more splits than keys (empty splits) and causal rows
    that see none of a split's keys."""
    q, k, v, _ = drawn
    o, lse = decode_split_kv(q, k, v, num_splits, scale, causal=causal)
    o_ref, lse_ref = attention(q, k, v, causal, scale, return_lse=True)
    close(o, o_ref)
    close(lse, lse_ref)


@settings(max_examples=150, deadline=None)
@given(drawn=strategies.qkv(max_n=10, max_d=4), cuts=st.lists(st.integers(0, 10), min_size=0, max_size=5))
def test_combine_is_merge_of_normalised_states(drawn, cuts):
    """(o_i, lse_i) is the state (m = lse_i, l = 1, o_tilde = o_i): combine = folding merge."""
    q, k, v, _ = drawn
    s = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])  # (..., N_q, N_k)
    edges = [0] + sorted(min(c, k.shape[-2]) for c in cuts) + [k.shape[-2]]  # splits, some empty
    states = [
        OnlineSoftmaxState.empty(s.shape[:-1], v.shape[-1]).update(s[..., a:b], v[..., a:b, :])
        for a, b in zip(edges[:-1], edges[1:])
    ]
    merged = states[0]
    for st_ in states[1:]:
        merged = merged.merge(st_)
    o, lse = combine(np.stack([x.output() for x in states]), np.stack([x.lse for x in states]))
    close(o, merged.output())
    close(lse, merged.lse)
    close(o, attention(q, k, v))


def test_combine_edge_cases():
    rng = np.random.default_rng(3)
    o_parts, lse_parts = rng.normal(size=(4, 2, 3, 5)), rng.normal(scale=800, size=(4, 2, 3))  # e^800 overflows
    o, lse = combine(o_parts, lse_parts)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    o_perm, lse_perm = combine(o_parts[::-1], lse_parts[::-1])  # order does not matter
    close(o_perm, o)
    close(lse_perm, lse)
    close(combine(o_parts[:1], lse_parts[:1])[0], o_parts[0])  # one split: nothing to do
    lse_parts[:, 0, 1] = -np.inf  # row (0, 1) is empty in every split
    lse_parts[1:, 1, 2] = -np.inf  # row (1, 2) only in split 0
    o, lse = combine(o_parts, lse_parts)
    assert lse[0, 1] == -np.inf and (o[0, 1] == 0).all()
    close(o[1, 2], o_parts[0, 1, 2])
    close(lse[1, 2], lse_parts[0, 1, 2])


def test_combine_rejects_mismatched_parts():
    with pytest.raises(ValueError, match=r"got o_parts.shape=\(2, 3, 4\), lse_parts.shape=\(3, 3\)"):
        combine(np.zeros((2, 3, 4)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="num_splits must be an integer >= 1; got 0"):
        decode_split_kv(np.zeros((1, 4)), np.zeros((8, 4)), np.zeros((8, 4)), 0)


def test_split_heuristic_examples():
    assert split_heuristic(1, 16, 65536, 132) == 9  # H200: 16 programs alone would leave 116 SMs idle
    assert split_heuristic(8, 32, 65536, 132) == 1  # 256 programs already fill the SMs
    assert split_heuristic(1, 16, 200, 132, block_n=128) == 2  # only 2 key blocks to share out
    assert split_heuristic(1, 1, 1, 108) == 1


@settings(max_examples=300, deadline=None)
@given(
    batch=st.integers(1, 16),
    heads=st.integers(1, 64),
    n_k=st.integers(1, 1 << 17),
    num_sms=st.integers(1, 160),
    block_n=st.sampled_from([32, 64, 128, 256]),
)
def test_split_heuristic_is_the_smallest_that_fills_the_sms(batch, heads, n_k, num_sms, block_n):
    s = split_heuristic(batch, heads, n_k, num_sms, block_n)
    n_blocks = -(-n_k // block_n)
    assert 1 <= s <= n_blocks  # every split has at least one block of keys
    assert batch * heads * s >= num_sms or s == n_blocks  # fills the SMs, unless out of blocks
    assert s == 1 or batch * heads * (s - 1) < num_sms  # and no fewer splits would


# ---------------------------------------------------------------- paged KV cache
@st.composite
def paged_scenarios(draw):
    """A cache and a random sequence of appends (and frees) to its sequences."""
    batch, page_size, num_pages = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 10))
    H_kv, G, d, d_v = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ops = draw(
        st.lists(st.tuples(st.integers(0, batch - 1), st.integers(-1, 7)), min_size=1, max_size=12)
    )  # (b, n_new); n_new = -1 frees sequence b
    seed = draw(st.integers(0, 2**32 - 1))
    return batch, page_size, num_pages, H_kv, G, d, d_v, ops, seed


@settings(max_examples=150, deadline=None)
@given(scenario=paged_scenarios(), causal=st.booleans(), n_q=st.integers(1, 3))
def test_paged_cache_holds_what_was_appended(scenario, causal, n_q):
    batch, page_size, num_pages, H_kv, G, d, d_v, ops, seed = scenario
    rng = np.random.default_rng(seed)
    cache = PagedKVCache(batch, num_pages, page_size, H_kv, d, d_v)
    keys = [np.zeros((0, H_kv, d)) for _ in range(batch)]  # what each sequence should hold
    values = [np.zeros((0, H_kv, d_v)) for _ in range(batch)]
    for b, n_new in ops:
        if n_new == -1:
            cache.free(b)
            keys[b], values[b] = keys[b][:0], values[b][:0]
            continue
        k_new, v_new = rng.normal(size=(n_new, H_kv, d)), rng.normal(size=(n_new, H_kv, d_v))
        needed = -(-(len(keys[b]) + n_new) // page_size) - -(-len(keys[b]) // page_size)
        if needed > len(cache.free_pages):
            before = (cache.block_table.copy(), cache.seq_lens.copy(), list(cache.free_pages))
            with pytest.raises(ValueError, match="page pool is exhausted"):
                cache.append(b, k_new, v_new)
            after = (cache.block_table, cache.seq_lens, cache.free_pages)
            assert all(np.array_equal(x, y) for x, y in zip(before, after))  # nothing changed
            continue
        cache.append(b, k_new, v_new)
        keys[b], values[b] = np.concatenate([keys[b], k_new]), np.concatenate([values[b], v_new])

    owned = np.concatenate([cache.pages_of(b) for b in range(batch)])
    assert len(set(owned.tolist())) == len(owned)  # no page belongs to two sequences
    assert sorted(owned.tolist() + cache.free_pages) == list(range(num_pages))  # none lost
    for b in range(batch):
        k_b, v_b = cache.gather(b)
        np.testing.assert_array_equal(k_b, keys[b])
        np.testing.assert_array_equal(v_b, values[b])

    q = rng.normal(size=(batch, H_kv * G, n_q, d))
    o = attention_paged(q, cache, causal)
    for b in range(batch):
        k_b, v_b = (np.swapaxes(x, 0, 1) for x in (keys[b], values[b]))  # (H_kv, n, .)
        close(o[b], attention_gqa(q[b], k_b, v_b, causal))


def test_paged_pages_out_of_order():
    """Interleaved appends and a freed sequence leave sequence 2's pages scattered and
    out of order in the pool; attention still reads them in logical order."""
    rng = np.random.default_rng(4)
    cache = PagedKVCache(batch=3, num_pages=8, page_size=2, n_kv_heads=1, d=4)
    for b, n in [(0, 3), (1, 2), (2, 1), (0, 2), (2, 2)]:
        cache.append(b, rng.normal(size=(n, 1, 4)), rng.normal(size=(n, 1, 4)))
    cache.free(0)  # pages 0, 1, 4 back on the free list
    cache.append(2, rng.normal(size=(6, 1, 4)), rng.normal(size=(6, 1, 4)))
    pages = cache.pages_of(2).tolist()
    assert pages == [3, 5, 4, 1, 0] and pages != sorted(pages)
    q = rng.normal(size=(3, 2, 1, 4))
    k2, v2 = cache.gather(2)
    close(attention_paged(q, cache)[2], attention_gqa(q[2], np.swapaxes(k2, 0, 1), np.swapaxes(v2, 0, 1)))
    assert (attention_paged(q, cache)[0] == 0).all()  # an empty sequence sees nothing


def test_paged_errors():
    cache = PagedKVCache(batch=2, num_pages=2, page_size=4, n_kv_heads=2, d=3)
    with pytest.raises(ValueError, match=r"needs 3 new page\(s\) of 4 tokens, but only 2 of 2 are free"):
        cache.append(0, np.zeros((9, 2, 3)), np.zeros((9, 2, 3)))
    with pytest.raises(ValueError, match=r"k_new must be \(n_new, 2, 3\)"):
        cache.append(0, np.zeros((1, 1, 3)), np.zeros((1, 1, 3)))
    with pytest.raises(ValueError, match=r"b must be a sequence index in \[0, 2\); got 2"):
        cache.gather(2)
    with pytest.raises(ValueError, match=r"q must be \(B=2, H, N_q, d=3\) with H a multiple of H_kv=2"):
        attention_paged(np.zeros((2, 3, 1, 3)), cache)
