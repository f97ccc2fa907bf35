"""torch.compile of models that call flashlab's kernels (flashlab.kernels.ops: custom operators).

What is checked, for flash_attention, flash_attention_varlen and flash_decode:

- the operators' registration (torch.library.opcheck: schema, fake implementation against the
  real outputs' shapes, dtypes and strides, autograd registration, AOTAutograd with dynamic shapes);
- the fake implementations alone, under FakeTensorMode: output shapes, dtypes, devices, and the
  lse layout (B, H, N_q) float32, (H, total_q) for varlen, with no kernel run;
- ``torch.compile(fullgraph=True)`` of a tiny module traces without a graph break (fullgraph
  raises on one; torch._dynamo.explain counts 0) and gives eager's outputs and gradients. On a
  CPU the compiled graph runs with backend="aot_eager" (the graph AOTAutograd traces, run by
  PyTorch's eager kernels; Inductor's C++ compile would take most of a minute on two cores), the
  kernels under Triton's interpreter; on a GPU with Inductor. Tolerance: fp32 with IEEE dots,
  the same kernels on the same inputs: 1e-6 absolute (the ops around the kernels may be
  reordered or fused by the compiler; the kernels' own results are bit-identical).
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from flashlab.kernels import flash_attention, flash_attention_varlen, flash_decode, ops
from tiers import DEVICE, GPU, needs_gpu, runs_somewhere

BACKEND = "inductor" if GPU else "aot_eager"
TOL = dict(rtol=0.0, atol=1e-6)


def _randn(*shape, seed=0, grad=False):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE).requires_grad_(grad)


class TinyAttention(torch.nn.Module):
    """x (B, N, C) -> projections -> flashlab attention -> projection: a transformer block's
    attention, C = H * d, with H_kv K/V heads."""

    def __init__(self, heads: int = 2, kv_heads: int = 1, d: int = 16, **options):
        super().__init__()
        torch.manual_seed(0)
        self.h, self.h_kv, self.d, self.options = heads, kv_heads, d, options
        self.wq = torch.nn.Linear(heads * d, heads * d, bias=False)
        self.wkv = torch.nn.Linear(heads * d, 2 * kv_heads * d, bias=False)
        self.wo = torch.nn.Linear(heads * d, heads * d, bias=False)

    def forward(self, x):
        B, N, _ = x.shape
        q = self.wq(x).view(B, N, self.h, self.d).transpose(1, 2)  # (B, H, N, d), a strided view
        k, v = self.wkv(x).view(B, N, 2, self.h_kv, self.d).permute(2, 0, 3, 1, 4)  # (B, H_kv, N, d) each
        o, lse = flash_attention(q, k, v, return_lse=True, **self.options)
        return self.wo(o.transpose(1, 2).reshape(B, N, -1)), lse


def _eager_and_compiled(fn, *inputs):
    """fn's outputs and the gradients of their sum of squares w.r.t. ``inputs`` and any parameters,
    eager and compiled with fullgraph=True (which raises at a graph break)."""
    results = []
    for run in (fn, torch.compile(fn, fullgraph=True, backend=BACKEND)):
        torch._dynamo.reset()
        leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
        for p in params:
            p.grad = None
        outs = run(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        wrt = [t for t in leaves + params if t.requires_grad]
        loss = sum((o.float() ** 2).sum() for o in outs if o.requires_grad)
        grads = torch.autograd.grad(loss, wrt) if wrt else ()
        results.append(([o.detach() for o in outs], list(grads)))
    return results


def _assert_same(eager, compiled):
    (outs_e, grads_e), (outs_c, grads_c) = eager, compiled
    assert len(outs_e) == len(outs_c) and len(grads_e) == len(grads_c)
    for name, a, b in [*(("output", x, y) for x, y in zip(outs_e, outs_c)),
                       *(("gradient", x, y) for x, y in zip(grads_e, grads_c))]:
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(b, a, **TOL, equal_nan=True, msg=lambda m: f"{name}: {m}")


# --------------------------------------------------------------- the operators' registration
@runs_somewhere
@pytest.mark.parametrize("deterministic, window, h_kv", [(True, None, 1), (False, [3, 2], 2)])
def test_opcheck_attention(deterministic, window, h_kv):
    """Schema, fake against real (shapes, dtypes, strides), autograd registration, and AOTAutograd
    with dynamic shapes, on the forward operator (its derivative is the backward operator)."""
    q, k, v = _randn(1, 2, 20, 16, seed=1, grad=True), _randn(1, h_kv, 24, 16, seed=2, grad=True), _randn(1, h_kv, 24, 16, seed=3, grad=True)
    args = (q, k, v, True, 0.25, window, deterministic, "triton", None, None, 0, 0)
    results = torch.library.opcheck(torch.ops.flashlab.attention_forward.default, args)
    assert set(results.values()) == {"SUCCESS"}, results


@runs_somewhere
def test_opcheck_attention_varlen():
    total_q, total_k = 13, 17
    q = _randn(total_q, 2, 16, seed=4, grad=True).permute(1, 0, 2).unsqueeze(0)  # (1, H, total, d) views
    k, v = (_randn(total_k, 2, 16, seed=s, grad=True).permute(1, 0, 2).unsqueeze(0) for s in (5, 6))
    cu_q = torch.tensor([0, 5, 13], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 9, 17], dtype=torch.int32, device=DEVICE)
    args = (q, k, v, True, 0.25, None, True, "triton", cu_q, cu_k, 8, 9)
    results = torch.library.opcheck(torch.ops.flashlab.attention_forward.default, args,
                                    test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    assert set(results.values()) == {"SUCCESS"}, results


@runs_somewhere
def test_opcheck_decode():
    q, cache = _randn(2, 4, 2, 16, seed=7), _randn(2, 2, 40, 16, seed=8)
    seqlens = torch.tensor([40, 7], dtype=torch.int32, device=DEVICE)
    results = torch.library.opcheck(torch.ops.flashlab.decode.default, (q, cache, cache, seqlens, 3, None, None, None, True, True))
    assert set(results.values()) == {"SUCCESS"}, results


def test_fake_implementations_give_shapes_without_running_a_kernel():
    """Under FakeTensorMode nothing runs (a kernel launched on fake tensors would fail), yet the
    operators report their outputs: o like q, lse2 float32 (B, H, N_q), or (H, total_q) for
    packed varlen input; dq, dk, dv like q, k, v (the atomic-dQ path: a contiguous dq)."""
    with FakeTensorMode():
        q, k, v = torch.empty(2, 8, 100, 64), torch.empty(2, 2, 300, 64), torch.empty(2, 2, 300, 64)
        o, lse2 = torch.ops.flashlab.attention_forward(q, k, v, True, 0.125, None, True, "triton", None, None, 0, 0)
        assert o.shape == q.shape and o.dtype == q.dtype and o.device == q.device
        assert lse2.shape == (2, 8, 100) and lse2.dtype == torch.float32
        do = torch.empty_like(q)
        for deterministic in (True, False):
            strided_q = torch.empty(2, 100, 8, 64).transpose(1, 2)  # (B, H, N, d) over (B, N, H, d) memory
            dq, dk, dv = torch.ops.flashlab.attention_backward(do, strided_q, k, v, o, lse2, True, 0.125, None,
                                                               deterministic, None, None, 0, 0)
            assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
            assert dq.stride() == (strided_q.stride() if deterministic else q.stride())

        packed = torch.empty(1000, 8, 64).permute(1, 0, 2).unsqueeze(0)  # (1, H, total, d)
        cu = torch.empty(4, dtype=torch.int32)
        o, lse2 = torch.ops.flashlab.attention_forward(packed, packed, packed, False, 0.125, None, True, "triton",
                                                       cu, cu, 500, 500)
        assert o.shape == (1, 8, 1000, 64) and o.stride() == packed.stride()
        assert lse2.shape == (8, 1000) and lse2.dtype == torch.float32

        q = torch.empty(3, 8, 1, 128, dtype=torch.bfloat16)
        cache = torch.empty(3, 2, 4096, 128, dtype=torch.bfloat16)
        o, lse = torch.ops.flashlab.decode(q, cache, cache, torch.empty(3, dtype=torch.int32), None, None, None, None,
                                           False, True)
        assert o.shape == q.shape and o.dtype == torch.bfloat16 and lse.shape == (3, 8, 1) and lse.dtype == torch.float32


# --------------------------------------------------------------- torch.compile, no graph break
@runs_somewhere
@pytest.mark.parametrize("options", [dict(causal=True), dict(causal=False, window=(5, 3), deterministic=False),
                                     dict(causal=True, scale=0.3, impl="auto")], ids=["causal", "window-atomic", "auto"])
def test_compiled_module_matches_eager(options):
    """A projection + GQA attention + projection module (q a strided view), compiled with
    fullgraph=True: the same outputs (o and lse) and gradients of x and every weight as eager."""
    model = TinyAttention(heads=2, kv_heads=1, d=16, **options).to(DEVICE)
    x = _randn(2, 20, 32, seed=9, grad=True)
    _assert_same(*_eager_and_compiled(model, x))


@runs_somewhere
def test_compiled_varlen_matches_eager():
    cu_q = torch.tensor([0, 5, 5, 18], dtype=torch.int32, device=DEVICE)  # an empty sequence in the middle
    cu_k = torch.tensor([0, 9, 11, 20], dtype=torch.int32, device=DEVICE)

    def fn(q, k, v):
        o, lse = flash_attention_varlen(q, k, v, cu_q, cu_k, 13, 9, causal=True, return_lse=True)
        return o * 2.0, lse

    q, k, v = _randn(18, 2, 16, seed=10, grad=True), _randn(20, 1, 16, seed=11, grad=True), _randn(20, 1, 16, seed=12, grad=True)
    _assert_same(*_eager_and_compiled(fn, q, k, v))


@runs_somewhere
@pytest.mark.parametrize("paged", [False, True])
def test_compiled_decode_matches_eager(paged):
    """A decoding step: q from a projection, flash_decode on a (paged) cache, a projection after."""
    B, H, H_KV, n_q, d, N = 2, 4, 2, 2, 16, 48
    seqlens = torch.tensor([48, 19], dtype=torch.int32, device=DEVICE)
    k, v = _randn(B, H_KV, N, d, seed=13), _randn(B, H_KV, N, d, seed=14)
    kw = {}
    if paged:  # pages of 16 keys, sequence b's page p at pool page 3 * b + p, in reverse order
        k, v = (t.view(B, H_KV, 3, 16, d).permute(0, 2, 3, 1, 4).reshape(6, 16, H_KV, d).flip(0) for t in (k, v))
        kw = dict(block_table=torch.tensor([[5, 4, 3], [2, 1, 0]], dtype=torch.int32, device=DEVICE), page_size=16)
    w = _randn(d, d, seed=15)

    def fn(q):
        o, lse = flash_decode(q @ w, k, v, seqlens, num_splits=2, return_lse=True, **kw)
        return o @ w, lse

    eager, compiled = _eager_and_compiled(fn, _randn(B, H, n_q, d, seed=16))
    _assert_same(eager, compiled)


@runs_somewhere
def test_explain_counts_no_graph_break():
    """torch._dynamo.explain of a function calling all three entry points: one graph, no break."""
    cu = torch.tensor([0, 6, 16], dtype=torch.int32, device=DEVICE)
    seqlens = torch.tensor([16], dtype=torch.int32, device=DEVICE)

    def fn(q, k, v, packed):
        o = flash_attention(q, k, v, causal=True)
        o2 = flash_attention_varlen(packed, packed, packed, cu, cu, 10, 10)
        o3 = flash_decode(q[:, :, -1:], k, v, seqlens)
        return o.sum() + o2.sum() + o3.sum()

    torch._dynamo.reset()
    q, k, v = (_randn(1, 2, 16, 16, seed=s) for s in (17, 18, 19))
    explanation = torch._dynamo.explain(fn)(q, k, v, _randn(16, 2, 16, seed=20))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


def test_impl_resolution_is_metadata_only():
    """The choice of forward kernel reads only device, dtype and shapes (so a trace makes it once):
    on fake CPU tensors "auto" is "triton" and "gluon" says what it needs."""
    with FakeTensorMode():
        q = torch.empty(1, 2, 64, 64, dtype=torch.bfloat16)
        assert ops.resolve_impl("auto", q, q, None) == "triton"
        assert ops.resolve_impl("triton", q, q, None) == "triton"
        with pytest.raises(ValueError, match="impl='gluon'.*needs a CUDA GPU; got tensors on cpu"):
            ops.resolve_impl("gluon", q, q, None)


def test_auto_takes_gluon_only_at_auto_head_dims(monkeypatch):
    """Where the Gluon forward could run (its refusal stubbed to None), "auto" takes it at d = 64
    and 128 (fa3.AUTO_HEAD_DIMS) and keeps forward.py at d = 256, which impl="gluon" still runs."""
    monkeypatch.setattr(ops, "gluon_refusal", lambda *args: None)
    with FakeTensorMode():
        for d, auto in ((64, "gluon"), (128, "gluon"), (256, "triton")):
            q = torch.empty(1, 2, 64, d, dtype=torch.bfloat16)
            assert ops.resolve_impl("auto", q, q, None) == auto, d
            assert ops.resolve_impl("gluon", q, q, None) == "gluon", d


# --------------------------------------------------------------- on a GPU (Inductor)
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_compiled_module_in_low_precision(dtype):
    """Inductor around the kernels in fp16/bf16 at a GPU's block sizes: the same outputs as eager,
    and gradients within the low-precision rounding of the projections Inductor fuses."""
    model = TinyAttention(heads=4, kv_heads=2, d=64, causal=True).to("cuda", dtype)
    x = torch.randn(2, 300, 256, device="cuda", dtype=dtype, requires_grad=True)
    (outs_e, grads_e), (outs_c, grads_c) = _eager_and_compiled(model, x)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=2e-3, atol=2e-3)
    for a, b in zip(outs_e + grads_e, outs_c + grads_c):
        torch.testing.assert_close(b.float(), a.float(), **tol)


@needs_gpu
def test_gpu_compiled_gluon_forward():
    """impl="gluon" under torch.compile on a Hopper GPU: one graph, eager's numbers."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon forward needs a Hopper GPU (sm_90)")
    model = TinyAttention(heads=2, kv_heads=2, d=128, causal=True, impl="gluon").to("cuda", torch.bfloat16)
    x = torch.randn(2, 500, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    (outs_e, grads_e), (outs_c, grads_c) = _eager_and_compiled(model, x)
    for a, b in zip(outs_e + grads_e, outs_c + grads_c):
        torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)
