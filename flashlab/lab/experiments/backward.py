"""The backward pass against cuDNN: flashlab's teaching backward (two kernels, deterministic),
the Gluon FlashAttention-3 backward (:mod:`flashlab.kernels.fa3_backward`), and, for the check
where heads are grouped, the one-pass Triton variant with TMA loads and a TMA reduce-add of dQ
(:mod:`flashlab.lab.variants.backward_one_pass`), in one process.

    python -m flashlab.lab.experiments backward_check backward_configs backward_speed --out results

Writes three records:

- ``backward_check_<gpu>``: the Gluon backward's gradients (GQA rows: the one-pass backward's,
  the Gluon kernel takes equal heads only; column ``backward``) against a float32 PyTorch
  reference, beside the error of PyTorch attention in the same low precision (the flash-attn
  rule: kernel error <= 2 x that error + 1e-5), over causal and non-causal, ragged N, N_q != N_k,
  GQA, fp16 and bf16; and whether dK, dV come out bit-identical twice.
- ``backward_speed_<gpu>``: forward + backward at the papers' shape (B x N = 16k tokens,
  H x d = 2048), d = 64 and 128, causal and not, N = 4k and 16k, and one 128k-token causal
  sequence (16 heads, d = 128): SDPA cuDNN, flashlab's teaching path (Triton forward and
  deterministic backward) and the Gluon path (FA3 forward and backward). Times are medians of
  do_bench; the backward alone is timed too. Also the bf16 matmul ceiling, measured here.
- ``backward_configs_<gpu>``: the one-pass backward's time for each autotuning candidate at
  N = 16k, so the choice the autotuner makes can be read.
"""

from __future__ import annotations

from pathlib import Path

import torch

from flashlab.lab.experiments import gpu_ms, precompile, record
from flashlab.lab.measure import HEADS_X_D, paper_shape
from flashlab.reference.naive import attention_flops

NS = (4096, 16384)
LONG = (1, 16, 131072, 128)  # B, H, N, d: one 128k-token causal sequence
# FLOPs of each pass in units of the forward's: the backward does 2.5 times its matmul work
PASS_FLOPS = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
# (Z, H, H_kv, N_q, N_k, d, causal): ragged lengths, N_q != N_k both ways, GQA
CHECKS = [(2, 4, 4, 1024, 1024, 128, False), (2, 4, 4, 1024, 1024, 128, True), (1, 6, 2, 777, 1333, 128, True),
          (1, 4, 4, 1333, 777, 128, True), (3, 5, 5, 300, 301, 64, False), (1, 8, 1, 513, 2049, 64, True),
          (2, 3, 3, 129, 65, 64, True), (1, 2, 2, 4096, 4096, 128, True)]


def _torch_reference(q, k, v, do, causal, dtype):
    """(dq, dk, dv) of plain PyTorch attention in ``dtype`` (bench.naive_attention_torch; GQA by
    repeating K and V, whose gradients autograd sums back per K/V head)."""
    from flashlab.lab.bench import naive_attention_torch

    q, k, v, do = (t.detach().to(dtype).requires_grad_(t is not do) for t in (q, k, v, do))
    group = q.shape[1] // k.shape[1]
    o = naive_attention_torch(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), causal)
    return torch.autograd.grad(o, (q, k, v), do)


def _forward(impl: str):
    from flashlab.kernels import fa3
    from flashlab.kernels.forward import forward

    return fa3.forward if impl == "gluon" else forward


def _backward(name: str):
    from flashlab.kernels import backward as kb
    from flashlab.lab.variants import backward_one_pass as kh

    if name == "gluon":
        from flashlab.kernels import fa3_backward

        return fa3_backward.backward
    if name == "one_pass":
        return lambda do, q, k, v, o, lse2, causal, scale: kh.backward(do, q, k, v, o, lse2, causal, scale)
    return lambda do, q, k, v, o, lse2, causal, scale: kb.backward(
        do, q, k, v, o, lse2, causal, scale, deterministic=(name == "teaching_det"))


def check() -> list[dict[str, object]]:
    """The Gluon backward (the one-pass backward where heads are grouped) against float32
    PyTorch, as the module docstring says."""
    from flashlab.kernels.forward import forward

    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for Z, H, H_KV, N_Q, N_K, d, causal in CHECKS:
            q = torch.randn(Z, H, N_Q, d, device="cuda", generator=g).to(dtype)
            k, v = (torch.randn(Z, H_KV, N_K, d, device="cuda", generator=g).to(dtype) for _ in range(2))
            do = torch.randn(Z, H, N_Q, d, device="cuda", generator=g).to(dtype)
            scale = d**-0.5
            bwd_name = "gluon" if H == H_KV else "one_pass"
            backward = _backward(bwd_name)
            o, lse2 = forward(q, k, v, causal, scale)
            got = backward(do, q, k, v, o, lse2, causal, scale)
            again = backward(do, q, k, v, o, lse2, causal, scale)
            ref = _torch_reference(q, k, v, do, causal, torch.float32)
            low = _torch_reference(q, k, v, do, causal, dtype)
            row = {"backward": bwd_name, "dtype": str(dtype).replace("torch.", ""), "Z": Z, "H": H, "H_kv": H_KV,
                   "N_q": N_Q, "N_k": N_K, "d": d, "causal": causal}
            ok = True
            for name, a, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
                err = (a.float() - r).abs().max().item()
                bound = 2 * (lo.float() - r).abs().max().item() + 1e-5
                row[f"{name}_err"], row[f"{name}_bound"] = f"{err:.3e}", f"{bound:.3e}"
                ok = ok and err <= bound and bool(torch.isfinite(a).all())
            row["dkdv_bitwise_repeat"] = bool(torch.equal(got[1], again[1]) and torch.equal(got[2], again[2]))
            row["ok"] = ok
            rows.append(row)
            print(row, flush=True)
    return rows


def _qkv(B, H, N, d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, N, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4)]


def _sdpa_cudnn(q, k, v, do, causal):
    from flashlab.lab.bench import fused_attention_torch

    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    fwd = lambda: fused_attention_torch(q, k, v, causal, "cudnn")  # noqa: E731
    return fwd, lambda: torch.autograd.grad(fwd(), (q, k, v), do)


def _flashlab(q, k, v, do, causal, fwd_impl, bwd_name):
    scale = q.shape[-1] ** -0.5
    forward, backward = _forward(fwd_impl), _backward(bwd_name)
    o, lse2 = forward(q, k, v, causal, scale)

    def both():
        o_, lse_ = forward(q, k, v, causal, scale)
        return backward(do, q, k, v, o_, lse_, causal, scale)

    return (lambda: forward(q, k, v, causal, scale)), both, (lambda: backward(do, q, k, v, o, lse2, causal, scale))


CONTENDERS = [("sdpa_cudnn", None, None), ("flashlab", "triton", "teaching_det"), ("flashlab", "gluon", "gluon")]


def _shapes():
    """The bars' shapes, most telling first (a time limit keeps the rows measured so far)."""
    for n in sorted(NS, reverse=True):
        for d in (128, 64):
            for causal in (False, True):
                B, H = paper_shape(n, d)
                yield B, H, n, d, causal
    B, H, n, d = LONG
    yield B, H, n, d, True


def speed(out: Path | None = None) -> list[dict[str, object]]:
    """Forward, backward and both for every contender at every shape (see module docstring);
    with ``out``, the record is rewritten after each shape."""
    from flashlab.lab.bench import ceilings

    rows = [{"impl": "ceiling", "forward": "", "backward": "", "d": "", "causal": "", "N": "", "B": "", "H": "",
             "pass": c["ceiling"], "ms": c["ms"], "tflops": round(c["value"] / 1e12, 1)} for c in ceilings()]
    for B, H, n, d, causal in _shapes():
        q, k, v, do = _qkv(B, H, n, d)
        flops = attention_flops(n, n, d, causal=causal, batch=B * H)
        for impl, fwd_impl, bwd_name in CONTENDERS:
            with torch.no_grad():
                try:
                    if impl == "sdpa_cudnn":
                        fwd, both = _sdpa_cudnn(q, k, v, do, causal)
                        bwd = None
                    else:
                        fwd, both, bwd = _flashlab(q, k, v, do, causal, fwd_impl, bwd_name)
                    with torch.enable_grad():
                        times = {"fwd": gpu_ms(fwd), "fwdbwd": gpu_ms(both)}
                    if bwd is not None:
                        times["bwd"] = gpu_ms(bwd)
                except Exception as exc:  # a backend that refuses a shape: reported, the rest go on
                    print(f"{impl} {fwd_impl} {bwd_name} d={d} N={n} causal={causal}: {type(exc).__name__}: {exc}"[:300])
                    continue
            for pass_name, ms in times.items():
                factor = PASS_FLOPS[pass_name]
                row = {"impl": impl, "forward": fwd_impl or "", "backward": bwd_name or "", "d": d, "causal": causal,
                       "N": n, "B": B, "H": H, "pass": pass_name, "ms": round(ms, 5),
                       "tflops": round(factor * flops / (ms * 1e-3) / 1e12, 1)}
                rows.append(row)
                print(row, flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()
        if out is not None:
            record("backward_speed", rows, out)
    return rows


def configs() -> list[dict[str, object]]:
    """The one-pass backward alone, each autotuning candidate, at N = 16k (papers' shape)."""
    from flashlab.lab.variants import backward_one_pass as kh
    from flashlab.kernels.forward import forward
    from flashlab.lab import compile_report

    rows = []
    for d in (64, 128):
        for causal in (False, True):
            B, H = paper_shape(16384, d)
            q, k, v, do = _qkv(B, H, 16384, d)
            scale = d**-0.5
            o, lse2 = forward(q, k, v, causal, scale)
            flops = 2.5 * attention_flops(16384, 16384, d, causal=causal, batch=B * H)
            for cfg in kh.CANDIDATES:
                try:
                    ms = gpu_ms(lambda: kh.backward(do, q, k, v, o, lse2, causal, scale, cfg))
                    row = {"d": d, "causal": causal, "config": "x".join(map(str, cfg)), "ms": round(ms, 5),
                           "tflops": round(flops / (ms * 1e-3) / 1e12, 1), "status": "ok"}
                except Exception as exc:
                    row = {"d": d, "causal": causal, "config": "x".join(map(str, cfg)), "ms": "", "tflops": "",
                           "status": f"{type(exc).__name__}"}
                row.update(registers="", stack_bytes="", shared_bytes="")
                if d == 128 and not causal:  # what this Triton compiles the configuration to
                    try:
                        rep = compile_report.report("backward_one_pass", cfg, d)
                        row.update({key: rep.get(key, "") for key in ("registers", "stack_bytes", "shared_bytes")})
                    except Exception as exc:
                        row["registers"] = f"{type(exc).__name__}"
                rows.append(row)
                print(row, flush=True)
    return rows


def _compile_one_pass(d: int, causal: bool, config: tuple) -> None:
    """Compile one configuration of the one-pass backward (a precompile worker)."""
    from flashlab.kernels.forward import forward
    from flashlab.lab.variants import backward_one_pass as kh

    q, k, v, do = (torch.randn(1, HEADS_X_D // d, 256, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse2 = forward(q, k, v, causal, d**-0.5, (64, 64, 4, 2))  # any configuration: only lse is read
    kh.backward(do, q, k, v, o, lse2, causal, d**-0.5, config)


def _precompile_one_pass() -> None:
    """The Triton forward's candidates and every one-pass configuration (backward_configs times them all)."""
    from flashlab.lab.bench import precompile_kernels
    from flashlab.lab.variants import backward_one_pass as kh

    precompile_kernels((64, 128), passes=("fwd",))
    precompile([("flashlab.lab.experiments.backward:_compile_one_pass", (d, c, cfg))
                for d in (64, 128) for c in (False, True) for cfg in kh.CANDIDATES])


def run_check(out: Path) -> list[Path]:
    from flashlab.lab.bench import precompile_kernels

    precompile_kernels((64, 128), passes=("fwd",))
    return record("backward_check", check(), out)


def run_configs(out: Path) -> list[Path]:
    _precompile_one_pass()
    return record("backward_configs", configs(), out)


def run_speed(out: Path) -> list[Path]:
    from flashlab.lab.bench import precompile_kernels

    precompile_kernels((64, 128))
    return record("backward_speed", speed(out), out)
