#!/bin/bash
# one device call for change 19 (P packed to e4m3 where the P V wgmma reads it) and change 18
# (conditional rescaling), in the order they matter, each step within the call's END seconds
# (default 470): ab_pack.py (change 19 against fa3_fp8_before.py, the kernel as main has it:
# the same bits, then the times, in one process, rotated rounds; AB_D=128 for d = 128 only);
# Nsight Compute's stall samples per SASS instruction of both FP8 kernels (ncu_fp8.py);
# the FP8 kernel against the float64 reference and the race check; the other FP8 GPU tests and
# the time stamps; fp8switches at d = 128 (change 18's theta contenders); the staircase test
# against two broken kernels. A short call: END=180 AB_D=128 bash device_run.sh
cd "$(dirname "$0")"; D=$PWD; cd ../../..
K=flashlab/kernels/fa3_fp8.py
GLUON="python -m pytest -m gpu tests/test_kernels_gluon.py -q -p no:cacheprovider"
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
END=${END:-470}; cap() { local l=$(( END - $(el) )); echo $(( $1 < l ? $1 : (l > 5 ? l : 5) )); }
pack() { (cd $OUT && tar czf $1.tgz $1 && rm -rf $1); }   # a step's files in one archive, as soon as it ends
step() {  # step NAME SECONDS COMMAND...: COMMAND within the call's time, its output in $OUT/NAME/log.txt
  local name=$1 secs=$2; shift 2; mkdir -p $OUT/$name
  timeout $(cap $secs) "$@" >> $OUT/$name/log.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/$name/log.txt; pack $name; }
broken() {  # broken NAME SED: the staircase test against the kernel SED breaks (this copy only); it should fail
  cp $K /tmp/fa3_fp8.orig; sed -i "$2" $K; mkdir -p $OUT/$1
  cmp -s $K /tmp/fa3_fp8.orig && echo "the edit $2 matched nothing" > $OUT/$1/log.txt
  step $1 45 env TRITON_CACHE_DIR=$(mktemp -d) $GLUON -x -k "conditional_rescaling_matches and 0.75"
  cp /tmp/fa3_fp8.orig $K; }
mkdir -p $OUT/s1 && cp $D/device_run.sh $D/ab_pack.py $D/ncu_fp8.py $D/device_commit.txt $D/device_tree.diff $OUT/s1/
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat $D/device_commit.txt) + device_tree.diff"; } > $OUT/s1/gpu.txt 2>&1
pack s1
step ab 140 env PYTHONPATH=. python $D/ab_pack.py $OUT/ab
step ncu 150 bash -c "cd $D && ncu --clock-control none -k regex:_fa3_fp8_kernel --launch-skip 2 -c 2 \
  --section WarpStateStats --section SourceCounters --section SchedulerStats --section ComputeWorkloadAnalysis \
  -o $OUT/ncu/fp8 env PYTHONPATH=$PWD python ncu_fp8.py && ncu -i $OUT/ncu/fp8.ncu-rep --page details > $OUT/ncu/details.txt \
  && ncu -i $OUT/ncu/fp8.ncu-rep --page source --csv --print-source sass > $OUT/ncu/source_sass.csv"
step t1 90 $GLUON -k "fp8_matches_dequantised or fp8_race_free"
step t2 170 $GLUON -k "(fp8 or time_stamps) and not fp8_matches_dequantised and not fp8_race_free"
step fp8sw 110 python -c "
import sys
import flashlab.lab.experiments as x
from flashlab.lab.experiments import fa3 as e
x.COMMAND = 'python -m flashlab.lab.experiments fp8switches, SPEED_D = (128,)'
e.SPEED_D = (128,)
e.fp8_switches(sys.argv[1])
" $OUT/fp8sw
broken break_gap 's/        rescale = rise > THETA$/        rescale = rise > THETA + 2.0/'
broken break_branch 's/    if rescale:$/    if not rescale:/'
