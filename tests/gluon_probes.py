"""What the Gluon kernel tests share: small Gluon kernels that test a layout choice at compile
time (sm_90, no GPU needed; each fails to compile, with a message, when the choice no longer
holds), and ``cuobjdump`` to read the machine code of a build."""

import subprocess
import tempfile
from pathlib import Path

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashlab.kernels import fa3_backward
from flashlab.kernels.fa3 import compile_for_sm90


@gluon.jit
def _dq_tile_probe(X, L: gl.constexpr, W: gl.constexpr, MOST: gl.constexpr):
    """The dQ tile of fa3_backward: (1, Br, W) in layout L, which TMA reads, stored from the
    wgmma accumulator (Br, W); the store may cost at most MOST shared-memory wavefronts beyond
    the fewest it could take (gl.bank_conflicts)."""
    acc: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, W, 16])
    tile = gl.allocate_shared_memory(gl.float32, [1, 64, W], L).reshape([64, W])
    stored = gl.zeros([64, W], gl.float32, acc)
    gl.static_assert(gl.bank_conflicts(stored.type, tile.type) <= MOST, "the dQ tile's store has bank conflicts")


def dq_tile_probe(layout=fa3_backward.DQ_SMEM_LAYOUT, most: int = 1) -> None:
    """Compile :func:`_dq_tile_probe` for the kernel's dQ tile (64 columns at d = 64 and 128)."""
    compile_for_sm90(_dq_tile_probe, {"X": "*fp32", "L": "constexpr", "W": "constexpr", "MOST": "constexpr"},
                     {"L": layout, "W": 64, "MOST": most}, (0,), 4, None)


def cuobjdump(cubin: bytes, flag: str) -> str:
    """``cuobjdump FLAG`` (``-sass``, ``-res-usage``) of the cubin, with the cuobjdump that ships
    with Triton; empty where it is missing."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True, check=True).stdout
