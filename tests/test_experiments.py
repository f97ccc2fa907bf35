"""The experiments' shared row measurement, checked on a CPU (the timer is replaced)."""

import math

import numpy as np
import pytest
import torch

import flashlab.lab.experiments as experiments


def test_measure_case_records_time_error_and_failures(monkeypatch):
    monkeypatch.setattr(experiments, "gpu_ms", lambda fn: 2.0)  # do_bench needs a GPU
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


def test_fp8_tile_rows_have_the_recorded_columns():
    """A variant's row (also the one written for a crashed or hung variant) names the columns of
    results/fp8_tiles_h200 in their order, so new runs and the recorded one read alike."""
    from flashlab.lab import results
    from flashlab.lab.experiments import fp8

    recorded = list(results.load("fp8_tiles_h200").rows[0])
    row = fp8._tile_row((64, 128, 4, 2, 168), 128, 4096, "tma", False)
    assert list(row) == recorded[: len(row)]
    assert recorded[len(row):] == ["ms", "tflops", "max_err", "status"]
    assert (row["maxnreg"], row["B"], row["H"]) == (168, 4, 16)
    assert fp8._tile_row((128, 64, 4, 3), None, 16384, "pointer", True)["maxnreg"] == ""


def test_fp8_option_rows_name_the_recorded_columns():
    """A RESCALE_VARIANTS or PIPELINE_VARIANTS row names only columns that the recorded files hold,
    and says which V descale and which options it used."""
    from flashlab.lab import results
    from flashlab.lab.experiments import fp8

    for stem, variants in (("fp8_rescale_h200", fp8.RESCALE_VARIANTS), ("fp8_pipeline_h200", fp8.PIPELINE_VARIANTS)):
        recorded = set(results.load(stem).rows[0])
        for config, v_block, options in variants:
            row = fp8._option_row(config, v_block, options, 8192)
            assert set(row) <= recorded, (stem, set(row) - recorded)
            assert row["v_block"] == (v_block or "") and row["pipeline"] == options.get("pipeline", False)
            assert row["rescale_threshold"] == options.get("rescale_threshold", "")


def test_backward_variants_load_a_tree_and_refuse_one_that_differs_elsewhere(tmp_path):
    import shutil
    from pathlib import Path

    from flashlab.lab.experiments.fa3_backward_variants import load_backward, shapes

    kernels = Path(experiments.__file__).resolve().parents[2] / "kernels"
    tree = tmp_path / "v-1"
    shutil.copytree(kernels, tree / "flashlab" / "kernels")
    module = load_backward(tree)
    assert module.__name__ == "flashlab.kernels._fa3_backward_v_1" and callable(module.backward)
    (tree / "flashlab" / "kernels" / "fa3.py").write_text("# another forward\n")
    with pytest.raises(ValueError, match=r"differs in \['fa3.py'\]"):
        load_backward(tree)
    with pytest.raises(ValueError, match="must hold flashlab/kernels/fa3_backward.py"):
        load_backward(tmp_path)
    assert len(shapes()) == 9 and {s[2] for s in shapes()} == {4096, 16384, 131072}


def test_backward_variants_ratios_read_cudnn_and_the_first_tree():
    from flashlab.lab.experiments.fa3_backward_variants import ratios

    shape = {"B": 1, "H": 2, "N": 64, "d": 64, "causal": True}
    rows = [{"tree": "ceiling", "pass": "matmul", "ms": 1.0, **{k: "" for k in shape}},
            {"tree": "sdpa_cudnn", "pass": "fwd", "ms": 1.0, **shape},
            {"tree": "sdpa_cudnn", "pass": "fwdbwd", "ms": 4.0, **shape},
            {"tree": "main", "pass": "fwdbwd", "ms": 5.0, **shape}, {"tree": "main", "pass": "bwd", "ms": 3.0, **shape},
            {"tree": "new", "pass": "fwdbwd", "ms": 4.0, **shape}, {"tree": "new", "pass": "bwd", "ms": 2.0, **shape}]
    assert ratios(rows) == [{**shape, "tree": "main", "vs_cudnn": 0.8, "bwd_vs_first": 1.0, "pair_excess": ""},
                            {**shape, "tree": "new", "vs_cudnn": 1.0, "bwd_vs_first": 1.5, "pair_excess": ""}]
    rows.append({"tree": "gluon_forward", "pass": "fwd", "ms": 1.5, **shape})  # the shared forward, alone
    assert [r["pair_excess"] for r in ratios(rows)] == [0.1, 0.125]  # (5 - 1.5 - 3) / 5, (4 - 1.5 - 2) / 4


def test_backward_variants_refuse_names_that_collide_and_zero_rounds(tmp_path):
    from flashlab.lab.experiments.fa3_backward_variants import main

    for argv in (["a/x", "b/x", "--out", str(tmp_path)], ["sdpa_cudnn", "--out", str(tmp_path)],
                 ["x/gluon_forward", "--out", str(tmp_path)],
                 ["a", "--rounds", "0", "--out", str(tmp_path)]):
        with pytest.raises(ValueError, match="distinct names"):
            main(argv)


def test_in_rounds_rotates_the_order_and_refuses_zero_rounds():
    calls = []
    fns = {name: (lambda name=name: name) for name in "abc"}
    times = experiments.in_rounds(fns, 4, lambda fn: calls.append(fn()) or float(len(calls)))
    assert calls == list("abc" "bca" "cab" "abc")  # each round starts one contender later
    assert times == {"a": [1.0, 6.0, 8.0, 10.0], "b": [2.0, 4.0, 9.0, 11.0], "c": [3.0, 5.0, 7.0, 12.0]}
    with pytest.raises(ValueError, match="rounds must be at least 1 and fns not empty; got 0 rounds, 3"):
        experiments.in_rounds(fns, 0, lambda fn: 1.0)
    with pytest.raises(ValueError, match="got 2 rounds, 0 functions"):
        experiments.in_rounds({}, 2, lambda fn: 1.0)


def test_switch_rows_take_medians_and_compare_with_the_default(monkeypatch):
    from flashlab.kernels import fa3
    from flashlab.lab.experiments.fa3 import switch_rows

    times = {"cudnn": [1.0, 3.0, 2.0], "pingpong_overlap": [2.0, 2.0, 2.5], "no_pingpong_no_overlap": [1.0, 1.6, 4.0]}
    rows = {r["impl"]: r for r in switch_rows(times, 128, 4096, True, flops=4e12)}
    assert rows["no_pingpong_no_overlap"] == {"impl": "no_pingpong_no_overlap", "d": 128, "N": 4096, "causal": True,
                                              "ms": 1.6, "tflops": 2500.0, "spread": 1.875, "vs_default": 1.25}
    assert rows["pingpong_overlap"]["vs_default"] == 1.0 and rows["cudnn"]["spread"] == 1.0
    # the default is each head dimension's (flashlab.kernels.fa3.SWITCHES and CONSUMERS, by mask)
    times["no_pingpong_no_overlap_3wg"] = [2.0, 2.0, 2.0]
    monkeypatch.setitem(fa3.CONSUMERS, (64, False), 3)
    rows = {r["impl"]: r for r in switch_rows(times, 64, 4096, False, flops=4e12)}
    assert rows["no_pingpong_no_overlap_3wg"]["vs_default"] == 1.0 and rows["no_pingpong_no_overlap"]["vs_default"] == 1.25
    rows = {r["impl"]: r for r in switch_rows(times, 64, 4096, True, flops=4e12)}
    assert rows["no_pingpong_no_overlap"]["vs_default"] == 1.0 and rows["no_pingpong_no_overlap_3wg"]["vs_default"] == 0.8
    # an explicit default (the FP8 experiment's)
    rows = {r["impl"]: r for r in switch_rows(times, 64, 4096, False, flops=4e12, default="pingpong_overlap")}
    assert rows["pingpong_overlap"]["vs_default"] == 1.0 and rows["no_pingpong_no_overlap"]["vs_default"] == 1.25
    with pytest.raises(ValueError, match="must hold the default setting 'pingpong_overlap' of d = 128, causal = True"):
        switch_rows({"cudnn": [1.0]}, 128, 4096, True, flops=1.0)
    with pytest.raises(ValueError, match="'no_pingpong_no_overlap_3wg' of d = 64, causal = False"):
        switch_rows({"cudnn": [1.0], "no_pingpong_no_overlap": [1.0]}, 64, 4096, False, flops=1.0)
    with pytest.raises(ValueError, match="'no_pingpong_no_overlap' of d = 64, causal = True"):
        switch_rows({"cudnn": [1.0], "no_pingpong_no_overlap_3wg": [1.0]}, 64, 4096, True, flops=1.0)


def test_forward_switches_default_per_head_dimension():
    from flashlab.kernels import fa3
    from flashlab.lab.experiments.fa3 import switch_name

    assert fa3.SWITCHES == {64: (False, False), 128: (True, True), 256: (True, True)}
    assert fa3.switches(128) == (True, True)
    assert fa3.switches(64, pingpong=False) == (False, fa3.SWITCHES[64][1])
    assert fa3.switches(128, overlap=False) == (True, False) and fa3.switches(64, False, False) == (False, False)
    assert switch_name(False, False, 3) == "no_pingpong_no_overlap_3wg" and switch_name(True, False) == "pingpong_no_overlap"
    with pytest.raises(ValueError, match=r"d must be one of \(64, 128, 256\); got 96"):
        fa3.switches(96)


def test_switch_contenders_run_the_setting_they_name(monkeypatch):
    """Each contender of fa3switches and fp8switches calls its kernel with the switches its name
    says (and the lambdas do not all share the loop's last setting)."""
    import flashlab.kernels.fa3_fp8 as fa3_fp8
    import flashlab.lab.experiments.fa3 as experiment

    calls = []
    monkeypatch.setattr(experiment, "forward", lambda *a, **kw: calls.append(kw))
    monkeypatch.setattr(fa3_fp8, "forward", lambda *a, **kw: calls.append(kw))
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 256, 64, generator=g, dtype=torch.bfloat16) for _ in range(4))
    fns = experiment.switch_contenders(q, k, v, do, causal=False)
    assert set(fns) == {"cudnn", "pingpong_overlap", "pingpong_no_overlap", "no_pingpong_overlap",
                        "no_pingpong_no_overlap", "no_pingpong_no_overlap_3wg"}
    fp8_fns = experiment.fp8_switch_contenders(q, k, v, do, causal=True)
    default = "fp8_" + experiment.switch_name(*fa3_fp8.SWITCHES[64], fa3_fp8.CONSUMERS[64])
    assert set(fp8_fns) == {"cudnn", "bf16_default", "triton_fp8", "fp8_pingpong_overlap", "fp8_pingpong_no_overlap",
                            "fp8_no_pingpong_overlap", "fp8_no_pingpong_no_overlap", default, default + "_theta2",
                            default + "_theta8", default + "_poly0.125", default + "_poly0.25", default + "_poly0.5",
                            "fp8_pingpong_overlap_poly0.5"}
    assert experiments.EXPERIMENTS["fp8switches"] == "flashlab.lab.experiments.fa3:fp8_switches"
    for name, fn in [*fns.items(), *((n, f) for n, f in fp8_fns.items() if n.startswith("fp8_"))]:
        if name == "cudnn":
            continue
        calls.clear()
        fn()
        (kw,) = calls
        w = kw["consumers"]  # always given: the FP8 kernel's default count differs by d
        name, _, theta = name.partition("_theta")
        assert kw.get("rescale_threshold") == (int(theta) if theta else None), (name, kw)
        name, _, poly = name.partition("_poly")
        assert kw.get("poly_fraction") == (float(poly) if poly else None), (name, kw)
        assert experiment.switch_name(kw["pingpong"], kw["overlap"], w) == name.removeprefix("fp8_"), (name, kw)


def test_time_switches_per_length_records_each_length_longest_first(monkeypatch):
    """per_length: one record per length, <name>_n<N>, the longest first, each holding only its
    own length's rows (so that a device call's time limit keeps the lengths already done)."""
    from flashlab.lab.experiments import backward
    from flashlab.lab.experiments import fa3 as e

    records = []
    monkeypatch.setattr(experiments, "require_gpu", lambda: None)
    monkeypatch.setattr(experiments, "in_rounds", lambda fns, rounds: {k: [1.0] for k in fns})
    monkeypatch.setattr(experiments, "record", lambda name, rows, out: records.append((name, rows)) or [name])
    monkeypatch.setattr(backward, "_qkv", lambda B, H, n, d: (None,) * 4)
    monkeypatch.setattr(e.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(e, "SPEED_D", (64,))
    paths = e._time_switches(lambda *a: {"a": None, "b": None}, lambda d, causal: "a", "ab", "out",
                             per_length=True, lengths=(4096, 16384))
    assert paths == ["ab_n16384", "ab_n4096"]
    for (name, rows), n in zip(records, (16384, 4096)):
        assert {row["N"] for row in rows} == {n} and len(rows) == 4, (name, rows)  # 2 contenders x causal


@pytest.mark.parametrize("staircase, low, high", [(0.0, 1.0, 1.1), (0.75, 1.25, 1.45)])
def test_conditional_rescaling_costs_fp8_rmse_only_on_a_staircase(staircase, low, high):
    """The Gluon FP8 kernel's arithmetic emulated on a CPU (fa3.fp8_emulated_rmse), theta = 2
    against rescaling at every block, on one case, (2, 3, 1024, 1024, 128), non-causal: on
    random scores the RMSE grows by 4 %, on the staircase (a warpgroup keeps a stale m two
    blocks in three) by 31 % (5 % and 34 % at Bc = 128, where the six GPU cases of FP8_CASES
    range from 15 % to 93 %). The GPU
    test (test_fp8_conditional_rescaling_matches) holds the kernel to this emulation, not to
    the kernel rescaling at every block. The emulation is pinned to the kernel's default tile
    (fa3_fp8.config: Bc = 256 at d = 128, 64 rows deciding together) and scale
    (P = 2^(8 - theta) exp2(S - m))."""
    from flashlab.kernels import fa3_fp8
    from flashlab.lab.experiments import fa3
    from flashlab.reference import attention, rescale

    pre = fa3._fp8_inputs(2, 3, 1024, 1024, 128, 0, staircase, device="cpu")
    qkv = fa3._dequantised(pre)
    o_ref = attention(*qkv)
    plain, theta2 = (fa3.fp8_emulated_rmse(qkv, o_ref, False, t) for t in (None, 2.0))
    assert low <= theta2 / plain <= high, (plain, theta2)
    bc = fa3_fp8.config(128)["BLOCK_N"]
    assert bc == fa3_fp8.P_SMEM_BLOCK_N  # the numbers above are for the 256-key blocks
    o = rescale.conditional_attention(*qkv, 2.0, bc, row_group=64, p_format="e4m3", p_shift=6.0).o
    assert theta2 == float(np.sqrt(np.mean((o - o_ref) ** 2)))
    with pytest.raises(ValueError, match="rescale_threshold"):
        fa3.fp8_emulated_rmse(qkv, o_ref, False, 9.0)  # P = 2^(8 - 9) exp2(S - m): outside the kernel's range
    with pytest.raises(ValueError, match="o_ref must have shape"):
        fa3.fp8_emulated_rmse(qkv, o_ref[..., :64], False)


def test_fp8_emulation_follows_l_mma():
    """With l_mma the emulated kernel's row sums add the rounded P (the tensor cores sum the
    e4m3 tile P V reads): fa3.fp8_emulated_rmse is conditional_attention's with l_of_rounded_p,
    and differs from the emulation that sums the exact P; l_mma needs a build with P in shared
    memory."""
    from flashlab.kernels import fa3_fp8
    from flashlab.lab.experiments import fa3
    from flashlab.reference import attention, rescale

    pre = fa3._fp8_inputs(1, 2, 512, 512, 128, 0, device="cpu")
    qkv = fa3._dequantised(pre)
    o_ref = attention(*qkv)
    rounded = fa3.fp8_emulated_rmse(qkv, o_ref, False, l_mma=True)
    o = rescale.conditional_attention(*qkv, 0.0, fa3_fp8.config(128)["BLOCK_N"], row_group=64, p_format="e4m3",
                                      p_shift=8.0, l_of_rounded_p=True).o
    assert rounded == float(np.sqrt(np.mean((o - o_ref) ** 2)))
    assert rounded != fa3.fp8_emulated_rmse(qkv, o_ref, False, l_mma=False)
    with pytest.raises(ValueError, match="l_mma=True sums P from shared memory"):
        fa3.fp8_emulated_rmse(qkv, o_ref, False, p_smem=False, l_mma=True)


def test_fp8_emulated_lse_is_exact_unless_l_sums_the_rounded_p():
    """The emulation's lse, m_ref + log2 l: with l of the exact P it is the float64 lse, causal
    rows with no key -inf; with l of the rounded P (an l_mma kernel) it moves, but at most by
    log2(1 + 2^-4 + N_k 2^-18), the allowance fp8_check_case adds for l_mma (each P rounds by 2^-4
    of itself or half e4m3's subnormal step, 2^-18 unshifted, against l >= 1)."""
    from flashlab.lab.experiments import fa3
    from flashlab.reference import attention

    pre = fa3._fp8_inputs(1, 2, 300, 256, 128, 0, device="cpu")
    qkv = fa3._dequantised(pre)
    _, lse_ref = attention(*qkv, causal=True, return_lse=True)  # natural log; 44 rows see no key
    lse2 = {}
    for l_mma in (False, True):
        emu = fa3.fp8_emulated(qkv, True, l_mma=l_mma)
        with np.errstate(divide="ignore"):
            lse2[l_mma] = emu.m_ref + np.log2(emu.l)
    finite = np.isfinite(lse_ref)
    assert np.array_equal(finite, np.isfinite(lse2[False])) and np.array_equal(finite, np.isfinite(lse2[True]))
    assert np.allclose(lse2[False][finite] * math.log(2), lse_ref[finite], rtol=0, atol=1e-12)
    moved = np.abs(lse2[True][finite] - lse2[False][finite])
    assert 0 < moved.max() <= math.log2(1 + 2.0**-4 + 256 * 2.0**-18)
