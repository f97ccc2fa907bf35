"""flashlab.lab.compile_report: compiling for Hopper on a CPU, and reading the key loop out of SASS."""

import json
import os
import subprocess
import sys

import pytest

from flashlab.lab import compile_report


def _report(*args, **options) -> dict:
    """compile_report.report in a fresh process without TRITON_INTERPRET (the test suite sets it,
    and interpreted kernels cannot be compiled)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = f"import json; from flashlab.lab import compile_report as c; print(json.dumps(c.report(*{args!r}, **{options!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FFMA R2, R3, R4, R5 ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0030*/                   MUFU.EX2 R6, R7 ;
        /*0040*/               @P0 BRA 0x10 ;
        /*0050*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R2 ;
        /*0060*/              @!P1 BRA 0x0 ;
"""


def test_loop_mix_takes_the_shortest_loop_with_a_tensor_core_instruction():
    """0x10-0x40 is the key loop; 0x00-0x60 (a barrier wait's retry jump) also spans a GMMA but is longer."""
    mix = compile_report.loop_mix(SASS)
    assert mix == {"FFMA": 1, "HGMMA": 1, "MUFU": 1, "BRA": 1}


def test_loop_mix_ignores_loops_without_matrix_instructions():
    assert compile_report.loop_mix(SASS.replace("HGMMA.64x128x16.F32.BF16", "FADD")) == {}


def test_loop_mix_ignores_a_short_span_without_exponentials():
    """After pipeline="pv"'s loop come the last tile's P V and the store, inside a barrier wait's
    retry jump: a GMMA in a span shorter than the loop, but no exponential."""
    tail = """
        /*0070*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R88, R152, gdesc[UR4], R88 ;
        /*0080*/              @!P2 BRA 0x70 ;
"""
    assert compile_report.loop_mix(SASS + tail) == {"FFMA": 1, "HGMMA": 1, "MUFU": 1, "BRA": 1}


def test_compiles_the_fp8_kernel_for_sm90_without_a_gpu():
    """One configuration of the FP8 forward, compiled for an H100/H200 on this CPU."""
    row = _report("fp8", (64, 64, 4, 2), 128)
    assert row["status"] == "ok", row["status"]
    assert 0 < row["registers"] <= 255 and row["stack_bytes"] >= 0
    assert row["qgmma"] > 0 and row["mufu"] > 0 and row["hgmma"] == 0  # fp8 x fp8 dots, exp2 on the MUFU
    assert row["programs_per_sm"] >= 1 and row["instructions_per_score"] > 1


def test_compiles_the_forward_kernel_and_its_warp_specialised_variant():
    """The bf16 forward (TMA loads of K and V) and the lab variant whose key loop Triton splits
    into producer and consumer warps compile for sm_90 to the same key loop: at 8 warps Triton
    adds no warp-specialised region."""
    plain = _report("forward", (128, 128, 8, 3), 128)
    ws = _report("forward", (128, 128, 8, 3), 128, warp_specialize=True)
    assert plain["status"] == ws["status"] == "ok", (plain["status"], ws["status"])
    assert plain["hgmma"] > 0 and plain["mufu"] > 0 and plain["qgmma"] == 0
    assert ws["loop_instructions"] == plain["loop_instructions"] and not ws["warp_specialized"]


def test_pipelined_pv_keeps_q_in_registers():
    """pipeline="pv" holds one more V buffer; Q as a register operand keeps two programs per SM."""
    row = _report("fp8", (64, 128, 4, 3), 128, v_block=None, pipeline="pv")
    plain = _report("fp8", (64, 128, 4, 3), 128, v_block=None)
    assert row["status"] == "ok" and row["v_block"] == "head" and row["pipeline"] == "pv"
    assert row["programs_per_sm"] == 2 and row["qgmma"] == plain["qgmma"] == 8  # the key loop: 4 + 4 dots
    assert row["shared_bytes"] <= plain["shared_bytes"] + 16384  # one more V buffer, no Q buffer


def test_register_cap_is_applied():
    capped = _report("fp8", (64, 128, 4, 2, 128), 128)
    assert capped["status"] == "ok" and capped["registers"] <= 128 and capped["maxnreg"] == 128


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel must be one of"):
        compile_report.compile_case("backward", (64, 64, 4, 2))


def test_interpreter_mode_is_named(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        compile_report.compile_case("fp8", (64, 64, 4, 2))


def test_compiles_the_fa4_kernel_and_its_polynomial_replaces_mufu_work():
    """The FA4-style forward compiled for sm_90: with half of P's columns on the polynomial the key
    loop issues about half the MUFU.EX2 of the hardware-only kernel."""
    hw = _report("fa4", (128, 64, 8, 3), 128)
    half = _report("fa4", (128, 64, 8, 3), 128, poly_fraction=0.5)
    assert hw["status"] == half["status"] == "ok"
    assert hw["hgmma"] > 0 and half["mufu"] < 0.6 * hw["mufu"]


def test_no_kernel_function_takes_more_than_30_parameters():
    """Long signatures are grouped (tuples of strides, tensor descriptors in the pointers' place)."""
    import triton

    from flashlab.kernels import _common, backward, decoding, fa4, forward, fp8
    from flashlab.lab.variants import forward_schedules, fp8_schedules

    for module in (forward, backward, decoding, _common, fp8, fa4, forward_schedules, fp8_schedules):
        for name, obj in vars(module).items():
            fn = obj.fn if isinstance(obj, triton.runtime.Autotuner) else obj  # the jit function under autotuning
            if isinstance(fn, triton.runtime.JITFunction) and fn.__module__ == module.__name__:
                assert len(fn.arg_names) <= 30, (module.__name__, name, len(fn.arg_names))
