"""causal_key_range: the (lo, hi) split of the kernels' causal block skipping.

For every query block of every shape: keys [0, lo) are seen by every row of the block
(no mask needed), keys seen by some rows but not all lie in [lo, hi), and no key at or
beyond hi is seen by any row. The split is also tight: lo is as large as whole blocks
allow, and hi - 1 is seen by the block's last row.
"""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st

from flashlab.kernels._common import causal_key_range


def _visible(row: int, key: int, n_q: int, n_k: int) -> bool:
    return key <= row + (n_k - n_q)  # bottom-right alignment


@settings(max_examples=300, deadline=None)
@given(n_q=st.integers(1, 200), n_k=st.integers(1, 200),
       block_m=st.sampled_from([1, 2, 16, 32, 64, 128]), block_n=st.sampled_from([1, 2, 16, 32, 64, 128]))
def test_ranges_split_keys_by_visibility(n_q, n_k, block_m, block_n):
    for start_m in range(math.ceil(n_q / block_m)):
        lo, hi = causal_key_range(start_m, block_m, block_n, n_q, n_k)
        rows = range(start_m * block_m, min(start_m * block_m + block_m, n_q))  # the block's real rows
        assert 0 <= lo <= hi <= n_k and lo % block_n == 0
        for key in range(n_k):
            seen = [_visible(r, key, n_q, n_k) for r in rows]
            if key < lo:
                assert all(seen), f"block {start_m}: unmasked key {key} hidden from some row"
            elif key >= hi:
                assert not any(seen), f"block {start_m}: skipped key {key} is visible"
            if any(seen) and not all(seen):
                assert lo <= key < hi, f"block {start_m}: partly visible key {key} outside the masked range"
        # tight: one more whole block would include a key the first row cannot see (or the ragged tail)
        assert lo == (n_k // block_n) * block_n or not _visible(rows[0], lo + block_n - 1, n_q, n_k)
        assert hi == 0 or _visible(rows[-1], hi - 1, n_q, n_k)


def test_square_example():
    # N = 512, Br = 128, Bc = 64: each query block has two masked key blocks on the diagonal
    assert [causal_key_range(i, 128, 64, 512, 512) for i in range(4)] == [(0, 128), (128, 256), (256, 384), (384, 512)]
