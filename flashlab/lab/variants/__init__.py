"""Kernel variants that only experiments time: the teaching kernels of :mod:`flashlab.kernels`
with a switch that a recorded measurement asked about (each module says which)."""
