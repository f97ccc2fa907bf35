"""Where the kernel tests run: the GPU when there is one, else the CPU under Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before this is imported).

GPU, DEVICE      a CUDA GPU is present, and the device the tests put their tensors on
SIZE             sequence lengths scale by this: 1 under the interpreter (16 x 16 tiles),
                 8 on a GPU (tiles of 64-128)
runs_somewhere   skip only where neither a GPU nor the interpreter is available
needs_gpu        skip without a CUDA GPU (CI has none)
"""

import pytest
import torch

from flashlab.kernels import INTERPRET

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
SIZE = 1 if INTERPRET else 8
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (CI has none)")
runs_somewhere = pytest.mark.skipif(not GPU and not INTERPRET, reason="needs a GPU or TRITON_INTERPRET=1")
