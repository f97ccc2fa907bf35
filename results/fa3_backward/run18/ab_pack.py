"""Change 19 against the FP8 kernel as main had it, in one process on one GPU (run 18).

    PYTHONPATH=. python results/fa3_backward/run18/ab_pack.py OUT

Contenders, timed in fa3._time_switches' rotated rounds at d = 128 and 64 (AB_D: which),
N = 16k and 4k (AB_N: which), causal and not: cuDNN and the bf16 Gluon forward (anchors), the
FP8 kernel with change 19 (fp8_default) and without it (fp8_before: main's kernel with
change19.patch, beside this file, taken back), both with their default switches, on the same
quantised inputs. Before the rounds, each shape checks that the two FP8 kernels give the same bits (``fa3_fp8_pack_same_bits.json``): change 19 moves where P
is converted, not how. Writes fa3_fp8_pack_n<N>_<gpu>.csv/.json for each N (provenance as the
experiments record it) under OUT."""
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

experiments.COMMAND = "PYTHONPATH=. python results/fa3_backward/run18/ab_pack.py"  # the records' command


def _kernel_before_change19() -> Path:
    """fa3_fp8.py as it was before change 19: main's kernel with change19.patch taken back
    (git apply -R on a copy in a temporary folder; main is not touched)."""
    kernel = Path(experiments.__file__).parents[2] / "kernels" / "fa3_fp8.py"
    root = Path(tempfile.mkdtemp())
    (root / "flashlab" / "kernels").mkdir(parents=True)
    shutil.copy(kernel, root / "flashlab" / "kernels" / "fa3_fp8.py")
    subprocess.run(["git", "apply", "-R", "--include=flashlab/kernels/fa3_fp8.py",
                    str(Path(__file__).with_name("change19.patch"))], cwd=root, check=True)
    return root / "flashlab" / "kernels" / "fa3_fp8.py"


# inside the package, so that its relative imports (from . import fa3) resolve
spec = importlib.util.spec_from_file_location("flashlab.kernels.fa3_fp8_before", _kernel_before_change19())
before = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = before  # gluon.jit looks its functions' module up by name
spec.loader.exec_module(before)
SAME: dict[tuple, bool] = {}


def contenders(q, k, v, do, causal):
    from flashlab.kernels.fa3_fp8 import forward as fp8_forward
    from flashlab.kernels.fp8 import quantize_qkv
    from flashlab.lab.experiments.backward import _sdpa_cudnn

    pre = quantize_qkv(q, k, v, block=e.FP8_BLOCK, v_block=None)
    new = lambda: fp8_forward(**pre, causal=causal)  # noqa: E731
    old = lambda: before.forward(**pre, causal=causal)  # noqa: E731
    key = (q.shape[-1], q.shape[2], causal)
    SAME[key] = all(torch.equal(a, b) for a, b in zip(new(), old()))  # (O, lse) of each kernel
    print("same bits (d, N, causal):", key, SAME[key], flush=True)
    same = [{"d": d, "N": n, "causal": c, "same_bits": s} for (d, n, c), s in SAME.items()]
    Path(OUT, "fa3_fp8_pack_same_bits.json").write_text(json.dumps(same, indent=1))  # at once: a time limit may come
    return {"cudnn": _sdpa_cudnn(q, k, v, do, causal)[0], "bf16_default": lambda: e.forward(q, k, v, causal),
            "fp8_default": new, "fp8_before": old}


if __name__ == "__main__":
    OUT = sys.argv[1]
    e.SPEED_D = tuple(int(d) for d in os.environ.get("AB_D", "128 64").split())
    lengths = tuple(int(n) for n in os.environ.get("AB_N", "16384 4096").split())
    e._time_switches(contenders, lambda d, causal: "fp8_default", "fa3_fp8_pack", OUT, per_length=True, lengths=lengths)
