"""Run 25: the stall samples of the FP8 kernel with change 23 (the first profiled launch) and
without it (the chain, main; the second), in the consumers' key-block loops, from Nsight
Compute's per-SASS-instruction source page (ncu/source_sass.csv.gz; run24/ncu_tree.py).

    python results/fa3_backward/run25/ncu_compare.py results/fa3_backward/run25/ncu

A loop instruction is one that ran as often as most of the hot ones (516,096 times at this shape).
For each kernel: the loops' samples by stall reason (per cent of the loops' samples and absolute),
and the samples at four kinds of instruction: MUFU.EX2, FMNMX, the waits for the GEMMs
(WARPGROUP.DEPBAR) and BAR.SYNC, and five reasons' samples by kind. Writes ncu_compare.json beside the CSV, with gpu.txt and device_commit.txt of the call."""
import csv
import gzip
import io
import json
import sys
from collections import Counter
from pathlib import Path

folder = Path(sys.argv[1])
rows = list(csv.reader(io.StringIO(gzip.open(folder / "source_sass.csv.gz", "rt").read())))
starts = [i for i, r in enumerate(rows) if r and r[0] == "Address"] + [len(rows) + 1]
num = lambda x: float(x or 0)  # noqa: E731
result = {}
for name, (a, b) in zip(("change 23", "chain"), zip(starts, starts[1:])):
    header = rows[a]
    body = [dict(zip(header, r)) for r in rows[a + 1:b - 1] if len(r) == len(header)]
    reasons = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
    # the loops' count: the one most instructions share among those run 100,000 times or more (a
    # spin-wait's retries run more often than the loop body)
    runs = Counter(num(x["Instructions Executed"]) for x in body
                   if num(x["Instructions Executed"]) >= 1e5).most_common(1)[0][0]
    loop = [x for x in body if num(x["Instructions Executed"]) == runs]
    by_reason = Counter()
    by_kind = Counter()
    kind_reason = {}
    for x in loop:
        s = sum(num(x[r]) for r in reasons)
        for r in reasons:
            by_reason[r[len("stall_"):]] += num(x[r])
        kind = next((k for k in ("MUFU.EX2", "FMNMX", "WARPGROUP.DEPBAR", "BAR.SYNC") if k in x["Source"]), "other")
        by_kind[kind] += s
        for r in ("dispatch", "not_selected", "wait", "barrier", "mio"):
            kind_reason.setdefault(kind, Counter())[r] += num(x["stall_" + r])
    total = sum(by_reason.values())
    result[name] = {"loop_instructions": len(loop), "runs_each": runs, "loop_samples": total,
                    "reasons_pct": {r: round(100 * v / total, 1) for r, v in by_reason.most_common(8)},
                    "reasons_samples": {r: int(v) for r, v in by_reason.most_common(8)},
                    "samples_by_instruction_kind": {k: int(v) for k, v in by_kind.most_common()},
                    "five_reasons_by_kind": {k: {r: int(v) for r, v in c.items()} for k, c in kind_reason.items()}}
    print(name, json.dumps(result[name]))
provenance = {"gpu_txt": (folder.parent / "gpu.txt").read_text().strip().splitlines(),
              "device_commit": (folder.parent / "device_commit.txt").read_text().strip() + " + device_tree.diff",
              "command": 'STEPS="ncu23" END=200 bash results/fa3_backward/run18/device_run.sh; then '
                         "python results/fa3_backward/run25/ncu_compare.py results/fa3_backward/run25/ncu"}
json.dump({"provenance": provenance, **result}, open(folder / "ncu_compare.json", "w"), indent=1)
