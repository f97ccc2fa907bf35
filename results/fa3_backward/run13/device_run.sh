#!/bin/bash
# device call 1 of session 2026-12-06b, on branch r/three-consumers (main d95f766 + change 15)
cd "$(dirname "$0")"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat device_commit.txt)"; } > $OUT/gpu.txt 2>&1
t0=$(date +%s)
timeout 170 python -m pytest -m gpu tests/test_kernels_gluon.py -k "two_consumers_at_d64" -q -p no:cacheprovider > $OUT/tests_two_consumers.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/tests_two_consumers.txt
timeout 150 python -m pytest -m gpu tests/test_kernels_gluon.py -k "measured_best or dealt_in_pairs" -q -p no:cacheprovider > $OUT/tests_three_consumers.txt 2>&1; rc=$?; echo "rc=$rc $(( $(date +%s)-t0 ))s" >> $OUT/tests_three_consumers.txt
left=$(( 590 - ($(date +%s)-t0) ))
echo "switches with ${left}s" 
timeout $left python -c "import sys; import flashlab.lab.experiments.fa3 as f; f.SPEED_D=(64,); f.switches(sys.argv[1])" $OUT > $OUT/switches.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/switches.txt
