"""Change 22 against the FP8 kernel without it, in one process on one GPU (run 22).

    git apply results/fa3_backward/run22/change22.patch
    PYTHONPATH=. python results/fa3_backward/run22/ab_tree_max.py OUT
    git apply -R results/fa3_backward/run22/change22.patch

(device_run.sh's step ``tree`` does the three.) Change 22 (``change22.patch``, beside this
file) makes the FP8 kernel's row maximum a tree inside each thread (``fa3._row_max_tree``: depth log2(Bc / 8) and two shuffles, where
``gl.reduce`` chains a row's 32 registers one after the other); the row sum keeps its chain,
which adds each exponential as it comes. The bf16 kernel does not change. ``fp8_chain`` is
the patched ``fa3_fp8.py`` with its part of the patch taken back (``git apply -R`` on a copy in
a temporary folder, loaded as a module of ``flashlab.kernels``), beside the patched ``fa3.py``.
Contenders, in fa3._time_switches' rotated rounds at AB_D (default 128) x AB_N (default 16k and 4k), causal
and not: ``cudnn`` (SDPA's cuDNN forward), ``bf16`` (the Gluon forward), ``fp8`` (with change
22), ``fp8_chain`` (without). Before the rounds each shape records whether the two FP8 kernels
give the same bits (``ab_tree_max_bits.json``; the maximum is exact in any order, so they
should). Writes ab_tree_max_n<N>_<gpu>.csv/.json under OUT."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import flashlab.lab.experiments as experiments
from flashlab.lab.experiments import fa3 as e

experiments.COMMAND = " ".join(  # the records' command, with the overrides below when they are set
    [f"{k}={os.environ[k]}" for k in ("AB_PATCH", "AB_NAME", "AB_WITHOUT") if os.environ.get(k)]
    + ["PYTHONPATH=. python results/fa3_backward/run22/ab_tree_max.py"])
# AB_PATCH: another patch of the same form in its place (run 24: ../run24/change23.patch; run 26:
# ../run26/change24.patch); AB_NAME the records' name (default ab_tree_max); AB_WITHOUT the
# name of the kernel without the patch (default fp8_chain)
PATCH = Path(os.environ.get("AB_PATCH") or Path(__file__).resolve().with_name("change22.patch")).resolve()
NAME = os.environ.get("AB_NAME", "ab_tree_max")
WITHOUT = os.environ.get("AB_WITHOUT", "fp8_chain")  # the name of the kernel without the patch
KERNELS = Path(experiments.__file__).parents[2] / "kernels"


def _fp8_without_change22():
    """fa3_fp8.py with change22.patch taken back, loaded as flashlab.kernels.fa3_fp8_chain."""
    root = Path(tempfile.mkdtemp())
    (root / "flashlab" / "kernels").mkdir(parents=True)
    path = root / "flashlab" / "kernels" / "fa3_fp8.py"
    shutil.copy(KERNELS / "fa3_fp8.py", path)
    subprocess.run(["git", "apply", "-R", "--include=flashlab/kernels/fa3_fp8.py", str(PATCH)], cwd=root, check=True)
    spec = importlib.util.spec_from_file_location("flashlab.kernels.fa3_fp8_chain", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # gluon.jit reads its functions' source back by module name
    spec.loader.exec_module(module)
    return module


chain = _fp8_without_change22()
BITS: list[dict] = []


def contenders(q, k, v, do, causal):
    from flashlab.kernels import fa3, fa3_fp8
    from flashlab.kernels.fp8 import quantize_qkv
    from flashlab.lab.experiments.backward import _sdpa_cudnn

    pre = quantize_qkv(q, k, v, block=e.FP8_BLOCK, v_block=None)
    fns = {"cudnn": _sdpa_cudnn(q, k, v, do, causal)[0], "bf16": lambda: fa3.forward(q, k, v, causal),
           "fp8": lambda: fa3_fp8.forward(**pre, causal=causal),
           WITHOUT: lambda: chain.forward(**pre, causal=causal)}
    (o1, l1), (o2, l2) = fns["fp8"](), fns[WITHOUT]()
    BITS.append({"d": q.shape[-1], "N": q.shape[2], "causal": causal,
                 "same_bits": bool(torch.equal(o1, o2)) and bool(torch.equal(l1, l2))})
    print(BITS[-1], flush=True)
    Path(OUT, f"{NAME}_bits.json").write_text(json.dumps(BITS, indent=1))  # at once: a time limit may come
    return fns


if __name__ == "__main__":
    OUT = sys.argv[1]
    Path(OUT).mkdir(parents=True, exist_ok=True)
    e.SPEED_D = tuple(int(d) for d in os.environ.get("AB_D", "128").split())
    lengths = tuple(int(n) for n in os.environ.get("AB_N", "16384 4096").split())
    e._time_switches(contenders, lambda d, causal: WITHOUT, NAME, OUT, per_length=True,
                     lengths=lengths)
