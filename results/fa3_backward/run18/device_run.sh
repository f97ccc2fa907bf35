#!/bin/bash
# device call of session 2026-12-07 (H100 or H200): change 19 (P packed to e4m3 where the P V
# wgmma reads it) and change 18 (conditional rescaling), in the order they matter, each step
# within the call's END seconds: the FP8 kernel against the float64 reference; ab_pack.py
# (change 19 against fa3_fp8_before.py, the kernel as main has it, one process, rotated rounds);
# the other FP8 GPU tests and the time stamps; fp8switches at d = 128 (change 18's theta
# contenders); the staircase test against two broken kernels.
cd "$(dirname "$0")"; D=$PWD; cd ../../..
pack() { (cd $OUT && tar czf $1.tgz $1 && rm -rf $1); }   # each step's files in one archive, as soon as it ends
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
END=${END:-470}; cap() { local l=$(( END - $(el) )); echo $(( $1 < l ? $1 : (l > 5 ? l : 5) )); }  # a step's seconds, within the call's
mkdir -p $OUT/s1 && cp $D/device_run.sh $D/ab_pack.py $D/device_commit.txt $D/device_tree.diff $OUT/s1/
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat $D/device_commit.txt) + device_tree.diff"; } > $OUT/s1/gpu.txt 2>&1
pack s1
mkdir -p $OUT/t1; timeout $(cap 90) python -m pytest -m gpu tests/test_kernels_gluon.py -k "fp8_matches_dequantised or fp8_race_free" -q -p no:cacheprovider > $OUT/t1/gpu_tests.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/t1/gpu_tests.txt; pack t1
fp8sw() {  # $1 step name, $2 seconds, $3 package root; d = 128 only
  mkdir -p $OUT/$1; (cd $3 && timeout $(cap $2) python -c "
import sys
import flashlab.lab.experiments as x
from flashlab.lab.experiments import fa3 as e
x.COMMAND = 'python -m flashlab.lab.experiments fp8switches, SPEED_D = (128,)'
e.SPEED_D = (128,)
e.fp8_switches(sys.argv[1])
" $OUT/$1) > $OUT/$1/log.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/$1/log.txt; pack $1; }
mkdir -p $OUT/ab; PYTHONPATH=. timeout $(cap 140) python $D/ab_pack.py $OUT/ab > $OUT/ab/log.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/ab/log.txt; pack ab
mkdir -p $OUT/t2; timeout $(cap 170) python -m pytest -m gpu tests/test_kernels_gluon.py -k "(fp8 or time_stamps) and not fp8_matches_dequantised and not fp8_race_free" -q -p no:cacheprovider > $OUT/t2/gpu_tests.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/t2/gpu_tests.txt; pack t2
fp8sw sw_new 110 $PWD
# the staircase test against two broken kernels (this copy of the tree only); each should fail
K=flashlab/kernels/fa3_fp8.py; cp $K /tmp/fa3_fp8.orig; mkdir -p $OUT/breaks
sed -i 's/        rescale = rise > THETA$/        rescale = rise > THETA + 2.0/' $K; grep -c "THETA + 2.0" $K > $OUT/breaks/break_gap.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout $(cap 45) python -m pytest -m gpu tests/test_kernels_gluon.py -k "conditional_rescaling_matches and 0.75" -q -x -p no:cacheprovider >> $OUT/breaks/break_gap.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/breaks/break_gap.txt
cp /tmp/fa3_fp8.orig $K
sed -i 's/    if rescale:$/    if not rescale:/' $K; grep -c "if not rescale:" $K > $OUT/breaks/break_branch.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout $(cap 45) python -m pytest -m gpu tests/test_kernels_gluon.py -k "conditional_rescaling_matches and 0.75" -q -x -p no:cacheprovider >> $OUT/breaks/break_branch.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/breaks/break_branch.txt
cp /tmp/fa3_fp8.orig $K; pack breaks
