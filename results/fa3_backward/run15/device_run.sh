#!/bin/bash
# device call 3 of session 2026-12-06b: change 16 (the FP8 forward's switches)
cd "$(dirname "$0")"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat device_commit.txt)"; } > $OUT/gpu.txt 2>&1
t0=$(date +%s)
timeout 200 python -m pytest -m gpu tests/test_kernels_gluon.py -k "fp8" -q -p no:cacheprovider > $OUT/gpu_tests_fp8.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/gpu_tests_fp8.txt
left=$(( 590 - ($(date +%s)-t0) ))
timeout $left python -m flashlab.lab.experiments fp8switches --out $OUT > $OUT/fp8switches.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/fp8switches.txt
