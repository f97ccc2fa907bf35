"""The fa3timeline experiment for the package kernel and for scratch variants; phase means per consumer."""
import csv
import importlib
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = Path(os.environ.get("OUT", "/tmp/out"))
name = sys.argv[1] if len(sys.argv) > 1 else "package"
if name != "package":
    sys.modules["flashlab.kernels.fa3"] = importlib.import_module(f"scratch.{name}")
from flashlab.lab.experiments import fa3_timeline  # noqa: E402

out = OUT / name
out.mkdir(parents=True, exist_ok=True)
paths = fa3_timeline.run(out)
rows = list(csv.DictReader(open([p for p in paths if str(p).endswith(".csv")][0])))
acc = defaultdict(list)
for r in rows:
    if 5 <= int(r["block"]) < 60:
        acc[(r["partition"], r["phase"])].append(float(r["end_us"]) - float(r["start_us"]))
for part in ("consumer 0", "consumer 1"):
    items = [(ph, sum(v) / len(v)) for (p, ph), v in acc.items() if p == part]
    print(name, part, "sum %.3f" % sum(m for _, m in items), " ".join(f"{ph}={m:.3f}" for ph, m in items))
