"""Where the warps of the FP8 forward with change 23 and without it wait, instruction by
instruction (under Nsight Compute; device_run.sh's step ``ncu23``, with change23.patch applied):

    AB_PATCH=results/fa3_backward/run24/change23.patch \
    ncu --clock-control none -k regex:_fa3_fp8_kernel --launch-skip 2 -c 2 \
        --section WarpStateStats --section SourceCounters --section SchedulerStats \
        --section ComputeWorkloadAnalysis -o OUT/fp8 python results/fa3_backward/run24/ncu_tree.py

Runs the FP8 kernel with change 23 (fa3_fp8, patched) and without it (the chain, loaded as
run22/ab_tree_max.py loads it) at d = 128, N = 8192, B = 2, H = 16, non-causal, as run 20
profiled main: each once to compile, then each once more, the two launches ncu profiles
(change 23 first)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run22"))
from ab_tree_max import chain  # noqa: E402  (fa3_fp8 without the patch's part in it)

from flashlab.kernels.fa3_fp8 import forward  # noqa: E402
from flashlab.kernels.fp8 import quantize_qkv  # noqa: E402

torch.manual_seed(0)
q, k, v = (torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
pre = quantize_qkv(q, k, v, block=128, v_block=None)
for _ in range(2):
    forward(**pre, causal=False)
    chain.forward(**pre, causal=False)
torch.cuda.synchronize()
