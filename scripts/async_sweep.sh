#!/bin/bash
# Issue 19 on the device machine: sync vs async (one process, rollout thread) throughput on the GPU,
# then learning over seeds 0-2 (arithmetic_dapo on CPU cores, shapes_nft on the GPU), side by side.
# Needs `unirl` importable by python3. docs/benchmarks.md, "Async lifecycle", records the results.
#   OUT=/tmp/out PHASE=speed|learn bash scripts/async_sweep.sh
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; R=/tmp/r; mkdir -p $R
U='import sys; from unirl.apps.cli import main; sys.exit(main(sys.argv[1:]))'
A="rl.lifecycle=async"
run() { local name=$1; shift; OMP_NUM_THREADS=1 timeout ${T:-500} python3 -c "$U" train "$@" --run-dir $R/$name > $R/$name.log 2>&1; }
if [ "${PHASE:-speed}" = speed ]; then
  # one run at a time: the GPU's timings are not shared with another process
  AR="arithmetic_dapo device=cuda threads=1 sft.steps=300 rl.steps=80 eval.every=0 eval.num_prompts=50"
  SH="shapes_nft device=cuda threads=1 sft.steps=100 rl.steps=16 eval.every=0 eval.num_prompts=8"
  run ar_sync $AR; run ar_async $AR $A; run ar_async_s2 $AR $A rl.buffer.max_staleness=2 rl.buffer.capacity=3
  run sh_sync $SH; run sh_async $SH $A
  { python3 scripts/async_summary.py $R/ar_sync $R/ar_async $R/ar_async_s2
    python3 scripts/async_summary.py $R/sh_sync $R/sh_async; } | tee $OUT/speed.txt
elif [ "$PHASE" = ray ]; then
  # the Ray layout: train and rollout workers in their own processes (one GPU shared: colocate)
  AR="arithmetic_dapo threads=1 sft.steps=300 rl.steps=80 eval.every=0 eval.num_prompts=50"
  GPU="device=cuda layout.kind=ray layout.placement=colocate layout.device=gpu layout.sync=buckets"
  CPU="device=cpu layout.kind=ray layout.placement=separate layout.sync=buckets"
  for u in 2 4; do
    run rg${u}_sync $AR $GPU rl.geometry.num_updates_per_batch=$u
    run rg${u}_async $AR $GPU rl.geometry.num_updates_per_batch=$u $A
  done
  run rc_sync $AR $CPU layout.rollout_workers=2; run rc_async $AR $CPU layout.rollout_workers=2 $A
  { for p in rg2 rg4 rc; do python3 scripts/async_summary.py $R/${p}_sync $R/${p}_async; done; } | tee $OUT/ray.txt
else
  for s in 0 1 2; do
    run ard_sync_s$s arithmetic_dapo seed=$s device=cpu threads=1 &
    run ard_async_s$s arithmetic_dapo seed=$s device=cpu threads=1 $A &
    run ard_asyncoff_s$s arithmetic_dapo seed=$s device=cpu threads=1 $A rl.algorithm.old_logprobs=recompute "rl.algorithm.off_policy={mode: truncate, cap: 2.0}" &
    run nft_sync_s$s shapes_nft seed=$s device=cuda threads=1 &
    run nft_async_s$s shapes_nft seed=$s device=cuda threads=1 $A &
  done
  wait
  python3 scripts/eval_curves.py $R/ard_*/ $R/nft_*/ | tee $OUT/curves.txt
  { python3 scripts/async_summary.py $R/ard_*/; python3 scripts/async_summary.py $R/nft_*/; } | tee $OUT/learn.txt
fi
for f in $R/*.log; do tail -n 2 $f | grep -i -E "error|Traceback" && echo "^ $f"; done
