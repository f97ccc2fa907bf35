"""The Gluon FlashAttention-3 backward (flashlab.kernels.fa3_backward).

On a CPU the kernel is compiled for sm_90 (Gluon has no interpreter) and the compiled code must
show FA3's structure: warp specialisation with register reallocation (``setmaxnreg``), TMA loads
completing on mbarriers, wgmma, dQ added by TMA's reduce-add; and what makes it fast: no local
memory in the query-block loop and no serialised wgmma (ptxas waits for each wgmma to finish when
other instructions touch its accumulators while it runs).
On a Hopper GPU (marker ``gpu``): dq, dk, dv against the float64 reference under the flash-attn
rule (max error at most twice that of plain PyTorch attention in the same precision, plus 1e-5),
causal and not, ragged N, N_q != N_k both ways (rows that see no key among them), several heads
and batches, bf16 and fp16; dk and dv bit-identical twice (dq is summed atomically, in any
order); bad input refused naming the argument.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper", reason="this triton has no Gluon for Hopper")

import triton  # noqa: E402

from gluon_probes import cuobjdump  # noqa: E402
from tiers import DEVICE, SM90_TRITON_VERSION, needs_gpu, runs_somewhere, sm90_build_env  # noqa: E402

VERIFIED_TRITON = ("3.6.", "3.9.")
BUILDS = [(d, causal) for d in (64, 128) for causal in (False, True)]

# compiled in a fresh process: TRITON_INTERPRET (set for the other kernel tests) patches triton.language
_BUILD = """
import base64, json, sys, torch, triton
sys.path.insert(0, "tests")
from flashlab.kernels import fa3_backward
import gluon_probes
from triton.experimental.gluon import language as gl
out = {"triton": triton.__version__}
for name, layout in (("dq_tile", fa3_backward.DQ_SMEM_LAYOUT), ("dq_tile_unswizzled", gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3))):
    try:
        gluon_probes.dq_tile_probe(layout)
        out[name] = {"ok": True}
    except Exception as exc:
        out[name] = {"error": str(exc)[-300:]}
for d, causal, stamps in json.loads(sys.argv[1]):
    try:
        k = fa3_backward.compile_sm90(torch.bfloat16, d, causal, stamps)
        out[f"{d}-{causal}-{stamps}"] = {"ptx": k.asm["ptx"], "cubin": base64.b64encode(k.asm["cubin"]).decode(),
                                "shared": k.metadata.shared}
    except Exception as exc:
        out[f"{d}-{causal}-{stamps}"] = {"error": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}
print(json.dumps(out))
"""


@functools.cache
def _builds() -> dict:
    env = sm90_build_env()
    wanted = [(d, causal, False) for d, causal in BUILDS] + [(128, False, True)]
    run = subprocess.run([sys.executable, "-c", _BUILD, json.dumps(wanted)], capture_output=True, text=True,
                         env=env, timeout=600, cwd=Path(__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _compiled(d: int, causal: bool, stamps: bool = False) -> dict:
    build = _builds()[f"{d}-{causal}-{stamps}"]
    if "error" in build:
        if triton.__version__.startswith(VERIFIED_TRITON):
            raise AssertionError(f"the backward does not compile for sm_90: {build['error']}")
        pytest.skip(f"the backward does not compile with triton {triton.__version__}: {build['error'][:120]}")
    return build


def _sass(cubin: bytes) -> str:
    sass = cuobjdump(cubin, "-sass")
    if not sass:
        pytest.skip("no cuobjdump beside this triton")
    return sass


def query_block_loops(sass: str) -> list[list[str]]:
    """The instructions of each query-block loop in ``sass``: the shortest backward branches whose
    body holds the step's wgmmas (HGMMA, at least 4 k-steps each of S^T, dP^T, dV, dK). A branch
    whose span holds the kernel's EXIT (not a predicated one) is no loop: ptxas puts the retry
    paths of mbarrier waits past the kernel's end, each jumping back into the code it came from."""
    ins = [(int(a, 16), op.strip()) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = []
    for addr, op in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", op)
        if m and int(m.group(1), 16) < addr:
            body = [o for a, o in ins if int(m.group(1), 16) <= a <= addr]
            if sum("HGMMA" in o for o in body) >= 16 and "EXIT" not in body:
                loops.append(body)
    shortest = min((len(b) for b in loops), default=0)
    return [b for b in loops if len(b) < 1.5 * shortest]


def serialised(body: list[str]) -> bool:
    """Whether ptxas waits for every wgmma to finish before the next one (its C7514 fallback): a
    full wait (``WARPGROUP.DEPBAR.LE gsb0, 0x0``) behind most HGMMA instructions."""
    waits = sum("WARPGROUP.DEPBAR.LE gsb0, 0x0" in o for o in body)
    return waits >= 0.75 * sum("HGMMA" in o for o in body)


@pytest.mark.parametrize("d, causal", BUILDS)
def test_compiled_code_has_fa3_backward_structure(d, causal):
    ptx = _compiled(d, causal)["ptx"]
    assert "setmaxnreg.dec.sync.aligned.u32 \t24" in ptx and "setmaxnreg.inc.sync.aligned.u32 \t240" in ptx
    assert "cp.async.bulk.tensor" in ptx and "mbarrier.try_wait" in ptx and "expect_tx" in ptx
    assert "wgmma.mma_async" in ptx and "wgmma.wait_group.sync.aligned 1" in ptx  # S^T ready, dP^T may run
    # dQ: TMA's bulk reduce-add from shared memory, waited for before the tile is written again
    assert "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add" in ptx
    # each consumer waits for TMA's read before it writes the tile again, and once before it ends
    assert len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx)) >= 4 and "atom.global" not in ptx


@pytest.mark.parametrize("d, causal", BUILDS)
def test_query_block_loop_is_neither_spilled_nor_serialised(d, causal):
    sass = _sass(base64.b64decode(_compiled(d, causal)["cubin"]))
    loops = query_block_loops(sass)
    assert loops, "no query-block loop found in the SASS"
    assert not any(serialised(body) for body in loops), "ptxas serialised the wgmma of the query-block loop"
    if not _builds()["triton"].startswith(SM90_TRITON_VERSION):
        pytest.skip(f"spills are checked with the GPU's Triton {SM90_TRITON_VERSION}x (make test installs it); "
                    f"this build used {_builds()['triton']}")
    local = sum(bool(re.match(r"(@!?U?P\d+ )?(LDL|STL)", o)) for body in loops for o in body)
    assert local == 0, f"{local} local-memory accesses in the query-block loop"


def test_loop_finder_skips_the_retry_paths_past_exit():
    hgmma = "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0"
    code = [(0x10 * k, hgmma) for k in range(1, 33)] + [(0x210, "BRA 0x10"),  # the query-block loop
                                                          (0x220, "@P0 EXIT"), (0x230, "EXIT"),
                                                          (0x240, "BRA 0x100")]  # a retry path jumping back
    sass = "".join(f"/*{a:04x}*/ {op} ;\n" for a, op in code)
    loops = query_block_loops(sass)
    assert len(loops) == 1 and loops[0][-1] == "BRA 0x10" and len(loops[0]) == 33


def test_serialisation_finder_finds_a_serialised_loop():
    body = ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x0"] * 8
    assert serialised(body)
    overlapped = ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0"] * 8 + ["WARPGROUP.DEPBAR.LE gsb0, 0x1"]
    assert not serialised(overlapped)


@pytest.mark.parametrize("d", (64, 128))
def test_config_fits_shared_memory(d):
    assert _compiled(d, False)["shared"] <= 227 * 1024


def test_dq_tile_store_costs_at_most_one_extra_wavefront():
    """The kernel's dQ tile layout, the 128-byte swizzle TMA reads, passes the probe
    (tests/gluon_probes.py): its stores from the accumulator cost at most one wavefront beyond the
    fewest. An unswizzled layout, which costs three, fails it."""
    builds = _builds()
    assert builds["dq_tile"] == {"ok": True}, builds["dq_tile"]
    assert "bank conflicts" in builds["dq_tile_unswizzled"].get("error", "")


def test_time_stamps_are_compiled_only_when_asked():
    assert "%globaltimer" not in _compiled(128, False)["ptx"]
    stamped = _compiled(128, False, stamps=True)["ptx"]
    assert "%globaltimer" in stamped and "%clock64" in stamped


def _synthetic_stamps(steps: int, phases: int, gap: int = 100) -> "np.ndarray":
    """Stamps as the kernel writes them for ``steps`` steps: cycles rising by ``gap`` a phase,
    the timer at 2 ns a cycle, consumer 1 one cycle behind consumer 0."""
    import numpy as np

    s = np.zeros((steps + 3, phases, 2, 2), dtype=np.int64)
    for t in range(steps):
        for p in range(phases):
            for w in range(2):
                c = 1000 + (t * phases + p) * gap + w
                s[t, p, w] = (2 * c, c)
    return s


def test_phases_follow_the_consumer_order():
    from flashlab.kernels import fa3_backward
    from flashlab.lab.experiments import fa3_backward_timeline as tl

    n = len(fa3_backward.STAMP_PHASES)
    rows = tl.phases(_synthetic_stamps(8, n))
    assert len(rows) == 2 * (8 * n - 1)  # each consumer: every phase but the very last has an end
    first = [r for r in rows if r["partition"] == "consumer 0"][: n + 1]
    assert [r["phase"] for r in first] == list(fa3_backward.STAMP_PHASES) + ["wait_q"]
    assert all(abs(r["end_us"] - r["start_us"] - 0.2) < 1e-6 for r in rows)  # 100 cycles at 2 ns
    assert abs(tl.step_period(rows) - 0.2 * n) < 1e-6
    assert abs(tl.phase_means(rows)[("consumer 1", "exp")] - 0.2) < 1e-6


def test_phases_refuse_missing_stamps():
    from flashlab.kernels import fa3_backward
    from flashlab.lab.experiments import fa3_backward_timeline as tl

    s = _synthetic_stamps(6, len(fa3_backward.STAMP_PHASES))
    s[3, 5, 1] = 0  # consumer 1 never noted "exp" of step 3
    with pytest.raises(ValueError, match="missing"):
        tl.phases(s)


def test_step_products_at_the_matmul_rate():
    from flashlab.lab.experiments import fa3_backward_timeline as tl

    # ten 64 x 64 x 128 products (10.5 MFLOP) at 1 TFLOP/s on one SM: 10.49 us
    assert abs(tl.step_products_us(1.0, 128, 1) - 10.48576) < 1e-4


# ---------------------------------------------------------------------------------------- GPU


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (sm_90: H100, H200)")

# (B, H, N_q, N_k, d, causal, dtype): ragged lengths, N_q != N_k both ways (N_q > N_k causal:
# the first N_q - N_k rows see no key), a key block shorter than one block
CASES = [(2, 4, 1024, 1024, 128, False, torch.bfloat16), (2, 4, 1024, 1024, 128, True, torch.bfloat16),
         (1, 4, 1333, 777, 128, True, torch.bfloat16), (1, 3, 777, 1333, 128, True, torch.float16),
         (3, 5, 300, 301, 64, False, torch.bfloat16), (2, 3, 129, 65, 64, True, torch.float16),
         (1, 2, 2048, 2048, 64, True, torch.bfloat16), (1, 2, 1, 700, 128, False, torch.bfloat16),
         (1, 2, 1, 700, 128, True, torch.bfloat16), (1, 3, 200, 100, 128, False, torch.bfloat16)]


def _attention(q, k, v, causal):
    """Attention with bottom-right causal alignment; a row that sees no key gives 0."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if causal:
        n_q, n_k = s.shape[-2:]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril(n_k - n_q)
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ v


def _grads(q, k, v, do, causal, dtype):
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(_attention(q, k, v, causal), (q, k, v), do.to(dtype))


@needs_gpu
@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_matches_float64_reference(case):
    from flashlab.kernels import fa3_backward
    from flashlab.kernels.forward import forward

    B, H, N_Q, N_K, d, causal, dtype = case
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, N_Q, d, device="cuda", generator=g).to(dtype)
    k, v = (torch.randn(B, H, N_K, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    do = torch.randn(B, H, N_Q, d, device="cuda", generator=g).to(dtype)
    o, lse2 = forward(q, k, v, causal, d**-0.5)
    got = fa3_backward.backward(do, q, k, v, o, lse2, causal, d**-0.5)
    again = fa3_backward.backward(do, q, k, v, o, lse2, causal, d**-0.5)
    ref = _grads(q, k, v, do, causal, torch.float64)
    low = _grads(q, k, v, do, causal, dtype)
    for name, a, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
        assert a.dtype == dtype and a.shape == r.shape, name
        assert torch.isfinite(a).all(), f"{name} is not finite"
        err = (a.double() - r).abs().max().item()
        bound = 2 * (lo.double() - r).abs().max().item() + 1e-5
        assert err <= bound, f"{name}: max error {err:.3e} > {bound:.3e}"
    assert torch.equal(got[1], again[1]) and torch.equal(got[2], again[2]), "dk, dv differ between two runs"


@needs_gpu
@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("bad, words", [("d", "head dimension"), ("dtype", "q must be bfloat16 or float16"),
                                        ("lse", "lse2 must be"), ("stride", "contiguous")])
def test_bad_input_names_the_argument(bad, words):
    from flashlab.kernels import fa3_backward

    q, k, v, do, o = (torch.randn(1, 2, 128, 128 if bad != "d" else 96, device="cuda", dtype=torch.bfloat16)
                      for _ in range(5))
    lse2 = torch.zeros(1, 2, 128, device="cuda")
    if bad == "dtype":
        q = q.float()
    if bad == "lse":
        lse2 = lse2.half()
    if bad == "stride":
        k = k.transpose(2, 3)
    with pytest.raises(ValueError, match=words):
        fa3_backward.backward(do, q, k, v, o, lse2, False, 0.1)


@needs_gpu
@needs_hopper
@pytest.mark.gpu
def test_time_stamps_change_nothing_and_cover_every_phase():
    from flashlab.kernels import fa3_backward
    from flashlab.kernels.forward import forward
    from flashlab.lab.experiments import fa3_backward_timeline as tl

    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v, do = (torch.randn(1, 4, 1024, 128, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
    o, lse2 = forward(q, k, v, False, 128**-0.5)
    _, dk, dv, stamps = tl.stamped_backward(do, q, k, v, o, lse2, False, at=(3, 2))
    _, dk_plain, dv_plain = fa3_backward.backward(do, q, k, v, o, lse2, False, 128**-0.5)
    assert torch.equal(dk, dk_plain) and torch.equal(dv, dv_plain)
    rows = tl.phases(stamps)
    assert {r["block"] for r in rows} == set(range(1024 // 64))
    assert all(r["end_us"] >= r["start_us"] for r in rows)


def test_cpu_tensors_take_the_triton_backward():
    from flashlab.kernels import ops

    q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    assert not ops.hopper_backward(q, q, q)


def _route(monkeypatch, **options):
    """Call flashlab::attention_backward on DEVICE's tensors (the Triton kernels run there: the GPU,
    or the interpreter on a CPU) with the Gluon kernel said to take them
    (hopper_backward patched to True) and a stand-in for it; returns (whether it ran, the op's
    outputs, k). k is a permuted view, as a model's projection gives it."""
    from flashlab.kernels import ops

    ran = []

    def stand_in(do, q, k, v, o, lse2, causal, scale):
        assert all(t.is_contiguous() for t in (do, q, k, v, o)), "the Gluon kernel takes contiguous tensors"
        ran.append(1)
        return torch.zeros_like(q), torch.ones_like(k), torch.full_like(v, 2.0)

    monkeypatch.setattr(ops, "hopper_backward", lambda q, k, v: True)
    monkeypatch.setattr(ops, "_fa3_backward", stand_in)
    g = torch.Generator().manual_seed(0)
    q, do, o = (torch.randn(1, 2, 64, 64, generator=g).to(DEVICE) for _ in range(3))
    k = torch.randn(1, 64, 2, 64, generator=g).to(DEVICE).permute(0, 2, 1, 3)  # (B, H, N, d), not contiguous
    v = torch.randn(1, 2, 64, 64, generator=g).to(DEVICE)
    lse2 = torch.zeros(1, 2, 64, device=DEVICE)
    opts = dict(causal=False, scale=0.125, window=None, deterministic=False, cu_seqlens_q=None,
                cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0) | options
    out = ops.attention_backward(do, q, k, v, o, lse2, **opts)
    return bool(ran), out, k


def test_atomic_backward_routes_to_the_gluon_kernel_in_the_fake_layout(monkeypatch):
    """deterministic=False takes the Gluon kernel; dk comes back in the layout the operator's
    fake implementation gives (empty_like(k): k's strides), though the kernel wrote it contiguous."""
    ran, (dq, dk, dv), k = _route(monkeypatch)
    assert ran
    assert dk.stride() == torch.empty_like(k).stride() != dk.contiguous().stride()
    assert torch.equal(dk, torch.ones_like(k)) and torch.equal(dv, torch.full_like(dv, 2.0))


@runs_somewhere
@pytest.mark.parametrize("options", [dict(deterministic=True), dict(window=[5, 3])], ids=["deterministic", "window"])
def test_other_backwards_stay_with_triton(monkeypatch, options):
    ran, _, _ = _route(monkeypatch, **options)
    assert not ran


@needs_gpu
@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("causal", (False, True))
def test_flash_attention_atomic_backward_is_the_gluon_one(causal, monkeypatch):
    from flashlab.kernels import fa3_backward, flash_attention

    calls = []
    real = fa3_backward.backward
    monkeypatch.setattr(fa3_backward, "backward", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(2, 3, 700, 128, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    got = torch.autograd.grad(flash_attention(q, k, v, causal=causal, deterministic=False), (q, k, v), do)
    assert calls, "deterministic=False on a Hopper GPU did not run the Gluon backward"
    ref = _grads(q, k, v, do, causal, torch.float64)
    low = _grads(q, k, v, do, causal, torch.bfloat16)
    for name, a, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
        err = (a.double() - r).abs().max().item()
        assert err <= 2 * (lo.double() - r).abs().max().item() + 1e-5, f"{name}: max error {err:.3e}"


@pytest.mark.parametrize("module", ["fa3", "fa3_backward"])
@pytest.mark.parametrize("dtype, d, words", [(torch.float32, 128, "dtype must be bfloat16 or float16"),
                                             (torch.bfloat16, 96, "d must be one of")])
def test_compile_refuses_what_the_kernels_do_not_build(module, dtype, d, words):
    import importlib

    with pytest.raises(ValueError, match=words):
        importlib.import_module(f"flashlab.kernels.{module}").compile_sm90(dtype, d)


def test_only_the_forward_takes_d_256():
    """The Gluon forward takes d = 256; the FA3 backward and the FP8 forward keep d = 64 and 128
    and say so in their errors."""
    from flashlab.kernels import fa3, fa3_backward, fa3_fp8

    assert 256 in fa3.HEAD_DIMS and 256 not in fa3.AUTO_HEAD_DIMS
    with pytest.raises(ValueError, match=r"d must be one of \(64, 128\); got 256"):
        fa3_backward.compile_sm90(torch.bfloat16, 256)
    with pytest.raises(ValueError, match=r"d must be one of \(64, 128\); got 256"):
        fa3_fp8.compile_sm90(256)
    q = torch.empty(1, 2, 64, 256, dtype=torch.bfloat16)
    fa3.check_shapes(q, q, q)  # the forward's own check passes
    with pytest.raises(ValueError, match=r"head dimension d must be one of \(64, 128\); got d = 256"):
        fa3.check_shapes(q, q, q, fa3_backward.HEAD_DIMS)


@runs_somewhere
@pytest.mark.parametrize("B, H, N, d", [(1, 2, 70, 64), (2, 1, 64, 128), (1, 1, 1, 64)])
def test_prepare_and_finish_match_pytorch(B, H, N, d):
    """The one-pass preparation (D, L padded with 0 and +inf, dQ's accumulator zeroed) and the
    one-pass dQ = scale * dQ_acc, against PyTorch; a row that saw no key gets L = +inf."""
    from flashlab.kernels.fa3_backward import BLOCK_M, finish, prepare

    g = torch.Generator().manual_seed(B * 100 + N + d)
    do, o = (torch.randn(B, H, N, d, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
    lse2 = torch.randn(B, H, N, generator=g).to(DEVICE)
    lse2[..., 0] = float("-inf")
    delta, lse, dq_acc = prepare(do, o, lse2)
    n_pad = -(-N // BLOCK_M) * BLOCK_M
    assert delta.shape == lse.shape == (B * H, n_pad) and dq_acc.shape == (B, H, N, d)
    want = (do.float() * o.float()).sum(-1).reshape(B * H, N)
    torch.testing.assert_close(delta[:, :N], want, rtol=1e-5, atol=1e-5)
    assert (delta[:, N:] == 0).all() and (lse[:, N:] == float("inf")).all() and (dq_acc == 0).all()
    assert (lse[:, 0] == float("inf")).all() and torch.equal(lse[:, 1:N], lse2.reshape(B * H, N)[:, 1:])
    acc = torch.randn(B, H, N, d, generator=g).to(DEVICE)
    # Triton's interpreter rounds fp32 to bf16 by truncation; the GPU, like PyTorch, to nearest even
    for dtype in (torch.float16, torch.bfloat16) if DEVICE == "cuda" else (torch.float16,):
        assert torch.equal(finish(acc, 0.125, dtype), (acc * 0.125).to(dtype))
    strided = torch.randn(B, H, N, 2 * d, generator=g).to(DEVICE, torch.bfloat16)[..., ::2]  # do's shape
    with pytest.raises(ValueError, match="do and o must be contiguous"):
        prepare(strided, o, lse2)
    with pytest.raises(ValueError, match="lse2 float32"):
        prepare(do, o, lse2.double())
    with pytest.raises(ValueError, match="d must be one of"):
        prepare(do[..., :48].contiguous(), o[..., :48].contiguous(), lse2)
