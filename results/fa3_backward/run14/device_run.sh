#!/bin/bash
# device call 2 of session 2026-12-06b, main c9f4c97 (d = 64: both switches off, 3 consumers without the mask)
cd "$(dirname "$0")"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat device_commit.txt)"; } > $OUT/gpu.txt 2>&1
t0=$(date +%s)
timeout 200 python -m pytest -m gpu tests/test_kernels_gluon.py -q -p no:cacheprovider > $OUT/gpu_tests_gluon.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/gpu_tests_gluon.txt
timeout 60 python -c "import json,sys; from flashlab.lab.bench import ceilings; json.dump(ceilings(), open(sys.argv[1],'w'), indent=1)" $OUT/ceilings.json > $OUT/ceilings.log 2>&1
mkdir -p $OUT/switches; timeout 170 python -m flashlab.lab.experiments fa3switches --out $OUT/switches > $OUT/switches.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/switches.txt
left=$(( 585 - ($(date +%s)-t0) ))
mkdir -p variants/cur $OUT/variants && cp -r flashlab variants/cur/
timeout $left python -m flashlab.lab.experiments.fa3_backward_variants variants/cur --rounds 3 --out $OUT/variants > $OUT/variants.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/variants.txt
