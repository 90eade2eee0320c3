#!/bin/bash
# Issue 19: sync vs async throughput with a vLLM engine on one process (docs/benchmarks.md,
# "Async lifecycle"). Runs in the vLLM test environment (`nox -s tests_vllm` builds it):
#   PY=.nox/tests_vllm/bin/python OUT=/tmp/vb bash scripts/async_vllm_bench.sh
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\n' ':')$PWD/apps/src
PY=${PY:-.nox/tests_vllm/bin/python}; R=${OUT:-/tmp/vb}; rm -rf "$R"; mkdir -p "$R"
U='import sys; from unirl.apps.cli import main; sys.exit(main(sys.argv[1:]))'
TINY="model.tiny.hidden_size=64 model.tiny.num_heads=2 model.tiny.num_kv_heads=1"   # vLLM CPU: head_dim >= 32
O="train arithmetic_grpo $TINY rollout.engine.kind=vllm rollout.engine.max_num_seqs=64 sft.steps=100 sft.batch_size=32"
O="$O rl.steps=24 rl.prompts_per_step=8 rl.samples_per_prompt=8 rl.geometry.micro_batch_size=16 eval.num_prompts=16 eval.every=0 threads=1"
for g in 1 4; do
  $PY -c "$U" $O rl.geometry.num_updates_per_batch=$g --run-dir $R/sync_u$g > $R/sync_u$g.log 2>&1; echo "sync u$g rc=$?"
  $PY -c "$U" $O rl.geometry.num_updates_per_batch=$g rl.lifecycle=async --run-dir $R/async_u$g > $R/async_u$g.log 2>&1; echo "async u$g rc=$?"
done
for g in 1 4; do $PY scripts/async_summary.py $R/sync_u$g $R/async_u$g; done
