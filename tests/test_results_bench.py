"""Recorded results carry their provenance; the benchmark harness runs on a CPU."""

from __future__ import annotations

import json

import pytest
import torch

from flashlab.lab import bench, results
from flashlab.lab.measure import gpu_tag


def test_every_recorded_result_has_provenance():
    stems = sorted(str(p.relative_to(results.RESULTS_DIR).with_suffix("")) for p in results.RESULTS_DIR.rglob("*.csv"))
    assert stems, "results/ holds no recorded measurements"
    for stem in stems:
        rec = results.load(stem)
        assert rec.rows
        for key in results.REQUIRED_META:
            assert rec.meta[key] not in ("", None, "unknown"), f"{stem}.json: {key} is {rec.meta[key]!r}"
        assert rec.meta["gpu"] in rec.provenance
        if rec.meta["gpu"].startswith("none"):  # compiled for a GPU, not run on one (flashlab.lab.compile_report)
            assert rec.short.startswith(rec.meta["gpu"].split(":", 1)[1].strip() + " (Triton ")
            assert "measured" not in rec.short
        else:
            assert rec.short.startswith(f"measured on an {rec.meta['gpu']} (torch ")
        assert rec.short.endswith(f"results/{stem}")
        assert "commit" not in rec.short and "\n" not in rec.short  # one line for readers, no maintainer detail


def test_recorded_h200_run_is_self_consistent():
    rec = results.load("naive_vs_fused_h200")
    for row in rec.rows:
        flops = 4 * row["batch"] * row["heads"] * row["N"] ** 2 * row["d"] * (3.5 if row["pass"] == "fwdbwd" else 1)
        assert row["tflops"] == pytest.approx(flops / (row["ms"] * 1e-3) / 1e12, rel=1e-3)
    naive = rec.where(backend="naive", **{"pass": "fwd"}, d=64, N=16384)[0]
    flash = rec.where(backend="flash", **{"pass": "fwd"}, d=64, N=16384)[0]
    assert naive["peak_extra_bytes"] > 100 * flash["peak_extra_bytes"]  # N^2 vs N


def test_write_then_load_roundtrip(tmp_path):
    meta = {k: "x" for k in results.REQUIRED_META}
    results.write("demo", [{"a": 1, "b": 2.5, "c": "text"}], meta, tmp_path)
    rec = results.load("demo", tmp_path)
    assert rec.rows == [{"a": 1, "b": 2.5, "c": "text"}]
    assert json.loads((tmp_path / "demo.json").read_text()) == meta


def test_load_and_where_errors(tmp_path):
    with pytest.raises(ValueError, match="stem must name a recorded result"):
        results.load("nope", tmp_path)
    with pytest.raises(ValueError, match="meta must record"):
        results.write("demo", [{"a": 1}], {}, tmp_path)
    rec = results.load("naive_vs_fused_h200")
    with pytest.raises(ValueError, match="column must be one of"):
        rec.where(colour="red")


def test_naive_torch_matches_reference_and_sdpa():
    from flashlab.reference import attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 8, generator=g, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        ref = torch.from_numpy(attention(q.numpy(), k.numpy(), v.numpy(), causal=causal))
        torch.testing.assert_close(bench.naive_attention_torch(q, k, v, causal), ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(bench.fused_attention_torch(q, k, v, causal), ref, rtol=1e-12, atol=1e-12)


def test_quick_bench_on_cpu(tmp_path):
    assert bench.main(["--quick", "--suite", "ch01", "--out", str(tmp_path), "--tag", "cpu"]) == 0
    rec = results.load("naive_vs_fused_cpu", tmp_path)
    assert {r["backend"] for r in rec.rows} == {"naive", "default"}
    steps = results.load("naive_steps_cpu", tmp_path)
    softmax_rows = steps.where(step="P = softmax(S)")
    assert all(r["intensity"] == 5 / (2 * 4) for r in softmax_rows)  # 5 FLOPs per fp32 element read + written


def test_quick_bench_tags_its_stems_by_device(tmp_path):
    """Without --tag the chapter-1 stems carry the device: cpu here, the GPU's slug without its vendor on a GPU."""
    assert bench.main(["--quick", "--suite", "ch01", "--out", str(tmp_path), "--ns", "64"]) == 0
    tag = gpu_tag() if torch.cuda.is_available() else "cpu"
    assert results.load(f"naive_vs_fused_{tag}", tmp_path).rows


def test_paper_shape_is_the_benchmark_shape():
    """compare_naive_fused takes B and H from lab.measure.paper_shape: 16384 tokens, H * d = 2048."""
    rows = bench.compare_naive_fused([128], d=16, backends=("naive",), tokens=256, repeats=1)
    assert (rows[0]["batch"], rows[0]["heads"]) == (2, 128)


def test_bench_refuses_cpu_without_quick():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bench.main(["--out", "/nonexistent"]) == 2


def test_fused_backend_name_checked():
    q = torch.zeros(1, 1, 2, 2)
    with pytest.raises(ValueError, match="backend must be one of"):
        bench.fused_attention_torch(q, q, q, backend="fast")


def test_kernel_suite_columns_on_cpu():
    rows = bench.kernel_suite([64], ds=(16,), impls=("naive", "sdpa_math"), device="cpu", dtype=torch.float32,
                              tokens=64, causals=(True,), progress=False)
    assert list(rows[0]) == ["impl", "dtype", "causal", "d", "N", "B", "H", "pass", "ms", "tflops"]
    assert {(r["impl"], r["pass"]) for r in rows} == {(i, p) for i in ("naive", "sdpa_math") for p in ("fwd", "fwdbwd")}


def test_gpu_slug():
    assert bench.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert bench.gpu_slug("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"


def test_kernel_bench_columns_and_flops():
    rec = results.load("nvidia-h200/bench")
    assert list(rec.rows[0]) == ["impl", "dtype", "causal", "d", "N", "B", "H", "pass", "ms", "tflops"]
    for row in rec.rows:
        flops = 4 * row["B"] * row["H"] * row["N"] ** 2 * row["d"] * (0.5 if row["causal"] else 1.0)
        flops *= 3.5 if row["pass"] == "fwdbwd" else 1.0
        assert row["tflops"] == pytest.approx(flops / (row["ms"] * 1e-3) / 1e12, rel=1e-3)
    shapes = {(r["d"], r["causal"], r["N"], r["pass"]) for r in rec.rows}
    assert len(shapes) == 2 * 2 * 6 * 2  # d x causal x N x pass: a complete run
    for shape in shapes:
        assert {r["impl"] for r in rec.rows if (r["d"], r["causal"], r["N"], r["pass"]) == shape} >= {"flashlab", "sdpa_flash", "sdpa_cudnn"}


def test_kernel_suite_fp8_rows_are_forward_only(monkeypatch):
    """flashlab_fp8 (asked for by name) gives forward rows with dtype float8_e4m3fn and no
    forward+backward rows; its inputs are quantised before timing. Under the interpreter on CPU."""
    import flashlab.kernels.fp8 as kfp8

    if not kfp8.INTERPRET:
        pytest.skip("runs the FP8 kernel under the Triton interpreter (the test suite's CPU mode)")
    quantised = []
    real = kfp8.quantize_qkv
    monkeypatch.setattr(kfp8, "quantize_qkv", lambda *a, **kw: quantised.append(kw.get("v_block", "same")) or real(*a, **kw))
    rows = bench.kernel_suite([32], ds=(32,), impls=("flashlab_fp8",), device="cpu", dtype=torch.float32,
                              tokens=32, causals=(False,), passes=("fwd", "fwdbwd"), progress=False)
    assert [(r["impl"], r["dtype"], r["pass"]) for r in rows] == [("flashlab_fp8", "float8_e4m3fn", "fwd")]
    assert quantised == [None]  # once, outside the timed function, with one V descale per head (FP8_V_BLOCK)


@pytest.mark.parametrize("name, impl, deterministic", [("flashlab", "triton", True), ("flashlab_gluon", "gluon", True),
                                                       ("flashlab_fa3", "gluon", False)])
def test_kernel_impls_call_the_kernels_they_name(monkeypatch, name, impl, deterministic):
    """Each flashlab row of the suite times flash_attention with the forward (impl) and backward
    (deterministic=False: the Gluon FA3 backward on sm_90) its name stands for."""
    import flashlab.kernels

    calls = []
    monkeypatch.setattr(flashlab.kernels, "flash_attention", lambda q, k, v, **kw: calls.append(kw))
    bench._impl(name, True)(None, None, None)
    assert calls == [{"causal": True, "impl": impl, "deterministic": deterministic}]


def test_kernel_suite_writes_its_own_ceilings(tmp_path, monkeypatch):
    """On a GPU the kernel suite records the matmul and copy ceilings of the same run beside its rows,
    so every TFLOP/s it prints has a same-run fraction of the ceiling (the device is stubbed here)."""
    row = {"impl": "sdpa_cudnn", "dtype": "bfloat16", "causal": False, "d": 64, "N": 128, "B": 1, "H": 1,
           "pass": "fwd", "ms": 1.0, "tflops": 1.0}
    ceiling = {"ceiling": "matmul_bf16_8192", "ms": 1.0, "value": 7.5e14, "unit": "FLOP/s"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "kernel_suite", lambda *a, **k: [row])
    monkeypatch.setattr(bench, "ceilings", lambda device: [ceiling])
    monkeypatch.setattr(bench, "gpu_slug", lambda: "stub-gpu")
    meta = dict.fromkeys(results.REQUIRED_META, "stub")
    monkeypatch.setattr(bench, "provenance", lambda command: meta | {"command": command})
    assert bench.main(["--suite", "kernels", "--impls", "sdpa_cudnn", "--out", str(tmp_path)]) == 0
    assert results.load("stub-gpu/bench", tmp_path).rows[0]["impl"] == "sdpa_cudnn"
    assert results.load("stub-gpu/ceilings", tmp_path).rows[0]["value"] == 7.5e14
