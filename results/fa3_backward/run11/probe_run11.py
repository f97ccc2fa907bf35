"""Run 11's probe, archived as it ran: the passes around the Gluon backward timed alone, one
tile's stamps at N = 4k and 16k (d = 128), and the forward at d = 64 under each schedule switch
beside cuDNN. (Its rotated rounds are now flashlab.lab.experiments.in_rounds, and its forward
part the experiment fa3switches.)

    PYTHONPATH=. python results/fa3_backward/run11/probe_run11.py OUT_DIR

(run 11 ran it as ``python probe_run11.py $OUT`` from the repository root; its JSON holds the
rows, the stamps are ``stamps_N<N>_d128_<full|causal>.npy``, (steps, phases, 2, 2) int64 as
:func:`flashlab.lab.experiments.fa3_backward_timeline.stamped_backward` returns them)."""
import json
import sys

import numpy as np
import torch

from flashlab.kernels import fa3
from flashlab.kernels import fa3_backward as fb
from flashlab.lab.experiments import gpu_ms
from flashlab.lab.experiments.fa3_backward_timeline import stamped_backward
from flashlab.lab.measure import paper_shape, provenance

out = sys.argv[1]
rows = []
for N in (4096, 16384):
    for d in (128, 64):
        B, H = paper_shape(N, d)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(B, H, N, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
        for causal in (False, True):
            scale = d ** -0.5
            o, lse2 = fa3.forward(q, k, v, causal, scale)
            _, _, acc = fb.prepare(do, o, lse2)
            r = {"N": N, "d": d, "causal": causal, "B": B, "H": H,
                 "prepare_ms": gpu_ms(lambda: fb.prepare(do, o, lse2)),
                 "finish_ms": gpu_ms(lambda: fb.finish(acc, scale, q.dtype)),
                 "bwd_ms": gpu_ms(lambda: fb.backward(do, q, k, v, o, lse2, causal, scale))}
            if d == 128:
                n_kb = -(-N // (2 * fb.BLOCK_M))
                at = (0 if causal else n_kb // 2, B * H // 2)
                for _ in range(3):
                    *_, st = stamped_backward(do, q, k, v, o, lse2, causal, at)
                torch.cuda.synchronize()
                s = st.cpu().numpy()
                np.save(f"{out}/stamps_N{N}_d{d}_{'causal' if causal else 'full'}.npy", s)
                ns = s[:, 0, 0, 0]  # consumer 0's wait_q, ns
                ns = ns[ns > 0]
                r["tile"] = at
                r["step_ns"] = np.diff(ns).tolist()
            rows.append(r)
            print({k_: v_ for k_, v_ in r.items() if k_ != "step_ns"}, flush=True)
meta = provenance("python probe_run11.py $OUT")
json.dump({"meta": meta, "rows": rows}, open(f"{out}/probe_run11.json", "w"), indent=1)

# The forward at d = 64 with each schedule switch, beside cuDNN, rounds rotated.
from flashlab.lab.experiments.backward import _sdpa_cudnn  # noqa: E402
from flashlab.reference.naive import attention_flops  # noqa: E402

fwd_rows = []
for N in (4096, 16384):
    for d in (64,):
        B, H = paper_shape(N, d)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(B, H, N, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
        for causal in (False, True):
            fns = {"cudnn": _sdpa_cudnn(q, k, v, do, causal)[0]}
            for pp in (True, False):
                for ov in (True, False):
                    fns[f"pp{int(pp)}_ov{int(ov)}"] = (lambda pp=pp, ov=ov: fa3.forward(q, k, v, causal, pingpong=pp, overlap=ov))
            times = {n_: [] for n_ in fns}
            order = list(fns)
            with torch.no_grad():
                for r_ in range(3):
                    for n_ in order[r_ % len(order):] + order[:r_ % len(order)]:
                        times[n_].append(gpu_ms(fns[n_]))
            flops = attention_flops(N, N, d, causal=causal, batch=B * H)
            for n_, ts in times.items():
                ms = float(np.median(ts))
                fwd_rows.append({"impl": n_, "N": N, "d": d, "causal": causal, "ms": ms,
                                 "tflops": flops / ms / 1e9, "spread": (max(ts) - min(ts)) / ms})
                print(fwd_rows[-1], flush=True)
json.dump({"meta": meta, "rows": rows, "forward_switches": fwd_rows}, open(f"{out}/probe_run11.json", "w"), indent=1)
