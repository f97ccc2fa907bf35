"""Benchmarks: naive attention against fused kernels, and the GPU's own ceilings.

``python -m flashlab.lab.bench --out results`` (``make bench``) runs on a CUDA GPU and
writes, for each suite, ``results/STEM.csv`` + ``results/STEM.json`` with the
provenance of the run (see :mod:`flashlab.lab.results`). On a CPU the same functions
time small problems live (the notebooks use them that way).

Conventions (those of the FlashAttention papers):
- batch x sequence length = 16384 tokens, heads x d = 2048 (:func:`flashlab.lab.measure.paper_shape`);
- forward FLOPs = 4 B H N^2 d (two matmuls, :func:`flashlab.reference.naive.attention_flops`),
  halved when causal; forward+backward counts 3.5x the forward (the backward does 5 matmuls
  to the forward's 2);
- times are medians of ``triton.testing.do_bench`` on a GPU, of repeated
  ``time.perf_counter`` runs on a CPU.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from flashlab.lab.measure import HEADS_X_D, TOKENS, gpu_slug, gpu_tag, paper_shape, precompile, provenance, time_ms
from flashlab.reference.naive import attention_flops

__all__ = [
    "naive_attention_torch",
    "fused_attention_torch",
    "time_ms",
    "compare_naive_fused",
    "naive_step_costs",
    "kernel_suite",
    "gpu_slug",
    "provenance",
    "main",
]


def naive_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Attention as people write it by hand: four operations, S and P materialised in memory.

    q, k, v: (B, H, N, d) -> o: (B, H, N, d). Q K^T, the scaling by 1/sqrt(d), the softmax
    and P V each read their input from and write their output to device memory (HBM on
    a GPU): exactly the data flow that FlashAttention removes."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, N, N)  write S
    if causal:
        n_q, n_k = s.shape[-2:]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril(n_k - n_q)
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)  # (B, H, N, N)  read S, write P
    return torch.matmul(p, v)  # (B, H, N, d)     read P and V, write O


def fused_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, backend: str = "default") -> torch.Tensor:
    """torch's fused scaled_dot_product_attention; ``backend`` is "default" (torch picks),
    "flash", "cudnn", "efficient" or "math"."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    choices = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    if backend == "default":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if backend not in choices:
        raise ValueError(f"backend must be one of {['default', *choices]}; got {backend!r}")
    with sdpa_kernel([choices[backend]]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _peak_extra_bytes(fn: Callable[[], object], device: str) -> int | None:
    """Peak memory allocated by one call of ``fn`` beyond what was allocated before it."""
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return int(peak)


def _qkv(batch: int, heads: int, n: int, d: int, dtype: torch.dtype, device: str, grad: bool = False, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [
        torch.randn(batch, heads, n, d, generator=g, dtype=torch.float32).to(device=device, dtype=dtype).requires_grad_(grad)
        for _ in range(3)
    ]


def compare_naive_fused(
    ns: list[int],
    d: int = 64,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    backends: tuple[str, ...] = ("naive", "default"),
    passes: tuple[str, ...] = ("fwd",),
    tokens: int = TOKENS,
    heads: int | None = None,
    causal: bool = False,
    repeats: int = 5,
) -> list[dict[str, object]]:
    """Time naive attention against fused backends over sequence lengths ``ns``.

    (batch, heads) = :func:`flashlab.lab.measure.paper_shape` unless heads is given. Returns one row per
    (backend, N, pass): ms, TFLOP/s and, on a GPU, the peak extra memory in bytes."""
    rows = []
    for n in ns:
        batch, paper_heads = paper_shape(n, d, tokens)
        n_heads = heads if heads is not None else paper_heads
        fwd_flops = attention_flops(n, n, d, causal=causal, batch=batch * n_heads)
        for backend in backends:
            for pass_name in passes:
                q, k, v = _qkv(batch, n_heads, n, d, dtype, device, grad=(pass_name == "fwdbwd"))
                if backend == "naive":
                    fwd = lambda: naive_attention_torch(q, k, v, causal)  # noqa: E731
                else:
                    fwd = lambda: fused_attention_torch(q, k, v, causal, backend)  # noqa: E731
                if pass_name == "fwd":
                    fn, flops = fwd, fwd_flops
                    with torch.no_grad():
                        ms, peak = time_ms(fn, device, repeats), _peak_extra_bytes(fn, device)
                else:
                    do = torch.randn_like(q)
                    fn = lambda: torch.autograd.grad(fwd(), (q, k, v), do)  # noqa: E731
                    flops = 3.5 * fwd_flops
                    ms, peak = time_ms(fn, device, repeats), _peak_extra_bytes(fn, device)
                rows.append(
                    {
                        "backend": backend,
                        "pass": pass_name,
                        "dtype": str(dtype).replace("torch.", ""),
                        "batch": batch,
                        "heads": n_heads,
                        "N": n,
                        "d": d,
                        "causal": causal,
                        "ms": round(ms, 5),
                        "tflops": round(flops / (ms * 1e-3) / 1e12, 3),
                        "peak_extra_bytes": "" if peak is None else peak,
                    }
                )
                del q, k, v
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def naive_step_costs(
    n: int,
    d: int = 64,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    tokens: int = TOKENS,
    repeats: int = 5,
) -> list[dict[str, object]]:
    """Time each of the three naive steps on its own, with its FLOPs and the fewest
    bytes it must move (inputs read once, output written once).

    Rows: step, ms, flops, bytes, TFLOP/s, GB/s, intensity (FLOP/byte)."""
    batch, heads = paper_shape(n, d, tokens)
    q, k, v = _qkv(batch, heads, n, d, dtype, device)
    e = q.element_size()
    bh = batch * heads
    with torch.no_grad():
        s = torch.matmul(q, k.transpose(-2, -1))
        p = torch.softmax(s, dim=-1)
        steps = {
            # step: (function, FLOPs, bytes)
            "S = QK^T": (lambda: torch.matmul(q, k.transpose(-2, -1)), 2 * bh * n * n * d, bh * (2 * n * d + n * n) * e),
            # softmax: max, subtract, exp, sum, divide ~ 5 ops per element
            "P = softmax(S)": (lambda: torch.softmax(s, dim=-1), 5 * bh * n * n, bh * 2 * n * n * e),
            "O = PV": (lambda: torch.matmul(p, v), 2 * bh * n * n * d, bh * (n * n + 2 * n * d) * e),
        }
        rows = []
        for step, (fn, flops, nbytes) in steps.items():
            ms = time_ms(fn, device, repeats)
            rows.append(
                {
                    "step": step,
                    "dtype": str(dtype).replace("torch.", ""),
                    "batch": batch,
                    "heads": heads,
                    "N": n,
                    "d": d,
                    "ms": round(ms, 5),
                    "flops": int(flops),
                    "bytes": int(nbytes),
                    "tflops": round(flops / (ms * 1e-3) / 1e12, 3),
                    "gbps": round(nbytes / (ms * 1e-3) / 1e9, 1),
                    "intensity": round(flops / nbytes, 3),
                }
            )
    return rows


KERNEL_IMPLS = ("flashlab", "sdpa_flash", "sdpa_cudnn", "naive")
# Asked for by name (--impls): flashlab_gluon, flash_attention(impl="gluon"): the Gluon FA3 forward
# (sm_90) with the Triton backward; flashlab_fa3, the same with deterministic=False: the Gluon FA3
# forward and the Gluon FA3 backward (fa3_backward.py), flashlab's fastest pair; flashlab_fp8, the
# FP8 forward, inputs quantised before timing; flashlab_gluon_fp8, the same with
# flash_attention_fp8(impl="gluon"): the Gluon FA3 FP8 forward (sm_90).
OPTIONAL_IMPLS = ("flashlab_gluon", "flashlab_fa3", "flashlab_fp8", "flashlab_gluon_fp8")
FORWARD_ONLY_IMPLS = ("flashlab_fp8", "flashlab_gluon_fp8")
FP8_BLOCK = 128  # rows per descale of flashlab_fp8's Q and K
FP8_V_BLOCK = None  # ... and of its V: one descale per (batch, head), as FlashAttention-3 scales V (chapter 6)


def _impl(name: str, causal: bool) -> Callable:
    if name in ("flashlab", "flashlab_gluon", "flashlab_fa3"):
        from flashlab.kernels import flash_attention

        impl = "triton" if name == "flashlab" else "gluon"
        deterministic = name != "flashlab_fa3"
        return lambda q, k, v: flash_attention(q, k, v, causal=causal, impl=impl, deterministic=deterministic)
    if name == "naive":
        return lambda q, k, v: naive_attention_torch(q, k, v, causal)
    if name.startswith("sdpa_"):
        backend = name.removeprefix("sdpa_")
        return lambda q, k, v: fused_attention_torch(q, k, v, causal, backend)
    raise ValueError(f"impl must be one of {KERNEL_IMPLS + OPTIONAL_IMPLS}; got {name!r}")


def _forward_fn(name: str, causal: bool, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], object]:
    """One forward pass of ``name`` on (q, k, v), ready to time. flashlab_fp8 times the FP8 kernel
    on inputs quantised here, beforehand (Q and K per block of FP8_BLOCK rows, V per head and
    keys-contiguous), as FlashAttention-3 reports FP8 speed; chapter 6 times the quantisation
    separately."""
    if name in ("flashlab_fp8", "flashlab_gluon_fp8"):
        from flashlab.kernels.fp8 import flash_attention_fp8, quantize_qkv

        pre = quantize_qkv(q, k, v, block=FP8_BLOCK, v_block=FP8_V_BLOCK)
        impl = "gluon" if name == "flashlab_gluon_fp8" else "triton"
        return lambda: flash_attention_fp8(**pre, causal=causal, impl=impl)
    fn = _impl(name, causal)
    return lambda: fn(q, k, v)


def _compile_one(kind: str, d: int, causal: bool, config: tuple) -> None:
    """Compile one configuration of flashlab's forward (``kind="fwd"``, config a Candidate) or
    backward (``"bwd"``, config = (dK/dV, dQ) Candidates) by running it once on a small input
    whose integer arguments specialise like the suite's (multiples of 16, H = HEADS_X_D / d)."""
    from flashlab.kernels.backward import backward
    from flashlab.kernels.forward import forward

    q, k, v, do = (torch.randn(1, HEADS_X_D // d, 256, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    with torch.no_grad():
        if kind == "fwd":
            forward(q, k, v, causal, d**-0.5, config)
        else:
            o, lse2 = forward(q, k, v, causal, d**-0.5)
            backward(do, q, k, v, o, lse2, causal, d**-0.5, config)


def precompile_kernels(ds: tuple[int, ...], causals: tuple[bool, ...] = (False, True), passes=("fwd", "fwdbwd")) -> None:
    """Compile every autotuning candidate of flashlab's kernels for these head dimensions and
    masks in parallel worker processes (:func:`flashlab.lab.experiments.precompile`), so that the
    suite's autotuner, which tries the candidates one after another, finds them in Triton's
    cache instead of compiling each in turn."""
    from flashlab.kernels import backward as kb, forward as kf

    calls = []
    for d in ds:
        wide = d > 128
        fwd = kf.WIDE_CANDIDATES if wide else kf.CANDIDATES
        dkdv = kb.DKDV_WIDE_CANDIDATES if wide else kb.DKDV_CANDIDATES
        dq = kb.DQ_WIDE_CANDIDATES if wide else kb.DQ_CANDIDATES
        for causal in causals:
            calls += [("flashlab.lab.bench:_compile_one", ("fwd", d, causal, c)) for c in fwd]
            if "fwdbwd" in passes:  # pairs, so each worker compiles one dK/dV and one dQ configuration
                calls += [("flashlab.lab.bench:_compile_one", ("bwd", d, causal, pair)) for pair in zip(dkdv, dq)]
    precompile(calls)


def kernel_suite(
    ns: list[int],
    ds: tuple[int, ...] = (64, 128),
    *,
    impls: tuple[str, ...] = KERNEL_IMPLS,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    tokens: int = TOKENS,
    causals: tuple[bool, ...] = (False, True),
    passes: tuple[str, ...] = ("fwd", "fwdbwd"),
    progress: bool = True,
) -> list[dict[str, object]]:
    """flashlab's kernels beside torch SDPA (flash, cuDNN) and naive PyTorch, in one process.

    Rows have exactly the columns impl, dtype, causal, d, N, B, H, pass, ms, tflops.
    An implementation that fails at a shape (e.g. out of memory) is reported and skipped."""
    jobs = [(d, causal, n, impl) for d in ds for causal in causals for n in ns for impl in impls]
    rows: list[dict[str, object]] = []
    try:
        _run_jobs(jobs, rows, device, dtype, tokens, passes, progress)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from a time limit (see main): keep what was measured
        print(f"interrupted after {len(rows)} rows; writing those", flush=True)
    return rows


def _run_jobs(jobs, rows, device, dtype, tokens, passes, progress) -> None:
    for i, (d, causal, n, impl) in enumerate(jobs, 1):
        B, H = paper_shape(n, d, tokens)
        fwd_flops = attention_flops(n, n, d, causal=causal, batch=B * H)
        for pass_name in passes:
            if impl in FORWARD_ONLY_IMPLS and pass_name != "fwd":
                continue  # the FP8 kernel is forward-only
            try:
                q, k, v = _qkv(B, H, n, d, dtype, device, grad=(pass_name == "fwdbwd"))
                if pass_name == "fwd":
                    with torch.no_grad():
                        ms = time_ms(_forward_fn(impl, causal, q, k, v), device)
                    flops = fwd_flops
                else:
                    fn = _impl(impl, causal)
                    do = torch.randn_like(q)
                    ms = time_ms(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do), device)
                    flops = 3.5 * fwd_flops
            except (RuntimeError, ValueError) as exc:  # OOM, or a backend that refuses the shape
                if progress:
                    print(f"[{i}/{len(jobs)}] {impl} d={d} causal={causal} N={n} {pass_name}: skipped ({str(exc)[:80]})", flush=True)
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
                continue
            row = {"impl": impl, "dtype": "float8_e4m3fn" if impl in FORWARD_ONLY_IMPLS else str(dtype).replace("torch.", ""), "causal": causal, "d": d, "N": n,
                   "B": B, "H": H, "pass": pass_name, "ms": round(ms, 5), "tflops": round(flops / (ms * 1e-3) / 1e12, 2)}
            rows.append(row)
            if progress:
                print(f"[{i}/{len(jobs)}] {impl:>10} d={d} causal={causal!s:5} N={n:>5} {pass_name:>6}: {ms:8.3f} ms {row['tflops']:7.1f} TFLOP/s", flush=True)
            del q, k, v
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def ceilings(device: str = "cuda") -> list[dict[str, object]]:
    """The two ceilings of the roofline, measured: a dense bf16 8192^3 matmul (FLOP/s) and a
    large device-to-device copy (bytes read + written per second)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(8192, 8192, generator=g).to(device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, generator=g).to(device=device, dtype=torch.bfloat16)
    ms_mm = time_ms(lambda: a @ b, device)
    x = torch.randn(2**30, dtype=torch.float32, device=device)  # 4 GiB
    y = torch.empty_like(x)
    ms_cp = time_ms(lambda: y.copy_(x), device)
    return [
        {"ceiling": "matmul_bf16_8192", "ms": round(ms_mm, 5), "value": round(2 * 8192**3 / (ms_mm * 1e-3), 1), "unit": "FLOP/s"},
        {"ceiling": "copy_4GiB", "ms": round(ms_cp, 5), "value": round(2 * x.numel() * 4 / (ms_cp * 1e-3), 1), "unit": "B/s"},
    ]


def main(argv: list[str] | None = None) -> int:
    from flashlab.lab import results

    parser = argparse.ArgumentParser(prog="python -m flashlab.lab.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(results.RESULTS_DIR), help="results folder")
    parser.add_argument("--suite", choices=["all", "kernels", "ch01"], default="all",
                        help="kernels: flashlab vs SDPA vs naive -> OUT/<gpu-slug>/bench.csv, with the same "
                             "run's ceilings in OUT/<gpu-slug>/ceilings.csv; "
                             "ch01: naive vs fused, per-step costs, ceilings -> OUT/*_TAG.csv")
    parser.add_argument("--tag", help="suffix of the chapter-1 result stems (default: the GPU's slug without its "
                                          "vendor, e.g. h200; cpu without a GPU)")
    parser.add_argument("--ns", type=int, nargs="+", help="sequence lengths (default 512 ... 16384)")
    parser.add_argument("--ds", type=int, nargs="+", default=[64, 128], help="head dimensions of the kernel suite")
    parser.add_argument("--passes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"],
                        help="passes of the kernel suite")
    parser.add_argument("--impls", nargs="+", choices=[*KERNEL_IMPLS, *OPTIONAL_IMPLS],
                        help=f"implementations of the kernel suite (default {' '.join(KERNEL_IMPLS)}; "
                             "flashlab_gluon: the Gluon FA3 forward with the Triton backward, on sm_90; "
                             "flashlab_fa3: the Gluon FA3 forward and backward (deterministic=False), on sm_90; "
                             "flashlab_fp8: the FP8 forward, on a GPU with FP8 tensor cores; "
                             "flashlab_gluon_fp8: the Gluon FA3 FP8 forward, on sm_90)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the harness (CPU ok)")
    args = parser.parse_args(argv)
    import signal

    def _interrupt(signum, frame):  # a time limit's SIGTERM ends the suite like Ctrl-C: rows so far are written
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.quick:
        print("make bench needs a CUDA GPU; use --quick to exercise the harness on a CPU", file=sys.stderr)
        return 2
    command = "python -m flashlab.lab.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = provenance(command.strip())
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ns = args.ns or ([128, 256] if args.quick else [512, 1024, 2048, 4096, 8192, 16384])
    tokens = 256 if args.quick else TOKENS
    written: list[Path] = []
    ceiling_rows: list[dict[str, object]] = []  # measured once a run, on a GPU, for both suites
    if args.suite in ("all", "kernels"):
        impls = tuple(args.impls) if args.impls else KERNEL_IMPLS if device == "cuda" else ("naive", "sdpa_math")
        if device == "cuda" and ("flashlab" in impls or "flashlab_gluon" in impls):  # the latter's backward
            precompile_kernels(tuple(args.ds), passes=tuple(args.passes))
        rows = kernel_suite(ns, tuple(args.ds), impls=impls, device=device, dtype=dtype, tokens=tokens,
                            passes=tuple(args.passes))
        slug = gpu_slug() if device == "cuda" else "cpu"
        written += results.write("bench", rows, meta, Path(args.out) / slug)
        if device == "cuda":  # the ceilings of this run, so every row has a same-run fraction of them
            ceiling_rows = ceilings(device)
            written += results.write("ceilings", ceiling_rows, meta, Path(args.out) / slug)
    if args.suite in ("all", "ch01"):
        tag = args.tag or (gpu_tag() if device.startswith("cuda") else "cpu")
        backends = ("naive", "flash", "cudnn") if device == "cuda" else ("naive", "default")
        suites: dict[str, list[dict[str, object]]] = {
            f"naive_vs_fused_{tag}": [
                row
                for d in (64, 128)
                for row in compare_naive_fused(ns, d, device=device, dtype=dtype, backends=backends,
                                               passes=("fwd", "fwdbwd"), tokens=tokens)
            ],
            f"naive_steps_{tag}": [
                row for n in ns for d in (64, 128) for row in naive_step_costs(n, d, device=device, dtype=dtype, tokens=tokens)
            ],
        }
        if device == "cuda":
            suites[f"ceilings_{tag}"] = ceiling_rows or ceilings(device)
        for stem, rows in suites.items():
            written += results.write(stem, rows, meta, args.out)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
