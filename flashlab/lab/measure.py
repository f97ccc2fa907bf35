"""How the lab runs a measurement: timing, provenance, and work spread over processes.

- :func:`time_ms` -- the median time of a call (``triton.testing.do_bench`` on a GPU);
- :func:`provenance` -- GPU, driver, versions, date, command and commit of a run;
- :func:`gpu_slug` -- the folder name of a GPU (``"NVIDIA H200"`` -> ``"nvidia-h200"``);
- :func:`precompile` -- compile many kernels in parallel worker processes;
- :func:`isolated` -- run one configuration in a fresh process, surviving hangs and crashes;
- :data:`TOKENS`, :data:`HEADS_X_D`, :func:`paper_shape` -- the FlashAttention papers' benchmark
  shape: batch x sequence length = 16384 tokens and heads x head dimension = 2048.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import os
import platform
import statistics
import subprocess
import time
from typing import Callable

import torch

__all__ = ["TOKENS", "HEADS_X_D", "paper_shape", "time_ms", "provenance", "gpu_slug", "gpu_tag", "function_at", "precompile", "isolated"]

TOKENS = 16384  # B * N, the batch shrinks as the sequence grows
HEADS_X_D = 2048  # H * d, the heads shrink as the head dimension grows


def paper_shape(n: int, d: int, tokens: int = TOKENS) -> tuple[int, int]:
    """(B, H) of the papers' benchmark at sequence length ``n`` and head dimension ``d``:
    B = tokens / N and H = 2048 / d, each at least 1."""
    return max(1, tokens // n), max(1, HEADS_X_D // d)


def time_ms(fn: Callable[[], object], device: str, repeats: int = 5) -> float:
    """Median wall time of ``fn()`` in milliseconds (do_bench with CUDA events on a GPU)."""
    if device.startswith("cuda"):
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)



def gpu_tag(name: str | None = None) -> str:
    """The suffix of a result stem on this GPU: its slug without the vendor and brand words,
    'NVIDIA H200' -> 'h200', 'NVIDIA GeForce RTX 4090' -> 'rtx-4090'; 'cpu' without a GPU."""
    if name is None and not torch.cuda.is_available():
        return "cpu"
    words = gpu_slug(name).split("-")
    return "-".join(w for w in words if w not in ("nvidia", "geforce", "tesla")) or "gpu"


def gpu_slug(name: str | None = None) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': the results folder of a GPU."""
    name = name if name is not None else torch.cuda.get_device_name(0)
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())



def provenance(command: str) -> dict[str, object]:
    """GPU, driver, CUDA, torch and triton versions, date, command and git commit of this run."""
    import triton

    def _run(args: list[str]) -> str:
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception:
            return "unknown"

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "CPU"
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()
    # A copy of the tree without .git (a GPU machine that received the files only) names its
    # commit in FLASHLAB_COMMIT.
    commit = os.environ.get("FLASHLAB_COMMIT") or _run(["git", "rev-parse", "HEAD"]) or "unknown"
    dirty = "" if os.environ.get("FLASHLAB_COMMIT") else _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "gpu": gpu,
        "driver": driver[0] if driver else "none",
        "cuda": torch.version.cuda or "none",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "commit": commit + ("+dirty" if dirty else ""),
    }



def function_at(target: str) -> Callable:
    """The function that ``"module:function"`` names."""
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)



def _call(spec: tuple[str, tuple]) -> str:
    """Run ``module:function(*args)`` once (in a worker process); return "ok" or the error."""
    target, args = spec
    try:
        function_at(target)(*args)
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
    queue.put(function_at(target)(*args))



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
