"""Runs 23 and 24: consumer 0's mean phase lengths over the steady key blocks, in cycles at the
fitted clock, its block period, and the share of its softmax time during which consumer 1 is
in its own softmax (flashlab.lab.experiments.fa3_timeline: phase_means, period,
softmax_overlap), from fp8timeline's CSV and JSON.

    python results/fa3_backward/run23/phases.py CHAIN_DIR TREE_DIR   (each holding fa3_fp8_timeline_*)
"""
import csv
import json
import sys
from pathlib import Path

from flashlab.lab.experiments import fa3_timeline as timeline


def summary(folder: Path) -> str:
    csv_path = next(folder.glob("fa3_fp8_timeline_*.csv"))
    ghz = json.loads(csv_path.with_suffix(".json").read_text())["sm_clock_ghz"]
    rows = [{**r, "block": int(r["block"]), "start_us": float(r["start_us"]), "end_us": float(r["end_us"])}
            for r in csv.DictReader(csv_path.open())]
    cycles = {phase: round(us * 1e3 * ghz) for (part, phase), us in timeline.phase_means(rows).items()
              if part == "consumer 0"}
    return (f"period {round(timeline.period(rows) * 1e3 * ghz)} cycles, {cycles}, "
            f"softmax overlapped by the other's: {timeline.softmax_overlap(rows)}")


if __name__ == "__main__":
    for name, folder in zip(("chain", "tree"), sys.argv[1:3]):
        print(name, summary(Path(folder)))
