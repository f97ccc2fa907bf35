"""d = 256: the Gluon forward against the Triton forward (forward.py) and SDPA's cuDNN and flash
backends, bf16, B N = 16k tokens, H = 16, N = 4096 and 16384, causal and not; the median of
triton.testing.do_bench, and the same call's bf16 matmul ceiling (the bench's; run 18's call 1
timed its own a @ a instead).

    PYTHONPATH=. python results/fa3_backward/run18/speed256.py OUT"""
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

from flashlab.kernels import fa3, forward as triton_forward
from flashlab.lab.bench import ceilings, fused_attention_torch
from flashlab.reference import attention_flops

ceiling = ceilings("cuda")[0]["value"] / 1e12  # the bench's bf16 8192^3 matmul, TFLOP/s
rows = []
for n in (4096, 16384):
    q, k, v = (torch.randn(16384 // n, 16, n, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for causal in (False, True):
        runs = {"gluon": lambda: fa3.forward(q, k, v, causal),
                "triton": lambda: triton_forward.forward(q, k, v, causal, 256**-0.5),
                "sdpa_cudnn": lambda: fused_attention_torch(q, k, v, causal, "cudnn"),
                "sdpa_flash": lambda: fused_attention_torch(q, k, v, causal, "flash")}
        flops = attention_flops(n, n, 256, causal=causal, batch=16384 // n * 16)
        for name, fn in runs.items():
            try:
                ms = do_bench(fn, warmup=25, rep=200)
                row = {"N": n, "causal": causal, "impl": name, "ms": ms, "tflops": flops / ms / 1e9,
                       "of_ceiling": flops / ms / 1e9 / ceiling}
            except Exception as exc:  # a backend that refuses d = 256
                row = {"N": n, "causal": causal, "impl": name, "error": str(exc).splitlines()[0][:200]}
            rows.append(row)
            print(row, flush=True)
out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "ceiling_tflops": ceiling, "rows": rows}
Path(sys.argv[1], "speed256.json").write_text(json.dumps(out, indent=1))
