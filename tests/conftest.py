"""Test-session setup.

Without a CUDA GPU the Triton kernels run under Triton's interpreter. The variable
must be set before flashlab.kernels is imported (``@triton.jit`` reads it when the
kernels are defined), so it is set here, before any test module is collected.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
