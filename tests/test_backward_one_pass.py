"""The one-pass backward variant (flashlab.lab.variants.backward_one_pass).

On a CPU it runs under Triton's interpreter in float32 (tl.dot exact to fp32 rounding; the
interpreter has no TMA reduce, so dQ is summed by atomic adds there), against the float64
reference with the fp32 bound of the tolerance policy (1e-5, relative to the largest gradient
entry, as tests/test_kernels.py's candidate test uses 1e-4 for 16-wide interpreter tiles),
and it is compiled for sm_90 to check that the copy engine does the moving. On a GPU: bf16 and
fp16 against float64 with the flash-attn rule (<= 2x plain PyTorch's error in the same
precision + 1e-5), and dK and dV bit-identical from run to run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from flashlab.reference import attention_backward
from tiers import DEVICE, GPU, needs_gpu, runs_somewhere

# (Z, H, H_kv, N_q, N_k, d, causal): ragged for every block size, N_q != N_k both ways, GQA and MQA
SHAPES = [(1, 1, 1, 40, 72, 64, False), (2, 2, 2, 33, 33, 64, True), (1, 4, 2, 70, 45, 64, True),
          (1, 2, 1, 16, 48, 128, True), (1, 3, 1, 50, 50, 64, False)]


def _inputs(Z, H, H_KV, N_Q, N_K, d, seed=0, dtype=torch.float32):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, do = (torch.randn(Z, H, N_Q, d, generator=g) for _ in range(2))
    k, v = (torch.randn(Z, H_KV, N_K, d, generator=g) for _ in range(2))
    return [t.to(DEVICE, dtype) for t in (q, k, v, do)]


def _reference(q, k, v, do, causal):
    """float64 (dq, dk, dv) by flashlab.reference, the query heads of a K/V head summed (GQA)."""
    group = q.shape[1] // k.shape[1]
    as64 = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
    kk, vv = (as64(t.repeat_interleave(group, dim=1)) for t in (k, v))
    dq, dk, dv = attention_backward(as64(q), kk, vv, as64(do), causal=causal)
    fold = lambda g: torch.from_numpy(g).reshape(k.shape[0], k.shape[1], group, *g.shape[2:]).sum(2)  # noqa: E731
    return torch.from_numpy(dq), fold(dk), fold(dv)


def _run(q, k, v, do, causal, config=None):
    from flashlab.lab.variants.backward_one_pass import backward
    from flashlab.kernels.forward import forward

    scale = q.shape[-1] ** -0.5
    o, lse2 = forward(q, k, v, causal, scale)
    return backward(do, q, k, v, o, lse2, causal, scale, config)


@runs_somewhere
@pytest.mark.skipif(GPU, reason="the float32 interpreter case; on a GPU the bf16/fp16 tests below run")
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_under_the_interpreter(shape):
    *dims, causal = shape
    q, k, v, do = _inputs(*dims)
    for name, got, ref in zip(("dq", "dk", "dv"), _run(q, k, v, do, causal), _reference(q, k, v, do, causal)):
        err = (got.cpu().double() - ref).abs().max().item()
        assert err <= 1e-5 * max(1.0, ref.abs().max().item()), f"{name}: error {err:.1e} at {shape}"


@runs_somewhere
@pytest.mark.skipif(GPU, reason="the interpreter's block sizes; the GPU compiles the candidates")
@pytest.mark.parametrize("config", [(16, 32, 4, 1), (32, 16, 4, 1), (16, 64, 4, 1)])
def test_block_sizes_give_the_same_gradients(config):
    """The query ranges each key block visits (causal skipping, ragged tails) depend on
    BLOCK_M and BLOCK_N: N_q = 150 and N_k = 200 are ragged for every block size."""
    q, k, v, do = _inputs(1, 2, 1, 150, 200, 64, seed=3)
    for name, got, ref in zip(("dq", "dk", "dv"), _run(q, k, v, do, True, config), _reference(q, k, v, do, True)):
        err = (got.cpu().double() - ref).abs().max().item()
        assert err <= 1e-5 * max(1.0, ref.abs().max().item()), f"{name} with {config}: error {err:.1e}"


@runs_somewhere
@pytest.mark.skipif(GPU, reason="the interpreter case; the GPU test below poisons bf16")
def test_rows_of_the_next_head_never_leak_in():
    """The descriptors read (Z * H * N_q, d) as one 2-D tensor, so a ragged query block runs
    into the next head's rows. Filling that head with values whose exponentials overflow, and
    its dO with NaN, must change nothing in the first head's gradients (P is masked there)."""
    q, k, v, do = _inputs(1, 2, 2, 40, 24, 64, seed=5)
    clean = _run(q, k, v, do, False, (16, 16, 4, 1))
    q[:, 1] = 1e4
    do[:, 1] = float("nan")
    poisoned = _run(q, k, v, do, False, (16, 16, 4, 1))
    for name, a, b in zip(("dq", "dk", "dv"), clean, poisoned):
        assert torch.equal(a[:, 0], b[:, 0]), f"{name} of head 0 changed when head 1 was poisoned"


def test_eligible_names_what_it_takes():
    from flashlab.lab.variants.backward_one_pass import eligible

    cpu = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
    assert not eligible(cpu, cpu, cpu, None, False)  # not on a Hopper GPU


def test_compiled_for_sm90_the_copy_engine_moves_q_do_and_dq():
    """Compiled for an H100/H200 on this CPU: Q and dO arrive by TMA (cp.async.bulk.tensor),
    dQ leaves by a TMA reduce-add (cp.reduce.async.bulk.tensor ... .add), the products run on
    wgmma. (Spills depend on the Triton version: recorded, not asserted.)"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import json, re\n"
        "from flashlab.lab import compile_report as c\n"
        "out = {}\n"
        "for d, cfg in ((64, (64, 128, 8, 2)), (128, (64, 128, 8, 2))):\n"
        "    k = c.compile_case('backward_one_pass', cfg, d, causal=True)\n"
        "    ptx = k.asm['ptx']\n"
        "    usage = c._cuobjdump(k.asm['cubin'], '-res-usage')\n"
        "    out[d] = dict(reduce=len(re.findall(r'cp\\.reduce\\.async\\.bulk\\.tensor\\.\\dd[^;]*add', ptx)),\n"
        "                  loads=ptx.count('cp.async.bulk.tensor'), wgmma=ptx.count('wgmma.mma_async'),\n"
        "                  red=len(re.findall(r'(?<![a-z])red\\.global', ptx)), stack=int(re.search(r'STACK:(\\d+)', usage).group(1)))\n"
        "print(json.dumps(out))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    import json

    found = json.loads(run.stdout.strip().splitlines()[-1])
    for d, f in found.items():
        assert f["reduce"] >= 1 and f["red"] == 0, f"d={d}: dQ is not added by a TMA reduce: {f}"
        assert f["loads"] >= 2 and f["wgmma"] > 0, f"d={d}: no TMA loads or no wgmma: {f}"


# ------------------------------------------------------------------------------------- GPU
def _flash_attn_rule(got, q, k, v, do, causal):
    from test_kernels import outputs_and_grads, torch_attention

    ref = outputs_and_grads(lambda *a: torch_attention(*a, causal), q.double(), k.double(), v.double(), do.double())
    base = outputs_and_grads(lambda *a: torch_attention(*a, causal), q, k, v, do)
    for name, x, r, b in zip(("dq", "dk", "dv"), got, ref[1:], base[1:]):
        bound = 2 * (b.double() - r).abs().max().item() + 1e-5
        err = (x.double() - r).abs().max().item()
        assert torch.isfinite(x).all() and err <= bound, f"{name}: {err:.2e} > {bound:.2e}"


GPU_SHAPES = [(2, 4, 4, 1024, 1024, 128, False), (2, 4, 4, 1024, 1024, 128, True), (1, 6, 2, 777, 1333, 128, True),
              (1, 4, 4, 1333, 777, 128, True), (3, 5, 5, 300, 301, 64, False), (1, 8, 1, 513, 2049, 64, True),
              (2, 3, 3, 129, 65, 64, True)]


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_gpu_matches_float64(shape, dtype):
    *dims, causal = shape
    q, k, v, do = _inputs(*dims, dtype=dtype)
    _flash_attn_rule(_run(q, k, v, do, causal), q, k, v, do, causal)


@needs_gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_every_candidate(d):
    from flashlab.lab.variants.backward_one_pass import CANDIDATES

    q, k, v, do = _inputs(1, 2, 1, 1000, 1100, d, seed=d, dtype=torch.bfloat16)
    for config in CANDIDATES:
        _flash_attn_rule(_run(q, k, v, do, True, config), q, k, v, do, True)


@needs_gpu
def test_gpu_dk_dv_bit_identical_and_buffers_overwritten():
    """dK, dV: each program writes its own rows once, so two runs agree bit for bit; dQ's
    additions arrive in any order, so it is only close. Poisoned (NaN) output memory from an
    earlier allocation must be overwritten everywhere."""
    from flashlab.lab.variants.backward_one_pass import backward
    from flashlab.kernels.forward import forward

    q, k, v, do = _inputs(2, 4, 4, 1000, 1000, 128, seed=9, dtype=torch.bfloat16)
    o, lse2 = forward(q, k, v, True, 128**-0.5)
    torch.empty(64 << 20, device="cuda").fill_(float("nan"))  # leave NaN in the caching allocator's blocks
    a = backward(do, q, k, v, o, lse2, True, 128**-0.5)
    b = backward(do, q, k, v, o, lse2, True, 128**-0.5)
    assert all(torch.isfinite(t).all() for t in a)
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert torch.allclose(a[0], b[0], atol=1e-2)
