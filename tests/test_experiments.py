"""The experiments' shared row measurement, checked on a CPU (the timer is replaced)."""

import pytest
import torch

import flashlab.experiments as experiments


def test_measure_case_records_time_error_and_failures(monkeypatch):
    monkeypatch.setattr(experiments, "ms", lambda fn: 2.0)  # do_bench needs a GPU
    ref = torch.ones(3)
    row = experiments.measure_case({"cfg": 1}, lambda: ref + 1e-3, lambda: ref, flops=4e12, timed=True)
    assert row == {"cfg": 1, "ms": 2.0, "tflops": 2000.0, "max_err": "1.00e-03", "status": "ok"}

    def refused():
        raise RuntimeError("out of resources: shared memory, required: 294912")

    row = experiments.measure_case({}, refused, lambda: ref, flops=1.0, timed=True)
    assert row["ms"] == "" and row["status"].startswith("RuntimeError: out of resources") and "," not in row["status"]
    with pytest.raises(RuntimeError, match="out of resources"):  # a precompile worker must not hide it
        experiments.measure_case({}, refused, lambda: ref, flops=1.0, timed=False)
    assert experiments.measure_case({"a": 0}, lambda: ref, lambda: ref, flops=1.0, timed=False) == {"a": 0}


def _returns(x):
    return [x]


def _exits():
    import os

    os._exit(3)


def _sleeps():
    import time

    time.sleep(60)


def test_isolated_reports_results_crashes_and_hangs():
    """A configuration run in its own process: its rows come back; a crash (as after an illegal
    memory access) or a hang (a deadlocked pipeline) is named, and the caller goes on."""
    assert experiments.isolated("tests.test_experiments:_returns", (5,), timeout=60) == ([5], "ok")
    assert experiments.isolated("tests.test_experiments:_exits", (), timeout=60) == (None, "crashed (exit 3)")
    assert experiments.isolated("tests.test_experiments:_sleeps", (), timeout=2) == (None, "timeout")
