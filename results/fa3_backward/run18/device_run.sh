#!/bin/bash
# run 18's and run 19's device calls: STEPS names the steps a call takes, in order, each within the call's END
# seconds (default 470), each packed into $OUT/NAME.tgz as soon as it ends (a call returns at most
# 8 files: at most 7 steps a call). Steps:
#   ab      change 19 against main's FP8 kernel with change19.patch taken back: the same bits,
#           then the times, one process, rotated rounds (ab_pack.py; AB_D=128 for d = 128 only)
#   abt     run 19: changes 19, 20 and 21 against the kernels without them (../run19/ab_tree.py;
#           20 and 21 are applied to this copy for the step and taken back after it)
#   tb      the Gluon forward (bf16, fp16, FP8; d = 64, 128) against the float64 reference, and races
#   t1      the FP8 kernel against the float64 reference, and its race check
#   t256    the Gluon forward at d = 256 against the float64 reference, and its race check
#   s256    its speed beside forward.py and SDPA (speed256.py)
#   ncu     Nsight Compute's stall samples per SASS instruction of both FP8 kernels (ncu_fp8.py)
#   t2      the other FP8 GPU tests and the time stamps
#   fp8sw   fp8switches at d = 128: cuDNN, bf16, FP8 with ping-pong off (default) and on, and run 21's
#           software-exp contenders
#   broken  change 18's staircase test against two broken kernels (both should fail)
#   cr      run 20: the conditional-rescaling tests, held to the float64 emulation of the kernel
#   tauto   run 20: "auto" and the Gluon forward's refusals (test_kernels.py), verbose, with durations
#   ts8     the FP8 kernel's time stamps: their GPU test, then one stamped tile (fp8timeline)
#   ts8pp   the same stamped tile with ping-pong on (fa3_fp8.SWITCHES[128] = (True, True))
#   tpoly   run 21: the FP8 kernel with software exp2 on a quarter and on all of P (GPU tests)
#   tree    run 22: change 22 (the FP8 row max as a tree) against the kernel without it (../run22)
#   tree2   run 23: change 22 and the chain, ping-pong off and on (../run23/ab_tree_pp.py), then one
#           stamped tile of the kernel with change 22 (fp8timeline)
#   tree3   run 24: change 23 (the tree with adjacent columns first) against the chain
#           (../run22/ab_tree_max.py with AB_PATCH), then one stamped tile of it (fp8timeline)
#   skip    run 26: change 24 (a warp whose maxima did not move skips O's rescale): the FP8 GPU
#           tests with it, then it against main (../run22/ab_tree_max.py with AB_PATCH)
#   psmem   run 26: change 25 (P through shared memory at Bc = 256) against the kernel at Bc = 128, K
#           one descale a head for both, beside the bench's FP8 inputs (../run26/ab_psmem.py)
#   tps     run 27: the FP8 GPU tests (float64 reference, races, conditional rescaling) with
#           fa3_fp8.P_SMEM[128] = True, so that the d = 128 cases run change 25, then change 25's
#           and change 26's own GPU tests (p_smem=True, consumers=3)
#   psmem64 run 28: psmem2 at d = 64 (P_SMEM[64] is still off)
#   tfp8    every FP8 GPU test at the defaults (three consumers at d = 64 from run 28)
#   c27     change 27 (two P tiles a consumer at d = 128, ../run29/change27.patch): the FP8 GPU
#           tests with it, then it against main with a bits check (../run22/ab_tree_max.py)
#   ts8ps   run 30: the FP8 stamp tests (both builds), then one stamped tile of the 256-key default
#           (fp8timeline256)
#   tlmma   run 30: change 28 (l summed by the tensor cores, fa3_fp8.forward(l_mma=True)): its GPU
#           tests, then the FP8 tests at the defaults it must not disturb
#   lmma    run 30: change 28 against d = 128's default build (../run30/ab_lmma.py); lmma64 at d = 64
#   psmem2  run 27: changes 25 and 26 with the bench's FP8 inputs (K a descale per 128 keys) against
#           main (../run27/ab_psmem_bench.py)
#   ncu23   run 25: Nsight Compute's stall samples per SASS instruction of the FP8 kernel with change
#           23 and without it (../run24/ncu_tree.py)
#   variants  forward + backward against cuDNN, the issue's shapes (fa3_backward_variants, 3 rounds)
#   b128, b64  the kernel bench chapters 5 and 9 read, with flashlab_fa3 and the FP8 forward
# NOTE (optional) goes into gpu.txt, e.g. a patch applied to the tree before the script ran.
# Before a call: git rev-parse HEAD > device_commit.txt; git diff > device_tree.diff (in this
# folder). An unknown step name stops the call before anything runs.
cd "$(dirname "$0")"; D=$PWD; cd ../../..
K=flashlab/kernels/fa3_fp8.py
GLUON="python -m pytest -m gpu tests/test_kernels_gluon.py -q -p no:cacheprovider"
BENCH="python -m flashlab.lab.bench --suite kernels --impls flashlab flashlab_fa3 sdpa_flash sdpa_cudnn naive flashlab_gluon_fp8"
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
END=${END:-470}; cap() { local l=$(( END - $(el) )); echo $(( $1 < l ? $1 : (l > 5 ? l : 5) )); }
pack() { (cd $OUT && tar czf $1.tgz $1 && rm -rf $1); }
patched() {  # patched "PATCH..." COMMAND...: COMMAND with the patches applied to this copy, taken back after
  local p=$1; shift; git apply $p && "$@"; git apply -R $p; }
step() {  # step NAME SECONDS COMMAND...: COMMAND within the call's time, its output in $OUT/NAME/log.txt
  local name=$1 secs=$2; shift 2; mkdir -p $OUT/$name
  timeout $(cap $secs) "$@" >> $OUT/$name/log.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/$name/log.txt; pack $name; }
broken() {  # broken SED...: the staircase test against the kernel each SED breaks (this copy only)
  mkdir -p $OUT/broken; cp $K /tmp/fa3_fp8.orig
  for edit in "$@"; do
    sed -i "$edit" $K; cmp -s $K /tmp/fa3_fp8.orig && echo "the edit $edit matched nothing" >> $OUT/broken/log.txt
    echo "== $edit" >> $OUT/broken/log.txt
    timeout $(cap 45) env TRITON_CACHE_DIR=$(mktemp -d) $GLUON -x -k "conditional_rescaling_matches and 0.75" \
      >> $OUT/broken/log.txt 2>&1; echo "rc=$? $(el)s" >> $OUT/broken/log.txt; cp /tmp/fa3_fp8.orig $K
  done; pack broken; }
KNOWN="ab abt tb t1 t256 s256 ncu t2 fp8sw broken cr tauto ts8 ts8pp tpoly tree tree2 tree3 ncu23 skip psmem tps psmem2 psmem64 tfp8 c27 ts8ps tlmma lmma lmma64 variants b128 b64"
for s in $STEPS; do [[ " $KNOWN " == *" $s "* ]] || { echo "unknown step $s; steps: $KNOWN" >&2; exit 2; }; done
mkdir -p $OUT/s1 && cp $D/*.sh $D/*.py $D/device_commit.txt $D/device_tree.diff $OUT/s1/
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch,triton;print(torch.__version__,triton.__version__)"; date -u; echo "commit $(cat $D/device_commit.txt) + device_tree.diff; STEPS=$STEPS END=$END AB_D=$AB_D NOTE=$NOTE"; } > $OUT/s1/gpu.txt 2>&1
pack s1
for s in $STEPS; do case $s in
  ab) step ab 140 env PYTHONPATH=. python $D/ab_pack.py $OUT/ab ;;
  abt) P="$D/../run19/change20.patch $D/../run19/change21.patch"
    patched "$P" step abt 170 env PYTHONPATH=. python $D/../run19/ab_tree.py $OUT/abt ;;
  tb) step tb 130 $GLUON -k "(matches_float64 or race_free or fp8_matches_dequantised) and not 256" ;;
  t1) step t1 90 $GLUON -k "fp8_matches_dequantised or fp8_race_free" ;;
  t256) step t256 200 bash -c "$GLUON -k \"(matches_float64 or race_free) and 256 and not fp8\"; a=\$?
      python -m pytest tests/test_kernels.py -q -p no:cacheprovider \
        -k \"(gpu_gluon_forward and 256) or gpu_auto or gpu_gluon_refuses\"; exit \$(( a | \$? ))" ;;
  s256) step s256 90 env PYTHONPATH=. python $D/speed256.py $OUT/s256 ;;
  ncu) step ncu 150 bash -c "cd $D && ncu --clock-control none -k regex:_fa3_fp8_kernel --launch-skip 2 -c 2 \
      --section WarpStateStats --section SourceCounters --section SchedulerStats --section ComputeWorkloadAnalysis \
      -o $OUT/ncu/fp8 env PYTHONPATH=$PWD python ncu_fp8.py && ncu -i $OUT/ncu/fp8.ncu-rep --page details > $OUT/ncu/details.txt \
      && ncu -i $OUT/ncu/fp8.ncu-rep --page source --csv --print-source sass > $OUT/ncu/source_sass.csv" ;;
  t2) step t2 170 $GLUON -k "(fp8 or time_stamps) and not fp8_matches_dequantised and not fp8_race_free" ;;
  fp8sw) step fp8sw 200 python -c "
import sys
import flashlab.lab.experiments as x
from flashlab.lab.experiments import fa3 as e
x.COMMAND = 'python -m flashlab.lab.experiments fp8switches, SPEED_D = (128,), contenders as device_run.sh step fp8sw keeps'
e.SPEED_D = (128,)
every = e.fp8_switch_contenders
keep = ('cudnn', 'bf16_default', 'fp8_no_pingpong_overlap', 'fp8_pingpong_overlap')
e.fp8_switch_contenders = lambda *a: {k: f for k, f in every(*a).items() if k in keep or '_poly' in k}
e.fp8_switches(sys.argv[1])
" $OUT/fp8sw ;;
  cr) step cr 150 $GLUON -v -k "conditional_rescaling" ;;
  tauto) step tauto 320 python -m pytest tests/test_kernels.py -v -p no:cacheprovider --durations=0 \
      -k "gpu_auto or gpu_gluon_refuses" ;;
  ts8) step ts8 150 bash -c "$GLUON -v -k fp8_time_stamps_take_every_phase; a=\$?
      python -m flashlab.lab.experiments fp8timeline --out $OUT/ts8; exit \$(( a | \$? ))" ;;
  ts8pp) step ts8pp 90 python -c "
import sys
from pathlib import Path
import flashlab.lab.experiments as x
from flashlab.kernels import fa3_fp8
from flashlab.lab.experiments import fa3_timeline
x.COMMAND = 'python -m flashlab.lab.experiments fp8timeline, fa3_fp8.SWITCHES[128] = (True, True)'
fa3_fp8.SWITCHES[128] = (True, True)
fa3_timeline.run_fp8(Path(sys.argv[1]))
" $OUT/ts8pp ;;
  tpoly) step tpoly 150 $GLUON -v -k software_exp ;;
  tree) P=$D/../run22/change22.patch
    patched $P step tree 230 env PYTHONPATH=. python $D/../run22/ab_tree_max.py $OUT/tree ;;
  tree2) P=$D/../run22/change22.patch
    patched $P step tree2 260 bash -c "PYTHONPATH=. python $D/../run23/ab_tree_pp.py $OUT/tree2; a=\$?
      python -m flashlab.lab.experiments fp8timeline --out $OUT/tree2/ts; exit \$(( a | \$? ))" ;;
  tree3) P=$D/../run24/change23.patch
    patched $P step tree3 200 bash -c "AB_PATCH=$P AB_NAME=ab_tree23 PYTHONPATH=. python $D/../run22/ab_tree_max.py \
      $OUT/tree3; a=\$?; python -m flashlab.lab.experiments fp8timeline --out $OUT/tree3/ts; exit \$(( a | \$? ))" ;;
  skip) P=$D/../run26/change24.patch
    patched $P step skip 300 bash -c "$GLUON -k \"fp8_matches_dequantised or fp8_race_free or conditional_rescaling\"; a=\$?
      AB_PATCH=$P AB_NAME=ab_skip AB_WITHOUT=fp8_main PYTHONPATH=. python $D/../run22/ab_tree_max.py $OUT/skip
      exit \$(( a | \$? ))" ;;
  psmem) step psmem 220 env PYTHONPATH=. python $D/../run26/ab_psmem.py $OUT/psmem ;;
  tps) step tps 220 python -c "
import sys, pytest
from flashlab.kernels import fa3_fp8
fa3_fp8.P_SMEM[128] = True
sys.exit(pytest.main(['-m', 'gpu', 'tests/test_kernels_gluon.py', '-q', '-p', 'no:cacheprovider',
                      '-k', 'fp8_matches_dequantised or fp8_race_free or conditional_rescaling'
                      ' or shared_memory_matches or three_consumers_match']))" ;;
  psmem2) step psmem2 340 env PYTHONPATH=. python $D/../run27/ab_psmem_bench.py $OUT/psmem2 ;;
  tfp8) step tfp8 300 $GLUON -k fp8 ;;
  c27) P=$D/../run29/change27.patch
    patched $P step c27 330 bash -c "$GLUON -k \"fp8 and (matches_dequantised or race_free or conditional_rescaling or shared_memory_matches or heads_apart or rmse_below or every_phase)\"; a=\$?
      AB_PATCH=$P AB_NAME=ab_double AB_WITHOUT=fp8_main PYTHONPATH=. python $D/../run22/ab_tree_max.py $OUT/c27
      exit \$(( a | \$? ))" ;;
  ts8ps) step ts8ps 150 bash -c "$GLUON -v -k fp8_time_stamps_take_every_phase; a=\$?
      python -m flashlab.lab.experiments fp8timeline256 --out $OUT/ts8ps; exit \$(( a | \$? ))" ;;
  tlmma) step tlmma 380 $GLUON -k "fp8 and (row_sums_on_the_tensor_cores or matches_dequantised or race_free)" ;;
  lmma) step lmma 150 env PYTHONPATH=. python $D/../run30/ab_lmma.py $OUT/lmma ;;
  lmma64) step lmma64 120 env AB_D=64 PYTHONPATH=. python $D/../run30/ab_lmma.py $OUT/lmma64 ;;
  psmem64) step psmem64 120 env AB_D=64 PYTHONPATH=. python $D/../run27/ab_psmem_bench.py $OUT/psmem64 ;;
  ncu23) P=$D/../run24/change23.patch
    patched $P step ncu23 200 bash -c "cd $D/../run24 && AB_PATCH=$P ncu --clock-control none -k regex:_fa3_fp8_kernel \
      --launch-skip 2 -c 2 --section WarpStateStats --section SourceCounters --section SchedulerStats \
      --section ComputeWorkloadAnalysis -o $OUT/ncu23/fp8 env PYTHONPATH=$PWD python ncu_tree.py \
      && ncu -i $OUT/ncu23/fp8.ncu-rep --page details > $OUT/ncu23/details.txt \
      && ncu -i $OUT/ncu23/fp8.ncu-rep --page source --csv --print-source sass | gzip > $OUT/ncu23/source_sass.csv.gz" ;;
  broken) broken 's/        rescale = rise > THETA$/        rescale = rise > THETA + 2.0/' 's/    if rescale:$/    if not rescale:/' ;;
  variants) mkdir -p variants/cur && cp -r flashlab variants/cur/
    step variants 240 python -m flashlab.lab.experiments.fa3_backward_variants variants/cur --rounds 3 --out $OUT/variants ;;
  b128) step b128 300 $BENCH --ds 128 --out $OUT/b128 ;;
  b64) step b64 300 $BENCH --ds 64 --out $OUT/b64 ;;
esac; done
