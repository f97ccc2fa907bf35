"""Versions of the Gluon FlashAttention-3 backward timed side by side, in one process, on the
bars' shapes (the records of ``results/fa3_backward``).

    python -m flashlab.lab.experiments.fa3_backward_variants TREE [TREE ...] --out results

Each TREE is a checkout of this repository (``git archive <ref> | tar -x -C TREE``); its
``flashlab/kernels/fa3_backward.py`` is loaded as a module of this package, beside the others,
so every version runs with the same forward, the same inputs and the same GPU clocks. A tree
whose other kernel files differ from this package's is refused: the comparison would not be of
the backward alone.

For each shape, in rounds (each round takes every contender once, so a drift of the clocks
falls on all of them alike): SDPA cuDNN's forward and forward + backward, the Gluon forward
alone (``gluon_forward``), and for each tree the Gluon forward + that tree's backward and that
backward alone. Times are medians of do_bench,
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
import sys
from pathlib import Path
from types import ModuleType

import torch

from flashlab.lab.experiments.backward import PASS_FLOPS, _qkv, _sdpa_cudnn, _shapes
from flashlab.reference.naive import attention_flops

__all__ = ["load_backward", "main", "ratios", "shapes"]

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
ROUNDS = 3
FORWARD = "gluon_forward"  # the record's name for the Gluon forward every tree shares, timed alone
RESERVED = ("ceiling", "sdpa_cudnn", FORWARD)  # names no tree may take


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


def shapes() -> list[tuple[int, int, int, int, bool]]:
    """(B, H, N, d, causal): the bars' shapes, those of ``backward_speed``
    (:mod:`flashlab.lab.experiments.backward`)."""
    return list(_shapes())


def ratios(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """For each shape and tree of a record's rows: cuDNN's forward + backward time over the tree's
    (above 1: the tree is faster), the first tree's backward time over this tree's, and, where
    the shared Gluon forward was timed alone (:data:`FORWARD`), how much longer the tree's
    forward + backward took than the forward and the backward timed apart (``pair_excess``, a
    fraction of the forward + backward; "" without it)."""
    out = []
    shape = lambda r: (r["B"], r["H"], r["N"], r["d"], r["causal"])  # noqa: E731
    ms = {(r["tree"], shape(r), r["pass"]): float(r["ms"]) for r in rows if r["tree"] != "ceiling"}
    trees = list(dict.fromkeys(r["tree"] for r in rows if r["tree"] not in RESERVED))
    for key in dict.fromkeys(shape(r) for r in rows if r["tree"] != "ceiling"):
        for tree in trees:
            both, bwd = ms[(tree, key, "fwdbwd")], ms[(tree, key, "bwd")]
            fwd = ms.get((FORWARD, key, "fwd"))
            out.append({"B": key[0], "H": key[1], "N": key[2], "d": key[3], "causal": key[4], "tree": tree,
                        "vs_cudnn": round(ms[("sdpa_cudnn", key, "fwdbwd")] / both, 3),
                        "bwd_vs_first": round(ms[(trees[0], key, "bwd")] / bwd, 3),
                        "pair_excess": "" if fwd is None else round((both - fwd - bwd) / both, 3)})
    return out


def _time_shape(backwards: dict[str, ModuleType], B: int, H: int, N: int, d: int, causal: bool,
                rounds: int) -> list[dict[str, object]]:
    """Rows of one shape: cuDNN's forward and forward + backward, the shared Gluon forward alone,
    and each tree's forward + backward and backward alone, medians over ``rounds`` rounds, each round starting one
    contender later than the last, so none always runs first."""
    from flashlab.kernels.fa3 import forward
    from flashlab.lab.experiments import in_rounds, round_summary

    q, k, v, do = _qkv(B, H, N, d)
    scale = d**-0.5
    o, lse2 = forward(q, k, v, causal, scale)
    fns = dict(zip([("sdpa_cudnn", "fwd"), ("sdpa_cudnn", "fwdbwd")], _sdpa_cudnn(q, k, v, do, causal)))
    fns[(FORWARD, "fwd")] = lambda: forward(q, k, v, causal, scale)
    for name, m in backwards.items():
        def both(m=m):
            o_, lse_ = forward(q, k, v, causal, scale)
            return m.backward(do, q, k, v, o_, lse_, causal, scale)
        fns[(name, "fwdbwd")] = both
        fns[(name, "bwd")] = lambda m=m: m.backward(do, q, k, v, o, lse2, causal, scale)
    times = in_rounds(fns, rounds)
    flops = attention_flops(N, N, d, causal=causal, batch=B * H)
    rows = []
    for (name, pass_), ts in times.items():
        rows.append({"tree": name, "B": B, "H": H, "N": N, "d": d, "causal": causal, "pass": pass_,
                     **round_summary(ts, PASS_FLOPS[pass_] * flops)})
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[Path]:
    from flashlab.lab.bench import ceilings
    from flashlab.lab.experiments import COMMAND, require_gpu
    from flashlab.lab.measure import gpu_tag, provenance
    from flashlab.lab.results import write

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trees", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=ROUNDS)
    args = p.parse_args(argv)
    names = [t.name for t in args.trees]
    if len(set(names)) != len(names) or set(RESERVED) & set(names) or args.rounds < 1:
        raise ValueError(f"trees must have distinct names other than {', '.join(RESERVED)}, and rounds "
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
    for B, H, N, d, causal in shapes():
        rows += _time_shape(backwards, B, H, N, d, causal, args.rounds)
        torch.cuda.empty_cache()
        paths = write(f"fa3_backward_variants_{gpu_tag()}", rows, meta, args.out)
    for r in ratios(rows):
        print(" ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    for path in paths:
        print(path, flush=True)
    return paths


if __name__ == "__main__":
    main()
