#!/bin/bash
# device call of session 2026-12-06c: change 18 (conditional rescaling in the FP8 Gluon kernel, rescale_threshold)
cd "$(dirname "$0")"
pack() { (cd $OUT && tar czf $1.tgz $1 && rm -rf $1); }   # each step's files in one archive, as soon as it ends
mkdir -p $OUT/s1 && cp device_run.sh device_tree.diff device_commit.txt $OUT/s1/
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat device_commit.txt)"; } > $OUT/s1/gpu.txt 2>&1
t0=$(date +%s)
timeout 80 python -m pytest -m gpu tests/test_kernels_gluon.py -k "conditional_rescaling_matches or test_matches_float64_reference or test_fp8_matches_dequantised" -q -p no:cacheprovider > $OUT/s1/gpu_tests.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/s1/gpu_tests.txt
pack s1
# fp8switches at d = 128 only (the device time left): SPEED_D narrowed before the run
mkdir -p $OUT/s2; timeout 85 python -c "
import sys
from flashlab.lab.experiments import fa3 as e
e.SPEED_D = (128,)
e.fp8_switches(sys.argv[1])
" $OUT/s2 > $OUT/s2/log.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/s2/log.txt
pack s2
# the staircase test against two broken kernels (this copy of the tree only); each should fail
K=flashlab/kernels/fa3_fp8.py; cp $K /tmp/fa3_fp8.orig
mkdir -p $OUT/s3
sed -i 's/        rescale = rise > THETA$/        rescale = rise > THETA + 2.0/' $K; grep -c "THETA + 2.0" $K > $OUT/s3/break_gap.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout 40 python -m pytest -m gpu tests/test_kernels_gluon.py -k "conditional_rescaling_matches and 0.75" -q -p no:cacheprovider >> $OUT/s3/break_gap.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/s3/break_gap.txt
cp /tmp/fa3_fp8.orig $K
sed -i 's/    if rescale:$/    if not rescale:/' $K; grep -c "if not rescale:" $K > $OUT/s3/break_branch.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout 40 python -m pytest -m gpu tests/test_kernels_gluon.py -k "conditional_rescaling_matches and 0.75" -q -p no:cacheprovider >> $OUT/s3/break_branch.txt 2>&1; echo "rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/s3/break_branch.txt
cp /tmp/fa3_fp8.orig $K
pack s3
