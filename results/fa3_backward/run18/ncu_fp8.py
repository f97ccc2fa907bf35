"""Where the FP8 forward's warps wait, instruction by instruction (run 18, under Nsight Compute).

    ncu --clock-control none -k regex:_fa3_fp8_kernel --launch-skip 2 -c 2 \
        --section WarpStateStats --section SourceCounters --section SchedulerStats \
        --section ComputeWorkloadAnalysis -o OUT/fp8 python results/fa3_backward/run18/ncu_fp8.py

Runs the FP8 kernel with change 19 (fa3_fp8) and without it (change19.patch taken back, as
ab_pack.py loads it) at d = 128, N = 8192, B = 2, H = 16, non-causal: each once
to compile, then each once more, the two launches ncu profiles (change 19 first)."""
import torch

from ab_pack import before  # noqa: E402  (sys.path[0] is this file's folder)
from flashlab.kernels.fa3_fp8 import forward
from flashlab.kernels.fp8 import quantize_qkv

torch.manual_seed(0)
q, k, v = (torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
pre = quantize_qkv(q, k, v, block=128, v_block=None)
for _ in range(2):
    forward(**pre, causal=False)
    before.forward(**pre, causal=False)
torch.cuda.synchronize()
