"""The emulated columns of run 20's table: the FP8 kernel's arithmetic in float64
(flashlab.lab.experiments.fa3.fp8_emulated_rmse) on each FP8_CASES case's staircase inputs,
rescaling at every block and with theta = 2. The inputs are quantised on the CPU; on the GPU the
same inputs quantise to nearly the same bits (case 1, theta = 2: 1.068e-03 here, 1.069e-03 in
call 4's rmse_emulated).

    .venv/bin/python results/fa3_backward/run20/emulated_rmse.py"""
import numpy as np

from flashlab.kernels.fp8 import dequantize_fp8
from flashlab.lab.experiments import fa3
from flashlab.reference import attention

for case in fa3.FP8_CASES:
    pre = fa3._fp8_inputs(*case[:5], 0, 0.75, device="cpu")
    qkv = [dequantize_fp8(pre[x], pre[f"{x}_descale"], pre[f"{x}_block"]).double().numpy() for x in "qkv"]
    o_ref = np.asarray(attention(*qkv, causal=case[5]))
    every, theta2 = (fa3.fp8_emulated_rmse(qkv, o_ref, case[5], t) for t in (None, 2.0))
    print(f"{case}: every block {every:.3e}, theta = 2 {theta2:.3e}, ratio {theta2 / every:.3f}")
