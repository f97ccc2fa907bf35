"""Change 22 with and without ping-pong, in one process on one GPU (run 23).

    git apply results/fa3_backward/run22/change22.patch
    PYTHONPATH=. python results/fa3_backward/run23/ab_tree_pp.py OUT
    git apply -R results/fa3_backward/run22/change22.patch

(device_run.sh's step ``tree2`` does the three, and stamps one tile of the patched kernel.)
Run 22 found change 22 (the FP8 row maximum as a tree) 4-6 % slower than the chain it replaces.
The question here: does it lose because the two consumers' exponentials, starting sooner, now
meet at the special-function unit? Then ping-pong, whose turns keep the consumers' softmaxes
apart, should lose less with the tree than without it. Contenders, in fa3._time_switches'
rotated rounds at d = 128 x N = 16k and 4k, causal and not: ``bf16`` (the Gluon forward),
``fp8`` (with change 22), ``fp8_chain`` (without; run22/ab_tree_max.py loads it), and the same
two with ping-pong on (``fp8_pp``, ``fp8_chain_pp``). Writes ab_tree_pp_n<N>_<gpu>.csv/.json
under OUT."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run22"))

import ab_tree_max  # noqa: E402  (loads fa3_fp8 without change 22 as ab_tree_max.chain)

import flashlab.lab.experiments as experiments  # noqa: E402
from flashlab.lab.experiments import fa3 as e  # noqa: E402

experiments.COMMAND = "PYTHONPATH=. python results/fa3_backward/run23/ab_tree_pp.py"


def contenders(q, k, v, do, causal):
    from flashlab.kernels import fa3, fa3_fp8
    from flashlab.kernels.fp8 import quantize_qkv

    pre = quantize_qkv(q, k, v, block=e.FP8_BLOCK, v_block=None)
    chain = ab_tree_max.chain
    return {"bf16": lambda: fa3.forward(q, k, v, causal),
            "fp8": lambda: fa3_fp8.forward(**pre, causal=causal),
            "fp8_chain": lambda: chain.forward(**pre, causal=causal),
            "fp8_pp": lambda: fa3_fp8.forward(**pre, causal=causal, pingpong=True),
            "fp8_chain_pp": lambda: chain.forward(**pre, causal=causal, pingpong=True)}


if __name__ == "__main__":
    OUT = sys.argv[1]
    Path(OUT).mkdir(parents=True, exist_ok=True)
    e.SPEED_D = (128,)
    lengths = tuple(int(n) for n in os.environ.get("AB_N", "16384 4096").split())
    e._time_switches(contenders, lambda d, causal: "fp8_chain", "ab_tree_pp", OUT, per_length=True,
                     lengths=lengths)
