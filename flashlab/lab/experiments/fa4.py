"""FlashAttention-4's software tricks measured on Hopper: software exp2 and conditional rescaling.

    python -m flashlab.lab.experiments fa4 --out results

For bf16, d = 128 and 64 (H = 2048 / d heads), B·N = 16384 tokens with N in {4096, 16384},
non-causal and causal, one after the other in this process:

- ``base``: :func:`flashlab.kernels.flash_attention` (the FA2 kernel, autotuned);
- ``fa4``: :func:`flashlab.kernels.fa4.flash_attention_fa4`'s kernel with ONE fixed
  configuration per d (:data:`CONFIGS`), rescale off, at poly_fraction 0, 0.1 (realised as
  1/8), 0.25 and 0.5 — poly 0 separates "variant vs base" from "poly vs no poly";
- ``fa4`` with rescale_threshold = 8 (poly 0): conditional rescaling.

Each row: variant, poly_fraction (asked), poly_realised, threshold, causal, d, N, B, H, ms,
tflops, max_abs_err (against torch SDPA on the fp32 inputs), the kernel's hardware exp2
count (``ex2.approx`` in its PTX; ``MUFU.EX2`` in its SASS where nvdisasm is there), its
``convert_layout`` count (a layout change the tile split might cost), and the rescales per
program on these random inputs: ``rescales_mean`` (tiles whose accumulators were rescaled:
every tile after the first on the standard path, the branches taken at theta = 8 on the
conditional one) and ``rises_mean`` (tiles where some row's max rose, the count at theta = 0).
Written as ``fa4_variants_<tag>.csv/.json``. About two minutes on an H200, most of it compiles
and the base kernel's autotuning.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from flashlab.lab.experiments import gpu_ms, record, require_gpu
from flashlab.lab.measure import paper_shape
from flashlab.reference.naive import attention_flops

# (BLOCK_M, BLOCK_N, warps, stages) of the fa4 variant, per head dimension. On an H200 (triton 3.6,
# bf16, N = 16384, non-causal, poly 0): d = 128 at 128x128x8x3 is within 2 % of the autotuned base
# kernel; d = 64 at 128x64x8x3 matches it (the base's own pick), where 128x128x8x3 is 16 % slower.
CONFIGS: dict[int, tuple[int, int, int, int]] = {128: (128, 128, 8, 3), 64: (128, 64, 8, 3)}
POLY_FRACTIONS = (0.0, 0.1, 0.25, 0.5)
THRESHOLD = 8.0


def _compile_facts(compiled) -> dict[str, object]:
    """Hardware exp2 and layout conversions in the compiled kernel (None where not readable)."""
    facts: dict[str, object] = {"ex2_ptx": None, "mufu_ex2_sass": None, "convert_layouts": None}
    if compiled is None:
        return facts
    try:
        facts["ex2_ptx"] = compiled.asm["ptx"].count("ex2.approx")
        facts["convert_layouts"] = compiled.asm["ttgir"].count("convert_layout")
    except Exception:  # noqa: BLE001 - an inspection only
        pass
    try:
        facts["mufu_ex2_sass"] = compiled.asm["sass"].count("MUFU.EX2")
    except Exception:  # noqa: BLE001 - needs nvdisasm
        pass
    return facts


def _base_config() -> str:
    """The configuration the base kernel's autotuner picked for the last shape it ran."""
    try:
        from flashlab.kernels.forward import _forward_kernel

        c = _forward_kernel.best_config
        return f"autotuned {c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}x{c.num_warps}x{c.num_stages}"
    except Exception:  # noqa: BLE001 - the base kernel's internals may change
        return "autotuned"


def _tiles_per_program(n: int, block_m: int, block_n: int, causal: bool) -> float:
    """Mean number of K/V tiles a query block visits (causal: up to the diagonal, as the kernel)."""
    from flashlab.kernels._common import causal_key_range

    programs = -(-n // block_m)
    if not causal:
        return float(-(-n // block_n))
    return sum(-(-causal_key_range(m, block_m, block_n, n, n)[1] // block_n) for m in range(programs)) / programs


def run(out: Path) -> list[Path]:
    require_gpu()
    from flashlab.kernels import flash_attention
    from flashlab.kernels.fa4 import fa4_forward, realised_poly_fraction

    t0 = time.perf_counter()
    rows: list[dict[str, object]] = []
    for d in (128, 64):
        cfg = CONFIGS[d]
        scale = d**-0.5
        for N in (4096, 16384):
            B, H = paper_shape(N, d)
            g = torch.Generator(device="cuda").manual_seed(N + d)
            q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            for causal in (False, True):
                flops = attention_flops(N, N, d, causal=causal, batch=B * H)
                with torch.no_grad():
                    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                           is_causal=causal)
                tiles = _tiles_per_program(N, cfg[0], cfg[1], causal)
                # rises per program: the conditional kernel at theta = 0 (theta is a run-time argument: no compile)
                _, rises, _ = fa4_forward(q, k, v, causal, scale, 0.0, 0.0, config=cfg)
                rises_mean = rises.float().mean().item()
                shape = {"causal": causal, "d": d, "N": N, "B": B, "H": H}

                def add(variant, poly, theta, fn, o, compiled, rescales_mean):
                    t = gpu_ms(fn)
                    err = (o.float() - ref).abs().max().item()
                    rows.append({"variant": variant, "poly_fraction": poly,
                                 "poly_realised": realised_poly_fraction(poly), "threshold": theta, **shape,
                                 "config": "x".join(map(str, cfg)) if variant == "fa4" else _base_config(),
                                 "ms": t, "tflops": flops / t * 1e-9, "max_abs_err": err,
                                 **_compile_facts(compiled), "rescales_mean": rescales_mean,
                                 "rises_mean": rises_mean})
                    r = rows[-1]
                    print(f"[{time.perf_counter() - t0:6.1f}s] {variant:4s} poly={poly:<4} theta={theta} "
                          f"causal={causal:d} d={d} N={N}: {t:.3f} ms {r['tflops']:.0f} TFLOP/s err={err:.2e} "
                          f"ex2={r['ex2_ptx']} mufu={r['mufu_ex2_sass']} cvt={r['convert_layouts']} "
                          f"rescales={rescales_mean:.2f} rises={rises_mean:.2f}", flush=True)

                base_fn = lambda: flash_attention(q, k, v, causal=causal)  # noqa: E731
                with torch.no_grad():
                    add("base", 0.0, None, base_fn, base_fn(), None, tiles - 1)
                for poly in POLY_FRACTIONS:
                    fn = lambda poly=poly: fa4_forward(q, k, v, causal, scale, poly, None, config=cfg)  # noqa: E731
                    o, _, compiled = fn()
                    add("fa4", poly, None, fn, o, compiled, tiles - 1)
                fn = lambda: fa4_forward(q, k, v, causal, scale, 0.0, THRESHOLD, config=cfg)  # noqa: E731
                o, counts, compiled = fn()
                add("fa4", 0.0, THRESHOLD, fn, o, compiled, counts.float().mean().item())
                del ref
            del q, k, v
            torch.cuda.empty_cache()
    print(f"fa4: {len(rows)} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    return record("fa4_variants", rows, out)
