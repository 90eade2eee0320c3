#!/bin/bash
# Issue 17 on the GPU: the default shapes_nft recipe vs `sft.stop` at two train-split levels, seeds 0-4,
# all 15 runs side by side (docs/benchmarks.md, "Issue 17"). Needs `unirl` importable by python3.
#   OUT=/tmp/out bash scripts/sweep_sft_stop.sh
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
R=/tmp/r; mkdir -p $R; U='import sys; from unirl.apps.cli import main; sys.exit(main(sys.argv[1:]))'
ST='every: 50, min_steps: 400, num_prompts: 32, samples_per_prompt: 2'
for s in 0 1 2 3 4; do
  OMP_NUM_THREADS=1 timeout ${T:-380} python3 -c "$U" train shapes_nft seed=$s device=cuda threads=1 --run-dir $R/base_s$s > $R/base_s$s.log 2>&1 &
  for a in 0.5 0.65; do
    OMP_NUM_THREADS=1 timeout ${T:-380} python3 -c "$U" train shapes_nft seed=$s device=cuda threads=1 sft.steps=2000 "sft.stop={metric: accuracy, at_least: $a, $ST}" --run-dir $R/st${a}_s$s > $R/st${a}_s$s.log 2>&1 &
  done
done
wait
python3 scripts/eval_curves.py $R/base_s* $R/st*_s? > $OUT/curves.txt
for f in $R/*.log; do echo "$f: $(grep -o 'accuracy=[0-9.]* >= .* at step [0-9]*' $f)"; done > $OUT/stops.txt
grep -h "rl vs sft" $R/*/report.md > $OUT/heads.txt
cat $OUT/curves.txt $OUT/stops.txt
cp $R/base_s0/report.md $OUT/report_base_s0.md; cp $R/base_s0/plots/eval.png $OUT/eval_base_s0.png; cp $R/base_s0/plots/reward.png $OUT/reward_base_s0.png
