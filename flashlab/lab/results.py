"""Recorded GPU measurements, read back with their provenance.

Each measurement set is two files under ``results/``: ``STEM.csv`` (one row per
measurement) and ``STEM.json`` (how it was taken: GPU, driver, CUDA, torch and
triton versions, date, command, git commit). Notebooks plot recorded numbers
through :func:`load` and print :attr:`Recorded.provenance` beside them, so a
reader always knows where a number came from.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RESULTS_DIR", "Recorded", "load", "write"]

RESULTS_DIR = Path(__file__).resolve().parents[2] / "results"  # the checkout's results/
REQUIRED_META = ("gpu", "driver", "torch", "triton", "date", "command", "commit")


def _number(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


@dataclass(frozen=True)
class Recorded:
    """Rows of one recorded measurement set and the metadata of the run that made them."""

    stem: str
    rows: list[dict[str, object]]
    meta: dict[str, object]

    @property
    def provenance(self) -> str:
        """One sentence saying where, when and how the numbers were measured."""
        m = self.meta
        commit = re.sub(r"\b([0-9a-f]{10})[0-9a-f]{30}\b", r"\1", str(m["commit"]))  # short hashes
        return (
            f"Recorded on {m['gpu']} (driver {m['driver']}, torch {m['torch']}, triton {m['triton']}) "
            f"on {m['date']} by `{m['command']}` at commit {commit}."
        )

    @property
    def short(self) -> str:
        """The source of the numbers in one short line for a reader, e.g. "measured on an
        NVIDIA H200 (torch 2.11.0, Triton 3.6.0), 2026-11-29; results/bench_h200". The full
        record (driver, command, commit, notes) stays in :attr:`provenance`, :attr:`meta` and
        the JSON file beside the CSV (the reproduction appendix explains how to re-run it)."""
        m = self.meta
        torch_version = str(m.get("torch", "?")).split("+")[0]
        date = re.match(r"\d{4}-\d{2}-\d{2}", str(m.get("date", ""))) or None
        when = f", {date.group(0)}" if date else ""
        gpu = str(m.get("gpu", "unknown GPU"))
        if gpu.startswith("none"):  # compiled, not run (flashlab.lab.compile_report): "none: compiled for sm_90 ..."
            what = gpu.split(":", 1)[-1].strip() if ":" in gpu else "not run on a GPU"
            return f"{what} (Triton {m.get('triton', '?')}){when}; results/{self.stem}"
        return f"measured on an {gpu} (torch {torch_version}, Triton {m.get('triton', '?')}){when}; results/{self.stem}"

    def where(self, **conditions: object) -> list[dict[str, object]]:
        """The rows whose columns equal every given value, e.g. ``where(backend="naive", d=64)``."""
        for key in conditions:
            if self.rows and key not in self.rows[0]:
                raise ValueError(f"column must be one of {sorted(self.rows[0])}; got {key!r}")
        return [r for r in self.rows if all(r[k] == v for k, v in conditions.items())]

    def column(self, name: str, **conditions: object) -> list[object]:
        """The values of column ``name`` in the rows matching ``conditions``."""
        return [r[name] for r in self.where(**conditions)]


def load(stem: str, results_dir: str | Path | None = None) -> Recorded:
    """Read ``results/STEM.csv`` and ``results/STEM.json``."""
    base = Path(results_dir) if results_dir is not None else RESULTS_DIR
    csv_path, meta_path = base / f"{stem}.csv", base / f"{stem}.json"
    if not csv_path.exists():
        available = sorted(p.stem for p in base.glob("*.csv"))
        raise ValueError(f"stem must name a recorded result in {base}; got {stem!r} (available: {available})")
    with csv_path.open(newline="") as f:
        rows = [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
    meta = json.loads(meta_path.read_text())
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(f"{meta_path} must record {list(REQUIRED_META)}; missing {missing}")
    return Recorded(stem, rows, meta)


def write(stem: str, rows: list[dict[str, object]], meta: dict[str, object], results_dir: str | Path) -> list[Path]:
    """Write rows (all with the same keys) and metadata as ``STEM.csv`` + ``STEM.json``."""
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(f"meta must record {list(REQUIRED_META)}; missing {missing}")
    if not rows:
        raise ValueError(f"rows must not be empty for {stem!r}")
    base = Path(results_dir)
    base.mkdir(parents=True, exist_ok=True)
    csv_path, meta_path = base / f"{stem}.csv", base / f"{stem}.json"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return [csv_path, meta_path]
