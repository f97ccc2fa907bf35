"""Versions of the Gluon FlashAttention-3 backward timed side by side, in one process, on the
bars' shapes (the records of ``results/fa3_backward``).

    python -m flashlab.lab.experiments.fa3_backward_variants TREE [TREE ...] --out results

Each TREE is a checkout of this repository (``git archive <ref> | tar -x -C TREE``); its
``flashlab/kernels/fa3_backward.py`` is loaded as a module of this package, beside the others,
so every version runs with the same forward, the same inputs and the same GPU clocks. A tree
whose other kernel files differ from this package's is refused: the comparison would not be of
the backward alone.

For each shape, in rounds (each round takes every contender once, so a drift of the clocks
falls on all of them alike): SDPA cuDNN's forward and forward + backward, and for each tree the
Gluon forward + that tree's backward and that backward alone. Times are medians of do_bench,
the record's values the medians over the rounds; each round starts one contender later than the
last, so none always runs first. Writes ``fa3_backward_variants_<gpu>.csv``
(tree, shape, pass, ms, TFLOP/s, rounds' spread) and ``.json`` with the provenance and the
sha256 of each tree's ``fa3_backward.py``.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

import torch

from flashlab.lab.measure import paper_shape
from flashlab.reference.naive import attention_flops

__all__ = ["load_backward", "main", "ratios", "shapes"]

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
ROUNDS = 3


def load_backward(tree: Path) -> ModuleType:
    """``tree``'s ``flashlab/kernels/fa3_backward.py`` as ``flashlab.kernels._fa3_backward_<name>``.
    Raises if the tree's other kernel files differ from this package's."""
    own = tree / "flashlab" / "kernels"
    path = own / "fa3_backward.py"
    if not path.is_file():
        raise ValueError(f"tree must hold flashlab/kernels/fa3_backward.py; got {tree}")
    differ = sorted(p.name for p in own.glob("*.py") if p.name != "fa3_backward.py"
                    and not ((KERNELS / p.name).is_file() and filecmp.cmp(p, KERNELS / p.name, shallow=False)))
    if differ:
        raise ValueError(f"tree {tree} must differ from this package in fa3_backward.py only; "
                         f"it differs in {differ}")
    name = "flashlab.kernels._fa3_backward_" + "".join(c if c.isalnum() else "_" for c in tree.name)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Gluon's JIT reads the source back through the module
    spec.loader.exec_module(module)
    return module


def shapes(which: str = "bars") -> list[tuple[int, int, int, int, bool]]:
    """(B, H, N, d, causal): the bars' shapes (N = 16k and 4k at the papers' B x N = 16k tokens,
    d = 128 and 64, causal and not, and one 128k-token causal sequence), or ``"quick"``: the
    d = 128 ones at N = 16k non-causal and N = 4k causal."""
    if which == "quick":
        return [(*paper_shape(16384, 128), 16384, 128, False), (*paper_shape(4096, 128), 4096, 128, True)]
    rows = [(*paper_shape(n, d), n, d, c) for n in (16384, 4096) for d in (128, 64) for c in (False, True)]
    return rows + [(1, 16, 131072, 128, True)]


def ratios(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """For each shape and tree of a record's rows: cuDNN's forward + backward time over the tree's
    (above 1: the tree is faster) and the first tree's backward time over this tree's."""
    out = []
    shape = lambda r: (r["B"], r["H"], r["N"], r["d"], r["causal"])  # noqa: E731
    ms = {(r["tree"], shape(r), r["pass"]): float(r["ms"]) for r in rows if r["tree"] != "ceiling"}
    trees = list(dict.fromkeys(r["tree"] for r in rows if r["tree"] not in ("ceiling", "sdpa_cudnn")))
    for key in dict.fromkeys(shape(r) for r in rows if r["tree"] != "ceiling"):
        for tree in trees:
            out.append({"B": key[0], "H": key[1], "N": key[2], "d": key[3], "causal": key[4], "tree": tree,
                        "vs_cudnn": round(ms[("sdpa_cudnn", key, "fwdbwd")] / ms[(tree, key, "fwdbwd")], 3),
                        "bwd_vs_first": round(ms[(trees[0], key, "bwd")] / ms[(tree, key, "bwd")], 3)})
    return out


def _inputs(B, H, N, d):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(B, H, N, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4)]


def main(argv: list[str] | None = None) -> list[Path]:
    from flashlab.kernels.fa3 import forward
    from flashlab.lab.bench import ceilings, fused_attention_torch
    from flashlab.lab.experiments import COMMAND, gpu_ms, require_gpu
    from flashlab.lab.measure import gpu_tag, provenance
    from flashlab.lab.results import write

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trees", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", choices=("bars", "quick"), default="bars")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    args = p.parse_args(argv)
    names = [t.name for t in args.trees]
    if len(set(names)) != len(names) or {"sdpa_cudnn", "ceiling"} & set(names) or args.rounds < 1:
        raise ValueError(f"trees must have distinct names other than sdpa_cudnn and ceiling, and rounds "
                         f"must be at least 1; got {names}, rounds = {args.rounds}")
    require_gpu()
    backwards = {t.name: load_backward(t) for t in args.trees}
    matmul = [c for c in ceilings() if c["ceiling"].startswith("matmul")][0]
    rows: list[dict[str, object]] = [{"tree": "ceiling", "B": "", "H": "", "N": "", "d": "", "causal": "",
                                      "pass": matmul["ceiling"], "ms": round(matmul["ms"], 5),
                                      "tflops": round(matmul["value"] / 1e12, 1), "spread": ""}]
    paths: list[Path] = []
    meta = provenance(" ".join([COMMAND + ".fa3_backward_variants", *(argv or sys.argv[1:])]))
    meta["trees"] = {str(t): hashlib.sha256((t / "flashlab/kernels/fa3_backward.py").read_bytes()).hexdigest()
                     for t in args.trees}  # each tree's backward, by the sha256 of its source
    for B, H, N, d, causal in shapes(args.shapes):
        q, k, v, do = _inputs(B, H, N, d)
        scale = d**-0.5
        o, lse2 = forward(q, k, v, causal, scale)
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        fns = {("sdpa_cudnn", "fwd"): lambda: fused_attention_torch(qg, kg, vg, causal, "cudnn"),
               ("sdpa_cudnn", "fwdbwd"): lambda: torch.autograd.grad(
                   fused_attention_torch(qg, kg, vg, causal, "cudnn"), (qg, kg, vg), do)}
        for name, m in backwards.items():
            def both(m=m):
                o_, lse_ = forward(q, k, v, causal, scale)
                return m.backward(do, q, k, v, o_, lse_, causal, scale)
            fns[(name, "fwdbwd")] = both
            fns[(name, "bwd")] = lambda m=m: m.backward(do, q, k, v, o, lse2, causal, scale)
        times: dict[tuple[str, str], list[float]] = {key: [] for key in fns}
        order = list(fns)
        for r in range(args.rounds):  # each round starts one contender later: none always runs first
            for key in order[r % len(order):] + order[:r % len(order)]:
                times[key].append(gpu_ms(fns[key]))
        flops = attention_flops(N, N, d, causal=causal, batch=B * H)
        for (name, pass_), ts in times.items():
            ms = statistics.median(ts)
            factor = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}[pass_]
            row = {"tree": name, "B": B, "H": H, "N": N, "d": d, "causal": causal, "pass": pass_,
                   "ms": round(ms, 5), "tflops": round(factor * flops / (ms * 1e-3) / 1e12, 1),
                   "spread": round((max(ts) - min(ts)) / ms, 4)}
            rows.append(row)
            print(row, flush=True)
        del q, k, v, do, o, lse2, qg, kg, vg, fns
        torch.cuda.empty_cache()
        paths = write(f"fa3_backward_variants_{gpu_tag()}", rows, meta, args.out)
    for r in ratios(rows):
        print(" ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    for path in paths:
        print(path, flush=True)
    return paths


if __name__ == "__main__":
    main()
