"""flashlab — FlashAttention from first principles.

Layers (each imports only from those above it):
  hardware   GPU specifications with sources; roofline helpers
  reference  exact NumPy algorithms (float64)
  memory     simulated HBM + SRAM of M elements that counts every element moved
  figures    every figure of the book, from code
  env        what this machine can run (the execution tiers)
"""

__version__ = "0.1.0"
