"""The Gluon FA3 forwards, one program per tile (a2ec4d6's kernels, as scratch/fa3_old.py and
scratch/fp8_old.py) against the persistent ones with a TMA-store epilogue (the package's), in one run.

Make the old kernels with
    git show a2ec4d6:flashlab/kernels/fa3.py | sed 's/^from \._common import/from flashlab.kernels._common import/' > scratch/fa3_old.py
    git show a2ec4d6:flashlab/kernels/fa3_fp8.py | sed 's/^from \. import fa3$/from scratch import fa3_old as fa3/; s/^from \._common import/from flashlab.kernels._common import/' > scratch/fp8_old.py
    touch scratch/__init__.py

For each bf16 kernel: correctness against fp32 torch with a NaN-filled output buffer, bit-identical
reruns, and bit-identity with the old kernel; then TFLOP/s beside cuDNN (each implementation three times,
interleaved: the spread is the noise) and the bf16 matmul ceiling. FP8: old against new on the same
quantised inputs (identical bits, time). Writes $OUT/fa3_persistent.json.
"""
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from flashlab.kernels import fa3, fa3_fp8  # noqa: E402
from flashlab.kernels.fp8 import quantize_qkv  # noqa: E402
from flashlab.lab.measure import provenance, time_ms  # noqa: E402
from scratch import fa3_old, fp8_old  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
rows = []
meta = provenance("python results/fa3_persistent/bench.py")


def save():
    json.dump({"meta": meta, "rows": rows}, open(os.path.join(OUT, "fa3_persistent.json"), "w"), indent=1)


def ref(q, k, v, causal):
    s = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v.float()


torch.manual_seed(0)
ok_all = True
for (B, H, nq, nk, d, causal, dt) in [(1, 2, 300, 300, 128, True, torch.bfloat16),
                                      (2, 3, 1000, 1000, 128, False, torch.bfloat16),
                                      (1, 2, 257, 1031, 128, True, torch.float16),
                                      (1, 2, 1031, 257, 64, True, torch.bfloat16),
                                      (1, 2, 2049, 2049, 64, False, torch.float16),
                                      (2, 2, 1531, 1531, 128, True, torch.bfloat16),
                                      (1, 1, 128, 4096, 128, False, torch.bfloat16),
                                      (3, 5, 4096, 4096, 128, True, torch.bfloat16),
                                      (2, 70, 1024, 1024, 64, False, torch.bfloat16),
                                      (1, 1, 64, 64, 128, False, torch.bfloat16),
                                      (1, 1, 1, 77, 64, True, torch.float16)]:
    q = torch.randn(B, H, nq, d, device="cuda", dtype=dt)
    k = torch.randn(B, H, nk, d, device="cuda", dtype=dt)
    v = torch.randn(B, H, nk, d, device="cuda", dtype=dt)
    out = torch.full_like(q, float("nan"))
    o, lse = fa3.forward(q, k, v, causal, out=out)
    r = ref(q, k, v, causal)
    rel = ((o.float() - r).norm() / r.norm()).item()
    o2, lse2 = fa3.forward(q, k, v, causal)
    o0, lse0 = fa3_old.forward(q, k, v, causal)
    same, as_old = torch.equal(o, o2) and torch.equal(lse, lse2), torch.equal(o, o0) and torch.equal(lse, lse0)
    bad = not math.isfinite(rel) or rel > 1e-2 or not same
    ok_all &= not bad
    rows.append({"kind": "check", "B": B, "H": H, "nq": nq, "nk": nk, "d": d, "causal": causal, "dtype": str(dt),
                 "rel": rel, "rerun_identical": same, "identical_to_old": as_old})
    print(f"check B={B} H={H} nq={nq} nk={nk} d={d} causal={causal} {dt}: rel={rel:.2e} rerun={same} "
          f"as_old={as_old}{'  BAD' if bad else ''}", flush=True)
save()

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
bm = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
ceiling = 2 * 8192 ** 3 / (time_ms(lambda: a @ bm, "cuda") * 1e-3) / 1e12
meta["ceiling_tflops"] = round(ceiling, 1)
print(f"bf16 matmul 8192^3: {ceiling:.1f} TFLOP/s", flush=True)
del a, bm

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402


def cudnn(q, k, v, causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return sdpa(q, k, v, is_causal=causal)


impls = {"old": lambda q, k, v, c: fa3_old.forward(q, k, v, c)[0],
         "new": lambda q, k, v, c: fa3.forward(q, k, v, c)[0], "cudnn": cudnn}
for d, ns in ((128, (4096, 8192, 16384)), (64, (4096, 8192))):
    for n in ns:
        B, H = 16384 // n, 2048 // d
        q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            flops = 4 * B * H * n * n * d * (0.5 if causal else 1.0)
            res = {}
            for rep in range(3):
                for name, fn in impls.items():
                    ms = time_ms(lambda fn=fn: fn(q, k, v, causal), "cuda")
                    tf = flops / (ms * 1e-3) / 1e12
                    res.setdefault(name, []).append(tf)
                    rows.append({"kind": "time", "impl": name, "d": d, "N": n, "B": B, "H": H, "causal": causal,
                                 "rep": rep, "ms": round(ms, 4), "tflops": round(tf, 1)})
            print(f"d={d} N={n} causal={causal!s:5} " + "  ".join(f"{nm} {max(t):.0f} ({min(t):.0f})"
                  for nm, t in res.items()) + f"  new/old {max(res['new']) / max(res['old']):.3f}"
                  f"  new/cudnn {max(res['new']) / max(res['cudnn']):.3f}", flush=True)
            save()

for n in (4096, 8192, 16384):
    d, B, H = 128, 16384 // n, 16
    q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    pre = quantize_qkv(q, k, v, block=128, v_block=None)
    for causal in (False, True):
        flops = 4 * B * H * n * n * d * (0.5 if causal else 1.0)
        res, outs = {}, {}
        for rep in range(3):
            for name, mod in (("fp8_old", fp8_old), ("fp8_new", fa3_fp8)):
                outs[name] = mod.forward(**pre, causal=causal)
                ms = time_ms(lambda mod=mod: mod.forward(**pre, causal=causal)[0], "cuda")
                tf = flops / (ms * 1e-3) / 1e12
                res.setdefault(name, []).append(tf)
                rows.append({"kind": "time_fp8", "impl": name, "d": d, "N": n, "causal": causal, "rep": rep,
                             "ms": round(ms, 4), "tflops": round(tf, 1)})
        same = all(torch.equal(a_, b_) for a_, b_ in zip(outs["fp8_old"], outs["fp8_new"]))
        rows.append({"kind": "fp8_identical", "N": n, "causal": causal, "identical": same})
        print(f"fp8 d={d} N={n} causal={causal!s:5} " + "  ".join(f"{nm} {max(t):.0f} ({min(t):.0f})"
              for nm, t in res.items()) + f"  new/old {max(res['fp8_new']) / max(res['fp8_old']):.3f}"
              f"  identical={same}", flush=True)
        save()
meta["checks_ok"] = ok_all
save()
print("done", time.strftime("%H:%M:%S"), "checks ok" if ok_all else "CHECKS FAILED")
