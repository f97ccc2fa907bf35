"""Hypothesis strategies shared by the property tests of the NumPy references."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


@st.composite
def qkv(draw, max_n: int = 9, max_d: int = 6):
    """(q, k, v, rng): leading batch dims (), (2,) or (2, 3); N_q and N_k drawn separately
    (so N_q != N_k and ragged blocks occur); d != d_v; scores spread from tiny to large.
    ``rng`` continues the same seeded stream, for further arrays such as dO."""
    lead = draw(st.sampled_from([(), (2,), (2, 3)]))
    n_q, n_k = draw(st.integers(1, max_n)), draw(st.integers(1, max_n))
    d, d_v = draw(st.integers(1, max_d)), draw(st.integers(1, max_d))
    seed = draw(st.integers(0, 2**32 - 1))
    spread = draw(st.sampled_from([0.1, 1.0, 10.0]))
    rng = np.random.default_rng(seed)
    q = rng.normal(scale=spread, size=lead + (n_q, d))
    k = rng.normal(scale=spread, size=lead + (n_k, d))
    v = rng.normal(size=lead + (n_k, d_v))
    return q, k, v, rng
