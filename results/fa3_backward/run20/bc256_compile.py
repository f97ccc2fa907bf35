"""Does the FP8 forward fit a key block of 256 (FA3's larger Bc for FP8)? Compiled for sm_90 on a
CPU (Triton 3.6 from .venv/triton-sm90), d = 128, per-head K descale, 2 stages of K and V^T:

    .venv/bin/python results/fa3_backward/run20/bc256_compile.py [BLOCK_N STAGES]

Prints cuobjdump's resource usage (REG, STACK) and the shared memory. Main's build (128 3) has
64 bytes of stack and 32 local stores (STL in cuobjdump -sass); 256 2 has 728 bytes and 574
local stores: the consumers spill."""
import os
import sys

sys.path[:0] = [".venv/triton-sm90", ".", "tests"]
from tiers import sm90_build_env  # noqa: E402

os.environ.update(sm90_build_env())
from flashlab.kernels import fa3_fp8  # noqa: E402
from test_kernels_gluon import _resource_usage  # noqa: E402

block_n, stages = (int(x) for x in sys.argv[1:3]) if len(sys.argv) > 2 else (256, 2)
main_config = fa3_fp8.config
fa3_fp8.config = lambda d: {**main_config(d), "BLOCK_N": block_n, "STAGES": stages}
kernel = fa3_fp8.compile_sm90(128, False, q_block=128, k_block=None)
usage = [line.strip() for line in _resource_usage(kernel.asm["cubin"]).splitlines() if "REG:" in line]
print(f"BLOCK_N = {block_n}, STAGES = {stages}: {usage[0]}; shared memory {kernel.metadata.shared} bytes")
