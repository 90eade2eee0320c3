#!/bin/bash
# RL sweep on the shapes world: SFT seeds, then RL variants (FlowGRPO, or any RECIPE) from each SFT checkpoint, all
# processes in parallel (a GPU machine runs the whole sweep in ~3 minutes; the tiny model needs
# little of the GPU). Needs `unirl` importable by python3 (PYTHONPATH or an installed env).
#   bash scripts/sweep_shapes.sh OUT_DIR [VARIANTS_FILE]   # summary in OUT_DIR/summary.txt
#   SW=/tmp/sweep SWX="sft.steps=2 rl.steps=1" bash scripts/sweep_shapes.sh /tmp/out   # smoke run
# VARIANTS_FILE: one variant a line, `name<TAB>override<TAB>override...` (no file: the variants
# below). SEEDS (default "0 1 2") picks the SFT seeds; T_SFT / T_RL bound each run in seconds;
# RECIPE (default shapes_flowgrpo) is the recipe name or YAML path; EV the evaluation overrides;
# SFT_STEPS (e.g. "800 1100") runs one SFT per seed and step count, and every variant from each.
# Summary columns: eval accuracy/reward per stage (init, sft, rl); RL train reward first -> last 5.
O=${1:-/tmp/out}; S=${SW:-/tmp/sw}; X=${SWX:-}; R=${RECIPE:-shapes_flowgrpo}; mkdir -p $S $O
run() { local name=$1; shift; timeout ${T:-200} python3 -c 'import sys; from unirl.apps.cli import main; sys.exit(main(sys.argv[1:]))' "$@" > $S/$name.log 2>&1; echo "$name rc=$? $(date +%T)"; }
EV=${EV:-eval.samples_per_prompt=8}
CORR='reward.scorers=[{name: geneval, weight: 1.0, scorer: {kind: shapes, reward: correct, check_shape: false}}]'
SEEDS=${SEEDS:-0 1 2}
# CKPTS: "seed" (the recipe's SFT) or "seed:steps" (SFT_STEPS), one SFT run each.
CKPTS=(); for s in $SEEDS; do if [[ -n "${SFT_STEPS:-}" ]]; then for n in $SFT_STEPS; do CKPTS+=("$s:$n"); done; else CKPTS+=("$s"); fi; done
sft_args() { [[ $1 == *:* ]] && echo "seed=${1%%:*} sft.steps=${1##*:}" || echo "seed=$1"; }
rm -rf "$S"; mkdir -p "$S"; T=${T_SFT:-120}
for c in "${CKPTS[@]}"; do run sft${c/:/_} sft $R $(sft_args $c) threads=1 $EV $X --run-dir $S/sft${c/:/_} & done; wait; T=${T_RL:-170}
variant() {  # name checkpoint overrides...
  local v=$1 c=$2 n=$1-${2/:/_}; shift 2; cp -r $S/sft${c/:/_} $S/$n; run $n train $R $(sft_args $c) threads=1 $EV $X "$@" --run-dir $S/$n
}
for s in "${CKPTS[@]}"; do
  if [[ -n "${2:-}" ]]; then
    while IFS=$'\t' read -r -a v; do [[ ${#v[@]} -gt 0 && ${v[0]} != \#* ]] && variant "${v[@]:0:1}" $s "${v[@]:1}" & done < "$2"
  else
    variant base $s &
    variant lr3 $s rl.lr=3e-4 &
    variant corr3 $s rl.lr=3e-4 "$CORR" &
    variant sde6 $s rl.lr=3e-4 'sampling.sde_schedule={kind: k_of_window, k: 6, start: 0.0, end: 1.0}' &
    variant long $s rl.lr=1e-4 rl.steps=150 &
  fi
done; wait
python3 - "$S" <<'PY' | tee $O/summary.txt
import json, pathlib, sys
for d in sorted(pathlib.Path(sys.argv[1]).iterdir()):
    if not d.is_dir():
        continue
    try:
        rows = [json.loads(l) for l in open(d / "metrics.jsonl")]
    except OSError:
        print(d.name, "NO METRICS"); continue
    ev = [f"{r['eval_accuracy']:.3f}/{r['eval_reward']:.3f}" for r in rows if r.get("phase") == "eval"]
    ev = ev[:2] + ["|"] + ev[2:] if len(ev) > 2 else ev  # init, sft | RL evals (eval.every, then the last)
    rl = [r.get("reward_mean", float("nan")) for r in rows if r.get("phase") == "rl"]
    tr = f"rl_reward {sum(rl[:5])/max(len(rl[:5]),1):.3f}->{sum(rl[-5:])/max(len(rl[-5:]),1):.3f} ({len(rl)} steps)" if rl else ""
    print(d.name, " ".join(ev), tr)
PY
for f in $S/*.log; do if ! grep -q "report:" $f; then echo "== $f"; tail -4 $f; fi; done > $O/failed.txt 2>&1
head -c 3000 $O/failed.txt
