"""Run every chapter on this machine, top to bottom, and record how each run ended.

``python -m flashlab.course.run_notebooks --out DIR [--results results] [--jobs 5] [NAME ...]``

Each notebook of ``notebooks/`` is executed in a fresh kernel (nbclient, the engine behind
``jupyter nbconvert --execute``), and the executed copy is written to ``DIR``; the
committed notebooks are never touched, so their CPU outputs stay what nbval compares. On a
machine with a CUDA GPU the chapters take the GPU paths (full-size kernels, autotuning), so
this is how a maintainer checks that "a GPU, when present, is used" still works. With
``--results`` the outcome is recorded as ``notebooks_h200`` (the experiments' stem suffix,
:func:`flashlab.lab.measure.gpu_tag`; one row per notebook: status, seconds, the failing cell's
error) with the provenance of :func:`flashlab.lab.bench.provenance`.

The exit status is 1 if any notebook failed, so the command can gate a release.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

__all__ = ["NOTEBOOKS", "run_notebook", "main"]

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def run_notebook(path: str | Path, out_dir: str | Path, timeout: int = 600) -> dict[str, object]:
    """Execute one notebook in a fresh kernel; write the executed copy to ``out_dir``.

    Returns ``{"notebook", "status" ("ok" or "error"), "seconds", "error"}``, where
    ``error`` is the last line of the exception (empty when the run was ok).
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: expected a notebook file, got {str(path)!r}, which does not exist")
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    error = ""
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute(
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # the kernel's own log is not the notebook's
    except Exception as exc:  # a failing cell (CellExecutionError) or a dead kernel
        lines = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
        error = next((ln for ln in reversed(lines) if ln.strip()), type(exc).__name__)[:300]
    seconds = round(time.perf_counter() - start, 1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / path.name)
    return {"notebook": path.name, "status": "error" if error else "ok", "seconds": seconds, "error": error}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashlab.course.run_notebooks", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="notebook names (default: every notebook in notebooks/)")
    parser.add_argument("--out", required=True, help="folder for the executed copies")
    parser.add_argument("--results", help="folder to write the outcome to, as notebooks_h200.{csv,json}")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks run at the same time (default 1)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default 600)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: expected a positive number of parallel runs, got {args.jobs}")
    paths = []
    for name in args.names or sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")):
        path = NOTEBOOKS / (name if name.endswith(".ipynb") else f"{name}.ipynb")
        if not path.is_file():
            parser.error(f"names: expected notebooks of {NOTEBOOKS}, got {name!r}")
        paths.append(path)
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_notebook, paths, [args.out] * len(paths), [args.timeout] * len(paths)))
    for row in rows:
        print(f"{row['notebook']:30s} {row['status']:5s} {row['seconds']:7.1f} s  {row['error']}")
    if args.results:
        from flashlab.lab import results
        from flashlab.lab.bench import provenance
        from flashlab.lab.measure import gpu_tag

        command = "python -m flashlab.course.run_notebooks " + " ".join(argv if argv is not None else sys.argv[1:])
        meta = provenance(command)
        meta["note"] = (f"every notebook executed top to bottom in a fresh kernel, {args.jobs} at a time "
                        f"(so the seconds include waiting for the GPU and the CPU cores); executed copies "
                        f"not kept in the repository")
        for p in results.write(f"notebooks_{gpu_tag()}", rows, meta, args.results):
            print("wrote", p)
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
