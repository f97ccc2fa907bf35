#!/bin/bash
# device call 2 of session 2026-12-06c: main 3543c24 + three bf16 consumers at d = 64 by default + change 17
cd "$(dirname "$0")"
R=$OUT/r; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat device_commit.txt)"; } > $R/gpu.txt 2>&1
cp device_run.sh device_tree.diff $R/
t0=$(date +%s)
timeout 230 python -m pytest -m gpu tests/test_kernels_gluon.py -q -p no:cacheprovider > $R/gpu_tests_gluon.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $R/gpu_tests_gluon.txt
mkdir -p $R/fp8switches; timeout 200 python -m flashlab.lab.experiments fp8switches --out $R/fp8switches > $R/fp8switches/log.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $R/fp8switches/log.txt
left=$(( 575 - ($(date +%s)-t0) ))
mkdir -p variants/cur $R/variants && cp -r flashlab variants/cur/
timeout $left python -m flashlab.lab.experiments.fa3_backward_variants variants/cur --rounds 3 --out $R/variants > $R/variants/log.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $R/variants/log.txt
cd $OUT && tar czf r.tgz r && rm -rf r
