#!/bin/bash
# device call 1 of session 2026-12-06c, main 3543c24: three consumers over several tiles; the bars' benches
# (the variants step ran, but its CSV, JSON and log did not come back: the call's limit on the number of files)
cd "$(dirname "$0")"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat device_commit.txt)"; } > $OUT/gpu.txt 2>&1
t0=$(date +%s)
timeout 150 python -m pytest -m gpu tests/test_kernels_gluon.py -k "three_consumers" -q -p no:cacheprovider > $OUT/gpu_tests_three.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/gpu_tests_three.txt
timeout 60 python -c "import json,sys; from flashlab.lab.bench import ceilings; json.dump(ceilings(), open(sys.argv[1],'w'), indent=1)" $OUT/ceilings.json > $OUT/ceilings.log 2>&1
mkdir -p variants/cur $OUT/variants && cp -r flashlab variants/cur/
timeout 150 python -m flashlab.lab.experiments.fa3_backward_variants variants/cur --rounds 3 --out $OUT/variants > $OUT/variants/log.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/variants/log.txt
mkdir -p $OUT/switches; timeout 150 python -m flashlab.lab.experiments fa3switches --out $OUT/switches > $OUT/switches/log.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/switches/log.txt
left=$(( 585 - ($(date +%s)-t0) ))
mkdir -p $OUT/bench; timeout $left python -m flashlab.lab.bench --suite kernels --impls flashlab flashlab_gluon sdpa_flash sdpa_cudnn flashlab_gluon_fp8 --ds 128 64 --ns 4096 8192 16384 --out $OUT/bench > $OUT/bench/log.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/bench/log.txt
