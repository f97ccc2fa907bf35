"""GPU experiments behind chapters 5-9, each a function that measures and records.

    python -m flashlab.experiments grid pipelining fp8 ... --out results

Each experiment is a function ``run(out: Path) -> list[Path]`` in a module of this
package, registered in :data:`EXPERIMENTS`. It measures on the GPU (CUDA required),
and writes ``OUT/<stem>_<tag>.csv`` + ``.json`` through :func:`record`, with the
provenance of :func:`flashlab.bench.provenance` (GPU, driver, versions, date, command,
git commit). Notebooks read them back with :func:`flashlab.results.load`.

Every timing is a median of :func:`triton.testing.do_bench` (via
:func:`flashlab.bench.time_ms`) and every comparison is between implementations
measured in the same process, one after the other.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Callable

import torch

__all__ = ["EXPERIMENTS", "TAG", "isolated", "measure_case", "record", "ms", "precompile", "require_gpu", "run"]

TAG = "h200"  # suffix of the result stems: the lent GPU
COMMAND = "python -m flashlab.experiments"

# name -> "module:function"; modules are imported only when their experiment runs.
EXPERIMENTS: dict[str, str] = {
    "grid": "flashlab.experiments.kernels:grid",
    "pipelining": "flashlab.experiments.kernels:pipelining",
    "determinism": "flashlab.experiments.kernels:determinism",
    "memory": "flashlab.experiments.kernels:memory",
    "beyond": "flashlab.experiments.kernels:beyond",
    "decode": "flashlab.experiments.kernels:decode",
    "fp8": "flashlab.experiments.fp8:run",
    "fp8rmse": "flashlab.experiments.fp8:rmse",
    "fp8tiles": "flashlab.experiments.fp8:tiles",
    "fp8rescale": "flashlab.experiments.fp8:rescaling",
    "fp8pipeline": "flashlab.experiments.fp8:pipelines",
    "fa4": "flashlab.experiments.fa4:run",
}


def require_gpu() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("this experiment measures a CUDA GPU; none is available (CI has none; run it on the lent H200)")


def ms(fn: Callable[[], object]) -> float:
    """Median milliseconds of ``fn`` on the GPU (triton.testing.do_bench)."""
    from ..bench import time_ms

    return time_ms(fn, "cuda")


def measure_case(row: dict[str, object], run: Callable[[], torch.Tensor], reference: Callable[[], torch.Tensor],
                 flops: float, timed: bool) -> dict[str, object]:
    """Run one fixed configuration of a kernel once, which compiles it; if ``timed``, also record
    in ``row`` its median time (ms), TFLOP/s, largest error against ``reference()`` (max_err)
    and status "ok". A configuration the compiler or the GPU refuses (out of shared memory, a
    failing pass) is recorded in ``status`` when timed, and raised in a :func:`precompile`
    worker (``timed=False``), where nothing is recorded."""
    try:
        with torch.no_grad():
            o = run()
            if timed:
                err = (o.float() - reference()).abs().max().item()
                t = ms(run)
                row.update(ms=round(t, 5), tflops=round(flops / (t * 1e-3) / 1e12, 2), max_err=f"{err:.2e}", status="ok")
    except Exception as exc:
        if not timed:
            raise
        row.update(ms="", tflops="", max_err="", status=f"{type(exc).__name__}: {str(exc)[:120]}".replace(",", ";"))
    return row


def _function(target: str) -> Callable:
    """The function that ``"module:function"`` names."""
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def _call(spec: tuple[str, tuple]) -> str:
    """Run ``module:function(*args)`` once (in a worker process); return "ok" or the error."""
    target, args = spec
    try:
        _function(target)(*args)
        return "ok"
    except Exception as exc:  # the timed run reports failures; here they only cost a compile
        return f"{type(exc).__name__}: {str(exc)[:100]}"


def precompile(calls: list[tuple[str, tuple]], workers: int = 12) -> list[str]:
    """Run each ``("module:function", args)`` once in a pool of spawned processes, so that
    Triton compiles the kernels they launch in parallel into its on-disk cache. The timing
    process, which runs one configuration after another, then loads binaries instead of
    compiling each in turn (a compile takes seconds; a timing, a fraction of one). What the
    workers measure is thrown away: they share the GPU, so their timings would mean nothing."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if not calls:
        return []
    with ProcessPoolExecutor(max_workers=min(workers, len(calls)), mp_context=multiprocessing.get_context("spawn")) as pool:
        status = list(pool.map(_call, calls))
    print(f"precompiled {sum(s == 'ok' for s in status)}/{len(calls)} in parallel", flush=True)
    return status


def _rows_into(queue, target: str, args: tuple) -> None:
    queue.put(_function(target)(*args))


def isolated(target: str, args: tuple, timeout: float) -> tuple[object, str]:
    """Run ``module:function(*args)`` in a fresh spawned process and return ``(result, status)``:
    status "ok", "timeout" (the process was killed after ``timeout`` seconds: a kernel that hangs
    the GPU, such as a pipeline waiting on a barrier no one arrives at) or "crashed (exit N)"
    (an illegal memory access ends the CUDA context, which would spoil every later measurement
    in a shared process). Used where a configuration may be broken and the rest must go on."""
    import multiprocessing
    import queue as queue_module
    import time

    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_rows_into, args=(q, target, args))
    proc.start()
    result, deadline = None, time.monotonic() + timeout
    while result is None and time.monotonic() < deadline:
        try:  # poll, so that a process that died is noticed at once rather than at the deadline
            result = q.get(timeout=0.5)
        except queue_module.Empty:
            if not proc.is_alive():
                try:
                    result = q.get(timeout=1.0)  # it may have finished just now
                except queue_module.Empty:
                    break
    proc.join(5)
    if result is not None:
        return result, "ok"
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None, "timeout"
    return None, f"crashed (exit {proc.exitcode})"


def record(stem: str, rows: list[dict[str, object]], out: str | Path) -> list[Path]:
    """Write ``OUT/<stem>_<TAG>.csv/.json`` with this run's provenance."""
    from ..bench import provenance
    from ..results import write

    command = COMMAND + " " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("__main__.py") else COMMAND
    paths = write(f"{stem}_{TAG}", rows, provenance(command.strip()), out)
    for p in paths:
        print(p, flush=True)
    return paths


def run(names: list[str], out: str | Path) -> list[Path]:
    """Run the named experiments in order; one that fails is reported and the rest go on."""
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"experiment names must be among {sorted(EXPERIMENTS)}; got {unknown}")
    written: list[Path] = []
    for name in names:
        print(f"== {name}", flush=True)
        try:
            written += _function(EXPERIMENTS[name])(Path(out))
        except Exception as exc:  # keep going: one broken experiment must not lose the others' results
            import traceback

            traceback.print_exc()
            print(f"== {name} FAILED: {type(exc).__name__}: {exc}", flush=True)
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return written
