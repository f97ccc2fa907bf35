"""Run 23: the mean length of each phase of consumer 0's steady key blocks (the first and the last
two left out), in cycles at the fitted clock, and the share of consumer 0's softmax time during
which consumer 1 is also in its softmax, from fp8timeline's CSV and JSON.

    python results/fa3_backward/run23/phases.py CHAIN_DIR TREE_DIR   (each holding fa3_fp8_timeline_*)
"""
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path


def load(folder: Path):
    csv_path = next(folder.glob("fa3_fp8_timeline_*.csv"))
    meta = json.loads(csv_path.with_suffix(".json").read_text())
    rows = list(csv.DictReader(csv_path.open()))
    return rows, meta["sm_clock_ghz"]


def summary(rows, ghz):
    blocks = sorted({int(r["block"]) for r in rows if r["partition"] == "consumer 0"})
    steady = set(blocks[1:-2])
    phase = defaultdict(list)
    for r in rows:
        if r["partition"] == "consumer 0" and int(r["block"]) in steady:
            phase[r["phase"]].append(float(r["end_us"]) - float(r["start_us"]))
    cycles = {p: round(sum(v) / len(v) * 1e3 * ghz) for p, v in phase.items()}
    soft = {c: [(float(r["start_us"]), float(r["end_us"])) for r in rows
                if r["partition"] == c and r["phase"] == "softmax" and int(r["block"]) in steady]
            for c in ("consumer 0", "consumer 1")}
    total = sum(b - a for a, b in soft["consumer 0"])
    both = sum(max(0.0, min(b, d) - max(a, c)) for a, b in soft["consumer 0"] for c, d in soft["consumer 1"])
    return cycles, round(both / total, 3)


if __name__ == "__main__":
    for name, folder in zip(("chain", "tree"), sys.argv[1:3]):
        rows, ghz = load(Path(folder))
        cycles, overlap = summary(rows, ghz)
        print(name, "block", sum(cycles.values()), cycles, "softmax overlapped by the other's:", overlap)
