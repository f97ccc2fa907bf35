"""Where the FP8 forward's warps spend their stall samples, by part of the program (run 20).

    python results/fa3_backward/run20/ncu_regions.py results/fa3_backward/run20/ncu

Reads ncu/source_sass.csv.gz (Nsight Compute's per-SASS-instruction source page of the first
profiled launch: main's FP8 kernel, d = 128, N = 8192, B = 2, H = 16, non-causal; ncu_fp8.py of
run 18) and sorts its instructions into parts by how often they ran: the two consumers'
key-block loops (the instructions that ran 516,096 times, split at the address between them),
the producer's loop (131,072 times), and the three warps that warp_specialize adds to fill the
producer's warpgroup, which wait at one barrier from start to end (the two NOPs after
BAR.SYNC 0x1 with more than 1,000 samples). Writes ncu_regions.csv (part, instructions,
share of all samples, share of the part's samples per stall reason) and its .json."""
import csv
import gzip
import io
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

folder = Path(sys.argv[1])
text = gzip.open(folder / "source_sass.csv.gz", "rt").read()
rows = list(csv.reader(io.StringIO(text)))
starts = [i for i, r in enumerate(rows) if r and r[0] == "Address"]
header = rows[starts[0]]
body = [dict(zip(header, r)) for r in rows[starts[0] + 1:starts[1] - 1] if len(r) == len(header)]
reasons = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
num = lambda x: float(x or 0)  # noqa: E731
loop = [int(b["Address"], 16) for b in body if num(b["Instructions Executed"]) == 516096]
split = (max(a for a in loop if a < (min(loop) + max(loop)) // 2) + min(a for a in loop if a > (min(loop) + max(loop)) // 2)) // 2


def part(b: dict) -> str:
    runs, addr = num(b["Instructions Executed"]), int(b["Address"], 16)
    if runs == 516096:
        return "consumer 0 loop" if addr < split else "consumer 1 loop"
    if runs == 131072:
        return "producer loop"
    if "NOP" in b["Source"] and num(b["stall_barrier"]) > 1000:
        return "idle filler warps"
    return "everything else"


samples, count = defaultdict(Counter), Counter()
for b in body:
    p = part(b)
    count[p] += 1
    for r in reasons:
        samples[p][r] += num(b[r])
total = sum(sum(c.values()) for c in samples.values())
out = []
for p, c in samples.items():
    s = sum(c.values())
    top = {r[len("stall_"):]: round(100 * v / s, 1) for r, v in c.most_common(6)}
    out.append({"part": p, "instructions": count[p], "share_of_samples_pct": round(100 * s / total, 1),
                "top_reasons_pct": json.dumps(top)})
    print(f"{p:18s} {count[p]:5d} instructions {100 * s / total:5.1f} % of samples  {top}")
with open(folder / "ncu_regions.csv", "w", newline="") as f:
    w = csv.DictWriter(f, list(out[0]))
    w.writeheader()
    w.writerows(out)
meta = json.load(open(folder.parent / "variants_3rounds" / "fa3_backward_variants_h100-80gb-hbm3.json"))
meta = {k: meta[k] for k in ("gpu", "driver", "cuda", "torch", "triton", "python", "commit")}
meta.update(date="2026-12-07 (device clock 09:31 UTC)",
            command="ncu --clock-control none -k regex:_fa3_fp8_kernel --launch-skip 2 -c 2 --section "
                    "WarpStateStats --section SourceCounters --section SchedulerStats --section "
                    "ComputeWorkloadAnalysis ... python ncu_fp8.py (run 18's device_run.sh, step ncu); then "
                    "python results/fa3_backward/run20/ncu_regions.py results/fa3_backward/run20/ncu")
json.dump(meta, open(folder / "ncu_regions.json", "w"), indent=1)
