#!/bin/bash
# device call on an H200 (session 2026-12-07): the full kernel bench that chapters 5 and 9 read,
# with flashlab_fa3 (the Gluon forward + FA3 backward) and the FP8 forward, and the same run's
# ceilings; one bench per head dimension, each packed as soon as it ends. Before the call:
# git rev-parse HEAD > results/fa3_backward/run18/device_commit.txt
cd "$(dirname "$0")"; D=$PWD; cd ../../..
pack() { (cd $OUT && tar czf $1.tgz $1 && rm -rf $1); }
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
mkdir -p $OUT/s1 && cp $D/device_run_h200_bench.sh $D/device_commit.txt $OUT/s1/
[ -f $D/device_tree.diff ] && cp $D/device_tree.diff $OUT/s1/   # meant for main as it is: the diff should be empty
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat $D/device_commit.txt)"; } > $OUT/s1/gpu.txt 2>&1
pack s1
for d in 128 64; do
  mkdir -p $OUT/b$d; timeout $(( d == 128 ? 300 : 580 - $(el) )) python -m flashlab.lab.bench --suite kernels --impls flashlab flashlab_fa3 sdpa_flash sdpa_cudnn naive flashlab_gluon_fp8 --ds $d --out $OUT/b$d > $OUT/b$d/log.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/b$d/log.txt; pack b$d
done
