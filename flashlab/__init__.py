"""flashlab -- FlashAttention from first principles.

The teaching core, in the order its modules import each other (each only from those below):
  kernels     Triton kernels: FlashAttention-2 forward and backward, decoding, FP8, FA4-style
  memory      simulated HBM + SRAM of M elements that counts every element moved
  sim         occupancy and waves; a discrete-event model of one SM
  cycles      cycles per tile from per-SM per-cycle unit rates
  generations the four FlashAttention papers as data
  reference   exact NumPy algorithms (float64)
  hardware    GPU specifications with sources; roofline helpers
  env         what this machine can run (the execution tiers)
Two packages build on it and are never imported by it: ``flashlab.lab`` (measuring) and
``flashlab.course`` (figures, site, assignments). ARCHITECTURE.md says where new code goes.
"""

__version__ = "0.1.0"
