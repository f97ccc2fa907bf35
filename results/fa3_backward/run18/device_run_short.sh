#!/bin/bash
# change 19 only, for a call with little device time (README, change 19, says how to prepare the
# tree): ab_pack.py first (it also checks that change 19 gives the bits of the kernel as main has
# it, which the float64 tests pass), then the FP8 kernel against the float64 reference, within
# END seconds.
cd "$(dirname "$0")"; D=$PWD; cd ../../..
pack() { (cd $OUT && tar czf $1.tgz $1 && rm -rf $1); }
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
END=${END:-180}; cap() { local l=$(( END - $(el) )); echo $(( $1 < l ? $1 : (l > 5 ? l : 5) )); }
mkdir -p $OUT/s1 && cp $D/device_run_short.sh $D/ab_pack.py $D/device_commit.txt $D/device_tree.diff $OUT/s1/
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat $D/device_commit.txt) + device_tree.diff"; } > $OUT/s1/gpu.txt 2>&1
pack s1
mkdir -p $OUT/ab; AB_D=128 AB_N="${AB_N:-16384 4096}" PYTHONPATH=. timeout $(cap 150) python $D/ab_pack.py $OUT/ab > $OUT/ab/log.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/ab/log.txt; pack ab
mkdir -p $OUT/t1; timeout $(cap 90) python -m pytest -m gpu tests/test_kernels_gluon.py -k "fp8_matches_dequantised or fp8_race_free" -q -p no:cacheprovider > $OUT/t1/gpu_tests.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/t1/gpu_tests.txt; pack t1
