"""FlashAttention-3's forward in Gluon on Hopper: is it right, and how fast beside flashlab and cuDNN?

    python -m flashlab.lab.experiments.fa3 --out results

1. Correctness (:data:`CASES`): :func:`flashlab.kernels.fa3.fa3_forward` against the float64
   reference (:func:`flashlab.reference.attention`) under the flash-attn rule: max |o - o_ref| at
   most twice that of plain PyTorch attention in the same precision, plus 1e-5, and within the
   tolerance policy (bf16 2e-2, fp16 2e-3); lse within 1e-4 relative, -inf exactly where a row
   sees no key. Then the race check: the same inputs twice give bit-identical o and lse, and an
   output buffer filled with NaN is overwritten everywhere.
2. Speed: bf16, d in (128, 64), N in (4096, 8192, 16384), B N = 16384 tokens, H = 2048 / d,
   causal and not: the Gluon kernel (``fa3``: o and log2-unit lse, what the autograd path takes),
   ``flashlab`` (:func:`flashlab.kernels.flash_attention`, autotuned) and ``cudnn`` (torch SDPA,
   cuDNN backend), one after the other in this process. TFLOP/s = attention_flops / median time;
   max_err over :data:`SAMPLE_ROWS` query rows of every head against fp32 attention.

Writes ``fa3_correctness_<gpu>.csv/.json`` and ``fa3_speed_<gpu>.csv/.json`` into ``--out`` and
prints both as tables. A case that fails is recorded with its error and the run goes on.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback

import torch

from flashlab.kernels.fa3 import fa3_forward, forward
from flashlab.lab.measure import gpu_slug, isolated, paper_shape, provenance, time_ms
from flashlab.reference import attention, attention_flops

__all__ = ["CASES", "TOLERANCE", "check_case", "main", "race_check", "speed", "torch_attention"]

# (B, H, N_q, N_k, d, causal, dtype): both dtypes and head dimensions, masked edges (N not a
# multiple of 128), N_q != N_k both ways (bottom-right causal alignment; rows that see no key).
CASES: list[tuple[int, int, int, int, int, bool, torch.dtype]] = [
    (2, 3, 1000, 1000, 128, False, torch.bfloat16),
    (2, 3, 1000, 1000, 128, True, torch.bfloat16),
    (1, 4, 1531, 1531, 64, True, torch.bfloat16),
    (1, 4, 1531, 1531, 64, False, torch.float16),
    (2, 2, 1024, 1024, 128, True, torch.float16),
    (1, 2, 777, 1531, 128, True, torch.bfloat16),
    (1, 2, 1531, 777, 128, True, torch.bfloat16),
    (1, 2, 1531, 777, 64, False, torch.float16),
    (3, 2, 100, 1000, 64, True, torch.float16),
    (2, 2, 1, 333, 128, False, torch.bfloat16),
]
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 2e-3}  # max |o - o_ref| on unit-variance inputs
LSE_RTOL = 1e-4
SAMPLE_ROWS = 256
SPEED_D = (128, 64)
SPEED_N = (4096, 8192, 16384)


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    scale: float | None = None) -> torch.Tensor:
    """Plain attention in q's dtype, S and P materialised: the low-precision baseline of the rule."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale  # (B, H, N_q, N_k)
    if causal:
        n_q, n_k = s.shape[-2:]
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).nan_to_num(0.0).to(q.dtype)  # a row seeing no key -> 0
    return p @ v


def _inputs(shape_q: tuple[int, ...], shape_k: tuple[int, ...], dtype: torch.dtype, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(*shape_q, generator=g).to(dtype)
    k = torch.randn(*shape_k, generator=g).to(dtype)
    v = torch.randn(*shape_k, generator=g).to(dtype)
    return q, k, v


def check_case(B: int, H: int, n_q: int, n_k: int, d: int, causal: bool, dtype: torch.dtype,
               seed: int = 0, pingpong: bool = True) -> dict[str, object]:
    """One correctness case on the GPU: errors of o and lse and their bounds, and ``ok``."""
    q, k, v = _inputs((B, H, n_q, d), (B, H, n_k, d), dtype, seed)
    o_ref, lse_ref = attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), causal=causal,
                               return_lse=True)
    o_ref, lse_ref = torch.from_numpy(o_ref), torch.from_numpy(lse_ref)
    qc, kc, vc = (t.cuda() for t in (q, k, v))
    o, lse = fa3_forward(qc, kc, vc, causal=causal, pingpong=pingpong)
    base = torch_attention(qc, kc, vc, causal)
    err = (o.double().cpu() - o_ref).abs().max().item()
    bound = min(2 * (base.double().cpu() - o_ref).abs().max().item() + 1e-5, TOLERANCE[dtype])
    lse = lse.double().cpu()
    finite = torch.isfinite(lse_ref)
    same_inf = bool(torch.equal(finite, torch.isfinite(lse))) and bool((lse[~finite] == float("-inf")).all())
    lse_err = (lse[finite] - lse_ref[finite]).abs().max().item() if finite.any() else 0.0
    lse_bound = LSE_RTOL * max(1.0, lse_ref[finite].abs().max().item() if finite.any() else 1.0)
    ok = (o.shape == q.shape and o.dtype == dtype and lse.shape == (B, H, n_q) and err <= bound
          and lse_err <= lse_bound and same_inf)
    return {"o_err": f"{err:.2e}", "o_bound": f"{bound:.2e}", "lse_err": f"{lse_err:.2e}",
            "lse_bound": f"{lse_bound:.2e}", "lse_inf_where_expected": same_inf, "ok": ok}


def race_check(B: int = 2, H: int = 4, n: int = 1531, d: int = 128, causal: bool = True,
               dtype: torch.dtype = torch.bfloat16, pingpong: bool = True) -> dict[str, object]:
    """The same inputs twice give bit-identical o and lse; a NaN-filled output buffer is fully
    overwritten (every tile, every warpgroup, the ragged last one included)."""
    q, k, v = (t.cuda() for t in _inputs((B, H, n, d), (B, H, n, d), dtype, 1))
    o1, lse1 = forward(q, k, v, causal, pingpong=pingpong)
    poisoned = torch.full_like(q, float("nan"))
    o2, lse2 = forward(q, k, v, causal, pingpong=pingpong, out=poisoned)
    identical = bool(torch.equal(o1, o2)) and bool(torch.equal(lse1, lse2))
    overwritten = not bool(torch.isnan(o2).any())
    return {"identical": identical, "nan_overwritten": overwritten, "ok": identical and overwritten}


def _row_sample(n: int) -> torch.Tensor:
    """SAMPLE_ROWS query rows spread over [0, n), the first and last included."""
    return torch.linspace(0, n - 1, min(SAMPLE_ROWS, n)).round().long().unique()


def _reference_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, rows: torch.Tensor):
    """fp32 attention (no TF32) for the query rows ``rows`` of every head: (B, H, len(rows), d)."""
    n_q, n_k = q.shape[2], k.shape[2]
    s = (q[:, :, rows].float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        keys = torch.arange(n_k, device=q.device)
        s = s.masked_fill(keys[None, :] > (rows.to(q.device)[:, None] + n_k - n_q), float("-inf"))
    return torch.softmax(s, dim=-1) @ v.float()


def speed(ds: tuple[int, ...] = SPEED_D, ns: tuple[int, ...] = SPEED_N,
          fa3_variants: tuple[bool, ...] = (True, False)) -> list[dict[str, object]]:
    """Median time, TFLOP/s and sampled max error of fa3 (``fa3``: with ping-pong,
    ``fa3_no_pingpong``: without; those in ``fa3_variants``), flashlab and cuDNN for each shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    from flashlab.kernels import flash_attention

    def cudnn(q, k, v, causal):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)

    impls = {}
    if True in fa3_variants:
        impls["fa3"] = lambda q, k, v, causal: forward(q, k, v, causal)[0]
    if False in fa3_variants:
        impls["fa3_no_pingpong"] = lambda q, k, v, causal: forward(q, k, v, causal, pingpong=False)[0]
    impls |= {
        "flashlab": lambda q, k, v, causal: flash_attention(q, k, v, causal=causal),
        "cudnn": cudnn,
    }
    rows = []
    for d in ds:
        for n in ns:
            B, H = paper_shape(n, d)
            q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            sample = _row_sample(n)
            for causal in (False, True):
                ref = _reference_rows(q, k, v, causal, sample.cuda())
                flops = attention_flops(n, n, d, causal=causal, batch=B * H)
                for name, fn in impls.items():
                    row: dict[str, object] = {"impl": name, "d": d, "N": n, "B": B, "H": H, "causal": causal}
                    try:
                        with torch.no_grad():
                            o = fn(q, k, v, causal)
                            err = (o[:, :, sample.cuda()].float() - ref).abs().max().item()
                            t = time_ms(lambda fn=fn, causal=causal: fn(q, k, v, causal), "cuda")
                        row.update(ms=round(t, 4), tflops=round(flops / (t * 1e-3) / 1e12, 1), max_err=f"{err:.2e}",
                                   status="ok")
                    except Exception as exc:  # record and go on: one failing implementation must not end the run
                        row.update(ms="", tflops="", max_err="", status=f"{type(exc).__name__}: {str(exc)[:160]}")
                    rows.append(row)
                    print(_line(row), flush=True)
    return rows


def _line(row: dict[str, object]) -> str:
    return "  ".join(f"{k}={v}" for k, v in row.items())


def _table(rows: list[dict[str, object]]) -> str:
    """Speed rows as one line per shape: TFLOP/s of each implementation and fa3 / cudnn."""
    shapes: dict[tuple, dict[str, object]] = {}
    for r in rows:
        shapes.setdefault((r["d"], r["N"], r["causal"]), {})[r["impl"]] = r["tflops"] if r["status"] == "ok" else "fail"
    names = ("fa3", "fa3_no_pingpong", "flashlab", "cudnn")
    lines = [f"{'d':>4} {'N':>6} {'causal':>6} " + " ".join(f"{n:>15}" for n in names) + f" {'fa3/cudnn':>9}"]
    for (d, n, causal), t in shapes.items():
        ratio = (f"{t['fa3'] / t['cudnn']:.2f}" if isinstance(t.get("fa3"), float) and isinstance(t.get("cudnn"), float)
                 else "-")
        lines.append(f"{d:>4} {n:>6} {causal!s:>6} " + " ".join(f"{t.get(m, '-')!s:>15}" for m in names)
                     + f" {ratio:>9}")
    return "\n".join(lines)


def smoke(pingpong: bool) -> dict[str, object]:
    """One small causal case: does the kernel finish (no barrier left waiting) and agree?"""
    return check_case(1, 2, 300, 300, 128, True, torch.bfloat16, pingpong=pingpong)


def correctness(pingpong: bool = True) -> list[dict[str, object]]:
    """Every case of :data:`CASES`, then the race check at d = 128 and 64: one row each."""
    rows = []
    for B, H, n_q, n_k, d, causal, dtype in CASES:
        row: dict[str, object] = {"case": "attention", "pingpong": pingpong, "B": B, "H": H, "N_q": n_q, "N_k": n_k,
                                  "d": d, "causal": causal, "dtype": str(dtype).removeprefix("torch.")}
        print("start", _line(row), flush=True)  # a case that hangs is the last one started
        try:
            row.update(check_case(B, H, n_q, n_k, d, causal, dtype, pingpong=pingpong), status="ok")
        except Exception as exc:  # record and go on
            traceback.print_exc()
            row.update(ok=False, status=f"{type(exc).__name__}: {str(exc)[:160]}")
        rows.append(row)
        print(_line(row), flush=True)
    for d in (128, 64):
        row = {"case": "race", "pingpong": pingpong, "B": 2, "H": 4, "N_q": 1531, "N_k": 1531, "d": d, "causal": True,
               "dtype": "bfloat16"}
        print("start", _line(row), flush=True)
        try:
            row.update(race_check(d=d, pingpong=pingpong), status="ok")
        except Exception as exc:
            traceback.print_exc()
            row.update(ok=False, status=f"{type(exc).__name__}: {str(exc)[:160]}")
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Smoke tests, the correctness cases, then the timings, each in a process of its own with a
    deadline (:func:`flashlab.lab.measure.isolated`): a kernel that hangs on a barrier or faults
    must not end the run or spoil the CUDA context of what follows."""
    from flashlab.lab.results import write

    parser = argparse.ArgumentParser(prog="python -m flashlab.lab.experiments.fa3", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results", help="folder for the CSV and JSON records")
    parser.add_argument("--skip-speed", action="store_true", help="run only the correctness cases")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("this experiment runs on a CUDA GPU (Hopper, sm_90); none is available")
    command = "python -m flashlab.lab.experiments.fa3 " + " ".join(sys.argv[1:] if argv is None else argv)
    meta = provenance(command.strip())
    print(_line(meta), flush=True)
    tag = gpu_slug()
    rows: list[dict[str, object]] = []
    working = []  # the ping-pong settings whose smoke test finished and agreed
    for pingpong in (True, False):
        result, status = isolated("flashlab.lab.experiments.fa3:smoke", (pingpong,), timeout=120)
        rows.append({"case": "smoke", "pingpong": pingpong, **(result or {"ok": False}), "status": status})
        print(_line(rows[-1]), flush=True)
        if status == "ok" and result["ok"]:
            working.append(pingpong)
    if working:
        result, status = isolated("flashlab.lab.experiments.fa3:correctness", (working[0],), timeout=240)
        rows += result if status == "ok" else [{"case": "correctness", "pingpong": working[0], "ok": False,
                                                  "status": status}]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    rows = [{k: r.get(k, "") for k in keys} for r in rows]
    for p in write(f"fa3_correctness_{tag}", rows, meta, args.out):
        print(p, flush=True)
    ok = all(bool(r["ok"]) for r in rows)
    print(f"correctness: {sum(bool(r['ok']) for r in rows)}/{len(rows)} ok", flush=True)
    if not args.skip_speed:
        timed, status = isolated("flashlab.lab.experiments.fa3:speed", (SPEED_D, SPEED_N, tuple(working)), timeout=420)
        if status != "ok":
            timed = [{"impl": "all", "d": "", "N": "", "B": "", "H": "", "causal": "", "ms": "", "tflops": "",
                      "max_err": "", "status": f"speed run {status}"}]
        for p in write(f"fa3_speed_{tag}", timed, meta, args.out):
            print(p, flush=True)
        print(_table(timed) if status == "ok" else timed[0]["status"], flush=True)
    return 0 if ok else 1


if __name__ == "__main__":  # guarded: isolated()'s spawned processes import this module again
    raise SystemExit(main())
