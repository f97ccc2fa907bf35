"""Where the kernel tests run: the GPU when there is one, else the CPU under Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before this is imported).

GPU, DEVICE      a CUDA GPU is present, and the device the tests put their tensors on
SIZE             sequence lengths scale by this: 1 under the interpreter (16 x 16 tiles),
                 8 on a GPU (tiles of 64-128)
runs_somewhere   skip only where neither a GPU nor the interpreter is available
needs_gpu        skip without a CUDA GPU (CI has none)
sm90_build_env   the environment of a subprocess that compiles Gluon kernels for sm_90 on a CPU
"""

import os
import sys
from pathlib import Path

import pytest
import torch

from flashlab.kernels import INTERPRET

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
SIZE = 1 if INTERPRET else 8
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (CI has none)")
runs_somewhere = pytest.mark.skipif(not GPU and not INTERPRET, reason="needs a GPU or TRITON_INTERPRET=1")

# The Triton the lent Hopper GPUs run, installed beside the venv's by `make test` (Makefile: SM90_DIR)
SM90_TRITON_DIR = Path(sys.prefix) / "triton-sm90"
SM90_TRITON_VERSION = "3.6."


def sm90_build_env() -> dict[str, str]:
    """Environment for a subprocess that compiles Gluon kernels for sm_90: without TRITON_INTERPRET
    (which patches triton.language, so Gluon would not build), and with the GPU's Triton
    (SM90_TRITON_DIR) ahead of the venv's where it is installed, so the compiled code read by the
    tests is the code the GPU runs."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if (SM90_TRITON_DIR / "triton").is_dir():
        env["PYTHONPATH"] = os.pathsep.join([str(SM90_TRITON_DIR), str(Path.cwd()), env.get("PYTHONPATH", "")])
    return env
