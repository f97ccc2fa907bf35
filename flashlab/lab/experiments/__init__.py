"""GPU experiments behind chapters 5-9, each a function that measures and records.

    python -m flashlab.lab.experiments grid pipelining fp8 ... --out results

Each experiment is a function ``run(out: Path) -> list[Path]`` in a module of this
package, registered in :data:`EXPERIMENTS`. It measures on the GPU (CUDA required),
and writes ``OUT/<stem>_<tag>.csv`` + ``.json`` through :func:`record`, with the
provenance of :func:`flashlab.lab.bench.provenance` (GPU, driver, versions, date, command,
git commit). Notebooks read them back with :func:`flashlab.lab.results.load`.

Every timing is a median of :func:`triton.testing.do_bench` (via
:func:`flashlab.lab.bench.time_ms`) and every comparison is between implementations
measured in the same process, one after the other.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Callable, Hashable, TypeVar

import torch

from flashlab.lab.measure import function_at, gpu_tag, isolated, precompile, provenance, time_ms

__all__ = ["EXPERIMENTS", "in_rounds", "isolated", "measure_case", "record", "gpu_ms", "precompile", "require_gpu",
           "round_summary", "run"]

K = TypeVar("K", bound=Hashable)

COMMAND = "python -m flashlab.lab.experiments"

# name -> "module:function"; modules are imported only when their experiment runs.
EXPERIMENTS: dict[str, str] = {
    "grid": "flashlab.lab.experiments.kernels:grid",
    "pipelining": "flashlab.lab.experiments.kernels:pipelining",
    "determinism": "flashlab.lab.experiments.kernels:determinism",
    "memory": "flashlab.lab.experiments.kernels:memory",
    "beyond": "flashlab.lab.experiments.kernels:beyond",
    "decode": "flashlab.lab.experiments.kernels:decode",
    "fp8": "flashlab.lab.experiments.fp8:run",
    "fp8rmse": "flashlab.lab.experiments.fp8:rmse",
    "fp8tiles": "flashlab.lab.experiments.fp8:tiles",
    "fp8rescale": "flashlab.lab.experiments.fp8:rescaling",
    "fp8pipeline": "flashlab.lab.experiments.fp8:pipelines",
    "fa4": "flashlab.lab.experiments.fa4:run",
    "fa3timeline": "flashlab.lab.experiments.fa3_timeline:run",
    "fp8timeline": "flashlab.lab.experiments.fa3_timeline:run_fp8",
    "fp8timeline256": "flashlab.lab.experiments.fa3_timeline:run_fp8_psmem",
    "fa3bwdtimeline": "flashlab.lab.experiments.fa3_backward_timeline:run",
    "fa3switches": "flashlab.lab.experiments.fa3:switches",
    "fp8switches": "flashlab.lab.experiments.fa3:fp8_switches",
    "backward_check": "flashlab.lab.experiments.backward:run_check",
    "backward_configs": "flashlab.lab.experiments.backward:run_configs",
    "backward_speed": "flashlab.lab.experiments.backward:run_speed",
}


def require_gpu() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("this experiment measures a CUDA GPU; none is available (run it on a machine with one)")


def gpu_ms(fn: Callable[[], object]) -> float:
    """Median milliseconds of ``fn`` on the GPU (triton.testing.do_bench)."""
    return time_ms(fn, "cuda")


def in_rounds(fns: dict[K, Callable[[], object]], rounds: int,
              timer: Callable[[Callable[[], object]], float] | None = None) -> dict[K, list[float]]:
    """Time every contender of ``fns`` (key -> function) once a round, ``rounds`` rounds, each
    round starting one contender later than the last, so that none always runs first and a drift
    of the clocks falls on all alike. Returns key -> the list of its times (``timer``: gpu_ms)."""
    if rounds < 1 or not fns:
        raise ValueError(f"rounds must be at least 1 and fns not empty; got {rounds} rounds, {len(fns)} functions")
    timer = timer or gpu_ms
    times: dict[K, list[float]] = {key: [] for key in fns}
    order = list(fns)
    for r in range(rounds):
        for key in order[r % len(order):] + order[:r % len(order)]:
            times[key].append(timer(fns[key]))
    return times


def round_summary(times: list[float], flops: float) -> dict[str, float]:
    """One contender's times over the rounds (ms) as the record's columns: the median (ms), its
    TFLOP/s for ``flops`` floating-point operations, and the rounds' spread (max - min) / median."""
    ms = statistics.median(times)
    return {"ms": round(ms, 5), "tflops": round(flops / (ms * 1e-3) / 1e12, 1),
            "spread": round((max(times) - min(times)) / ms, 4)}


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
                t = gpu_ms(run)
                row.update(ms=round(t, 5), tflops=round(flops / (t * 1e-3) / 1e12, 2), max_err=f"{err:.2e}", status="ok")
    except Exception as exc:
        if not timed:
            raise
        row.update(ms="", tflops="", max_err="", status=f"{type(exc).__name__}: {str(exc)[:120]}".replace(",", ";"))
    return row


def record(stem: str, rows: list[dict[str, object]], out: str | Path) -> list[Path]:
    """Write ``OUT/<stem>_<gpu>.csv/.json`` with this run's provenance (``<gpu>``: :func:`gpu_tag`)."""
    from flashlab.lab.results import write

    command = COMMAND + " " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("__main__.py") else COMMAND
    paths = write(f"{stem}_{gpu_tag()}", rows, provenance(command.strip()), out)
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
            written += function_at(EXPERIMENTS[name])(Path(out))
        except Exception as exc:  # keep going: one broken experiment must not lose the others' results
            import traceback

            traceback.print_exc()
            print(f"== {name} FAILED: {type(exc).__name__}: {exc}", flush=True)
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return written
