"""Change 28 (run 30): l = rowsum(P) summed by the tensor cores (``fa3_fp8.forward(l_mma=True)``)
against d's default build, which sums l in the softmax, with the bench's FP8 inputs.

    PYTHONPATH=. python results/fa3_backward/run30/ab_lmma.py OUT

(device_run.sh's steps ``lmma``, and ``lmma64`` with AB_D=64.) Inputs as flashlab.lab.bench times
``flashlab_gluon_fp8``: ``quantize_qkv(block=FP8_BLOCK, v_block=None)``. Contenders, in
fa3._time_switches' rotated rounds at AB_D x N = 16k and 4k, causal and not: ``cudnn``, ``bf16``
(the Gluon forward), ``fp8`` (the default build, l in the softmax) and ``fp8_lmma``. Before the
rounds, each shape records how far fp8_lmma's output and lse are from fp8's
(``ab_lmma_check.json``: the two l differ by P's rounding). Writes ab_lmma_n<N>_<gpu>.csv/.json."""
import json
import os
import sys
from pathlib import Path

import flashlab.lab.experiments as experiments
from flashlab.lab.experiments import fa3 as e

experiments.COMMAND = "PYTHONPATH=. python results/fa3_backward/run30/ab_lmma.py"
CHECKS: list[dict] = []


def contenders(q, k, v, do, causal):
    from flashlab.kernels import fa3, fa3_fp8
    from flashlab.kernels.fp8 import quantize_qkv
    from flashlab.lab.experiments.backward import _sdpa_cudnn

    pre = quantize_qkv(q, k, v, block=e.FP8_BLOCK, v_block=None)
    fns = {"cudnn": _sdpa_cudnn(q, k, v, do, causal)[0], "bf16": lambda: fa3.forward(q, k, v, causal),
           "fp8": lambda: fa3_fp8.forward(**pre, causal=causal, l_mma=False),
           "fp8_lmma": lambda: fa3_fp8.forward(**pre, causal=causal, l_mma=True)}
    (o1, l1), (o2, l2) = fns["fp8"](), fns["fp8_lmma"]()
    finite = l1.isfinite()
    CHECKS.append({"d": q.shape[-1], "N": q.shape[2], "causal": causal,
                   "rms_o": float(o1.double().pow(2).mean().sqrt()),
                   "rms_diff": float((o1.double() - o2.double()).pow(2).mean().sqrt()),
                   "max_diff": float((o1.double() - o2.double()).abs().max()),
                   "same_inf": bool((finite == l2.isfinite()).all()),
                   "max_lse_diff": float((l1[finite] - l2[finite]).abs().max())})
    print(CHECKS[-1], flush=True)
    Path(OUT, "ab_lmma_check.json").write_text(json.dumps(CHECKS, indent=1))
    return fns


if __name__ == "__main__":
    OUT = sys.argv[1]
    Path(OUT).mkdir(parents=True, exist_ok=True)
    e.SPEED_D = tuple(int(d) for d in os.environ.get("AB_D", "128").split(","))
    e._time_switches(contenders, lambda d, causal: "fp8", "ab_lmma", OUT, per_length=True, lengths=(16384, 4096))
