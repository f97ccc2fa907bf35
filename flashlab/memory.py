"""A simulated two-level GPU memory that counts every element moved.

The IO model of the FlashAttention paper (Dao et al., NeurIPS 2022, §3.2) has two
memories: a large, slow HBM that holds Q, K, V, O and anything else an algorithm
writes, and a small, fast SRAM of M numbers where all arithmetic happens. Running
time is dominated by traffic between the two, so an algorithm's *IO complexity* is
the number of elements it moves across: every element read from HBM into SRAM and
every element written back. Arithmetic is free in this model.

This module makes that model executable:

- :class:`HBM` holds named arrays (real NumPy arrays, or only their shapes in
  *counting mode*) and keeps a ledger of reads and writes per array.
- :class:`SRAM` has a capacity of M elements. An algorithm moves data only through
  ``load(name, index) -> block`` and ``store(name, index, block)``; each call moves a
  whole block and counts ``block.size`` elements. ``alloc`` reserves on-chip space for
  a result that will be stored, ``free`` (or the ``hold`` context manager) releases it.
  Exceeding M raises :class:`SRAMOverflowError`, naming the capacity, what is resident
  and what was asked.

What lives where. SRAM holds the matrix tiles that travel between the two memories
(blocks of Q, K, V, O, S, P). Two kinds of on-chip data stay outside its budget, as in
real kernels: per-row statistics (the running max m and sum l of a block of rows,
loaded with ``to="registers"``; their moves *are* counted) and intermediates that never
travel (FlashAttention's score tile S_ij and P~_ij). The paper's block sizes budget
exactly the four travelling tiles Q_i, K_j, V_j, O_i (hence the 4 in M/4d).

Two algorithms are run through the memory:

``count_standard`` — standard attention, Algorithm 0 of the paper, in three kernels:
    1. S = tau Q K^T : for each block Q_i of b rows (kept in SRAM), for each block K_j
       of b rows: load K_j, compute the b x b tile S_ij on chip, store it.
       b is the largest tile with 2bd + b^2 <= M (Q_i, K_j and S_ij fit together).
    2. P = softmax(S), row by row: if a row fits (N <= M), load floor(M/N) rows of S,
       normalise them in place and store them as P (S read once). If not, each row is
       streamed in chunks of M twice: pass one keeps the running (m, l) of chapter 2 in
       registers, pass two normalises and stores (S read twice).
    3. O = P V : for each block of b output rows (an accumulator in SRAM), for each
       block of b keys: load P_ik (b x b) and V_k (b x d), accumulate; store O_i.

``count_flash`` — FlashAttention, Algorithm 1 of the paper, with its block sizes
    Bc = ceil(M/4d), Br = min(ceil(M/4d), d): K/V blocks in the outer loop, Q blocks in
    the inner loop; each inner step reads Q_i, O_i, l_i, m_i and writes O_i, l_i, m_i
    (line 8 and lines 12-13). O, l, m are initialised in HBM (line 2), which is counted.

Counting the loops gives closed forms (derived in :func:`standard_io_formula` and
:func:`flash_io_formula`; the tests check that they equal the simulated counts):

    standard  = 4 N^2 + 2 N d + 2 Tb N d (+ N^2 if N > M),      Tb = ceil(N/b)
    flash     = 3 N d + 2 N + Tc (3 N d + 4 N),                 Tc = ceil(N/Bc) ~ 4Nd/M

that is Theta(N d + N^2) (when M >= 3d^2, so that b >= d) and Theta(N^2 d^2 / M):
Theorem 2 of the paper and the proof in its Appendix C. Proposition 3 there shows the
second is optimal: no exact attention algorithm makes o(N^2 d^2 / M) HBM accesses for
all M in [d, N d].

The model beside a real GPU (chapters 3 and 4): :func:`hbm_table` prints the
simulator's counts, in fp16 bytes, beside the FlashAttention paper's A100 numbers and
the bytes Nsight Compute counted on an H200 (``results/hbm_bytes_h200``);
:func:`fa2_order_io` counts FlashAttention-2's loop order in the same cache-less model.

Glossary: HBM = high-bandwidth memory, off-chip (显存); SRAM = on-chip memory of M
numbers (片上存储); IO = element moves between them (访存量); N = sequence length;
d = head dimension; M = sram_size; Br, Bc = rows of a Q block, of a K/V block;
Tr, Tc = number of Q blocks, of K/V blocks; b = tile size of standard attention's
kernels; tau = softmax scale 1/sqrt(d).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import numpy as np

from ._validate import as_float_array, positive_int
from .reference.common import block_ranges
from .reference.flash1 import block_sizes, flash1_step

__all__ = [
    "Counts",
    "HBM",
    "SRAM",
    "SRAMOverflowError",
    "standard_tile",
    "simulate_standard",
    "simulate_flash",
    "count_standard",
    "count_flash",
    "standard_io_formula",
    "flash_io_formula",
    "fa2_order_io",
    "hbm_table",
    "PAPER_GPT2_MEDIUM_GB",
]

class SRAMOverflowError(RuntimeError):
    """Raised when a load or alloc would put more than M elements in SRAM."""


@dataclass
class Counts:
    """Element moves between HBM and SRAM, per array.

    Attributes
    ----------
    reads : elements read from HBM into SRAM (or registers), per array name.
    writes : elements written from SRAM to HBM, per array name.
    peak_sram : the most elements ever resident in SRAM at once.
    sram_size : M, the SRAM capacity the run had.
    """

    reads: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)
    peak_sram: int = 0
    sram_size: int = 0

    @property
    def total_reads(self) -> int:
        return sum(self.reads.values())

    @property
    def total_writes(self) -> int:
        return sum(self.writes.values())

    @property
    def total(self) -> int:
        """Reads + writes: the IO complexity of the run, in elements."""
        return self.total_reads + self.total_writes

    def bytes(self, bytes_per_element: int = 2) -> int:
        """Total moves in bytes (2 for fp16/bf16, 4 for fp32)."""
        return self.total * bytes_per_element

    def table(self) -> str:
        """The ledger: one line per array, reads and writes, then the totals."""
        names = list(dict.fromkeys([*self.reads, *self.writes]))
        lines = [f"{'array':>6} {'reads':>14} {'writes':>14}"]
        for name in names:
            lines.append(f"{name:>6} {self.reads.get(name, 0):>14,} {self.writes.get(name, 0):>14,}")
        lines.append(f"{'total':>6} {self.total_reads:>14,} {self.total_writes:>14,}   (all moves: {self.total:,})")
        lines.append(f"peak SRAM residency {self.peak_sram:,} of M = {self.sram_size:,} elements")
        return "\n".join(lines)


def _block_shape(shape: tuple[int, ...], index: object) -> tuple[int, ...]:
    """Shape of ``array[index]`` for an array of ``shape``, computed without the array.
    Only basic slicing (a slice or a tuple of slices) is allowed: blocks are contiguous."""
    parts = index if type(index) is tuple else (index,)
    if len(parts) > len(shape):
        raise ValueError(f"index must be a slice or a tuple of at most {len(shape)} slices; got {index!r}")
    sliced = []
    for p, n in zip(parts, shape):
        if type(p) is not slice:
            raise ValueError(f"index must be a slice or a tuple of at most {len(shape)} slices; got {index!r}")
        start, stop, step = p.indices(n)
        sliced.append(len(range(start, stop, step)))
    return tuple(sliced) + shape[len(parts):]


class _Placeholder:
    """A block in counting mode: its shape and size, no data (so no memory, no arithmetic)."""

    __slots__ = ("shape", "size", "ndim")

    def __init__(self, shape: tuple[int, ...]):
        self.shape, self.ndim, self.size = shape, len(shape), math.prod(shape)


class HBM:
    """The large off-chip memory: named arrays and a ledger of moves per array.

    Parameters
    ----------
    arrays : name -> array (real mode: arithmetic is done and results are real) or
        name -> shape tuple (counting mode: only shapes exist, no arithmetic is done).
        All entries must be of the same kind.
    """

    def __init__(self, arrays: Mapping[str, object]):
        kinds = {isinstance(a, tuple) for a in arrays.values()}
        if len(kinds) > 1:
            raise ValueError("arrays must be all NumPy arrays (real mode) or all shape tuples (counting mode)")
        self.computing = kinds != {True}
        self.arrays: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.reads: dict[str, int] = {}
        self.writes: dict[str, int] = {}
        for name, a in arrays.items():
            self.add(name, a)

    def add(self, name: str, array: object) -> None:
        """Place a new array in HBM (no move is counted: it was already there)."""
        if self.computing:
            self.arrays[name] = np.array(array, dtype=np.float64)
            self.shapes[name] = self.arrays[name].shape
        else:
            self.shapes[name] = tuple(int(n) for n in array)  # type: ignore[union-attr]
        self.reads.setdefault(name, 0)
        self.writes.setdefault(name, 0)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.shapes:
            raise KeyError(f"name must be an array in HBM, one of {sorted(self.shapes)}; got {name!r}")
        return self.shapes[name]


class SRAM:
    """The small on-chip memory of ``capacity`` = M elements, attached to an HBM.

    Blocks move one call at a time; each call counts the block's size. In counting
    mode the blocks returned are placeholders that carry only a shape and a size
    (no memory, no arithmetic); algorithms do their arithmetic only when
    ``sram.computing`` is True.
    """

    def __init__(self, hbm: HBM, capacity: int):
        self.hbm = hbm
        self.capacity = positive_int("capacity", capacity)
        self.computing = hbm.computing
        self.resident: dict[int, tuple[str, object, np.ndarray]] = {}  # id(block) -> (name, index, block)
        self.used = 0
        self.peak = 0

    def _placeholder(self, shape: tuple[int, ...]) -> np.ndarray:
        return _Placeholder(shape)  # type: ignore[return-value]

    def _admit(self, name: str, index: object, block: np.ndarray) -> np.ndarray:
        if self.used + block.size > self.capacity:
            held = ", ".join(f"{_label(n, i)} {b.shape}" for n, i, b in self.resident.values()) or "nothing"
            raise SRAMOverflowError(
                f"SRAM capacity M = {self.capacity} elements exceeded: {self.used} resident ({held}); "
                f"asked for {_label(name, index)} of shape {block.shape} = {block.size} more elements"
            )
        self.resident[id(block)] = (name, index, block)
        self.used += block.size
        self.peak = max(self.peak, self.used)
        return block

    def load(self, name: str, index: object, to: str = "sram") -> np.ndarray:
        """Read ``hbm[name][index]`` into SRAM (or into registers, ``to="registers"``,
        for per-row statistics); counts block.size reads of ``name``."""
        shape = _block_shape(self.hbm.shape(name), index)
        block = self.hbm.arrays[name][index].copy() if self.computing else self._placeholder(shape)
        if to == "sram":
            self._admit(name, index, block)  # raises before anything is counted if it does not fit
        elif to != "registers":
            raise ValueError(f"to must be 'sram' or 'registers'; got {to!r}")
        self.hbm.reads[name] += block.size
        return block

    def alloc(self, shape: tuple[int, ...], label: str = "scratch") -> np.ndarray:
        """Reserve an on-chip block of zeros (a result to be built, then stored)."""
        block = np.zeros(shape) if self.computing else self._placeholder(shape)
        return self._admit(label, None, block)

    def store(self, name: str, index: object, block: np.ndarray) -> None:
        """Write ``block`` to ``hbm[name][index]``; counts block.size writes of ``name``.
        The block must be in SRAM (loaded or allocated) or be a register vector (1-D)."""
        shape = _block_shape(self.hbm.shape(name), index)
        if tuple(block.shape) != shape:
            raise ValueError(f"block must have the shape of {_label(name, index)}, {shape}; got {block.shape}")
        if block.ndim > 1 and id(block) not in self.resident:
            raise ValueError(f"block stored to {name} must be resident in SRAM (load or alloc it first)")
        if self.computing:
            self.hbm.arrays[name][index] = block
        self.hbm.writes[name] += block.size

    def free(self, *blocks: np.ndarray) -> None:
        """Release blocks from SRAM (register vectors are ignored)."""
        for block in blocks:
            entry = self.resident.pop(id(block), None)
            if entry is not None:
                self.used -= block.size

    @contextmanager
    def hold(self, *blocks: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
        """``with sram.hold(sram.load(...), ...) as (a, b):`` frees the blocks on exit."""
        try:
            yield blocks
        finally:
            self.free(*blocks)

    def counts(self) -> Counts:
        """The ledger so far."""
        moved = lambda ledger: {k: v for k, v in ledger.items() if v}  # noqa: E731
        return Counts(moved(self.hbm.reads), moved(self.hbm.writes), self.peak, self.capacity)


def _label(name: str, index: object) -> str:
    """'Q[0:64]' for a loaded block, the bare label for an allocated one."""
    if index is None:
        return name
    parts = index if isinstance(index, tuple) else (index,)
    return name + "[" + ", ".join(f"{p.start or 0}:{'' if p.stop is None else p.stop}" for p in parts) + "]"


def _block_slices(n: int, size: int) -> list[slice]:
    """:func:`~flashlab.reference.common.block_ranges` as slices, the index HBM and SRAM take."""
    return [slice(start, stop) for start, stop in block_ranges(n, size)]


# ---- standard attention (Algorithm 0) -----------------------------------------------


def standard_tile(d: int, sram_size: int) -> int:
    """Tile size b of standard attention's matmul kernels: the largest b with
    2bd + b^2 <= M, i.e. b = floor(sqrt(d^2 + M) - d), so that Q_i (b x d), K_j (b x d)
    and S_ij (b x b) fit in SRAM together (and likewise O_i, V_k, P_ik for O = PV)."""
    d, M = positive_int("d", d), positive_int("sram_size", sram_size)
    b = math.isqrt(d * d + M) - d
    if b < 1:
        raise ValueError(
            f"sram_size M must hold one row of Q and K and one score, M >= 2d + 1 = {2 * d + 1} "
            f"for d = {d}; got sram_size={M}"
        )
    return b


def _standard(sram: SRAM, N: int, d: int, tau: float) -> None:
    """Algorithm 0 against ``sram``: Q, K, V in HBM; S, P, O are written there."""
    b, M = standard_tile(d, sram.capacity), sram.capacity
    tiles = _block_slices(N, b)
    for r in tiles:  # kernel 1: S = tau Q K^T, Q_i kept while K_j streams
        with sram.hold(sram.load("Q", r)) as (Q_i,):
            for c in tiles:
                S_shape = (r.stop - r.start, c.stop - c.start)  # (b, b), smaller at ragged edges
                with sram.hold(sram.load("K", c), sram.alloc(S_shape, "S_ij")) as (K_j, S_ij):
                    if sram.computing:
                        S_ij[:] = tau * (Q_i @ K_j.T)  # (b, b)
                    sram.store("S", (r, c), S_ij)
    if N <= M:  # kernel 2: P = softmax(S), whole rows fit: floor(M/N) rows at a time
        for r in _block_slices(N, M // N):
            with sram.hold(sram.load("S", r)) as (S_r,):  # (rows, N)
                if sram.computing:
                    S_r -= S_r.max(axis=1, keepdims=True)
                    np.exp(S_r, out=S_r)
                    S_r /= S_r.sum(axis=1, keepdims=True)  # now P_r, in place
                sram.store("P", r, S_r)
    else:  # a row does not fit: two streaming passes per row, chunks of M
        for i in range(N):
            row = slice(i, i + 1)
            m, l = -np.inf, 0.0  # registers: running max and sum (chapter 2)
            for c in _block_slices(N, M):
                with sram.hold(sram.load("S", (row, c))) as (s,):
                    if sram.computing:
                        m_new = max(m, float(s.max()))
                        l = math.exp(m - m_new) * l + float(np.exp(s - m_new).sum())
                        m = m_new
            for c in _block_slices(N, M):
                with sram.hold(sram.load("S", (row, c))) as (s,):
                    if sram.computing:
                        s[:] = np.exp(s - m) / l
                    sram.store("P", (row, c), s)
    for r in tiles:  # kernel 3: O = P V, O_i accumulated on chip
        with sram.hold(sram.alloc((r.stop - r.start, d), "O_i")) as (O_i,):
            for c in tiles:
                with sram.hold(sram.load("P", (r, c)), sram.load("V", c)) as (P_ik, V_k):
                    if sram.computing:
                        O_i += P_ik @ V_k  # (b, d)
            sram.store("O", r, O_i)


def simulate_standard(q, k, v, sram_size: int, scale: float | None = None) -> tuple[np.ndarray, Counts]:
    """Run standard attention (Algorithm 0) on real data through the simulated memory.

    Parameters
    ----------
    q, k, v : arrays (N, d), one head.
    sram_size : M, elements of SRAM.
    scale : tau; default 1/sqrt(d).

    Returns
    -------
    o : array (N, d), equal to ``flashlab.reference.attention(q, k, v)``.
    counts : the ledger of moves.
    """
    q, k, v = _one_head(q, k, v)
    N, d = q.shape
    hbm = HBM({"Q": q, "K": k, "V": v, "S": np.zeros((N, N)), "P": np.zeros((N, N)), "O": np.zeros((N, d))})
    sram = SRAM(hbm, sram_size)
    _standard(sram, N, d, 1 / math.sqrt(d) if scale is None else float(scale))
    return hbm.arrays["O"], sram.counts()


def count_standard(N: int, d: int, sram_size: int) -> Counts:
    """Element moves of standard attention (Algorithm 0), counted by running it in
    counting mode (shapes only, no arithmetic). See the module docstring for the blocking."""
    N, d = positive_int("N", N), positive_int("d", d)
    hbm = HBM({"Q": (N, d), "K": (N, d), "V": (N, d), "S": (N, N), "P": (N, N), "O": (N, d)})
    sram = SRAM(hbm, sram_size)
    _standard(sram, N, d, 1.0)
    return sram.counts()


# ---- FlashAttention (Algorithm 1) ---------------------------------------------------


def _check_flash_sram(d: int, sram_size: int) -> None:
    """Algorithm 1's four tiles fill SRAM exactly only when 4d divides M: Bc = M/4d then,
    and Q_i, K_j, V_j, O_i take at most 4 * (M/4d) * d = M. Otherwise the ceiling in
    Bc = ceil(M/4d) overfills it."""
    block_sizes(sram_size, d)  # M >= 4d, with the package's error message
    if sram_size % (4 * d):
        lo = sram_size // (4 * d) * 4 * d
        raise ValueError(
            f"sram_size M must be a multiple of 4d = {4 * d} so that Algorithm 1's tiles Q_i, K_j, V_j, O_i "
            f"(Bc = ceil(M/4d) rows each) fit in M; got sram_size={sram_size} (try {lo} or {lo + 4 * d})"
        )


def _flash(sram: SRAM, N: int, d: int, tau: float) -> None:
    """Algorithm 1 against ``sram``: Q, K, V, O, l, m in HBM."""
    Br, Bc = block_sizes(sram.capacity, d)  # line 1: Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)
    q_blocks, kv_blocks = _block_slices(N, Br), _block_slices(N, Bc)  # lines 3-4: Tr and Tc blocks
    for r in q_blocks:  # line 2: O = 0, l = 0, m = -inf written to HBM
        with sram.hold(sram.alloc((r.stop - r.start, d), "O_i")) as (O_i,):
            l_i = np.zeros(r.stop - r.start) if sram.computing else sram._placeholder((r.stop - r.start,))
            m_i = np.full(r.stop - r.start, -np.inf) if sram.computing else l_i
            sram.store("O", r, O_i)
            sram.store("l", r, l_i)
            sram.store("m", r, m_i)
    for c in kv_blocks:  # line 5: for j = 1..Tc, the outer loop over K/V blocks
        with sram.hold(sram.load("K", c), sram.load("V", c)) as (K_j, V_j):  # line 6: load K_j, V_j
            for r in q_blocks:  # line 7: for i = 1..Tr, the inner loop over Q blocks
                with sram.hold(sram.load("Q", r), sram.load("O", r)) as (Q_i, O_i):  # line 8: load Q_i, O_i ...
                    l_i, m_i = sram.load("l", r, to="registers"), sram.load("m", r, to="registers")  # line 8: load l_i, m_i
                    if sram.computing:
                        S_ij = tau * (Q_i @ K_j.T)  # line 9: S_ij = tau Q_i K_j^T (Br, Bc), never leaves the chip
                        O_i[:], l_i, m_i = flash1_step(O_i, l_i, m_i, S_ij, V_j)  # lines 10-13 (chapter 3)
                    sram.store("O", r, O_i)  # line 12: O_i <- ..., written to HBM
                    sram.store("l", r, l_i)  # line 13: l_i <- l_new, to HBM
                    sram.store("m", r, m_i)  # line 13: m_i <- m_new, to HBM


def simulate_flash(
    q, k, v, sram_size: int, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counts]:
    """Run FlashAttention (Algorithm 1) on real data through the simulated memory.

    Parameters
    ----------
    q, k, v : arrays (N, d), one head.
    sram_size : M, elements of SRAM; a multiple of 4d.
    scale : tau; default 1/sqrt(d).

    Returns
    -------
    o, m, l : arrays (N, d), (N,), (N,), as ``flashlab.reference.flash1.flash1_forward``.
    counts : the ledger of moves.
    """
    q, k, v = _one_head(q, k, v)
    N, d = q.shape
    _check_flash_sram(d, sram_size)
    hbm = HBM({"Q": q, "K": k, "V": v, "O": np.zeros((N, d)), "l": np.zeros(N), "m": np.zeros(N)})
    sram = SRAM(hbm, sram_size)
    _flash(sram, N, d, 1 / math.sqrt(d) if scale is None else float(scale))
    return hbm.arrays["O"], hbm.arrays["m"], hbm.arrays["l"], sram.counts()


def count_flash(N: int, d: int, sram_size: int) -> Counts:
    """Element moves of FlashAttention (Algorithm 1), counted by running it in counting
    mode (shapes only, no arithmetic), with block sizes from ``block_sizes(M, d)``."""
    N, d = positive_int("N", N), positive_int("d", d)
    _check_flash_sram(d, sram_size)
    hbm = HBM({"Q": (N, d), "K": (N, d), "V": (N, d), "O": (N, d), "l": (N,), "m": (N,)})
    sram = SRAM(hbm, sram_size)
    _flash(sram, N, d, 1.0)
    return sram.counts()


def _one_head(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = (as_float_array(n, x, min_ndim=2) for n, x in (("q", q), ("k", k), ("v", v)))
    if not (q.ndim == 2 and q.shape == k.shape == v.shape):
        raise ValueError(
            f"q, k and v must be one head each, all of shape (N, d); got {q.shape}, {k.shape}, {v.shape}"
        )
    return q, k, v


# ---- the same counts as formulas ----------------------------------------------------


def standard_io_formula(N: int, d: int, sram_size: int, exact: bool = True) -> float:
    """Element moves of :func:`count_standard`, as a formula.

    Counting the three kernels with b = :func:`standard_tile` and Tb = ceil(N/b):

    - S = tau Q K^T reads Q once (N d), reads all of K once per Q block (Tb N d) and
      writes S (N^2);
    - softmax reads S once (twice if N > M) and writes P (N^2 + N^2, or 3 N^2);
    - O = P V reads P (N^2), reads all of V once per output block (Tb N d), writes O (N d).

    Total: 4 N^2 + 2 N d + 2 Tb N d, plus N^2 when N > M. With Tb ~ N/b that is
    4 N^2 + 2 N d + 2 N^2 d/b, which is Theta(N d + N^2) once b >= d (M >= 3 d^2):
    FlashAttention paper, Theorem 2, first part. ``exact=False`` drops the ceiling.
    """
    N, d = positive_int("N", N), positive_int("d", d)
    b = standard_tile(d, sram_size)
    Tb = math.ceil(N / b) if exact else N / b
    return 4 * N * N + 2 * N * d + 2 * Tb * N * d + (N * N if N > sram_size else 0)


def flash_io_formula(N: int, d: int, sram_size: int, exact: bool = True) -> float:
    """Element moves of :func:`count_flash`, as a formula.

    With (Br, Bc) = block_sizes(M, d) and Tc = ceil(N/Bc) K/V blocks:

    - line 2 writes O, l, m once (N d + 2 N);
    - line 6 reads K and V once in all (2 N d);
    - each of the Tc outer steps sweeps every Q block: reads Q_i, O_i, l_i, m_i and
      writes O_i, l_i, m_i, i.e. 3 N d + 4 N per outer step.

    Total: 3 N d + 2 N + Tc (3 N d + 4 N). With Tc ~ N/Bc = 4 N d / M (``exact=False``)
    the leading term is 12 N^2 d^2 / M: Theta(N^2 d^2 / M), FlashAttention paper,
    Theorem 2 and its proof in Appendix C ("Tc passes over Q and O").
    """
    N, d = positive_int("N", N), positive_int("d", d)
    _, Bc = block_sizes(sram_size, d)
    Tc = math.ceil(N / Bc) if exact else 4 * N * d / sram_size
    return 3 * N * d + 2 * N + Tc * (3 * N * d + 4 * N)


# ---- the model beside a GPU's byte counters (chapters 3 and 4) ------------------------

#: HBM traffic of one attention forward + backward on an A100 at the GPT-2-medium shape
#: (batch 64, 16 heads, N = 1024, d = 64), in GB, quoted from the FlashAttention paper
#: (Dao et al., 2022), Fig. 2 (left). Not measured by this project.
PAPER_GPT2_MEDIUM_GB = {"standard attention": 40.3, "FlashAttention (v1)": 4.4}


def fa2_order_io(N: int, d: int, block_q: int) -> int:
    """Element moves of FlashAttention-2's loop order in the two-level model (no cache).

    Query blocks of ``block_q`` rows form the outer loop. Each Q_i is read once and its
    O_i is written once (2 N d in all); every K_j and V_j is read again for each of the
    Tr = ceil(N / block_q) query blocks (2 Tr N d). The per-row log-sum-exp (N numbers)
    is left out. Total: (2 + 2 Tr) N d. Chapter 4 sets this beside the bytes a GPU
    measured: there an L2 cache serves most of the K, V re-reads.
    """
    N, d, block_q = (positive_int(n, x) for n, x in (("N", N), ("d", d), ("block_q", block_q)))
    return (2 + 2 * math.ceil(N / block_q)) * N * d


def hbm_table(measured, second_run=None, ns: tuple[int, ...] = (1024, 4096), sram_size: int | None = 32768) -> str:
    """HBM traffic of one attention layer in GB, fp16, from every source side by side.

    Columns: one forward (fwd) and one forward + backward (fwd+bwd) for each N in ``ns``.
    Rows, in this order:

    - the FlashAttention paper's A100 numbers (:data:`PAPER_GPT2_MEDIUM_GB`, fwd+bwd at N = 1024);
    - with ``sram_size`` = M: the simulator's forward counts, ``count_standard`` (Algorithm 0)
      and ``count_flash`` (Algorithm 1), times 2 bytes and times the batch x heads of the
      measured rows (the simulator has no backward pass);
    - the least any implementation moves: Q, K, V read and O written once (4 N d per head);
      for fwd+bwd also Q, K, V, O, dO read and dQ, dK, dV written once (8 N d more);
    - ``measured``: a recorded set with columns impl, pass, B, H, N, d, total_bytes
      (``results/hbm_bytes_h200``; impl naive, sdpa_flash, flashlab);
    - ``second_run`` (optional): a second measurement of the same shape, a recorded set with
      columns impl, N, total_gb of fwd+bwd runs that counted the whole process, input creation
      included (``results/hbm_bytes_gpt2medium_fwdbwd_h200``).

    A dash marks a number no source gives.
    """
    names = {"naive": "naive PyTorch", "sdpa_flash": "SDPA flash", "flashlab": "flashlab"}
    shapes = {}
    for n in ns:
        rows = [r for r in measured.rows if r["N"] == n]
        if not rows:
            lengths = sorted({r["N"] for r in measured.rows})
            raise ValueError(f"ns must hold lengths in the measured set, {lengths}; got {n}")
        shapes[n] = (rows[0]["B"], rows[0]["H"], rows[0]["d"])

    def measured_gb(impl: str, n: int, pass_name: str) -> str:
        rows = [r for r in measured.rows if r["impl"] == impl and r["N"] == n and r["pass"] == pass_name]
        return f"{rows[0]['total_bytes'] / 1e9:.2f}" if rows else "—"

    def all_heads_gb(elements_per_head: int, n: int) -> str:  # fp16 bytes over batch x heads, in GB
        B, H, _ = shapes[n]
        return f"{elements_per_head * 2 * B * H / 1e9:.2f}"

    table: list[tuple[str, str, list[str]]] = []  # (group, name, one cell per column)
    for name, gb in PAPER_GPT2_MEDIUM_GB.items():
        table.append(("FA1 paper, A100", name, [c for n in ns for c in ("—", f"{gb:.1f}" if n == 1024 else "—")]))
    if sram_size is not None:
        for name, count in (("Algorithm 0 (standard)", count_standard), ("Algorithm 1 (v1)", count_flash)):
            cells = [c for n in ns for c in (all_heads_gb(count(n, shapes[n][2], sram_size).total, n), "—")]
            table.append(("simulator", name, cells))
    table.append(("least possible", "inputs in, outputs out",
                  [all_heads_gb(k * n * shapes[n][2], n) for n in ns for k in (4, 12)]))
    for impl, name in names.items():
        table.append(("our H200", name, [measured_gb(impl, n, p) for n in ns for p in ("fwd", "fwdbwd")]))
    if second_run is not None:
        for impl in ("naive", "sdpa_flash"):
            rows = [r for r in second_run.rows if r["impl"] == impl]
            cells = [c for n in ns for c in ("—", next((f"{r['total_gb']:.2f}" for r in rows if r["N"] == n), "—"))]
            table.append(("second measurement", names[impl], cells))
    subtitle = {"simulator": f"(M = {sram_size or 0:,})", "our H200": "(Nsight Compute)",
                "second measurement": "(with inputs)"}  # the second row of a group names its source
    _, H, d = shapes[ns[0]]
    lines = [f"HBM traffic of one attention layer in GB (fp16, {H} heads, d = {d})",
             f"{'':42}" + "".join(f"{f'N = {n}, batch {shapes[n][0]}':>20}" for n in ns),
             f"{'':42}" + "".join(f"{'fwd':>10}{'fwd+bwd':>10}" for _ in ns)]
    for k, (group, name, cells) in enumerate(table):
        first = k == 0 or table[k - 1][0] != group
        second_row = not first and (k < 2 or table[k - 2][0] != group)
        label = group if first else subtitle.get(group, "") if second_row else ""
        lines.append(f"{label:<20}{name:<22}" + "".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)
