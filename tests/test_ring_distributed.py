"""flashlab.parallel.ring_attention on real processes: 1, 2 and 4 gloo ranks on the CPU,
each running the flashlab kernels under Triton's interpreter. (On a machine with a GPU the
kernels are compiled for it instead and these CPU tests are skipped; a multi-GPU NCCL run
is a separate measurement.)

Each world size is one start of its ranks (torch.multiprocessing, forked; MASTER_ADDR=127.0.0.1
and a free port): every rank runs each case, forward and backward, on its shard of the same inputs
and saves its rows; the test puts the rows back in sequence order and compares them with
the float64 reference (flashlab.reference.attention and attention_backward).

Sizes: N = 32 tokens per rank, d = 16, 2 heads, float32, so that 4 ranks share 2 CPU cores
in a few seconds. Tolerance 1e-5, the fp32 bound of the kernels (IEEE dot products): the ring
adds P merges of partial softmaxes and P partial gradients in float32, a few ulps each.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashlab.reference import attention, attention_backward

pytestmark = pytest.mark.skipif(
    not dist.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs torch.distributed and the Triton interpreter (tests/conftest.py sets it without a GPU)")

TOL = 1e-5
N_PER_RANK, D, HEADS = 32, 16, 2
CASES = {  # name -> (causal, layout)
    "full": (False, "plain"),
    "causal_zigzag": (True, "zigzag"),
    "causal_plain": (True, "plain"),
}


def _inputs(world: int) -> dict[str, torch.Tensor]:
    """The whole sequence's q, k, v and dO, (1, HEADS, world * N_PER_RANK, D), float32."""
    g = torch.Generator().manual_seed(world)
    shape = (1, HEADS, world * N_PER_RANK, D)
    return {name: torch.randn(shape, generator=g) for name in ("q", "k", "v", "do")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, inputs: dict, outdir: str) -> None:
    """One rank: every case, forward and backward on its shard; saves its rows of o, dq, dk, dv."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from flashlab.parallel import ring_attention, shard

        for name, (causal, layout) in CASES.items():
            q, k, v, do = (shard(inputs[t], rank, world, layout) for t in ("q", "k", "v", "do"))
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            o, lse = ring_attention(q, k, v, causal=causal, layout=layout, return_lse=True)
            o.backward(do)
            rows = {"o": o, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}
            torch.save({key: t.detach() for key, t in rows.items()}, Path(outdir) / f"{name}_{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda w: f"{w}_ranks")
def ring_run(request, tmp_path_factory):
    """(world size, inputs, {case: {tensor: whole-sequence result}}) from one spawn of the ranks."""
    from flashlab.parallel import unshard

    world = request.param
    inputs = _inputs(world)
    outdir = tmp_path_factory.mktemp(f"ring{world}")
    # fork: the ranks start with torch, triton and the interpreter's setting already loaded
    mp.start_processes(_rank_main, args=(world, _free_port(), inputs, str(outdir)), nprocs=world,
                       join=True, start_method="fork")
    results = {}
    for name, (_, layout) in CASES.items():
        parts = [torch.load(outdir / f"{name}_{r}.pt") for r in range(world)]
        whole = {key: unshard([p[key] for p in parts], layout) for key in ("o", "dq", "dk", "dv")}
        whole["lse"] = unshard([p["lse"][..., None] for p in parts], layout)[..., 0]
        results[name] = whole
    return world, inputs, results


@pytest.mark.parametrize("case", list(CASES))
def test_ring_matches_the_reference(ring_run, case):
    world, inputs, results = ring_run
    causal, _ = CASES[case]
    q, k, v, do = (inputs[t].double().numpy() for t in ("q", "k", "v", "do"))
    o_ref, lse_ref = attention(q, k, v, causal, return_lse=True)
    grads_ref = attention_backward(q, k, v, do, causal)
    got = results[case]
    for key, ref in zip(("o", "lse", "dq", "dk", "dv"), (o_ref, lse_ref, *grads_ref)):
        np.testing.assert_allclose(got[key].double().numpy(), ref, rtol=TOL, atol=TOL,
                                   err_msg=f"{key} on {world} ranks, {case}")


def test_the_shard_layout_round_trips():
    from flashlab.parallel import shard, unshard

    x = torch.arange(2 * 3 * 16 * 4.0).reshape(2, 3, 16, 4)
    for layout in ("plain", "zigzag"):
        parts = [shard(x, r, 4, layout) for r in range(4)]
        assert torch.equal(unshard(parts, layout), x)
    assert shard(x, 0, 4, "zigzag")[0, 0, :, 0].tolist() == [0.0, 4.0, 56.0, 60.0]  # chunks 0 and 7 of 8


def test_without_a_process_group_the_error_says_what_to_do():
    from flashlab.parallel import ring_attention

    q = torch.zeros(1, 1, 4, 16)
    with pytest.raises(ValueError, match="init_process_group"):
        ring_attention(q, q, q)
