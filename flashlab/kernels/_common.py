"""What the forward and backward kernels share: the interpreter switch, autotune
configurations, and the block ranges of causal block skipping.

Causal masking is aligned bottom-right (as in flash-attn): query row i may see key j
iff j <= i + (N_k - N_q). For a query block starting at row m0 the keys split into

    [0, lo)     blocks every row of the block sees entirely   -> no mask needed
    [lo, hi)    blocks on the diagonal (and the ragged tail)   -> masked
    [hi, N_k)   blocks no row of the block sees                -> never loaded

which is how the kernels skip the upper triangle.
"""

from __future__ import annotations

import math
import os

import torch
import triton

# Read once, when flashlab.kernels is imported: @triton.jit reads it at decoration time.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# FLASHLAB_AUTOTUNE=0 keeps only the first candidate of each kernel: no tuning runs (tests and
# profiling, where tuning would add compile time or extra kernel launches).
AUTOTUNE = os.environ.get("FLASHLAB_AUTOTUNE", "1") != "0"

LOG2E = 1.4426950408889634  # 1/ln 2: exp(x) = exp2(x * log2(e))
LN2 = 0.6931471805599453


Candidate = tuple[int, int, int, int]  # (BLOCK_M, BLOCK_N, num_warps, num_stages)


def configs(candidates: list[Candidate], wide: list[Candidate], interpret_config: dict) -> list[triton.Config]:
    """Autotune configurations: ``candidates`` serve head dimensions up to 128, ``wide`` the
    padded head dimension 256, whose tiles must be smaller to fit shared memory (see
    :func:`pruner`). Under the interpreter: a single small one (it would run every config,
    and timing means nothing there). With FLASHLAB_AUTOTUNE=0: the first of each list."""
    if INTERPRET:
        return [triton.Config(interpret_config, num_warps=4, num_stages=1)]
    chosen = [*candidates, *wide] if AUTOTUNE else [candidates[0], wide[0]]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in chosen]


def pruner(wide: list[Candidate]):
    """An ``early_config_prune`` that keeps the ``wide`` configurations for BLOCK_D = 256
    and the others for smaller head dimensions."""
    wide_set = set(wide)

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
    bm, bn, w, s = config
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}


def causal_key_range(start_m: int, block_m: int, block_n: int, n_q: int, n_k: int) -> tuple[int, int]:
    """The key ranges ``(lo, hi)`` of causal query block ``start_m``, as the kernels compute them.

    Query block ``start_m`` holds rows ``start_m * block_m`` to ``start_m * block_m + block_m - 1``;
    with bottom-right alignment row i sees key j iff j <= i + (n_k - n_q). Then

        [0, lo)     every row of the block sees these keys: no mask (whole blocks only)
        [lo, hi)    the diagonal, and the ragged last key block: masked
        [hi, n_k)   no row of the block sees these keys: skipped

    ``hi`` is one past the last key the block's last row sees; ``lo`` is the first row's
    last visible key plus one, rounded down to a multiple of ``block_n`` and at most the
    end of the last full key block. The Triton kernels (``_forward_kernel`` in forward.py,
    the dQ kernel in backward.py) compute the same two lines with ``tl.minimum`` and
    ``tl.maximum`` in place of ``min`` and ``max``. Pure Python, for teaching and tests.
    """
    causal_offset = n_k - n_q  # bottom-right alignment
    full_n = (n_k // block_n) * block_n  # end of the last full key block
    hi = min(max(start_m * block_m + block_m + causal_offset, 0), n_k)
    lo = min((max(start_m * block_m + causal_offset + 1, 0) // block_n) * block_n, full_n)
    return lo, hi


# ----------------------------------------------------------------------------- input checks
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def check_tensors(q: torch.Tensor, q_layout: str, **others: tuple[torch.Tensor, str]) -> None:
    """q and each named tensor (given with its expected layout) must be 4-D tensors of a supported
    dtype, on q's device and of q's dtype."""
    for name, (t, layout) in {"q": (q, q_layout), **others}.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {layout}; got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must have dtype float16, bfloat16 or float32; got {t.dtype}")
    for name, (t, _) in others.items():
        if t.device != q.device:
            raise ValueError(f"q and {name} must be on the same device; got q on {q.device}, {name} on {t.device}")
        if t.dtype != q.dtype:
            raise TypeError(f"q and {name} must have the same dtype; got q {q.dtype}, {name} {t.dtype}")


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


def check_scale(scale: float | None, d: int) -> float:
    """The softmax scale: 1/sqrt(d) by default, else a positive finite number."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number; got {scale!r}")
    return float(scale)
