"""The FP8 kernel with three consumer warpgroups (three_consumers.patch, beside this file),
compiled for sm_90 on a CPU: its SASS's local-memory traffic and wgmma waits (run 21).

    git apply results/fa3_backward/run21/three_consumers.patch
    PYTHONPATH=.:tests .venv/bin/python results/fa3_backward/run21/three_consumers_compile.py
    git apply -R results/fa3_backward/run21/three_consumers.patch

Prints, for d = 128 and 64 (non-causal, overlap on) and for the two-consumer build beside it:
SASS instructions, STL, LDL, QGMMA, WARPGROUP.DEPBAR and the setmaxnreg register counts."""
import os
import re
import sys

sys.path[:0] = [".venv/triton-sm90", ".", "tests"]
from tiers import sm90_build_env  # noqa: E402

os.environ.update(sm90_build_env())
from test_kernels_gluon import _sass  # noqa: E402

from flashlab.kernels import fa3_fp8  # noqa: E402

for d in (128, 64):
    for consumers in (3, 2):
        ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", _sass(fa3_fp8.compile_sm90(d, False, consumers=consumers)
                                                                  .asm["cubin"]))
        count = {name: sum(o.startswith(name) or f" {name}" in o for o in ops)
                 for name in ("STL", "LDL", "QGMMA", "WARPGROUP.DEPBAR")}
        regs = [int(m, 16) for o in ops for m in re.findall(r"USETMAXREG\.\w+\.CTAPOOL (?:UP\d, )?(0x[0-9a-f]+)", o)]
        print(f"d={d} consumers={consumers} instructions={len(ops)} {count} setmaxnreg={regs}", flush=True)
