"""flashlab.lab -- measuring the kernels: benchmarks, experiments, compile and Nsight reports.

Nothing in the teaching core imports this package; it imports the core.
  measure         timing, provenance, parallel precompilation, isolated runs
  bench           flashlab against torch SDPA (flash, cuDNN) and naive attention; GPU ceilings
  experiments/    the GPU experiments behind chapters 5-9 (``python -m flashlab.lab.experiments``)
  variants/       kernel variants that only the experiments time
  compile_report  what the compiler made of a kernel for sm_90 (registers, spills), no GPU needed
  ncu             HBM bytes of one attention pass, counted by Nsight Compute
  results         recorded measurements (``results/``) and their provenance
"""
