"""HBM bytes of one attention forward + backward, counted by Nsight Compute.

    python -m flashlab.lab.ncu --out results          # on a CUDA machine with ncu

For each implementation and shape, ncu (``--clock-control none``, metrics
dram__bytes_read.sum and dram__bytes_write.sum, ``--profile-from-start off``)
profiles a child process that brackets one forward (or forward + backward) with
cudaProfilerStart/Stop, so only those kernels are counted, not the ones that create
the inputs. (An NVTX range would not do: ranges belong to the thread that opens
them, and autograd launches the backward kernels from a thread of its own.) The shape of the FlashAttention
paper's Fig. 2 (left): GPT-2 medium, batch 64, 16 heads, N = 1024, d = 64, fp16.
flashlab's kernels run with FLASHLAB_AUTOTUNE=0 (one fixed configuration), so no
tuning launches are profiled.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys

IMPLS = ("naive", "sdpa_flash", "flashlab")
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


def workload(impl: str, batch: int, heads: int, n: int, d: int, pas: str = "fwdbwd") -> None:
    """One forward (``pas="fwd"``) or forward + backward of ``impl`` in fp16, between
    cudaProfilerStart and cudaProfilerStop."""
    import torch

    from flashlab.lab.bench import _impl

    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, n, d, generator=g).to("cuda", torch.float16) for _ in range(4))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    fn = _impl(impl, causal=False)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    if pas == "fwd":
        with torch.no_grad():
            fn(q, k, v)
    else:
        fn(q, k, v).backward(do)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def measure(impl: str, batch: int, heads: int, n: int, d: int, pas: str = "fwdbwd") -> dict[str, object]:
    """Run ``workload`` under ncu and sum the DRAM bytes over the profiled kernels."""
    cmd = ["ncu", "--clock-control", "none", "--metrics", ",".join(METRICS), "--csv", "--print-units", "base",
           "--profile-from-start", "off", sys.executable, "-m", "flashlab.lab.ncu", "--workload", impl,
           str(batch), str(heads), str(n), str(d), pas]
    env = {**os.environ, "FLASHLAB_AUTOTUNE": "0"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    rows = list(csv.reader(io.StringIO(proc.stdout)))
    start = next((i for i, r in enumerate(rows) if "Metric Name" in r), None)
    if start is None:
        raise RuntimeError(f"ncu reported no kernels for {impl}: {proc.stderr[-500:]}")
    header = rows[start]
    name, value, kernel = (header.index(c) for c in ("Metric Name", "Metric Value", "Kernel Name"))
    ident = header.index("ID") if "ID" in header else kernel
    total = dict.fromkeys(METRICS, 0.0)
    kernels = set()
    for r in rows[start + 1:]:
        if len(r) > value and r[name] in total:
            total[r[name]] += float(r[value].replace(",", ""))
            kernels.add((r[ident], r[kernel]))
    read, write = total[METRICS[0]], total[METRICS[1]]
    return {"impl": impl, "dtype": "float16", "pass": pas, "B": batch, "H": heads, "N": n, "d": d,
            "read_bytes": int(read), "write_bytes": int(write), "total_bytes": int(read + write), "kernels": len(kernels)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashlab.lab.ncu", description=__doc__.split("\n")[0])
    parser.add_argument("--workload", nargs=6, metavar=("IMPL", "B", "H", "N", "D", "PASS"), help=argparse.SUPPRESS)
    parser.add_argument("--passes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    parser.add_argument("--out", default=None, help="results folder (default: the repository's results/)")
    parser.add_argument("--ns", type=int, nargs="+", default=[1024, 4096], help="sequence lengths; batch = 65536 / N")
    args = parser.parse_args(argv)
    if args.workload:
        impl, b, h, n, d, pas = args.workload
        workload(impl, int(b), int(h), int(n), int(d), pas)
        return 0
    from flashlab.lab import bench, results
    from flashlab.lab.measure import gpu_tag

    rows = []
    for n in args.ns:
        for pas in args.passes:
            for impl in IMPLS:
                row = measure(impl, max(1, 65536 // n), 16, n, 64, pas)
                rows.append(row)
                print(row, flush=True)
    command = "python -m flashlab.lab.ncu " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = bench.provenance(command.strip())
    meta["method"] = "ncu --clock-control none --metrics " + ",".join(METRICS) + " --profile-from-start off"
    for path in results.write(f"hbm_bytes_{gpu_tag()}", rows, meta, args.out or results.RESULTS_DIR):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
