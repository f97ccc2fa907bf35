"""The Triton kernels against the float64 reference.

Tolerance (the rule of the flash-attn test suite): for fp16/bf16 the
kernel's max error against a float64 reference must be at most twice the error of
plain PyTorch attention computed in the same low precision, plus 1e-5 — for the
output and for each gradient. For fp32 (IEEE dot products) the bound is 1e-5
absolute on unit-variance inputs (the error of a length-N fp32 sum is ~N·2^-24 relative).

On a CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py) at small
sizes; on a GPU the same tests run for real, plus full-size and memory tests.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashlab.kernels import INTERPRET, flash_attention
from tiers import DEVICE, GPU, SIZE, needs_gpu, runs_somewhere

# Under the interpreter (blocks of 16) small N already spans several blocks; on a GPU (blocks of
# 64-128) the same tests run 8x longer sequences so that they cross blocks too, and so that the
# max-error statistics the tolerance rule compares are not dominated by a handful of elements.


def torch_attention(q, k, v, causal, scale=None):
    """Plain attention in q's dtype (the low-precision baseline) with GQA expansion."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        n_q, n_k = s.shape[-2:]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).nan_to_num(0.0).to(q.dtype)  # a row seeing no key -> 0
    return p @ v


def outputs_and_grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(do)
    return [o.detach(), q.grad, k.grad, v.grad]


def check(B, H, H_KV, N_Q, N_K, D, causal, dtype, scale=None, layout=None, impl="triton"):
    g = torch.Generator(device="cpu").manual_seed(N_Q * 1000 + N_K + D)
    make = lambda *shape: torch.randn(*shape, generator=g).to(DEVICE)  # noqa: E731
    q, k, v = make(B, H, N_Q, D), make(B, H_KV, N_K, D), make(B, H_KV, N_K, D)
    do = make(B, H, N_Q, D)
    if layout == "transposed":  # (B, N, H, d) memory, viewed as (B, H, N, d): non-contiguous
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        assert not q.is_contiguous()
    ref = outputs_and_grads(lambda *a: torch_attention(*a, causal, scale), q.double(), k.double(), v.double(), do.double())
    low = [q.to(dtype), k.to(dtype), v.to(dtype)]
    got = outputs_and_grads(lambda *a: flash_attention(*a, causal=causal, scale=scale, impl=impl), *low, do.to(dtype))
    if dtype == torch.float32:
        bounds = [1e-5 * max(1.0, r.abs().max().item()) for r in ref]
    else:
        base = outputs_and_grads(lambda *a: torch_attention(*a, causal, scale), *low, do.to(dtype))
        bounds = [2 * (b.double() - r).abs().max().item() + 1e-5 for b, r in zip(base, ref)]
    for name, x, r, bound in zip(["o", "dq", "dk", "dv"], got, ref, bounds):
        assert x.dtype == dtype and x.shape == r.shape
        err = (x.double() - r).abs().max().item()
        assert err <= bound, f"{name}: max error {err:.2e} > bound {bound:.2e} ({B=}, {H=}, {H_KV=}, {N_Q=}, {N_K=}, {D=}, {causal=}, {dtype}, {impl=})"


# --------------------------------------------------------------- interpreter-sized (run everywhere)
@runs_somewhere
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_forward_backward_ragged(causal, dtype):
    check(2, 2, 2, 37 * SIZE, 37 * SIZE, 32, causal, dtype)


@runs_somewhere
@pytest.mark.parametrize("D", [16, 32, 64, 128, 256, 40, 59])
def test_every_head_dim(D):
    check(1, 2, 2, 33 * SIZE, 33 * SIZE, D, True, torch.float16)


@runs_somewhere
@pytest.mark.parametrize("n_q, n_k", [(20, 45), (45, 20), (1, 33), (33, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_nq_differs_from_nk(n_q, n_k, causal):
    """Causal is aligned bottom-right; with N_q > N_k the first rows see no key and give 0."""
    check(1, 2, 2, n_q * SIZE, n_k * SIZE, 32, causal, torch.float32)


@runs_somewhere
@pytest.mark.parametrize("h_kv", [1, 2])
def test_gqa_and_mqa(h_kv):
    check(2, 4, h_kv, 40 * SIZE, 40 * SIZE, 32, True, torch.bfloat16)


@runs_somewhere
def test_non_contiguous_and_custom_scale():
    check(1, 2, 2, 24 * SIZE, 24 * SIZE, 32, False, torch.float32, scale=0.3, layout="transposed")


@runs_somewhere
def test_return_lse_matches_logsumexp():
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, 2, 29, 16, generator=g).to(DEVICE) for _ in range(3))
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    s = (q.double() @ k.double().transpose(-2, -1)) / 4.0
    s = s.masked_fill(~torch.ones(29, 29, dtype=torch.bool, device=DEVICE).tril(), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "args, kwargs, exc, words",
    [
        ((torch.zeros(2, 4, 8), torch.zeros(2, 4, 8), torch.zeros(2, 4, 8)), {}, ValueError, ["q must be 4-D", "(2, 4, 8)"]),
        ((torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8, dtype=torch.float16), torch.zeros(1, 2, 4, 8)), {}, TypeError, ["same dtype"]),
        ((torch.zeros(1, 2, 4, 8, dtype=torch.int32),) * 3, {}, TypeError, ["q must have dtype"]),
        ((torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4, 4)), {}, ValueError, ["head dimension", "(1, 2, 4, 8)", "(1, 2, 4, 4)"]),
        ((torch.zeros(1, 3, 4, 8), torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)), {}, ValueError, ["must divide", "3 query heads", "2 K/V heads"]),
        ((torch.zeros(1, 2, 4, 512),) * 3, {}, ValueError, ["between 1 and 256", "512"]),
        ((torch.zeros(1, 2, 4, 8),) * 3, {"scale": -1.0}, ValueError, ["scale must be a positive", "-1.0"]),
        ((torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 4, 8)), {}, ValueError, ["k and v must have the same shape"]),
        (([[1.0]], torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)), {}, TypeError, ["q must be a torch.Tensor", "list"]),
    ],
)
def test_bad_input(args, kwargs, exc, words):
    with pytest.raises(exc) as info:
        flash_attention(*args, **kwargs)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


@pytest.mark.skipif(GPU or INTERPRET, reason="only meaningful on a CPU without the interpreter")
def test_cpu_without_interpreter_is_refused():
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        flash_attention(*(torch.zeros(1, 1, 4, 8),) * 3)


# --------------------------------------------------------------- impl: which forward kernel
def test_unknown_impl_is_refused():
    with pytest.raises(ValueError, match=r"impl must be one of \('triton', 'gluon', 'auto'\); got 'cuda'"):
        flash_attention(*(torch.zeros(1, 1, 4, 8),) * 3, impl="cuda")


@pytest.mark.skipif(GPU, reason="a CPU-only check")
def test_gluon_on_a_cpu_is_refused():
    """Before any kernel (and before the interpreter check): the Gluon forward needs a GPU."""
    with pytest.raises(ValueError) as info:
        flash_attention(*(torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16),) * 3, impl="gluon")
    for word in ["impl='gluon'", "needs a CUDA GPU", "got tensors on cpu", "impl='triton' or 'auto'"]:
        assert word in str(info.value), f"{word!r} not in {info.value}"


@runs_somewhere
@pytest.mark.skipif(GPU, reason="a CPU-only check")
def test_auto_falls_back_to_triton_on_a_cpu():
    q, k, v, do = (torch.randn(1, 2, 21, 16, generator=torch.Generator().manual_seed(s)) for s in range(4))
    auto = outputs_and_grads(lambda *a: flash_attention(*a, causal=True, impl="auto"), q, k, v, do)
    triton_ = outputs_and_grads(lambda *a: flash_attention(*a, causal=True, impl="triton"), q, k, v, do)
    assert all(torch.equal(a, b) for a, b in zip(auto, triton_))


# --------------------------------------------------------------- conventions (see flash_attention's docstring)
def sdpa(q, k, v, **kw):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)


@runs_somewhere
@pytest.mark.parametrize("n_q, n_k", [(20, 45), (45, 20)])
def test_causal_is_bottom_right_unlike_sdpa_is_causal(n_q, n_k):
    """With N_q != N_k, flashlab's causal is SDPA with a bottom-right mask (its causal_lower_right),
    not SDPA's is_causal (top-left). fp32, IEEE dots: 1e-5; rows that see no key (N_q > N_k)
    compared as 0."""
    g = torch.Generator().manual_seed(n_q)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g).to(DEVICE) for n in (n_q * SIZE, n_k * SIZE, n_k * SIZE))
    o = flash_attention(q, k, v, causal=True)
    bottom_right = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=DEVICE).tril(k.shape[2] - q.shape[2])
    torch.testing.assert_close(o, sdpa(q, k, v, attn_mask=bottom_right).nan_to_num(0.0), rtol=0, atol=1e-5)
    top_left = sdpa(q, k, v, is_causal=True).nan_to_num(0.0)
    assert (o - top_left).abs().max() > 0.1, "flashlab's causal should differ from SDPA's is_causal when N_q != N_k"


@runs_somewhere
def test_a_row_that_sees_no_key_gives_zero_and_minus_infinite_lse():
    """Causal with N_q = 30 > N_k = 10: the first 20 rows see no key. o = 0, lse = -inf (the log
    of an empty sum; flash_attn_func gives +inf), their dq = 0, every gradient finite."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g).to(DEVICE).requires_grad_() for n in (30, 10, 10))
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert (o[:, :, :20] == 0).all() and (lse[:, :, :20] == float("-inf")).all()
    assert torch.isfinite(lse[:, :, 20:]).all()
    assert not lse.requires_grad, "lse is returned without a gradient"
    o.backward(torch.randn_like(o))
    assert (q.grad[:, :, :20] == 0).all()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@runs_somewhere
def test_deterministic_is_the_default():
    """flash_attn_func defaults to deterministic=False; flashlab to True: the default call gives the
    separate dQ kernel's bits (the atomic path sums in another order: its last bits differ, even
    under the interpreter)."""
    import inspect

    from flashlab.kernels import flash_attention_varlen

    for fn in (flash_attention, flash_attention_varlen):
        assert inspect.signature(fn).parameters["deterministic"].default is True, fn.__name__
    from flashlab.kernels.backward import backward
    from flashlab.kernels.forward import forward

    q, k, v, do = (torch.randn(1, 2, 40 * SIZE, 32, generator=torch.Generator().manual_seed(s)).to(DEVICE) for s in range(4))
    o, lse2 = forward(q, k, v, True, 32**-0.5)
    dq = {det: backward(do, q, k, v, o, lse2, True, 32**-0.5, deterministic=det)[0] for det in (True, False)}
    assert not torch.equal(dq[True], dq[False]), "the two dQ paths should differ in their last bits"
    default = outputs_and_grads(lambda *a: flash_attention(*a, causal=True), q, k, v, do)[1]
    assert torch.equal(default, dq[True])


@pytest.mark.parametrize("q, k, flashlab_error", [
    (torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8, dtype=torch.float16), TypeError),  # dtypes differ
    (torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 4), ValueError),  # head dimensions differ
])
def test_exception_types_differ_from_sdpa(q, k, flashlab_error):
    """flashlab raises TypeError for a wrong type and ValueError for a wrong shape or value, before
    any kernel; SDPA (like flash_attn_func) raises RuntimeError from its C++ checks."""
    with pytest.raises(flashlab_error) as info:
        flash_attention(q, k, k)
    assert not isinstance(info.value, RuntimeError)
    with pytest.raises(RuntimeError):
        sdpa(q, k, k)


# --------------------------------------------------------------- full size, real GPU only
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_full_size(dtype, causal, D):
    check(2, 8, 8, 2048, 2048, D, causal, dtype)


@needs_gpu
@pytest.mark.parametrize("D, n_q, n_k, h_kv", [(256, 1000, 1000, 8), (96, 777, 1531, 2), (128, 1531, 777, 1)])
def test_gpu_odd_shapes(D, n_q, n_k, h_kv):
    check(1, 8, h_kv, n_q, n_k, D, True, torch.bfloat16)


def _hopper() -> bool:
    return GPU and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (sm_90: H100, H200)")


@needs_gpu
@needs_hopper
@pytest.mark.parametrize("B, H, N_Q, N_K, D, causal, dtype", [
    (2, 4, 1000, 1000, 128, False, torch.bfloat16), (2, 4, 1000, 1000, 128, True, torch.float16),
    (1, 2, 777, 1531, 64, True, torch.bfloat16), (1, 2, 1531, 777, 128, True, torch.float16),
    (1, 3, 2048, 2048, 64, False, torch.float16), (1, 2, 1000, 777, 256, True, torch.bfloat16)])
def test_gpu_gluon_forward_with_triton_backward(B, H, N_Q, N_K, D, causal, dtype):
    """impl="gluon": the FA3 forward, then the Triton backward on its lse, against float64 under
    the flash-attn rule (output and each gradient)."""
    check(B, H, H, N_Q, N_K, D, causal, dtype, impl="gluon")


@needs_gpu
@needs_hopper
@pytest.mark.parametrize("dtype, d, h_kv, window, words", [
    (torch.float32, 64, 2, None, ["bfloat16 or float16", "torch.float32"]),
    (torch.bfloat16, 96, 2, None, ["(64, 128, 256)", "d = 96"]),
    (torch.bfloat16, 64, 2, (16, 0), ["no sliding window", "(16, 0)"]),
    (torch.bfloat16, 64, 1, None, ["no GQA/MQA", "2 query heads and 1 K/V heads"])])
def test_gpu_gluon_refuses_what_it_cannot_run_and_auto_falls_back(dtype, d, h_kv, window, words):
    q = torch.randn(1, 2, 300, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(1, h_kv, 300, d, device="cuda", dtype=dtype) for _ in range(2))
    with pytest.raises(ValueError) as info:
        flash_attention(q, k, v, window=window, impl="gluon")
    for word in ["impl='gluon'", *words]:
        assert word in str(info.value), f"{word!r} not in {info.value}"
    assert torch.equal(flash_attention(q, k, v, window=window, impl="auto"), flash_attention(q, k, v, window=window))


@needs_gpu
@needs_hopper
def test_gpu_auto_takes_gluon_where_it_runs():
    """At d = 128 "auto" is the Gluon forward; at d = 256, which the Gluon forward runs only when
    asked (fa3.AUTO_HEAD_DIMS), it is the Triton one."""
    q, k, v = (torch.randn(2, 4, 1000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    assert torch.equal(flash_attention(q, k, v, causal=True, impl="auto"), flash_attention(q, k, v, causal=True, impl="gluon"))
    q, k, v = (torch.randn(1, 2, 500, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    assert torch.equal(flash_attention(q, k, v, impl="auto"), flash_attention(q, k, v, impl="triton"))


def _extra_memory(N: int, D: int = 128) -> int:
    """Peak bytes of one causal forward + backward beyond the inputs (q, k, v, dO) and the
    tensors the pass must produce (o, dq, dk, dv, and the fp32 lse and D of N rows each)."""
    q, k, v, do = (torch.randn(1, 1, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    flash_attention(q, k, v, causal=True).backward(do)  # warm-up: compile (and tune) outside the measurement
    q.grad = k.grad = v.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    o = flash_attention(q, k, v, causal=True)
    o.backward(do)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert torch.isfinite(q.grad).all() and torch.isfinite(o).all()
    return peak - (4 * N * D * 2 + 2 * N * 4)


@needs_gpu
def test_gpu_memory_is_linear_at_128k_tokens():
    """N = 131072, B = H = 1, d = 128: forward + backward run, and the memory beyond inputs,
    outputs, gradients, lse and D is O(N): it grows at most linearly from N = 32768 (4x the
    tokens: at most 4x the bytes, plus 1 MiB of slack) and stays far below one N x N matrix
    (32 GiB in bf16 at this N): here, below 16 copies of one (N, d) tensor."""
    small, large = _extra_memory(32768), _extra_memory(131072)
    tensor_bytes = 131072 * 128 * 2
    print(f"\nextra memory: {small / 2**20:.1f} MiB at N = 32768, {large / 2**20:.1f} MiB at N = 131072")
    assert large <= 4 * max(small, 0) + 2**20, f"extra memory grew faster than N: {small} -> {large} bytes"
    assert large <= 16 * tensor_bytes, f"extra memory {large} bytes is not a small multiple of one tensor"


# --------------------------------------------------------------- every autotune candidate
def _candidate_cases():
    from flashlab.kernels import backward as bwd, forward as fwd

    cases = []
    for wide, d in ((False, 64), (True, 256)):
        f = fwd.WIDE_CANDIDATES if wide else fwd.CANDIDATES
        kv = bwd.DKDV_WIDE_CANDIDATES if wide else bwd.DKDV_CANDIDATES
        dq = bwd.DQ_WIDE_CANDIDATES if wide else bwd.DQ_CANDIDATES
        for i in range(max(len(f), len(kv), len(dq))):
            cases.append((d, f[i % len(f)], kv[i % len(kv)], dq[i % len(dq)]))
    return cases


@runs_somewhere
@pytest.mark.parametrize("d, fwd_config, dkdv_config, dq_config", _candidate_cases())
def test_every_autotune_candidate(d, fwd_config, dkdv_config, dq_config):
    """Each (BLOCK_M, BLOCK_N, warps, stages) the autotuner may pick computes the same function:
    block ranges, causal skipping and ragged tails depend on the block sizes. N_q = 150 and
    N_k = 200 are ragged for every block size and misaligned for the causal diagonal."""
    from flashlab.kernels import backward as bwd, forward as fwd
    from flashlab.reference import attention, attention_backward

    g = torch.Generator(device="cpu").manual_seed(d)
    n_q, n_k = (150, 200) if d <= 128 else (70, 90)  # d = 256 is slow under the interpreter
    q, do = torch.randn(1, 1, n_q, d, generator=g), torch.randn(1, 1, n_q, d, generator=g)
    k, v = torch.randn(1, 1, n_k, d, generator=g), torch.randn(1, 1, n_k, d, generator=g)
    scale = d**-0.5
    o, lse2 = fwd.forward(*(t.to(DEVICE) for t in (q, k, v)), True, scale, config=fwd_config)
    grads = bwd.backward(*(t.to(DEVICE) for t in (do, q, k, v)), o, lse2, True, scale, configs_=(dkdv_config, dq_config))
    ref_o = attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), causal=True)
    ref_grads = attention_backward(*(t.double().numpy() for t in (q, k, v, do)), causal=True)
    for name, got, ref in zip(["o", "dq", "dk", "dv"], [o, *grads], [ref_o, *ref_grads]):
        err = (got.cpu().double() - torch.from_numpy(ref)).abs().max().item()
        assert err < 1e-4 * max(1.0, abs(ref).max()), f"{name} with {fwd_config=}, {dkdv_config=}, {dq_config=}: error {err:.1e}"
