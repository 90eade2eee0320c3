#!/bin/bash
# Issue 19 on the device machine: the Ray layout (one GPU shared, colocate) sync vs async, then the same
# pair under CUDA MPS. Needs the wheels carried in .whl and .raywhl (../.library/device/README.md).
#   T=125 bash scripts/ray_async_gpu.sh   (T: seconds a run may take); docs/benchmarks.md, "Async lifecycle"
#   G=6 STEPS=50 MPS=0 T=140 bash scripts/ray_async_gpu.sh   (G updates a batch, STEPS RL steps, no MPS pair)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .raywhl/*.whl > /dev/null 2>&1 || { echo "pip failed"; exit 1; }
export PYTHONPATH=/tmp/site:$(ls -d packages/*/src | tr '\n' ':')apps/src
export PATH=/tmp/site/bin:$PATH
nvidia-smi --query-gpu=name --format=csv,noheader; which nvidia-cuda-mps-control
# a warm machine keeps /tmp between calls: start clean, or a run left by an earlier call is resumed
R=/tmp/r; rm -rf $R; mkdir -p $R
U='import sys; from unirl.apps.cli import main; sys.exit(main(sys.argv[1:]))'
run() { local name=$1; shift; OMP_NUM_THREADS=1 timeout ${T:-150} python3 -c "$U" train "$@" --run-dir $R/$name > $R/$name.log 2>&1; echo "$name rc=$? $(date +%T)"; }
AR="arithmetic_dapo threads=1 sft.steps=300 rl.steps=${STEPS:-80} eval.every=0 eval.num_prompts=50 rl.geometry.num_updates_per_batch=${G:-4}"
GPU="device=cuda layout.kind=ray layout.placement=colocate layout.device=gpu layout.sync=buckets"
run g_sync $AR $GPU; run g_async $AR $GPU rl.lifecycle=async
if [ "${MPS:-1}" = 1 ] && nvidia-cuda-mps-control -d; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-log
  sleep 2; run m_sync $AR $GPU; run m_async $AR $GPU rl.lifecycle=async
  echo quit | nvidia-cuda-mps-control
fi
{ python3 scripts/async_summary.py $R/g_sync $R/g_async; python3 scripts/async_summary.py $R/m_sync $R/m_async; } 2>&1 | tee $OUT/ray19.txt
for f in $R/*.log; do tail -n 3 $f | grep -i -E "error|Traceback" && echo "^ $f"; done
cp $R/g_async.log $OUT/ 2>/dev/null; true
