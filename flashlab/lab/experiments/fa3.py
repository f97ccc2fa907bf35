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

3. Ablation (:func:`ablation`, FA3 §4.3): at the paper's shape (d = 128, N = 8192, B N = 16384
   tokens, H = 16, bf16, non-causal and causal; and the paper's own (B, N, H) = (4, 8448, 16) in
   fp16), each schedule of :mod:`flashlab.lab.variants.fa3_schedules` (complete, no_pingpong,
   no_overlap, no_warp_specialization) beside cuDNN and a bf16 8192^3 ``torch.matmul`` (the
   ceiling), in one process; with the paper's TFLOP/s (:data:`PAPER_ABLATION`) and the chapter-6
   simulator's prediction (:func:`simulated`) for each schedule.
4. FP8 (:func:`fp8_speed`, :func:`fp8_correctness`, :func:`fp8_rmse`): the Gluon FP8 forward
   (:mod:`flashlab.kernels.fa3_fp8`) against the float64 reference of its dequantised inputs and
   the Triton FP8 kernel (``flashlab_fp8``) on the same inputs, the race check, its speed beside
   flashlab's bf16 forward, the Gluon bf16 forward and cuDNN (d = 128, N = 4096 ... 16384), and its
   RMSE on outlier inputs against the per-tensor-scaled baseline.

5. Switches (:func:`switches`, ``python -m flashlab.lab.experiments fa3switches --out results``):
   the forward with each setting of ``pingpong`` and ``overlap`` beside cuDNN (at d = 64 without
   ping-pong also with three consumer warpgroups, ``_3wg``), d = 64 and 128, N = 4096 and 16384,
   causal and not, in :data:`SWITCH_ROUNDS` rotated rounds; writes ``fa3_switches_<gpu>``. The
   FP8 kernel's the same way (:func:`fp8_switches`, ``fp8switches``), beside the bf16 forward and
   the Triton FP8 kernel; writes ``fa3_fp8_switches_<gpu>``.

Writes ``fa3_correctness_<gpu>``, ``fa3_speed_<gpu>``, ``fa3_ablation_<gpu>``, ``fa3_fp8_<gpu>`` and
``fa3_fp8_rmse_<gpu>`` (.csv/.json) into ``--out`` (``--parts`` picks some) and prints tables. A
case that fails is recorded with its error and the run goes on.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

from flashlab.kernels._common import LN2
from flashlab.kernels.fa3 import consumer_count, fa3_forward, forward
from flashlab.kernels.fa3 import switches as default_switches
from flashlab.lab.measure import gpu_slug, isolated, paper_shape, provenance, time_ms
from flashlab.reference import attention, attention_flops

__all__ = ["ABLATION_SHAPES", "CASES", "FP8_CASES", "PAPER_ABLATION", "TOLERANCE", "ablation", "check_case",
           "fp8_check_case", "fp8_correctness", "fp8_emulated_rmse", "fp8_race_check", "fp8_rmse", "fp8_speed",
           "main", "race_check", "simulated", "speed", "switch_name", "switch_rows", "switches", "torch_attention"]

# (B, H, N_q, N_k, d, causal, dtype): both dtypes and every head dimension, masked edges (N not
# a multiple of 128), N_q != N_k both ways (bottom-right causal alignment; rows that see no key).
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
    (1, 3, 1531, 1531, 256, True, torch.bfloat16),
    (2, 2, 777, 1000, 256, False, torch.float16),
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


def _run(q, k, v, causal: bool, pingpong: bool | None, schedule: str | None, out=None,
         overlap: bool | None = None, consumers: int | None = None):
    """(o, lse2) of the teaching kernel (``pingpong``, ``overlap``, ``consumers`` None: the head
    dimension's default), or of an ablation schedule (fa3_schedules) when named."""
    if schedule is None:
        return forward(q, k, v, causal, pingpong=pingpong, overlap=overlap, consumers=consumers, out=out)
    if overlap is not None or consumers is not None:
        raise ValueError(f"overlap and consumers are the teaching kernel's; got overlap = {overlap}, "
                         f"consumers = {consumers} with schedule = {schedule!r}")
    from flashlab.lab.variants.fa3_schedules import forward as scheduled

    return scheduled(q, k, v, causal, schedule=schedule, out=out)


def check_case(B: int, H: int, n_q: int, n_k: int, d: int, causal: bool, dtype: torch.dtype,
               seed: int = 0, pingpong: bool | None = None, schedule: str | None = None,
               overlap: bool | None = None, consumers: int | None = None) -> dict[str, object]:
    """One correctness case on the GPU: errors of o and lse and their bounds, and ``ok``
    (``pingpong`` None: the head dimension's default, :data:`flashlab.kernels.fa3.SWITCHES`;
    ``schedule``: one of fa3_schedules.SCHEDULES instead of the teaching kernel; ``overlap``: the
    teaching kernel's other switch, and ``consumers`` its consumer warpgroups, None for the
    default)."""
    q, k, v = _inputs((B, H, n_q, d), (B, H, n_k, d), dtype, seed)
    o_ref, lse_ref = attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), causal=causal,
                               return_lse=True)
    o_ref, lse_ref = torch.from_numpy(o_ref), torch.from_numpy(lse_ref)
    qc, kc, vc = (t.cuda() for t in (q, k, v))
    if schedule is None and overlap is None and consumers is None:
        o, lse = fa3_forward(qc, kc, vc, causal=causal, pingpong=pingpong)
    else:
        o, lse2 = _run(qc, kc, vc, causal, pingpong, schedule, overlap=overlap, consumers=consumers)
        lse = lse2 * LN2
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
               dtype: torch.dtype = torch.bfloat16, pingpong: bool | None = None,
               schedule: str | None = None, overlap: bool | None = None,
               consumers: int | None = None) -> dict[str, object]:
    """The same inputs twice give bit-identical o and lse; a NaN-filled output buffer is fully
    overwritten (every tile, every warpgroup, the ragged last one included)."""
    q, k, v = (t.cuda() for t in _inputs((B, H, n, d), (B, H, n, d), dtype, 1))
    o1, lse1 = _run(q, k, v, causal, pingpong, schedule, overlap=overlap, consumers=consumers)
    poisoned = torch.full_like(q, float("nan"))
    o2, lse2 = _run(q, k, v, causal, pingpong, schedule, out=poisoned, overlap=overlap, consumers=consumers)
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


def smoke(pingpong: bool | None) -> dict[str, object]:
    """One small causal case: does the kernel finish (no barrier left waiting) and agree?"""
    return check_case(1, 2, 300, 300, 128, True, torch.bfloat16, pingpong=pingpong)


def _switch_columns(d: int, pingpong: bool | None, causal: bool) -> dict[str, object]:
    """The schedule a correctness row ran with: ``pingpong`` as asked, the rest d's default."""
    pingpong, overlap = default_switches(d, pingpong)
    return {"pingpong": pingpong, "overlap": overlap, "consumers": consumer_count(d, pingpong, overlap, causal)}


def correctness(pingpong: bool | None = None) -> list[dict[str, object]]:
    """Every case of :data:`CASES`, then the race check at d = 128 and 64: one row each
    (``pingpong`` None: each head dimension's default, which the rows name)."""
    rows = []
    for B, H, n_q, n_k, d, causal, dtype in CASES:
        row: dict[str, object] = {"case": "attention", **_switch_columns(d, pingpong, causal), "B": B, "H": H,
                                  "N_q": n_q, "N_k": n_k, "d": d, "causal": causal,
                                  "dtype": str(dtype).removeprefix("torch.")}
        print("start", _line(row), flush=True)  # a case that hangs is the last one started
        try:
            row.update(check_case(B, H, n_q, n_k, d, causal, dtype, pingpong=pingpong), status="ok")
        except Exception as exc:  # record and go on
            traceback.print_exc()
            row.update(ok=False, status=f"{type(exc).__name__}: {str(exc)[:160]}")
        rows.append(row)
        print(_line(row), flush=True)
    for d in (128, 64):
        row = {"case": "race", **_switch_columns(d, pingpong, True), "B": 2, "H": 4, "N_q": 1531, "N_k": 1531, "d": d,
               "causal": True, "dtype": "bfloat16"}
        print("start", _line(row), flush=True)
        try:
            row.update(race_check(d=d, pingpong=pingpong), status="ok")
        except Exception as exc:
            traceback.print_exc()
            row.update(ok=False, status=f"{type(exc).__name__}: {str(exc)[:160]}")
        rows.append(row)
        print(_line(row), flush=True)
    return rows + schedule_correctness()


SCHEDULE_CASES = [CASES[1], CASES[2], CASES[6], CASES[8]]  # causal, d = 64 and 128, N_q != N_k both ways


def schedule_correctness() -> list[dict[str, object]]:
    """The ablation schedules that are not the teaching kernel's constexprs alone (no_overlap,
    no_warp_specialization) on :data:`SCHEDULE_CASES` and the race check at d = 128: one row each."""
    rows = []
    for schedule in ("no_overlap", "no_warp_specialization"):
        for case in SCHEDULE_CASES + [None]:
            row: dict[str, object] = {"case": "race" if case is None else "attention", "schedule": schedule}
            if case is not None:
                B, H, n_q, n_k, d, causal, dtype = case
                row.update(B=B, H=H, N_q=n_q, N_k=n_k, d=d, causal=causal, dtype=str(dtype).removeprefix("torch."))
            print("start", _line(row), flush=True)
            try:
                got = race_check(schedule=schedule) if case is None else check_case(*case, schedule=schedule)
                row.update(got, status="ok")
            except Exception as exc:
                traceback.print_exc()
                row.update(ok=False, status=f"{type(exc).__name__}: {str(exc)[:160]}")
            rows.append(row)
            print(_line(row), flush=True)
    return rows


# ------------------------------------------------------------------------------------ ablation
# (dtype, B, H, N, causal, label): the chapter's shape (B N = 16k tokens, H = 2048 / d) and the paper's own
ABLATION_SHAPES: list[tuple[torch.dtype, int, int, int, bool, str]] = [
    (torch.bfloat16, 2, 16, 8192, False, "chapter"),
    (torch.bfloat16, 2, 16, 8192, True, "chapter"),
    (torch.float16, 4, 16, 8448, False, "paper"),
]
# FA3 paper (Shah et al. 2024), §4.3 ablation, Table 2: non-causal FP16, (B, N, H, d) = (4, 8448, 16, 128),
# H100 SXM5, TFLOP/s. The paper ablates the GEMM-softmax pipelining and warp specialisation, not ping-pong.
PAPER_ABLATION = {"complete": 661.0, "no_overlap": 582.0, "no_warp_specialization": 570.0}
PAPER_SOURCE = "FA3 paper §4.3 Table 2 (H100 SXM5, fp16, B=4 N=8448 H=16 d=128, non-causal)"


def simulated(n_blocks: int = 64) -> dict[str, dict[str, object]]:
    """The chapter-6 simulator's prediction (:mod:`flashlab.sim.events`) for each ablation schedule:
    tensor-core utilisation of ``n_blocks`` key blocks of this kernel's tiles (Br = 64, Bc = 128,
    d = 128, H200 rates, 2 ring stages), and its ratio to the complete schedule's."""
    from flashlab.hardware import H200
    from flashlab.lab.variants.fa3_schedules import SIMULATED
    from flashlab.sim import events

    tile = events.Tile(Br=64, Bc=128, d=128, gpu=H200)
    util = {}
    for schedule, (name, flags) in SIMULATED.items():
        stages = 2
        built = events._build(name, tile, n_blocks, flags["consumers"], stages, flags["intra"], flags["producer"],
                              flags["barrier"])
        util[schedule] = (name, built.run().utilisation("tensor"))
    full = util["complete"][1]
    return {k: {"sim_schedule": name, "sim_tensor_util": round(u, 3), "sim_ratio": round(u / full, 3)}
            for k, (name, u) in util.items()}


def _matmul_ceiling() -> float:
    """TFLOP/s of a bf16 8192^3 torch.matmul on random data (the GPU's dense bf16 ceiling)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(8192, 8192, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    t = time_ms(lambda: a @ b, "cuda")
    return 2 * 8192**3 / (t * 1e-3) / 1e12


SWITCH_ROUNDS = 5
SWITCH_N = (4096, 16384)


def switch_name(pingpong: bool, overlap: bool, consumers: int = 2) -> str:
    """The record's name for a setting of :func:`flashlab.kernels.fa3.forward`'s switches; three
    consumer warpgroups add ``_3wg``."""
    return (("pingpong" if pingpong else "no_pingpong") + ("_overlap" if overlap else "_no_overlap")
            + ("_3wg" if consumers == 3 else ""))


def default_switch_name(d: int, causal: bool) -> str:
    """The record's name for what :func:`flashlab.kernels.fa3.forward` runs at head dimension ``d``
    by default, with or without the mask (:data:`flashlab.kernels.fa3.SWITCHES`,
    :data:`flashlab.kernels.fa3.CONSUMERS`)."""
    pingpong, overlap = default_switches(d)
    return switch_name(pingpong, overlap, consumer_count(d, pingpong, overlap, causal))


def switch_rows(times: dict[str, list[float]], d: int, n: int, causal: bool, flops: float,
                default: str | None = None) -> list[dict[str, object]]:
    """Rows of one shape of :func:`switches` from each contender's times over the rounds
    (:func:`~flashlab.lab.experiments.round_summary`), with the ratio of the default setting's
    median to each (``vs_default``; above 1: faster than it). ``times`` must hold the default
    setting: ``default``, or that of head dimension ``d`` with or without the mask
    (:func:`default_switch_name`)."""
    from flashlab.lab.experiments import round_summary

    default = default or default_switch_name(d, causal)
    if default not in times:
        raise ValueError(f"times must hold the default setting {default!r} of d = {d}, causal = {causal}; "
                         f"got {sorted(times)}")
    summaries = {name: round_summary(ts, flops) for name, ts in times.items()}
    default_ms = summaries[default]["ms"]
    return [{"impl": name, "d": d, "N": n, "causal": causal, **summary,
             "vs_default": round(default_ms / summary["ms"], 3)} for name, summary in summaries.items()]


def switch_contenders(q, k, v, do, causal: bool) -> dict[str, object]:
    """The contenders of one shape of :func:`switches`: cuDNN's forward and
    :func:`flashlab.kernels.fa3.forward` under each setting of its switches (at d = 64 with both
    off, with two and three consumer warpgroups), named by :func:`switch_name`."""
    from flashlab.lab.experiments.backward import _sdpa_cudnn

    d = q.shape[-1]
    fns = {"cudnn": _sdpa_cudnn(q, k, v, do, causal)[0]}
    for pingpong in (True, False):
        for overlap in (True, False):
            for n_wg in (2, 3) if d == 64 and not (pingpong or overlap) else (2,):
                fns[switch_name(pingpong, overlap, n_wg)] = (
                    lambda p=pingpong, o=overlap, w=n_wg: forward(q, k, v, causal, pingpong=p, overlap=o, consumers=w))
    return fns


def fp8_switch_contenders(q, k, v, do, causal: bool) -> dict[str, object]:
    """The contenders of one shape of :func:`fp8_switches`: cuDNN and the Gluon forward in bf16
    (its default), the Triton FP8 kernel, and the Gluon FP8 kernel under each setting of its two
    switches with two consumer warpgroups (``fp8_`` + :func:`switch_name`; ping-pong's turns are
    for two), its default build (:data:`flashlab.kernels.fa3_fp8.SWITCHES` and ``CONSUMERS``: at
    d = 64 three consumers, ``_3wg``), and that default with conditional rescaling (``_theta2``,
    ``_theta8``: ``rescale_threshold`` 2 and 8) or with software exp2 on a share of P
    (``_poly0.125``, ``_poly0.25``, ``_poly0.5``: ``poly_fraction`` 1/8, 1/4, 1/2; and 1/2 with
    ping-pong on, two consumers), on inputs quantised once (Q, K per :data:`FP8_BLOCK` rows, V
    per head). The Gluon FP8 time includes V's copy into its layout."""
    from flashlab.kernels.fa3_fp8 import CONSUMERS as FP8_CONSUMERS
    from flashlab.kernels.fa3_fp8 import SWITCHES as FP8_SWITCHES
    from flashlab.kernels.fa3_fp8 import forward as fp8_forward
    from flashlab.kernels.fp8 import flash_attention_fp8, quantize_qkv
    from flashlab.lab.experiments.backward import _sdpa_cudnn

    pre = quantize_qkv(q, k, v, block=FP8_BLOCK, v_block=None)
    fns = {"cudnn": _sdpa_cudnn(q, k, v, do, causal)[0], "bf16_default": lambda: forward(q, k, v, causal),
           "triton_fp8": lambda: flash_attention_fp8(**pre, causal=causal)}
    for pingpong in (True, False):
        for overlap in (True, False):
            fns["fp8_" + switch_name(pingpong, overlap)] = (
                lambda p=pingpong, o=overlap: fp8_forward(**pre, causal=causal, pingpong=p, overlap=o, consumers=2))
    p0, o0 = FP8_SWITCHES[q.shape[-1]]
    w0 = FP8_CONSUMERS[q.shape[-1]]
    default = "fp8_" + switch_name(p0, o0, w0)
    fns[default] = lambda: fp8_forward(**pre, causal=causal, pingpong=p0, overlap=o0, consumers=w0)
    for theta in (2, 8):
        fns[default + f"_theta{theta}"] = (
            lambda t=theta: fp8_forward(**pre, causal=causal, pingpong=p0, overlap=o0, consumers=w0,
                                        rescale_threshold=t))
    for pingpong, fraction in ((p0, 0.125), (p0, 0.25), (p0, 0.5), (True, 0.5)):  # software exp2 (FA4)
        w = 2 if pingpong else w0
        fns["fp8_" + switch_name(pingpong, o0, w) + f"_poly{fraction:g}"] = (
            lambda p=pingpong, f=fraction, w=w: fp8_forward(**pre, causal=causal, pingpong=p, overlap=o0,
                                                            consumers=w, poly_fraction=f))
    return fns


def _time_switches(contenders, default, name: str, out: str | Path, per_length: bool = False,
                   lengths: tuple[int, ...] | None = None) -> list[Path]:
    """Time ``contenders(q, k, v, do, causal)`` at every shape of :data:`SPEED_D` x ``lengths``
    (default :data:`SWITCH_N`) x (not causal, causal) in :data:`SWITCH_ROUNDS` rotated rounds,
    rows by :func:`switch_rows` against ``default(d, causal)``, recorded as ``name`` under
    ``out``; ``per_length``: one record per length instead, ``<name>_n<N>``, longest first, each
    written as soon as its shapes are timed (so that a time limit keeps those done)."""
    from flashlab.lab.experiments import in_rounds, record, require_gpu
    from flashlab.lab.experiments.backward import _qkv

    lengths = SWITCH_N if lengths is None else lengths
    if per_length:
        return [path for n in sorted(lengths, reverse=True)
                for path in _time_switches(contenders, default, f"{name}_n{n}", out, lengths=(n,))]
    require_gpu()
    rows: list[dict[str, object]] = []
    for d in SPEED_D:
        for n in lengths:
            B, H = paper_shape(n, d)
            q, k, v, do = _qkv(B, H, n, d)
            for causal in (False, True):
                with torch.no_grad():
                    times = in_rounds(contenders(q, k, v, do, causal), SWITCH_ROUNDS)
                flops = attention_flops(n, n, d, causal=causal, batch=B * H)
                for row in switch_rows(times, d, n, causal, flops, default(d, causal)):
                    rows.append(row)
                    print(_line(row), flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()
    return record(name, rows, out)


def switches(out: str | Path) -> list[Path]:
    """The forward under each schedule switch (module docstring, part 5), recorded under ``out``.
    :func:`ablation` times the schedules of the lab's variant kernel at the paper's shape; this
    times the switches of the kernel the package runs, :func:`flashlab.kernels.fa3.forward`, at
    the bench's shapes, where a change of its defaults would be decided."""
    return _time_switches(switch_contenders, default_switch_name, "fa3_switches", out)


def fp8_switches(out: str | Path) -> list[Path]:
    """The FP8 forward under each setting of its switches, beside the bf16 forward, the Triton FP8
    kernel and cuDNN (``python -m flashlab.lab.experiments fp8switches --out results``), at the
    shapes of :func:`switches`; ``vs_default`` against the FP8 kernel's default setting
    (:data:`flashlab.kernels.fa3_fp8.SWITCHES` and ``CONSUMERS``). Writes ``fa3_fp8_switches_<gpu>``."""
    from flashlab.kernels.fa3_fp8 import CONSUMERS as FP8_CONSUMERS
    from flashlab.kernels.fa3_fp8 import SWITCHES as FP8_SWITCHES

    return _time_switches(fp8_switch_contenders,
                          lambda d, causal: "fp8_" + switch_name(*FP8_SWITCHES[d], FP8_CONSUMERS[d]),
                          "fa3_fp8_switches", out)


def ablation() -> list[dict[str, object]]:
    """Each schedule of fa3_schedules at :data:`ABLATION_SHAPES`, beside cuDNN, in this process;
    a matmul ceiling row first. Columns: TFLOP/s, ratio to the complete kernel in the same shape,
    the paper's TFLOP/s and ratio, the simulator's ratio; max_err over sampled rows vs fp32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    from flashlab.lab.variants.fa3_schedules import SCHEDULES, forward as scheduled

    def cudnn(q, k, v, causal):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)

    sim = simulated()
    ceiling = _matmul_ceiling()
    rows: list[dict[str, object]] = [{"impl": "matmul_bf16_8192", "label": "ceiling", "tflops": round(ceiling, 1),
                                      "status": "ok"}]
    print(_line(rows[0]), flush=True)
    impls = {name: (lambda q, k, v, causal, name=name: scheduled(q, k, v, causal, schedule=name)[0])
             for name in SCHEDULES} | {"cudnn": cudnn}
    for dtype, B, H, n, causal, label in ABLATION_SHAPES:
        d = 128
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(B, H, n, d, generator=g).to("cuda", dtype) for _ in range(3))
        sample = _row_sample(n).cuda()
        ref = _reference_rows(q, k, v, causal, sample)
        flops = attention_flops(n, n, d, causal=causal, batch=B * H)
        shape_rows = []
        for name, fn in impls.items():
            row: dict[str, object] = {"impl": "fa3" if name in SCHEDULES else name, "schedule": name, "label": label,
                                      "dtype": str(dtype).removeprefix("torch."), "B": B, "H": H, "N": n, "d": d,
                                      "causal": causal}
            try:
                with torch.no_grad():
                    o = fn(q, k, v, causal)
                    err = (o[:, :, sample].float() - ref).abs().max().item()
                    t = time_ms(lambda fn=fn: fn(q, k, v, causal), "cuda")
                row.update(ms=round(t, 4), tflops=round(flops / (t * 1e-3) / 1e12, 1), max_err=f"{err:.2e}",
                           status="ok")
            except Exception as exc:  # record and go on
                row.update(ms="", tflops="", max_err="", status=f"{type(exc).__name__}: {str(exc)[:160]}")
            shape_rows.append(row)
        full = next((r["tflops"] for r in shape_rows if r["schedule"] == "complete" and r["status"] == "ok"), None)
        for row in shape_rows:
            name = row["schedule"]
            ok = row["status"] == "ok" and full
            row["ratio"] = round(row["tflops"] / full, 3) if ok else ""
            row["of_ceiling"] = round(row["tflops"] / ceiling, 3) if row["status"] == "ok" else ""
            paper = PAPER_ABLATION.get(name)
            row["paper_tflops"] = paper or ""
            row["paper_ratio"] = round(paper / PAPER_ABLATION["complete"], 3) if paper else ""
            row.update(sim.get(name, {"sim_schedule": "", "sim_tensor_util": "", "sim_ratio": ""}))
            rows.append(row)
            print(_line(row), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    rows.append({"impl": "paper", "label": PAPER_SOURCE, "status": "quoted"})
    return rows


def _ablation_table(rows: list[dict[str, object]]) -> str:
    lines = [f"{'shape':>22} {'schedule':>24} {'TFLOP/s':>8} {'ratio':>6} {'paper':>6} {'sim':>6}"]
    for r in rows:
        if r.get("schedule"):
            shape = f"{r['dtype']} N={r['N']} {'causal' if r['causal'] else 'full'}"
            lines.append(f"{shape:>22} {r['schedule']:>24} {r['tflops']!s:>8} {r['ratio']!s:>6} "
                         f"{r['paper_ratio']!s:>6} {r['sim_ratio']!s:>6}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ FP8
# (B, H, N_q, N_k, d, causal): ragged N, N_q != N_k both ways, d = 64 and 128
FP8_CASES: list[tuple[int, int, int, int, int, bool]] = [
    (2, 3, 1024, 1024, 128, False),
    (2, 3, 1000, 1000, 128, True),
    (1, 4, 1531, 1531, 64, True),
    (1, 2, 777, 1531, 128, True),
    (1, 2, 1531, 777, 128, False),
    (3, 2, 100, 1000, 64, True),
]
FP8_BLOCK = 128  # rows per Q and K descale; V one per head, as FA3 scales V
FP8_SPEED_N = (4096, 8192, 16384)


def _fp8_inputs(B, H, n_q, n_k, d, seed, staircase: float = 0.0, device: str = "cuda"):
    from flashlab.kernels.fp8 import quantize_qkv

    q, k, v = _inputs((B, H, n_q, d), (B, H, n_k, d), torch.bfloat16, seed)
    if staircase:
        q, k = _staircase(q, k, staircase, seed)
    return quantize_qkv(q.to(device), k.to(device), v.to(device), block=FP8_BLOCK, v_block=None)


def _dequantised(pre: dict[str, object]) -> list[np.ndarray]:
    """Q, K, V as float64 arrays of the values the FP8 inputs ``pre`` (:func:`_fp8_inputs`) stand for."""
    from flashlab.kernels.fp8 import dequantize_fp8

    return [dequantize_fp8(pre[x], pre[f"{x}_descale"], pre[f"{x}_block"]).double().cpu().numpy() for x in "qkv"]


def _staircase(q: torch.Tensor, k: torch.Tensor, rise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and K (B, H, N, d) whose scores, in log2 units, are 4 + chapter 7's staircase row
    (:func:`flashlab.reference.rescale.staircase_row`, blocks of FP8_BLOCK keys) in every row:
    key block t peaks at 4 + ``rise * t``, so it passes a reference maximum set s blocks earlier
    by s * rise, in every row of a warpgroup at once."""
    from flashlab.reference.rescale import staircase_row

    d, n_k = q.shape[-1], k.shape[2]
    unit = d**-0.5 * math.log2(math.e)  # a score of 1 in q k^T is this many log2 units
    row = staircase_row(-(-n_k // FP8_BLOCK), rise, FP8_BLOCK, seed)[:n_k]  # (N_k,)
    q, k = torch.zeros_like(q), torch.zeros_like(k)
    q[..., 0] = 1.0
    k[..., 0] = torch.from_numpy((4.0 + row) / unit).to(k.dtype)  # positive, largest first in a block
    return q, k


def fp8_check_case(B: int, H: int, n_q: int, n_k: int, d: int, causal: bool, seed: int = 0,
                   pingpong: bool | None = None, overlap: bool | None = None,
                   rescale_threshold: float | None = None, staircase: float = 0.0,
                   poly_fraction: float | None = None, p_smem: bool | None = None,
                   consumers: int | None = None, l_mma: bool | None = None) -> dict[str, object]:
    """The Gluon FP8 forward against float64 attention of its dequantised inputs (RMSE), beside the
    Triton FP8 kernel on the same inputs and beside an emulation of the Gluon kernel's own rounding
    of P (:func:`fp8_emulated_rmse`); lse against the reference's. ok: RMSE at most 1.25x the
    Triton kernel's + 1e-4 (rescaling at every block) or at most 1.1x the emulation's + 1e-5
    (conditional rescaling, which loses up to 2x against rescaling at every block on inputs
    built against it), lse within 1e-3 relative, -inf exactly where a row sees no key (with
    ``l_mma``, whose l sums the rounded P, up to ln 2 log2(1 + 2^-4 + N_k 2^-18) more).
    ``pingpong``, ``overlap``: the kernel's switches (None: fa3_fp8.SWITCHES);
    ``rescale_threshold``: conditional rescaling (None: rescale at every block); ``poly_fraction``:
    the share of P's exp2 in software (None: fa3_fp8.POLY_FRACTION); ``p_smem``: P through shared
    memory at Bc = 256 (None: fa3_fp8.P_SMEM); ``consumers``: 2 or 3 (None: fa3_fp8.CONSUMERS); ``l_mma``: l
    summed by the tensor cores (None: fa3_fp8.L_MMA); ``staircase``:
    scores whose block maxima climb this much a key block (:func:`_staircase`), where conditional
    rescaling keeps a stale maximum for blocks on end."""
    from flashlab.kernels import fa3_fp8
    from flashlab.kernels.fp8 import flash_attention_fp8

    pre = _fp8_inputs(B, H, n_q, n_k, d, seed, staircase)
    deq = _dequantised(pre)
    o_ref, lse_ref = attention(*deq, causal=causal, return_lse=True)
    o_ref, lse_ref = torch.from_numpy(o_ref), torch.from_numpy(lse_ref)
    o, lse2 = fa3_fp8.forward(**pre, causal=causal, pingpong=pingpong, overlap=overlap,
                              rescale_threshold=rescale_threshold, poly_fraction=poly_fraction, p_smem=p_smem,
                              consumers=consumers, l_mma=l_mma)
    lse = lse2 * LN2
    o_tri = flash_attention_fp8(**pre, causal=causal)
    rmse = ((o.double().cpu() - o_ref) ** 2).mean().sqrt().item()
    rmse_tri = ((o_tri.double().cpu() - o_ref) ** 2).mean().sqrt().item()
    rmse_emu = fp8_emulated_rmse(deq, o_ref.numpy(), causal, rescale_threshold, p_smem, consumers, l_mma)
    lse = lse.double().cpu()
    finite = torch.isfinite(lse_ref)
    same_inf = bool(torch.equal(finite, torch.isfinite(lse))) and bool((lse[~finite] == float("-inf")).all())
    lse_err = (lse[finite] - lse_ref[finite]).abs().max().item() if finite.any() else 0.0
    lse_bound = 1e-3 * max(1.0, lse_ref[finite].abs().max().item() if finite.any() else 1.0)
    if fa3_fp8._l_mma(d, l_mma, fa3_fp8.config(d, p_smem, consumers)):
        # l sums the e4m3 P: each rounds by at most 2^-4 of itself or half the subnormal step (2^-18
        # of the row's largest P), and a row that sees few keys averages nothing out
        lse_bound += LN2 * math.log2(1 + 2.0**-4 + n_k * 2.0**-18)
    near = rmse <= 1.25 * rmse_tri + 1e-4 if rescale_threshold is None else rmse <= 1.1 * rmse_emu + 1e-5
    ok = bool(torch.isfinite(o.float()).all()) and near and lse_err <= lse_bound and same_inf
    return {"rmse": f"{rmse:.3e}", "rmse_triton_fp8": f"{rmse_tri:.3e}",
            "rmse_emulated": f"{rmse_emu:.3e}", "lse_err": f"{lse_err:.2e}",
            "lse_bound": f"{lse_bound:.2e}", "lse_inf_where_expected": same_inf, "ok": ok}


def fp8_emulated_rmse(qkv: list[np.ndarray], o_ref: np.ndarray, causal: bool,
                      rescale_threshold: float | None = None, p_smem: bool | None = None,
                      consumers: int | None = None, l_mma: bool | None = None) -> float:
    """RMSE against ``o_ref`` (B, H, N_q, d) of :func:`fp8_emulated`'s output; arguments as it
    takes them."""
    q = qkv[0]
    if np.shape(o_ref) != q.shape[:-1] + (qkv[2].shape[-1],):
        raise ValueError(f"o_ref must have shape {q.shape[:-1] + (qkv[2].shape[-1],)} (Q's rows, V's width); "
                         f"got {np.shape(o_ref)}")
    o = fp8_emulated(qkv, causal, rescale_threshold, p_smem, consumers, l_mma).o
    return float(np.sqrt(np.mean((o - o_ref) ** 2)))


def fp8_emulated(qkv: list[np.ndarray], causal: bool, rescale_threshold: float | None = None,
                 p_smem: bool | None = None, consumers: int | None = None, l_mma: bool | None = None):
    """The Gluon FP8 kernel's softmax arithmetic emulated in float64:
    online softmax over its key blocks (Bc of fa3_fp8.config: 256 with ``p_smem``, the d = 128
    default; 128 otherwise) with its
    warpgroups' rule for moving m (64 rows decide together; theta = 0 without a threshold, which
    moves m whenever a row's maximum rises),
    and P = 2^SHIFT exp2(S - m) (SHIFT = 8 - theta, as the kernel takes them from
    ``rescale_threshold``) rounded to e4m3 before P V; with ``l_mma`` (the tensor cores sum l)
    the row sums add that rounded P too. Left out: the kernel's rounding of O to
    bf16 and the FP8 wgmma's own accumulation, so this bounds the size of the kernel's error, not
    its elements. ``qkv``: the dequantised Q (B, H, N_q, d), K and V (B, H, N_k, d) as float64
    arrays. Returns :func:`flashlab.reference.rescale.conditional_attention`'s result (o, and m_ref
    and l in log2 units: lse2 = m_ref + log2 l)."""
    from flashlab.kernels import fa3_fp8
    from flashlab.reference.rescale import conditional_attention

    shape, rule = fa3_fp8.config(qkv[0].shape[-1], p_smem, consumers), fa3_fp8._rescaling(rescale_threshold)
    theta = max(rule["THETA"], 0.0)  # THETA < 0: rescale at every block, the rule of theta = 0
    l_rounded = fa3_fp8._l_mma(qkv[0].shape[-1], l_mma, shape)
    return conditional_attention(*qkv, theta, shape["BLOCK_N"], causal, row_group=shape["BLOCK_M"],
                                 p_format="e4m3", p_shift=rule["SHIFT"], l_of_rounded_p=l_rounded)


def fp8_race_check(B: int = 2, H: int = 4, n: int = 1531, d: int = 128, causal: bool = True,
                   pingpong: bool | None = None, overlap: bool | None = None,
                   rescale_threshold: float | None = None, poly_fraction: float | None = None,
                   p_smem: bool | None = None, consumers: int | None = None,
                   l_mma: bool | None = None) -> dict[str, object]:
    """The FP8 kernel twice on the same inputs gives identical bits; a NaN-filled output is overwritten."""
    from flashlab.kernels.fa3_fp8 import forward as fp8_forward

    pre = _fp8_inputs(B, H, n, n, d, 1)
    switched = dict(causal=causal, pingpong=pingpong, overlap=overlap, rescale_threshold=rescale_threshold,
                    poly_fraction=poly_fraction, p_smem=p_smem, consumers=consumers, l_mma=l_mma)
    o1, lse1 = fp8_forward(**pre, **switched)
    poisoned = torch.full_like(o1, float("nan"))
    o2, lse2 = fp8_forward(**pre, **switched, out=poisoned)
    identical = bool(torch.equal(o1, o2)) and bool(torch.equal(lse1, lse2))
    overwritten = not bool(torch.isnan(o2).any())
    return {"identical": identical, "nan_overwritten": overwritten, "ok": identical and overwritten}


def fp8_correctness() -> list[dict[str, object]]:
    """Every case of :data:`FP8_CASES`, then the race check at d = 128 and 64: one row each."""
    rows = []
    for case in FP8_CASES:
        B, H, n_q, n_k, d, causal = case
        row: dict[str, object] = {"case": "fp8", "B": B, "H": H, "N_q": n_q, "N_k": n_k, "d": d, "causal": causal}
        print("start", _line(row), flush=True)
        try:
            row.update(fp8_check_case(*case), status="ok")
        except Exception as exc:
            traceback.print_exc()
            row.update(ok=False, status=f"{type(exc).__name__}: {str(exc)[:160]}")
        rows.append(row)
        print(_line(row), flush=True)
    for d in (128, 64):
        row = {"case": "fp8_race", "B": 2, "H": 4, "N_q": 1531, "N_k": 1531, "d": d, "causal": True}
        try:
            row.update(fp8_race_check(d=d), status="ok")
        except Exception as exc:
            traceback.print_exc()
            row.update(ok=False, status=f"{type(exc).__name__}: {str(exc)[:160]}")
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def fp8_speed(ns: tuple[int, ...] = FP8_SPEED_N, d: int = 128) -> list[dict[str, object]]:
    """Forward TFLOP/s at d, N in ns (B N = 16k tokens, H = 2048 / d), causal and not, one process:
    the Gluon FP8 kernel (``fa3_fp8``) and the Triton one (``flashlab_fp8``) on inputs quantised
    beforehand (Q, K per 128 rows, V per head), flashlab's bf16 forward (Triton, autotuned), the
    Gluon bf16 forward (``fa3``) and cuDNN; ``vs_flashlab``: TFLOP/s over flashlab's bf16."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    from flashlab.kernels import flash_attention
    from flashlab.kernels.fa3_fp8 import forward as fp8_forward, wgmma_v
    from flashlab.kernels.fp8 import flash_attention_fp8, quantize_qkv

    def cudnn(q, k, v, causal):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)

    rows = []
    for n in ns:
        B, H = paper_shape(n, d)
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(B, H, n, d, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
        pre = quantize_qkv(q, k, v, block=FP8_BLOCK, v_block=None)
        sample = _row_sample(n).cuda()
        for causal in (False, True):
            ref = _reference_rows(q, k, v, causal, sample)
            flops = attention_flops(n, n, d, causal=causal, batch=B * H)
            impls = {
                "fa3_fp8": lambda: fp8_forward(**pre, causal=causal)[0],
                "flashlab_fp8": lambda: flash_attention_fp8(**pre, causal=causal),
                "flashlab": lambda: flash_attention(q, k, v, causal=causal),
                "fa3": lambda: forward(q, k, v, causal)[0],
                "cudnn": lambda: cudnn(q, k, v, causal),
            }
            shape_rows = []
            for name, fn in impls.items():
                row: dict[str, object] = {"impl": name, "dtype": "float8_e4m3fn" if "fp8" in name else "bfloat16",
                                          "d": d, "N": n, "B": B, "H": H, "causal": causal}
                try:
                    with torch.no_grad():
                        o = fn()
                        err = (o[:, :, sample].float() - ref).abs().max().item()
                        t = time_ms(fn, "cuda")
                    row.update(ms=round(t, 4), tflops=round(flops / (t * 1e-3) / 1e12, 1), max_err=f"{err:.2e}",
                               status="ok")
                except Exception as exc:
                    row.update(ms="", tflops="", max_err="", status=f"{type(exc).__name__}: {str(exc)[:160]}")
                shape_rows.append(row)
            base = next((r["tflops"] for r in shape_rows if r["impl"] == "flashlab" and r["status"] == "ok"), None)
            for row in shape_rows:
                row["vs_flashlab"] = round(row["tflops"] / base, 3) if base and row["status"] == "ok" else ""
                rows.append(row)
                print(_line(row), flush=True)
        # the copy of V into the kernel's layout (V^T, keys in P's register order), part of fa3_fp8's time
        t = time_ms(lambda: wgmma_v(pre["v"]), "cuda")
        rows.append({"impl": "fa3_fp8_v_layout", "dtype": "float8_e4m3fn", "d": d, "N": n, "B": B, "H": H,
                     "causal": "", "ms": round(t, 4), "tflops": "", "max_err": "", "status": "ok", "vs_flashlab": ""})
        print(_line(rows[-1]), flush=True)
        del q, k, v, pre
        torch.cuda.empty_cache()
    return rows


def fp8_rmse(seeds: tuple[int, ...] = (0, 1, 2, 3, 4), n: int = 1024, d: int = 128) -> list[dict[str, object]]:
    """RMSE against exact float64 attention on outlier inputs (reference.fp8.outlier_inputs), one row
    per seed and method: the per-tensor-scaled baseline (Triton FP8, one descale per head for Q, K,
    V), the Gluon FP8 kernel per tensor, per block (Q, K per 128 rows, V per head: what it is timed
    with), per block + Hadamard rotation, and the Gluon bf16 forward."""
    from flashlab.kernels.fa3_fp8 import fa3_fp8_forward
    from flashlab.kernels.fp8 import flash_attention_fp8_from, quantize_qkv
    from flashlab.reference.fp8 import outlier_inputs, rmse

    methods = {  # name -> (impl, block, hadamard); None: bf16
        "fp8 per-tensor (baseline, triton)": ("triton", None, False),
        "gluon fp8 per-tensor": ("gluon", None, False),
        "gluon fp8 per-block, V per head": ("gluon", FP8_BLOCK, False),
        "gluon fp8 per-block + hadamard, V per head": ("gluon", FP8_BLOCK, True),
        "gluon bf16": None,
    }
    rows: list[dict[str, object]] = []
    for seed in seeds:
        q, k, v = outlier_inputs(n, d, seed)
        exact = attention(q, k, v)
        qt, kt, vt = (torch.from_numpy(x)[None, None].to("cuda", torch.float32) for x in (q, k, v))
        for method, how in methods.items():
            if how is None:
                o = forward(qt.bfloat16(), kt.bfloat16(), vt.bfloat16(), False)[0]
            elif how[0] == "triton":
                o = flash_attention_fp8_from(qt, kt, vt, block=how[1], hadamard=how[2], seed=seed, v_block=None)
            else:
                o = fa3_fp8_forward(**quantize_qkv(qt, kt, vt, how[1], how[2], seed, v_block=None))[0]
            err = rmse(o[0, 0].double().cpu().numpy(), exact)
            rows.append({"seed": seed, "method": method, "N": n, "d": d, "rmse": float(f"{err:.4e}")})
            print(f"rmse seed={seed} {method:>44}: {err:.3e}", flush=True)
    return rows


PARTS = ("correctness", "speed", "ablation", "fp8")


def _record_isolated(stem: str, target: str, args: tuple, timeout: float, meta: dict, out: str) -> list | None:
    """Run ``target(*args)`` in its own process (:func:`isolated`) and write its rows as ``stem``."""
    from flashlab.lab.results import write

    rows, status = isolated(target, args, timeout=timeout)
    if status != "ok":
        print(f"{stem}: {status}", flush=True)
        rows = [{"part": target, "status": f"run {status}"}]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    for p in write(stem, [{k: r.get(k, "") for k in keys} for r in rows], meta, out):
        print(p, flush=True)
    return rows if status == "ok" else None


def main(argv: list[str] | None = None) -> int:
    """Smoke tests, the correctness cases, then the timings, each in a process of its own with a
    deadline (:func:`flashlab.lab.measure.isolated`): a kernel that hangs on a barrier or faults
    must not end the run or spoil the CUDA context of what follows."""
    from flashlab.lab.results import write

    parser = argparse.ArgumentParser(prog="python -m flashlab.lab.experiments.fa3", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results", help="folder for the CSV and JSON records")
    parser.add_argument("--skip-speed", action="store_true", help="run only the correctness cases")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which parts to run")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("this experiment runs on a CUDA GPU (Hopper, sm_90); none is available")
    command = "python -m flashlab.lab.experiments.fa3 " + " ".join(sys.argv[1:] if argv is None else argv)
    meta = provenance(command.strip())
    print(_line(meta), flush=True)
    tag = gpu_slug()
    parts = [p for p in args.parts if not (args.skip_speed and p != "correctness")]
    ok = True
    working = [True, False]  # the ping-pong settings whose smoke test finished and agreed
    if "correctness" in parts or "speed" in parts:
        rows: list[dict[str, object]] = []
        working = []
        for pingpong in (True, False):
            result, status = isolated("flashlab.lab.experiments.fa3:smoke", (pingpong,), timeout=120)
            rows.append({"case": "smoke", "pingpong": pingpong, **(result or {"ok": False}), "status": status})
            print(_line(rows[-1]), flush=True)
            if status == "ok" and result["ok"]:
                working.append(pingpong)
        if "correctness" in parts and working:
            result, status = isolated("flashlab.lab.experiments.fa3:correctness", (working[0],), timeout=420)
            rows += result if status == "ok" else [{"case": "correctness", "pingpong": working[0], "ok": False,
                                                      "status": status}]
        if "correctness" in parts:
            keys = list(dict.fromkeys(k for r in rows for k in r))
            rows = [{k: r.get(k, "") for k in keys} for r in rows]
            for p in write(f"fa3_correctness_{tag}", rows, meta, args.out):
                print(p, flush=True)
            ok = all(bool(r["ok"]) for r in rows)
            print(f"correctness: {sum(bool(r['ok']) for r in rows)}/{len(rows)} ok", flush=True)
    if "speed" in parts:
        timed, status = isolated("flashlab.lab.experiments.fa3:speed", (SPEED_D, SPEED_N, tuple(working)), timeout=420)
        if status != "ok":
            timed = [{"impl": "all", "d": "", "N": "", "B": "", "H": "", "causal": "", "ms": "", "tflops": "",
                      "max_err": "", "status": f"speed run {status}"}]
        for p in write(f"fa3_speed_{tag}", timed, meta, args.out):
            print(p, flush=True)
        print(_table(timed) if status == "ok" else timed[0]["status"], flush=True)
    if "ablation" in parts:
        rows = _record_isolated(f"fa3_ablation_{tag}", "flashlab.lab.experiments.fa3:ablation", (), 240, meta, args.out)
        if rows:
            print(_ablation_table(rows), flush=True)
    if "fp8" in parts:
        rows = _record_isolated(f"fa3_fp8_correctness_{tag}", "flashlab.lab.experiments.fa3:fp8_correctness", (),
                                180, meta, args.out)
        ok = ok and bool(rows) and all(bool(r["ok"]) for r in rows)
        _record_isolated(f"fa3_fp8_rmse_{tag}", "flashlab.lab.experiments.fa3:fp8_rmse", (), 120, meta, args.out)
        _record_isolated(f"fa3_fp8_{tag}", "flashlab.lab.experiments.fa3:fp8_speed", (), 300, meta, args.out)
    return 0 if ok else 1


if __name__ == "__main__":  # guarded: isolated()'s spawned processes import this module again
    raise SystemExit(main())
