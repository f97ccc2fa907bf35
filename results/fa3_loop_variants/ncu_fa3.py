import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
from flashlab.kernels import fa3
q, k, v = (torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for causal in (False,):
    for _ in range(3):
        fa3.forward(q, k, v, causal)
torch.cuda.synchronize()
print("ok")
