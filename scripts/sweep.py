"""Run recipe variants x seeds side by side and print each run's held-out curve and RL's gain over SFT.

    python scripts/sweep.py shapes_nft --seeds 0-4 --jobs 15 --out /tmp/sw \\
        --variant base= --variant noise30="data.sft_caption_noise=0.3 sft.steps=1600" [--common "device=cuda threads=1"]

Each run is `unirl train RECIPE seed=S <common> <variant overrides> --run-dir OUT/<variant>_s<S>` in its
own process (OMP_NUM_THREADS=1 unless `threads=` says otherwise), at most `--jobs` at a time, each
killed after `--timeout` seconds. The summary (one line per run, then per variant: the gains, how many
reach `--target`, and the wall time) is printed and written to OUT/summary.txt.

`--shared-sft`: variants that differ only after SFT (RL and eval fields) share one SFT per seed: first
`unirl train RECIPE seed=S <common> rl.steps=0 --run-dir OUT/sft_s<S>` (SFT, its evaluation and its
checkpoint), then each variant runs in a copy of that directory, where `unirl train` resumes at RL step 0.
A variant that changes an SFT field is not re-trained: use it only for RL-side variants.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

CLI = "import sys; from unirl.apps.cli import main; sys.exit(main(sys.argv[1:]))"


def seeds_of(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def summarize(run: Path) -> dict[str, float] | None:
    """SFT and final held-out accuracy / pass@k, and the run's wall time, from metrics.jsonl."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    evals = [r for r in rows if r.get("phase") == "eval"]
    if len(evals) < 3:
        return None
    sft, last = evals[1], evals[-1]
    return {
        "sft": 100 * sft["eval_accuracy"],
        "rl": 100 * last["eval_accuracy"],
        "gain": 100 * (last["eval_accuracy"] - sft["eval_accuracy"]),
        "pass_sft": 100 * sft.get("eval_pass_at_k", float("nan")),
        "pass_rl": 100 * last.get("eval_pass_at_k", float("nan")),
        "curve": " ".join(f"{100 * r['eval_accuracy']:.1f}" for r in evals),  # type: ignore[dict-item]
        "wall": rows[-1]["time"] - rows[0]["time"] if "time" in rows[0] else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe")
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--variant", action="append", required=True, help="NAME=OVERRIDES (space separated)")
    ap.add_argument("--common", default="", help="overrides added to every run")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=560.0)
    ap.add_argument("--target", type=float, default=15.0, help="gain (points) a run must reach")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shared-sft", action="store_true", help="one SFT per seed, copied into each variant")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[tuple[str, int, Path, list[str]]] = []
    for spec in args.variant:
        name, _, over = spec.partition("=")
        for s in seeds_of(args.seeds):
            cmd = ["train", args.recipe, f"seed={s}", *shlex.split(args.common), *shlex.split(over)]
            runs.append((name, s, args.out / f"{name}_s{s}", cmd))
    start = time.time()
    if args.shared_sft:
        sft = [
            (
                "sft",
                s,
                args.out / f"sft_s{s}",
                ["train", args.recipe, f"seed={s}", *shlex.split(args.common), "rl.steps=0"],
            )
            for s in seeds_of(args.seeds)
        ]
        launch(sft, args.jobs, args.timeout)
        failed = [rd for _, _, rd, _ in sft if not rd.is_dir()]
        if failed:
            raise SystemExit(
                "shared SFT produced no run directory (see its log): "
                + ", ".join(str(rd.with_suffix(".log")) for rd in failed)
            )
        for _, s, rd, _ in runs:
            shutil.copytree(args.out / f"sft_s{s}", rd, dirs_exist_ok=True)
    launch(runs, args.jobs, args.timeout)
    report(runs, args, start)
    return 0


def launch(runs: list[tuple[str, int, Path, list[str]]], jobs: int, timeout: float) -> None:
    """Each run in its own process, at most ``jobs`` at a time, each killed after ``timeout`` s."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    pending, live = list(runs), []
    while pending or live:
        while pending and len(live) < jobs:
            *_, rd, cmd = pending.pop(0)
            log = open(rd.with_suffix(".log"), "w")  # noqa: SIM115 (closed with the process)
            p = subprocess.Popen(
                [sys.executable, "-c", CLI, *cmd, "--run-dir", str(rd)], stdout=log, stderr=log, env=env
            )
            live.append((p, log, time.time()))
        for item in list(live):
            p, log, t0 = item
            if p.poll() is None and time.time() - t0 > timeout:
                p.kill()
            if p.poll() is not None:
                log.close()
                live.remove(item)
        time.sleep(1.0)


def report(runs: list[tuple[str, int, Path, list[str]]], args: argparse.Namespace, start: float) -> None:
    lines = [f"sweep of {len(runs)} runs in {time.time() - start:.0f} s"]
    by_variant: dict[str, list[dict[str, float]]] = {}
    for name, s, rd, _ in runs:
        r = summarize(rd)
        if r is None:
            lines.append(f"{name} s{s}: no result (see {rd.with_suffix('.log')})")
            continue
        by_variant.setdefault(name, []).append(r)
        lines.append(
            f"{name} s{s}: {r['sft']:.1f} -> {r['rl']:.1f} ({r['gain']:+.1f}) pass@k {r['pass_sft']:.0f} -> "
            f"{r['pass_rl']:.0f}  curve {r['curve']}  {r['wall']:.0f}s"
        )
    for name, rs in by_variant.items():
        gains = [r["gain"] for r in rs]
        drops = [r["pass_sft"] - r["pass_rl"] for r in rs]
        lines.append(
            f"== {name}: gain mean {sum(gains) / len(gains):+.1f} min {min(gains):+.1f} max {max(gains):+.1f}; "
            f"{sum(g >= args.target for g in gains)}/{len(gains)} >= {args.target:+.0f}; "
            f"SFT {min(r['sft'] for r in rs):.1f}-{max(r['sft'] for r in rs):.1f}; "
            f"pass@k drop max {max(drops):.1f}; wall max {max(r['wall'] for r in rs):.0f}s"
        )
    text = "\n".join(lines)
    (args.out / "summary.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
