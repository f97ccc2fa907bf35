"""FP8 forward (FlashAttention-3 §3.3): speed beside bf16, and accuracy on outliers.

    python -m flashlab.lab.experiments fp8 --out results

Two tables, measured on the GPU in one process:

``fp8_bench``: forward time of flashlab's bf16 kernel, flashlab's FP8 kernel on inputs
quantised beforehand (``flashlab_fp8``) and with the quantisation timed too
(``flashlab_fp8_incl_quant``: amax per block, scale, cast, V transposed to keys-contiguous),
and torch SDPA's flash backend; B·N = 16384 tokens, H = 2048 / d heads, d = 128 and 64,
N from 1024 to 16384, causal and not. Columns impl, dtype, causal, d, N, B, H, pass, ms,
tflops as in flashlab.lab.bench (FLOPs = 4 B H N^2 d, halved when causal).

``fp8_rmse`` (also alone: ``python -m flashlab.lab.experiments fp8rmse``): RMSE against exact
float64 attention on reference.fp8.outlier_inputs (N(0,1) + N(0,100) x Bernoulli(0.001)),
N = 1024, d = 128, one row per seed and method: bf16 flashlab, fp8 per-tensor (one descale
per head), fp8 per-block, fp8 per-block + hadamard, fp8 per-tensor + hadamard (FA3's own
combination), and fp8 per-block with V per head (the speed benchmark's quantisation),
per-block with the benchmark's blocks of 128 rows.

Importable without a GPU; :func:`run` needs one (FP8 tensor cores: sm_89 or newer).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from flashlab.lab.experiments import gpu_ms, measure_case, record, require_gpu
from flashlab.lab.measure import paper_shape
from flashlab.reference.naive import attention_flops

NS = (1024, 2048, 4096, 8192, 16384)
DS = (128, 64)
BLOCK = 128  # rows per descale: one kernel tile of queries, one or two of keys
RMSE_N, RMSE_D, RMSE_SEEDS = 1024, 128, (0, 1, 2, 3, 4)
METHODS = {  # name -> (block, hadamard, v_block); None: bf16
    "bf16 flashlab": None,
    "fp8 per-tensor": (None, False, "same"),
    "fp8 per-block": (BLOCK, False, "same"),
    "fp8 per-block + hadamard": (BLOCK, True, "same"),
    "fp8 per-tensor + hadamard": (None, True, "same"),
    "fp8 per-block, V per head": (BLOCK, False, None),  # the benchmark's quantisation (bench.FP8_V_BLOCK)
}


def _flops(B: int, H: int, N: int, d: int, causal: bool) -> float:
    return attention_flops(N, N, d, causal=causal, batch=B * H)


def _impls(q, k, v, pre: dict, causal: bool) -> dict:
    """(impl, dtype) -> a function that runs one forward pass."""
    from flashlab.lab.bench import fused_attention_torch
    from flashlab.kernels import flash_attention
    from flashlab.kernels.fp8 import flash_attention_fp8, quantize_qkv

    return {
        ("flashlab", "bfloat16"): lambda: flash_attention(q, k, v, causal=causal),
        ("flashlab_fp8", "float8_e4m3fn"): lambda: flash_attention_fp8(**pre, causal=causal),
        ("flashlab_fp8_incl_quant", "float8_e4m3fn"):
            lambda: flash_attention_fp8(**quantize_qkv(q, k, v, block=BLOCK), causal=causal),
        ("sdpa_flash", "bfloat16"): lambda: fused_attention_torch(q, k, v, causal, "flash"),
    }


def bench_rows() -> list[dict[str, object]]:
    from flashlab.kernels.fp8 import quantize_qkv

    rows: list[dict[str, object]] = []
    jobs = [(d, n) for d in DS for n in NS]
    for i, (d, n) in enumerate(jobs, 1):
        B, H = paper_shape(n, d)
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(B, H, n, d, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
        pre = quantize_qkv(q, k, v, block=BLOCK)
        for causal in (False, True):
            for (impl, dtype), fn in _impls(q, k, v, pre, causal).items():
                try:
                    with torch.no_grad():
                        t = gpu_ms(fn)
                except (RuntimeError, ValueError) as exc:  # a backend that refuses the shape, or OOM
                    print(f"[{i}/{len(jobs)}] {impl} d={d} N={n} causal={causal}: skipped ({str(exc)[:100]})",
                          flush=True)
                    continue
                row = {"impl": impl, "dtype": dtype, "causal": causal, "d": d, "N": n, "B": B, "H": H, "pass": "fwd",
                       "ms": round(t, 5), "tflops": round(_flops(B, H, n, d, causal) / (t * 1e-3) / 1e12, 2)}
                rows.append(row)
                print(f"[{i}/{len(jobs)}] {impl:>23} d={d} causal={causal!s:5} N={n:>5}: {t:8.3f} ms "
                      f"{row['tflops']:7.1f} TFLOP/s", flush=True)
        torch.cuda.empty_cache()
    return rows


def rmse_rows() -> list[dict[str, object]]:
    from flashlab.kernels import flash_attention
    from flashlab.kernels.fp8 import flash_attention_fp8_from
    from flashlab.reference import attention
    from flashlab.reference.fp8 import outlier_inputs, rmse

    rows: list[dict[str, object]] = []
    for seed in RMSE_SEEDS:
        q, k, v = outlier_inputs(RMSE_N, RMSE_D, seed)
        exact = attention(q, k, v)  # float64
        qt, kt, vt = (torch.from_numpy(x)[None, None].to("cuda", torch.float32) for x in (q, k, v))
        for method, how in METHODS.items():
            if how is None:
                o = flash_attention(qt.bfloat16(), kt.bfloat16(), vt.bfloat16())
            else:
                block, hadamard, v_block = how
                o = flash_attention_fp8_from(qt, kt, vt, block=block, hadamard=hadamard, seed=seed, v_block=v_block)
            err = rmse(o[0, 0].double().cpu().numpy(), exact)
            rows.append({"seed": seed, "method": method, "block": how[0] if how and how[0] else 0,
                         "N": RMSE_N, "d": RMSE_D, "rmse": float(np.format_float_scientific(err, 4))})
            print(f"rmse seed={seed} {method:>26}: {err:.3e}", flush=True)
    return rows


def _require_fp8() -> None:
    require_gpu()
    if torch.cuda.get_device_capability() < (8, 9):
        raise RuntimeError(f"the FP8 experiment needs FP8 tensor cores (sm_89 or newer); got {torch.cuda.get_device_name()}")


def rmse(out: Path) -> list[Path]:
    """Only the ``fp8_rmse`` table."""
    _require_fp8()
    return record("fp8_rmse", rmse_rows(), out)


def run(out: Path) -> list[Path]:
    _require_fp8()
    paths = record("fp8_rmse", rmse_rows(), out)  # small and quick: first, so a slow benchmark cannot lose it
    paths += record("fp8_bench", bench_rows(), out)
    return paths


# Variants tried by :func:`tiles`: ((BLOCK_M, BLOCK_N, warps, stages[, register cap]), load path,
# pipeline, block), where the load path is "pointer" or "tma", ``pipeline`` asks for the next tile's
# scores before this tile's softmax (the kernel's PIPELINE), and ``block`` is the rows per descale
# (None: one descale per head, as FlashAttention-3 scales).
TILE_VARIANTS = [
    ((128, 64, 4, 3), "pointer", False, 128), ((128, 64, 4, 3), "tma", False, 128),
    ((128, 128, 8, 3), "tma", False, 128), ((64, 128, 4, 3), "tma", False, 128), ((64, 128, 4, 2), "tma", False, 128),
    ((64, 128, 4, 2, 168), "tma", False, 128), ((64, 128, 4, 3, 168), "tma", False, 128),
    ((64, 128, 4, 2, 168), "tma", False, None), ((64, 64, 4, 3), "tma", False, 128),
    ((64, 64, 4, 3, 128), "tma", False, 128), ((64, 128, 4, 3), "tma", True, 128),
]
TILE_NS = (4096, 8192, 16384)


def _config_columns(config: tuple[int, ...]) -> dict[str, object]:
    """impl, dtype and the tile configuration (BLOCK_M, BLOCK_N, warps, stages[, register cap])."""
    return {"impl": "flashlab_fp8", "dtype": "float8_e4m3fn", "BLOCK_M": config[0], "BLOCK_N": config[1],
            "warps": config[2], "stages": config[3], "maxnreg": config[4] if len(config) > 4 else ""}


def _shape_columns(n: int) -> dict[str, object]:
    """d, N, B, H of the timed inputs at sequence length n (see :func:`_inputs`)."""
    B, H = paper_shape(n, 128)
    return {"d": 128, "N": n, "B": B, "H": H}


def _tile_row(config: tuple[int, ...], block: int | None, n: int, path: str, pipeline: bool) -> dict[str, object]:
    """The columns that name one FP8 variant at sequence length n (timings are added to it)."""
    return {**_config_columns(config), "block": block or "", "path": path, "pipeline": pipeline, **_shape_columns(n)}


def _inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v bf16 (B, H, n, 128) on the GPU, B·n = 16k tokens, H = 16: the same for every variant."""
    g = torch.Generator(device="cpu").manual_seed(0)
    s = _shape_columns(n)
    return tuple(torch.randn(s["B"], s["H"], n, s["d"], generator=g).to("cuda", torch.bfloat16) for _ in range(3))


def _measure(row: dict[str, object], q, k, v, fn, timed: bool = True) -> dict[str, object]:
    """row (naming a variant) with fn's time on (q, k, v), d = 128, non-causal; max_err against
    float32 SDPA (see measure_case)."""
    B, H, n, d = q.shape
    row.update(d=d, N=n, B=B, H=H)
    exact = lambda: torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())  # noqa: E731
    return measure_case(row, fn, exact, _flops(B, H, n, d, False), timed)


def _tile_case(config: tuple[int, ...] | None, block: int | None, n: int, path: str = "pointer",
               pipeline: bool = False, timed: bool = False) -> dict[str, object]:
    """One FP8 forward (d = 128, non-causal, B·N = 16k tokens) with a fixed tile configuration,
    descale blocks of ``block`` rows, one load path ("pointer" or "tma") and the
    software-pipelined key loop (the lab variant's pipeline="qk") on or off; timed if asked.
    ``config=None``: flashlab's bf16 forward as users get it (autotuned, its default loads)."""
    from flashlab.kernels import flash_attention
    from flashlab.kernels.fp8 import flash_attention_fp8, quantize_qkv
    from flashlab.lab.variants.fp8_schedules import flash_attention_fp8_scheduled

    q, k, v = _inputs(n)
    if config is None:
        fn = lambda: flash_attention(q, k, v)  # noqa: E731
        row = {"impl": "flashlab", "dtype": "bfloat16",
               **dict.fromkeys(("BLOCK_M", "BLOCK_N", "warps", "stages", "maxnreg", "block", "path", "pipeline"), "")}
    else:
        pre = quantize_qkv(q, k, v, block=block)
        if pipeline:
            fn = lambda: flash_attention_fp8_scheduled(**pre, config=config, tma=path == "tma", pipeline=pipeline)  # noqa: E731
        else:
            fn = lambda: flash_attention_fp8(**pre, config=config, tma=path == "tma")  # noqa: E731
        row = _tile_row(config, block, n, path, pipeline)
    return _measure(row, q, k, v, fn, timed)


def _variant_rows(config, block: int | None, path: str, pipeline: bool) -> list[dict[str, object]]:
    """One TILE_VARIANTS entry at every TILE_NS, timed (run in its own process by :func:`tiles`)."""
    return [_tile_case(config, block, n, path, pipeline, timed=True) for n in TILE_NS]


def _sweep(stem: str, target: str, jobs: list, out: Path, timeout: float) -> list[Path]:
    """flashlab's autotuned bf16 forward at every TILE_NS, then each job (args, name) in its own
    process (:func:`isolated`), one after the other: ``target(*args)`` returns the job's timed rows,
    and ``name(n)`` the columns that name it, for the rows of a job that crashed or hung."""
    require_gpu()
    from flashlab.lab.experiments import isolated

    rows = [_tile_case(None, 0, n, timed=True) for n in TILE_NS]
    for row in rows:
        print(row, flush=True)
    for args, name in jobs:
        got, status = isolated(target, args, timeout)
        if got is None:  # crashed or hung: the job's rows say so
            got = [name(n) | {"ms": "", "tflops": "", "max_err": "", "status": status} for n in TILE_NS]
        for row in got:
            print(row, flush=True)
        rows += got
    keys = list(dict.fromkeys(k for r in rows for k in r))  # the bf16 rows leave the FP8 columns empty
    return record(stem, [{k: r.get(k, "") for k in keys} for r in rows], out)


def tiles(out: Path, timeout: float = 50.0) -> list[Path]:
    """The FP8 kernel's speed across TILE_VARIANTS (tile shapes, load paths, pipelining, descale
    blocks), beside flashlab's autotuned bf16 forward: which lever moves FP8 toward
    1.5x bf16. Each variant runs in its own process (:func:`isolated`), one after the other, so
    that one which crashes or hangs is recorded as such and cannot spoil the others."""
    jobs = [((config, block, path, pipeline), functools.partial(_tile_row, config, block, path=path, pipeline=pipeline))
            for config, path, pipeline, block in TILE_VARIANTS]
    return _sweep("fp8_tiles", "flashlab.lab.experiments.fp8:_variant_rows", jobs, out, timeout)


# Variants of the FP8 kernel's key-loop schedule (flashlab.lab.variants.fp8_schedules), each ((BLOCK_M, BLOCK_N, warps, stages[, register cap]),
# v_block, options), all with Q and K per block of 128 rows and TMA loads; v_block None is one V descale
# per (batch, head), as FlashAttention-3 scales V. RESCALE_VARIANTS (:func:`rescaling`): FlashAttention-4's
# conditional rescaling (rescale_threshold), which can skip O's rescale only when V has one descale.
RESCALE_VARIANTS = [
    ((64, 128, 4, 3), 128, {}),  # fp8_tiles' fastest, as recorded there: the baseline
    ((64, 128, 4, 3), None, {}),  # V per head, rescaled every tile
    ((64, 128, 4, 3), 128, {"rescale_threshold": 2.0}),  # V per block: O is multiplied every tile anyway
    ((64, 128, 4, 3), None, {"rescale_threshold": 0.0}),  # rescale whenever any row rises (the decision's cost)
    ((64, 128, 4, 3), None, {"rescale_threshold": 2.0}),  # rescale only on rises past 4x
    ((64, 128, 4, 2), None, {"rescale_threshold": 2.0}),  # ... 2 stages: 168 registers, three programs per SM
    ((128, 128, 8, 3), None, {"rescale_threshold": 2.0}),  # ... two warp groups per program
    ((64, 128, 4, 3), None, {"rescale_threshold": 2.0, "pipeline": True}),  # ... and the next QK^T issued early
]
# PIPELINE_VARIANTS (:func:`pipelines`): FlashAttention-3's intra-warpgroup overlap with P V issued late.
PIPELINE_VARIANTS = [
    ((64, 128, 4, 3), None, {}),  # fp8_tiles' fastest, V per head
    ((64, 128, 4, 3), None, {"pipeline": "pv"}),  # P V during the next softmax; Q in registers: 2 programs per SM
    ((64, 128, 4, 3), 128, {"pipeline": "pv"}),  # ... V per block
    ((64, 128, 4, 2), None, {"pipeline": "pv"}),  # ... 2 stages
    ((128, 128, 8, 3), None, {"pipeline": "pv"}),  # ... two warp groups in one program per SM
]
OPTION_COLUMNS = ("rescale_threshold", "pipeline")


def _option_row(config: tuple[int, ...], v_block: int | None, options: dict, n: int) -> dict[str, object]:
    """The columns that name one variant of RESCALE_VARIANTS or PIPELINE_VARIANTS at sequence length n."""
    named = {k: "" if options.get(k) is None else options[k] for k in OPTION_COLUMNS}
    named["pipeline"] = options.get("pipeline", False)  # False, True/"qk" (scores early) or "pv" (P V late)
    return {**_config_columns(config), "block": BLOCK, "v_block": v_block or "", **named, **_shape_columns(n)}


def _option_rows(config, v_block: int | None, options: dict) -> list[dict[str, object]]:
    """One variant at every TILE_NS, timed (run in its own process by :func:`_sweep`), through
    the lab variant :mod:`flashlab.lab.variants.fp8_schedules`, which takes ``options``."""
    from flashlab.kernels.fp8 import quantize_qkv
    from flashlab.lab.variants.fp8_schedules import flash_attention_fp8_scheduled

    rows = []
    for n in TILE_NS:
        q, k, v = _inputs(n)
        pre = quantize_qkv(q, k, v, block=BLOCK, v_block=v_block)
        fn = lambda: flash_attention_fp8_scheduled(**pre, config=config, **options)  # noqa: E731
        rows.append(_measure(_option_row(config, v_block, options, n), q, k, v, fn))
    return rows


def _variants(stem: str, variants: list, out: Path, timeout: float) -> list[Path]:
    """RESCALE_VARIANTS or PIPELINE_VARIANTS through :func:`_sweep`."""
    jobs = [((config, v_block, options), functools.partial(_option_row, config, v_block, options))
            for config, v_block, options in variants]
    return _sweep(stem, "flashlab.lab.experiments.fp8:_option_rows", jobs, out, timeout)


def rescaling(out: Path, timeout: float = 50.0) -> list[Path]:
    """FlashAttention-4's conditional rescaling inside the FP8 kernel (RESCALE_VARIANTS) beside
    flashlab's bf16 forward: does skipping O's rescale on most tiles make FP8 faster?"""
    return _variants("fp8_rescale", RESCALE_VARIANTS, out, timeout)


def pipelines(out: Path, timeout: float = 50.0) -> list[Path]:
    """The FP8 kernel with each tile's P V issued after the next tile's scores (PIPELINE_VARIANTS),
    so that it runs during the next softmax, beside flashlab's bf16 forward."""
    return _variants("fp8_pipeline", PIPELINE_VARIANTS, out, timeout)
