"""Changes 19, 20 and 21 against the kernels without them, in one process on one GPU (run 19).

    PYTHONPATH=. python results/fa3_backward/run19/ab_tree.py OUT

It ran on a tree with changes 20 and 21 applied to the kernels (``device_tree_call1.diff``).
Neither landed, so on main apply both first: ``git apply results/fa3_backward/run19/change2[01].patch``.

Change 20 (``change20.patch``, beside this file) makes the Gluon forward's row max and row sum
trees inside each thread; change 21 (``change21.patch``) keeps the FP8 kernel's wait for P V
after the softmax's exponentials; change 19 (``../run18/change19.patch``) converts the FP8
kernel's P to e4m3 where the P V wgmma reads it. The kernels without a change are the tree's files
with its patch taken back (``git apply -R`` on copies in a temporary folder, loaded as modules
of ``flashlab.kernels``; main is not touched). Change 19's patch applies only to a kernel
without change 21, so its effect is fp8_before21 against fp8_before21_19. Contenders, in fa3._time_switches' rotated rounds
at AB_D (default d = 128 and 64) x AB_N (default N = 16k and 4k), causal and not:

    cudnn           SDPA's cuDNN forward
    bf16            the tree's Gluon forward (with change 20)
    bf16_chain      the same without change 20
    fp8             the tree's FP8 forward (changes 19, 20 and 21)
    fp8_chain       the FP8 forward without change 20
    fp8_before21    the FP8 forward without change 21
    fp8_before21_19 the FP8 forward without changes 21 and 19 (with change 20)

Before the rounds each shape records how far each kernel without a change lies from main's
(``ab_tree_diffs.json``: largest |O| difference, and whether the bits agree; change 20 adds in
another order, so its l and O may move by an ulp or so; 19 and 21 should keep the bits). Writes ab_tree_n<N>_<gpu>.csv/.json
for each N (provenance as the experiments record it) under OUT."""
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

experiments.COMMAND = "PYTHONPATH=. python results/fa3_backward/run19/ab_tree.py"  # the records' command
HERE = Path(__file__).resolve().parent
KERNELS = Path(experiments.__file__).parents[2] / "kernels"


def _without(patches: list[Path], name: str, imports: dict[str, str] | None = None):
    """``flashlab/kernels/<name>.py`` with ``patches`` taken back in turn, loaded as
    ``flashlab.kernels.<name>_<patch stems>``; ``imports`` rewrites ``from . import X`` lines
    (X -> the name of an already loaded module of the package)."""
    root = Path(tempfile.mkdtemp())
    (root / "flashlab" / "kernels").mkdir(parents=True)
    path = root / "flashlab" / "kernels" / f"{name}.py"
    shutil.copy(KERNELS / f"{name}.py", path)
    for patch in patches:
        subprocess.run(["git", "apply", "-R", f"--include=flashlab/kernels/{name}.py", str(patch)], cwd=root,
                       check=True)
    text = path.read_text()
    for old, new in (imports or {}).items():
        line = f"from . import {old}\n"
        assert line in text, (line, path)
        text = text.replace(line, f"from . import {new} as {old}\n")
    path.write_text(text)
    module_name = f"flashlab.kernels.{name}_" + "_".join(p.stem for p in patches)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # gluon.jit reads its functions' source back by module name
    spec.loader.exec_module(module)
    return module


C19, C20, C21 = HERE.parent / "run18" / "change19.patch", HERE / "change20.patch", HERE / "change21.patch"
fa3_chain = _without([C20], "fa3")
fp8_chain = _without([C20], "fa3_fp8", {"fa3": "fa3_change20"})
fp8_before21 = _without([C21], "fa3_fp8")
fp8_before21_19 = _without([C21, C19], "fa3_fp8")
DIFFS: list[dict] = []


def contenders(q, k, v, do, causal):
    from flashlab.kernels import fa3, fa3_fp8
    from flashlab.kernels.fp8 import quantize_qkv
    from flashlab.lab.experiments.backward import _sdpa_cudnn

    pre = quantize_qkv(q, k, v, block=e.FP8_BLOCK, v_block=None)
    fns = {"cudnn": _sdpa_cudnn(q, k, v, do, causal)[0],
           "bf16": lambda: fa3.forward(q, k, v, causal), "bf16_chain": lambda: fa3_chain.forward(q, k, v, causal),
           "fp8": lambda: fa3_fp8.forward(**pre, causal=causal),
           "fp8_chain": lambda: fp8_chain.forward(**pre, causal=causal),
           "fp8_before21": lambda: fp8_before21.forward(**pre, causal=causal),
           "fp8_before21_19": lambda: fp8_before21_19.forward(**pre, causal=causal)}
    shape = {"d": q.shape[-1], "N": q.shape[2], "causal": causal}
    for base, other in (("bf16", "bf16_chain"), ("fp8", "fp8_chain"), ("fp8", "fp8_before21"),
                        ("fp8_before21", "fp8_before21_19")):
        (o1, _), (o2, _) = fns[base](), fns[other]()
        DIFFS.append({**shape, "kernel": other, "against": base, "same_bits": bool(torch.equal(o1, o2)),
                      "max_abs_diff": float((o1.float() - o2.float()).abs().max())})
        print(DIFFS[-1], flush=True)
    Path(OUT, "ab_tree_diffs.json").write_text(json.dumps(DIFFS, indent=1))  # at once: a time limit may come
    return fns


if __name__ == "__main__":
    OUT = sys.argv[1]
    e.SPEED_D = tuple(int(d) for d in os.environ.get("AB_D", "128 64").split())
    lengths = tuple(int(n) for n in os.environ.get("AB_N", "16384 4096").split())
    e._time_switches(contenders, lambda d, causal: "bf16", "ab_tree", OUT, per_length=True, lengths=lengths)
