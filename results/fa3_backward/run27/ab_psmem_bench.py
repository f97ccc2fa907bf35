"""Changes 25 and 26 with the bench's FP8 inputs (run 27): Q and K a descale per 128 rows, so
that at Bc = 256 (change 25) each half of a key block has its own K descale
(``fa3_fp8._fp8_softmax_step``'s HALVES); change 26 is three consumer warpgroups with P through
shared memory at Bc = 128 (``consumers=3``).

    PYTHONPATH=. python results/fa3_backward/run27/ab_psmem_bench.py OUT

(device_run.sh's step ``psmem2``; AB_D=64 for d = 64, 128 by default.) Inputs as flashlab.lab.bench times ``flashlab_gluon_fp8``:
``quantize_qkv(block=FP8_BLOCK, v_block=None)``, V keys-contiguous. Contenders, in
fa3._time_switches' rotated rounds at d = 128 x N = 16k and 4k, causal and not: ``cudnn``,
``bf16`` (the Gluon forward), ``fp8`` (p_smem=False: Bc = 128, P from registers) and
``fp8_psmem`` (p_smem=True), ``fp8_c3`` (consumers=3) and, from run 28, ``fp8_psmem_pp``
(p_smem=True with ping-pong). Before the rounds, each shape records
how far the other two FP8 outputs are from ``fp8``'s (``ab_psmem_bench_check.json``). Writes ab_psmem_bench_n<N>_<gpu>.csv/.json."""
import json
import os
import sys
from pathlib import Path

import torch

import flashlab.lab.experiments as experiments
from flashlab.lab.experiments import fa3 as e

experiments.COMMAND = "PYTHONPATH=. python results/fa3_backward/run27/ab_psmem_bench.py"
CHECKS: list[dict] = []


def contenders(q, k, v, do, causal):
    from flashlab.kernels import fa3, fa3_fp8
    from flashlab.kernels.fp8 import quantize_qkv
    from flashlab.lab.experiments.backward import _sdpa_cudnn

    pre = quantize_qkv(q, k, v, block=e.FP8_BLOCK, v_block=None)
    fns = {"cudnn": _sdpa_cudnn(q, k, v, do, causal)[0], "bf16": lambda: fa3.forward(q, k, v, causal),
           "fp8": lambda: fa3_fp8.forward(**pre, causal=causal, p_smem=False),
           "fp8_psmem": lambda: fa3_fp8.forward(**pre, causal=causal, p_smem=True),
           "fp8_c3": lambda: fa3_fp8.forward(**pre, causal=causal, consumers=3),
           "fp8_psmem_pp": lambda: fa3_fp8.forward(**pre, causal=causal, p_smem=True, pingpong=True)}
    o1, l1 = fns["fp8"]()
    for name in ("fp8_psmem", "fp8_c3"):
        o2, l2 = fns[name]()
        CHECKS.append({"kernel": name, "d": q.shape[-1], "N": q.shape[2], "causal": causal,
                       "rms_o": float(o1.double().pow(2).mean().sqrt()),
                       "rms_diff": float((o1.double() - o2.double()).pow(2).mean().sqrt()),
                       "max_diff": float((o1.double() - o2.double()).abs().max()),
                       "max_lse_diff": float((l1 - l2).abs().max())})
        print(CHECKS[-1], flush=True)
    Path(OUT, "ab_psmem_bench_check.json").write_text(json.dumps(CHECKS, indent=1))
    return fns


if __name__ == "__main__":
    OUT = sys.argv[1]
    Path(OUT).mkdir(parents=True, exist_ok=True)
    e.SPEED_D = tuple(int(d) for d in os.environ.get("AB_D", "128").split(","))
    e._time_switches(contenders, lambda d, causal: "fp8", "ab_psmem_bench", OUT, per_length=True,
                     lengths=(16384, 4096))
