"""GPU experiments on flashlab's own FlashAttention-2 kernels (chapters 5, 6, 7 and 9).

- :func:`grid`        — v1 partitioning (one program per head) vs v2 (query blocks x heads)
- :func:`pipelining`  — the forward across software-pipelining depths and warp specialisation
- :func:`determinism` — atomic-add dQ vs the deterministic two-kernel backward: bits and speed
- :func:`memory`      — forward + backward at N = 131072: peak memory beyond the tensors
- :func:`beyond`      — causal, sliding window, GQA, varlen vs padding, split-KV decoding

Each writes ``OUT/<name>_<tag>.csv/.json`` with provenance (:func:`flashlab.lab.experiments.record`);
FLOPs are :func:`flashlab.reference.naive.attention_flops` (halved when causal), forward +
backward 3.5x the forward, as in the bench.
"""

from __future__ import annotations

from pathlib import Path

import torch

from flashlab.lab.experiments import measure_case, record, require_gpu
from flashlab.lab.measure import paper_shape, time_ms
from flashlab.reference.naive import attention_flops

BF16 = torch.bfloat16


def _qkv(B: int, H: int, N: int, d: int, H_kv: int | None = None, N_k: int | None = None, seed: int = 0, grad: bool = False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    H_kv, N_k = H_kv or H, N_k or N
    q = torch.randn(B, H, N, d, device="cuda", dtype=BF16, generator=g)
    k = torch.randn(B, H_kv, N_k, d, device="cuda", dtype=BF16, generator=g)
    v = torch.randn(B, H_kv, N_k, d, device="cuda", dtype=BF16, generator=g)
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v


def _graph_ms(fn) -> float:
    """Median ms of ``fn`` captured once in a CUDA graph and replayed: the GPU time of its
    kernels without the host's per-call cost (argument checks, Python, kernel launches)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):  # warm up (compile) outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        fn()
    return _median_ms(graph.replay)


def _median_ms(fn) -> float:
    """Median milliseconds of ``fn`` on the GPU (:func:`flashlab.lab.measure.time_ms`)."""
    return time_ms(fn, "cuda")


def _tflops(flops: float, t_ms: float) -> float:
    return round(flops / (t_ms * 1e-3) / 1e12, 2)


def _fwd_flops(B: int, H: int, n_q: int, n_k: int, d: int, causal: bool) -> float:
    return attention_flops(n_q, n_k, d, causal=causal, batch=B * H)


# ----------------------------------------------------------------------------- chapter 5
def grid(out: Path) -> list[Path]:
    """The same forward kernel and block configuration launched on the two grids of chapter 5.
    v1: (1, B*H) programs, each looping over its query blocks; v2: (N/BLOCK_M, B*H)."""
    require_gpu()
    from flashlab.lab.variants.forward_schedules import forward

    config = (128, 128, 8, 3)  # one configuration (and pointer loads) for both grids, so only the partitioning differs
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for d in (128, 64):
        for causal in (False, True):
            for B, H, N in ((1, 16, 4096), (1, 16, 16384), (4, 16, 4096), (8, 16, 4096), (16, 16, 4096), (1, 132, 4096)):
                q, k, v = _qkv(B, H, N, d)
                for g in ("v1", "v2"):
                    with torch.no_grad():
                        t = _median_ms(lambda: forward(q, k, v, causal, d**-0.5, config, grid=g, tma=False))
                    programs = B * H * (1 if g == "v1" else -(-N // config[0]))
                    row = {"grid": g, "B": B, "H": H, "N": N, "d": d, "causal": causal, "BLOCK_M": config[0],
                           "BLOCK_N": config[1], "programs": programs, "sms": sms, "ms": round(t, 5),
                           "tflops": _tflops(_fwd_flops(B, H, N, N, d, causal), t)}
                    rows.append(row)
                    print(row, flush=True)
                del q, k, v
    return record("grid", rows, out)


# ----------------------------------------------------------------------------- chapter 6
# (d, N, causal, BLOCK_M, BLOCK_N, warps, stages, tma, warp_specialize): one row each.
_PIPELINE_CASES = [
    *[(128, 8192, False, 128, 128, 8, s, False, False) for s in (1, 2, 3)],  # how many K/V tiles in flight
    *[(128, 8192, False, 128, 128, 8, s, t, w) for s in (2, 3) for t in (False, True) for w in (False, True) if t or w],
    *[(128, 8192, False, 128, 128, 4, 3, t, w) for t in (False, True) for w in (False, True)],
    *[(128, 8192, False, 128, 64, w_, 3, True, w) for w_ in (4, 8) for w in (False, True)],
    (128, 8192, False, 128, 64, 4, 2, False, False),
    *[(128, 4096, True, 128, 128, 8, 3, t, w) for t in (False, True) for w in (False, True)],
    *[(64, 8192, False, 128, 64, 4, s, t, w) for s in (3, 4) for t in (False, True) for w in (False, True)],
    *[(64, 8192, False, 128, 128, 8, 3, t, False) for t in (False, True)],
]


def _pipeline_case(d, N, causal, bm, bn, warps, stages, tma, ws, timed: bool = False) -> dict[str, object]:
    """Run (and, if ``timed``, time) the forward with one fixed configuration at the papers'
    shape (:func:`flashlab.lab.measure.paper_shape`); returns the experiment's row."""
    from flashlab.lab.variants.forward_schedules import forward

    B, H = paper_shape(N, d)
    row: dict[str, object] = {"d": d, "N": N, "B": B, "H": H, "causal": causal, "BLOCK_M": bm, "BLOCK_N": bn,
                              "warps": warps, "stages": stages, "warp_specialize": ws, "tma": tma}
    q, k, v = _qkv(B, H, N, d)
    cfg = (bm, bn, warps, stages)
    return measure_case(row, lambda: forward(q, k, v, causal, d**-0.5, cfg, warp_specialize=ws, tma=tma)[0],
                        lambda: torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal),
                        _fwd_flops(B, H, N, N, d, causal), timed)


def pipelining(out: Path) -> list[Path]:
    """Forward TFLOP/s across num_stages (how many K/V tiles are in flight), Triton's warp
    specialisation of the main loop, and K/V loads through TMA tensor descriptors vs plain
    pointer loads, for a few block shapes (_PIPELINE_CASES). The configurations are compiled
    in parallel first (:func:`precompile`), then timed one at a time."""
    require_gpu()
    from flashlab.lab.experiments import precompile

    precompile([("flashlab.lab.experiments.kernels:_pipeline_case", case) for case in _PIPELINE_CASES])
    rows = []
    for case in _PIPELINE_CASES:
        rows.append(_pipeline_case(*case, timed=True))
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    return record("pipelining", rows, out)


# ----------------------------------------------------------------------------- chapter 7
def determinism(out: Path) -> list[Path]:
    """Bits: dQ over 10 backward passes with atomic adds vs with the deterministic dQ kernel.
    Speed: forward + backward of each path at the bench shapes."""
    require_gpu()
    from flashlab.kernels import flash_attention

    rows = []
    B, H, N, d = 2, 16, 4096, 128
    q, k, v = _qkv(B, H, N, d, seed=1)
    do = torch.randn_like(q)
    for det in (True, False):
        grads = []
        for _ in range(10):
            qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
            flash_attention(qq, kk, vv, causal=True, deterministic=det).backward(do)
            grads.append(qq.grad.float())
        distinct = len({g.cpu().numpy().tobytes() for g in grads})
        diff = max((g - grads[0]).abs().max().item() for g in grads)
        changed = max((g != grads[0]).float().mean().item() for g in grads)
        rows.append({"kind": "bits", "deterministic": det, "causal": True, "d": d, "N": N, "B": B, "H": H,
                     "runs": 10, "distinct_dq": distinct, "max_abs_diff": f"{diff:.3e}",
                     "fraction_changed": f"{changed:.4f}", "ms": "", "tflops": ""})
        print(rows[-1], flush=True)
    del q, k, v, do
    for d in (64, 128):
        for causal in (False, True):
            for N in (1024, 4096, 16384):
                B, H = paper_shape(N, d)
                q, k, v = _qkv(B, H, N, d, grad=True)
                do = torch.randn_like(q)
                for det in (True, False):
                    t = _median_ms(lambda: torch.autograd.grad(flash_attention(q, k, v, causal=causal, deterministic=det), (q, k, v), do))
                    rows.append({"kind": "speed", "deterministic": det, "causal": causal, "d": d, "N": N, "B": B, "H": H,
                                 "runs": "", "distinct_dq": "", "max_abs_diff": "", "fraction_changed": "",
                                 "ms": round(t, 5), "tflops": _tflops(3.5 * _fwd_flops(B, H, N, N, d, causal), t)})
                    print(rows[-1], flush=True)
                del q, k, v, do
    return record("determinism", rows, out)


# ----------------------------------------------------------------------------- chapter 4/5 memory
def memory(out: Path) -> list[Path]:
    """Peak GPU memory of one forward + backward at N = 131072, B = H = 1, d = 128, beyond the
    inputs (q, k, v, dO): flashlab and SDPA flash, causal and not."""
    require_gpu()
    from flashlab.lab.bench import fused_attention_torch
    from flashlab.kernels import flash_attention

    N, d = 131072, 128
    rows = []
    for impl in ("flashlab", "sdpa_flash"):
        for causal in (True, False):
            q, k, v = _qkv(1, 1, N, d, grad=True)
            do = torch.randn_like(q)
            fn = (lambda: flash_attention(q, k, v, causal=causal)) if impl == "flashlab" else \
                (lambda: fused_attention_torch(q, k, v, causal, "flash"))
            fn().backward(do)  # warm-up: compile and autotune first (the tuner's timing buffer is not the kernel's)
            q.grad = k.grad = v.grad = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            o = fn()
            o.backward(do)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
            tensor = N * d * 2
            accounted = 4 * tensor + 2 * N * 4  # o, dq, dk, dv, lse and D
            t = _median_ms(lambda: torch.autograd.grad(fn(), (q, k, v), do))
            rows.append({"impl": impl, "causal": causal, "N": N, "d": d, "peak_mib": round(peak / 2**20, 2),
                         "extra_mib": round((peak - accounted) / 2**20, 2), "tensor_mib": round(tensor / 2**20, 2),
                         "nxn_bf16_gib": round(N * N * 2 / 2**30, 1), "ms": round(t, 3),
                         "tflops": _tflops(3.5 * _fwd_flops(1, 1, N, N, d, causal), t), "finite": bool(torch.isfinite(q.grad).all())})
            print(rows[-1], flush=True)
            del q, k, v, do, o
            torch.cuda.empty_cache()
    return record("memory", rows, out)


# ----------------------------------------------------------------------------- chapter 9
def beyond(out: Path) -> list[Path]:
    """The features of chapter 9 but decoding (:func:`decode`), each timed beside its baseline, with rows in the bench columns
    (impl, dtype, causal, d, N, B, H, pass, ms, tflops) plus the case and what it varies: window (keys back),
    h_kv (K/V heads), padding (the fraction of a padded batch that is padding) and peak_gib (peak memory);
    blank where a case does not vary it."""
    require_gpu()
    from flashlab.kernels import flash_attention, flash_attention_varlen

    rows: list[dict[str, object]] = []

    def add(case, impl, causal, d, N, B, H, pass_name, t, flops, window="", h_kv="", padding="", peak_gib=""):
        rows.append({"case": case, "impl": impl, "dtype": "bfloat16", "causal": causal, "d": d, "N": N, "B": B, "H": H,
                     "pass": pass_name, "ms": round(t, 5), "tflops": _tflops(flops, t) if flops else "",
                     "window": window, "h_kv": h_kv, "padding": padding, "peak_gib": peak_gib})
        print(rows[-1], flush=True)

    # 1. causal vs full at N = 16k (time saved; FLOPs counted as full for both, to compare times)
    B, H, N, d = 1, 16, 16384, 128
    q, k, v = _qkv(B, H, N, d, grad=True)
    do = torch.randn_like(q)
    for causal in (False, True):
        with torch.no_grad():
            t = _median_ms(lambda: flash_attention(q, k, v, causal=causal))
        add("causal", "flashlab", causal, d, N, B, H, "fwd", t, _fwd_flops(B, H, N, N, d, causal))
        t = _median_ms(lambda: torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do))
        add("causal", "flashlab", causal, d, N, B, H, "fwdbwd", t, 3.5 * _fwd_flops(B, H, N, N, d, causal))
    # 2. sliding window (left 1024, causal) at N = 16k vs causal
    for window in ((1024, 0), (4096, 0)):
        with torch.no_grad():
            t = _median_ms(lambda: flash_attention(q, k, v, causal=True, window=window))
        add("window", "flashlab", True, d, N, B, H, "fwd", t, 0, window=window[0])
        t = _median_ms(lambda: torch.autograd.grad(flash_attention(q, k, v, causal=True, window=window), (q, k, v), do))
        add("window", "flashlab", True, d, N, B, H, "fwdbwd", t, 0, window=window[0])
    del q, k, v, do
    # 3. GQA / MQA: 32 query heads, 32 / 8 / 1 K/V heads, N = 8k
    B, H, N, d = 2, 32, 8192, 128
    for h_kv in (32, 8, 1):
        q, k, v = _qkv(B, H, N, d, H_kv=h_kv, grad=True)
        do = torch.randn_like(q)
        with torch.no_grad():
            t = _median_ms(lambda: flash_attention(q, k, v, causal=True))
        add("gqa", "flashlab", True, d, N, B, H, "fwd", t, _fwd_flops(B, H, N, N, d, True), h_kv=h_kv)
        t = _median_ms(lambda: torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do))
        add("gqa", "flashlab", True, d, N, B, H, "fwdbwd", t, 3.5 * _fwd_flops(B, H, N, N, d, True), h_kv=h_kv)
        del q, k, v, do
    # 4. varlen vs padding: 16 sequences of random length in [1, 4096] (about half of a padded batch)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 4097, (16,), generator=g)
    B, H, d, L = 16, 16, 128, 4096
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    total = int(cu[-1])
    flops = sum(attention_flops(int(n), int(n), d, causal=True, batch=H) for n in lengths)  # useful work
    qp, kp, vp = (torch.randn(total, H, d, device="cuda", dtype=BF16, requires_grad=True) for _ in range(3))
    dop = torch.randn_like(qp)
    cu_d = cu.cuda()
    padding = round(1 - total / (B * L), 3)
    with torch.no_grad():
        t = _median_ms(lambda: flash_attention_varlen(qp, kp, vp, cu_d, cu_d, L, L, causal=True))
    add("varlen", "flashlab_varlen", True, d, L, B, H, "fwd", t, flops, padding=padding)
    t = _median_ms(lambda: torch.autograd.grad(flash_attention_varlen(qp, kp, vp, cu_d, cu_d, L, L, causal=True), (qp, kp, vp), dop))
    add("varlen", "flashlab_varlen", True, d, L, B, H, "fwdbwd", t, 3.5 * flops, padding=padding)
    q, k, v = _qkv(B, H, L, d, grad=True)  # the padded batch: every sequence stretched to L
    do = torch.randn_like(q)
    with torch.no_grad():
        t = _median_ms(lambda: flash_attention(q, k, v, causal=True))
    add("varlen", "flashlab_padded", True, d, L, B, H, "fwd", t, flops, padding=padding)
    t = _median_ms(lambda: torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do))
    add("varlen", "flashlab_padded", True, d, L, B, H, "fwdbwd", t, 3.5 * flops, padding=padding)
    # padding + masking as a PyTorch user would write it: SDPA with a boolean mask (no flash backend takes one)
    valid = torch.arange(L)[None, :] < lengths[:, None]
    mask = (torch.ones(L, L, dtype=torch.bool).tril()[None] & valid[:, None, :] & valid[:, :, None]) | torch.eye(L, dtype=torch.bool)[None]
    mask = mask[:, None].cuda()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        t = _median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    add("varlen", "sdpa_padded_mask", True, d, L, B, H, "fwd", t, flops, padding=padding,
        peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1))
    del q, k, v, do, qp, kp, vp, dop, mask
    torch.cuda.empty_cache()
    return record("beyond", rows, out)


def _host_us(fn, calls: int = 200) -> float:
    """Microseconds the host spends per call of ``fn`` (argument checks, Python, kernel
    launches), measured while the GPU queue absorbs the work: the per-call cost a CUDA graph
    removes. 200 calls stay far below the launch queue's depth, so the host never waits."""
    import time

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host


def _paged(cache: torch.Tensor, page_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The contiguous cache (B, H_kv, N, d) moved into a shuffled pool of pages
    (num_pages, page_size, H_kv, d) with its block table (B, N / page_size) int32."""
    B, H, N, d = cache.shape
    pages = cache.transpose(1, 2).reshape(B * N // page_size, page_size, H, d)  # in logical order
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(pages.shape[0], generator=g).to(cache.device, torch.int32)
    pool = torch.empty_like(pages)
    pool[table.long()] = pages  # logical page i of the flat order lives in physical page table[i]
    return pool, table.view(B, N // page_size)


def decode(out: Path) -> list[Path]:
    """Decoding (chapter 9): one new token per sequence against a long KV cache, d = 128.
    Columns beyond the bench's: gbps (K and V bytes per second), max_err, host_us, and, for the
    split sweep, num_splits and the heuristic's chosen_splits. Each implementation is timed three ways: called from Python (do_bench, as a plain loop
    runs it), replayed as a CUDA graph (the GPU's time alone, as serving engines run decoding),
    and the host's own cost per call. Also: the paged cache (pages of 16 and 256 keys, shuffled)
    against the contiguous one, and the split count swept around the heuristic's choice."""
    require_gpu()
    from flashlab.lab.bench import fused_attention_torch
    from flashlab.kernels import flash_attention, flash_decode
    from flashlab.kernels.decoding import _launch_config, choose_num_splits

    rows: list[dict[str, object]] = []

    def add(impl, d, N, B, H, t, flops, bytes_, max_err="", host_us="", num_splits="", chosen_splits=""):
        rows.append({"case": "decode", "impl": impl, "dtype": "bfloat16", "causal": False, "d": d, "N": N, "B": B, "H": H,
                     "pass": "fwd", "ms": round(t, 5), "tflops": _tflops(flops, t),
                     "gbps": round(bytes_ / (t * 1e-3) / 1e9), "max_err": max_err, "host_us": host_us,
                     "num_splits": num_splits, "chosen_splits": chosen_splits})
        print(rows[-1], flush=True)

    d = 128
    for B, H, N in ((1, 8, 65536), (1, 32, 65536), (8, 8, 16384), (1, 8, 16384)):
        g = torch.Generator(device="cuda").manual_seed(3)
        q = torch.randn(B, H, 1, d, device="cuda", dtype=BF16, generator=g)
        kc = torch.randn(B, H, N, d, device="cuda", dtype=BF16, generator=g)
        vc = torch.randn(B, H, N, d, device="cuda", dtype=BF16, generator=g)
        seqlens = torch.full((B,), N, dtype=torch.int32, device="cuda")
        flops, bytes_ = attention_flops(1, N, d, batch=B * H), 2 * B * H * N * d * 2  # K and V read once
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), kc.float(), vc.float())
        impls = {
            "flashlab_decode_unsplit": lambda: flash_decode(q, kc, vc, seqlens, num_splits=1, validate=False),
            "flashlab_decode_split": lambda: flash_decode(q, kc, vc, seqlens, validate=False),
            "flashlab_decode_split_separate": lambda: flash_decode(q, kc, vc, seqlens, validate=False, fuse_combine=False),
            "flashlab_fwd": lambda: flash_attention(q, kc, vc, causal=True),
            "sdpa_flash": lambda: fused_attention_torch(q, kc, vc, False, "flash"),
            "sdpa_cudnn": lambda: fused_attention_torch(q, kc, vc, False, "cudnn"),
            "sdpa_default": lambda: torch.nn.functional.scaled_dot_product_attention(q, kc, vc),
        }
        for page_size in (16, 256):
            kp, table = _paged(kc, page_size)
            vp, _ = _paged(vc, page_size)
            impls[f"flashlab_decode_paged{page_size}"] = (
                lambda kp=kp, vp=vp, table=table, page_size=page_size:
                flash_decode(q, kp, vp, seqlens, block_table=table, page_size=page_size, validate=False))
        for impl, fn in impls.items():
            try:
                with torch.no_grad():
                    err = (fn().float() - ref).abs().max().item()
                    t = _median_ms(fn)
                    host = _host_us(fn)
                    t_graph = _graph_ms(fn)
            except (RuntimeError, ValueError) as exc:
                print(f"decode {impl}: skipped ({str(exc)[:80]})", flush=True)
                continue
            add(impl, d, N, B, H, t, flops, bytes_, max_err=f"{err:.1e}", host_us=round(host, 1))
            add(impl + "_graph", d, N, B, H, t_graph, flops, bytes_)
        # the split count: the heuristic's choice against its neighbours, GPU time only (graphs)
        block_m, block_n, _, _ = _launch_config(1, d)
        chosen = choose_num_splits(B * H, -(-N // block_n), torch.cuda.get_device_properties(0).multi_processor_count)
        for s in sorted({1, 2, 4, 8, 16, 32, 64, 128, chosen}):
            with torch.no_grad():
                t = _graph_ms(lambda: flash_decode(q, kc, vc, seqlens, num_splits=s, validate=False))
            add(f"flashlab_decode_splits{s}_graph", d, N, B, H, t, flops, bytes_, num_splits=s, chosen_splits=chosen)
        del q, kc, vc, impls
        torch.cuda.empty_cache()
    return record("decode", rows, out)
