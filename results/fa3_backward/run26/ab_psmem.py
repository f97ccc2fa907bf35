"""Change 25 (P through shared memory at Bc = 256) against the FP8 kernel without it (run 26).

    PYTHONPATH=. python results/fa3_backward/run26/ab_psmem.py OUT

(device_run.sh's step ``psmem``; as of d93af5b.) ``fa3_fp8.forward(p_smem=True)`` takes Bc = 256, 2 stages,
and stores P to shared memory as e4m3 for the P V product (``fa3_fp8._p_to_shared``); its K
descale must then be one per head or per multiple of 256 keys. Contenders, in fa3._time_switches'
rotated rounds at d = 128 x N = 16k and 4k, causal and not: ``cudnn`` (SDPA's cuDNN forward),
``bf16`` (the Gluon forward), ``fp8`` (the bench's inputs: Q and K a descale per 128 rows),
``fp8_khead`` (the same kernel, K one descale per head) and ``fp8_psmem`` (change 25, K one
descale per head). Before the rounds, each shape records how far fp8_psmem's O is from
fp8_khead's (the same products, summed in another order), and a ragged check (N_q = 1000,
N_k = 1300 and 1000, causal and not) records both kernels' RMSE against the float64 attention
of the dequantised inputs (``ab_psmem_check.json``). Writes ab_psmem_n<N>_<gpu>.csv/.json."""
import json
import sys
from pathlib import Path

import torch

import flashlab.lab.experiments as experiments
from flashlab.lab.experiments import fa3 as e

experiments.COMMAND = "PYTHONPATH=. python results/fa3_backward/run26/ab_psmem.py"
CHECKS: list[dict] = []


def _inputs(q, k, v, k_block):
    from flashlab.kernels.fp8 import quantize_fp8

    (q8, qd), (k8, kd), (v8, vd) = quantize_fp8(q, e.FP8_BLOCK), quantize_fp8(k, k_block), quantize_fp8(v, None)
    return {"q": q8, "k": k8, "v": v8, "q_descale": qd, "k_descale": kd, "v_descale": vd,
            "q_block": e.FP8_BLOCK, "k_block": k_block}


def _reference(pre, causal):
    """softmax(Q K^T / sqrt(d)) V in float64 from the dequantised inputs, causal bottom-right."""
    from flashlab.kernels.fp8 import dequantize_fp8

    q, k, v = (dequantize_fp8(pre[x], pre[f"{x}_descale"], pre.get(f"{x}_block")).double() for x in "qkv")
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril(n_k - n_q).logical_not(),
                          float("-inf"))
    return torch.softmax(s, -1) @ v


def ragged_check(out):
    from flashlab.kernels import fa3_fp8

    g = torch.Generator(device="cuda").manual_seed(0)
    for n_k in (1300, 1000):
        q = torch.randn(2, 3, 1000, 128, device="cuda", generator=g)
        k, v = (torch.randn(2, 3, n_k, 128, device="cuda", generator=g) for _ in range(2))
        pre = _inputs(q, k, v, None)
        for causal in (False, True):
            ref = _reference(pre, causal)
            row = {"N_q": 1000, "N_k": n_k, "causal": causal}
            for name, p_smem in (("fp8_khead", False), ("fp8_psmem", True)):
                o, _ = fa3_fp8.forward(**pre, causal=causal, p_smem=p_smem)
                o2, _ = fa3_fp8.forward(**pre, causal=causal, p_smem=p_smem)
                row[f"rmse_{name}"] = float((o.double() - ref).pow(2).mean().sqrt())
                row[f"max_err_{name}"] = float((o.double() - ref).abs().max())
                row[f"same_bits_twice_{name}"] = bool(torch.equal(o, o2))
            CHECKS.append(row)
            print(row, flush=True)
            Path(out, "ab_psmem_check.json").write_text(json.dumps(CHECKS, indent=1))


def contenders(q, k, v, do, causal):
    from flashlab.kernels import fa3, fa3_fp8
    from flashlab.lab.experiments.backward import _sdpa_cudnn

    pre, head = _inputs(q, k, v, e.FP8_BLOCK), _inputs(q, k, v, None)
    fns = {"cudnn": _sdpa_cudnn(q, k, v, do, causal)[0], "bf16": lambda: fa3.forward(q, k, v, causal),
           "fp8": lambda: fa3_fp8.forward(**pre, causal=causal),
           "fp8_khead": lambda: fa3_fp8.forward(**head, causal=causal, p_smem=False),
           "fp8_psmem": lambda: fa3_fp8.forward(**head, causal=causal, p_smem=True)}
    (o1, _), (o2, _) = fns["fp8_khead"](), fns["fp8_psmem"]()
    scale = float(o1.double().pow(2).mean().sqrt())
    CHECKS.append({"d": q.shape[-1], "N": q.shape[2], "causal": causal,
                   "rms_o": scale, "rms_diff": float((o1.double() - o2.double()).pow(2).mean().sqrt()),
                   "max_diff": float((o1.double() - o2.double()).abs().max())})
    print(CHECKS[-1], flush=True)
    Path(OUT, "ab_psmem_check.json").write_text(json.dumps(CHECKS, indent=1))
    return fns


if __name__ == "__main__":
    OUT = sys.argv[1]
    Path(OUT).mkdir(parents=True, exist_ok=True)
    ragged_check(OUT)
    e.SPEED_D = (128,)
    e._time_switches(contenders, lambda d, causal: "fp8_khead", "ab_psmem", OUT, per_length=True,
                     lengths=(16384, 4096))
