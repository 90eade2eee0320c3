"""The margin of every learning assertion in CI: each test's metric over seeds x torch threads.

    python scripts/learning_margins.py [--seeds 0-4] [--threads 1,2] [--jobs 2] [--out F.jsonl] [PROBE ...]
    python scripts/learning_margins.py --summary F.jsonl [F2.jsonl ...]     # the table of saved runs

A learning test runs one seed at one thread count; on another CPU (SIMD width, thread count,
library build) its float trajectory diverges, and after a few dozen optimizer steps the outcome is
as different as another seed's. So a threshold is set from the distribution over seeds and
thread counts: each (probe, seed, threads) runs in its own process through the test's own code
and overrides (imported from the test module), and the summary prints, per asserted metric,
n / mean / sd / min, the test's threshold and the margin (mean - threshold) / sd. The results
are recorded in docs/benchmarks.md ("Learning-test margins").

PROBE names (default: all): train_diffusion, train_ar (packages/unirl-train/tests/test_learning_*),
e2e_arith, e2e_arith_megatron (the same on the megatron backend), e2e_shapes
(apps/tests/test_e2e_recipes.py: the shared SFT, then NFT and FlowGRPO).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _module(path: str) -> ModuleType:
    name = "lm_" + Path(path).stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


E2E = "apps/tests/test_e2e_recipes.py"
DIFF = "packages/unirl-train/tests/test_learning_diffusion.py"
AR = "packages/unirl-train/tests/test_learning_ar.py"


# ---- probes: (seed, threads, workdir) -> {metric: value}; thresholds: {metric: asserted minimum} ----
def _train_run(run: Any, k: int) -> dict[str, float]:
    """The test's two metrics: eval gain, and the mean train reward of the last k steps over the first k."""
    first, last = sum(run.train_rewards[:k]) / k, sum(run.train_rewards[-k:]) / k
    return {"gain": run.gain, "train_gain": last - first}


def _train_cases(path: str, runner: str, k: int, seed: int, threads: int) -> dict[str, float]:
    """Every CASES entry of a train learning-test module, run by its ``runner`` function."""
    import torch

    torch.set_num_threads(threads)
    mod = _module(path)
    run = getattr(mod, runner)
    return {f"{name}/{m}": v for name in mod.CASES for m, v in _train_run(run(name, seed=seed), k).items()}


def _train_thresholds(path: str) -> dict[str, float]:
    """What the module's tests assert: the eval gain > margin, the train gain > margin / 2."""
    cases = _module(path).CASES.items()
    return {
        f"{name}/{m}": t
        for name, (*_, margin) in cases
        for m, t in (("gain", margin), ("train_gain", margin / 2))
    }


def probe_train_diffusion(seed: int, threads: int, work: Path) -> dict[str, float]:
    out = _train_cases(DIFF, "run_diffusion", 5, seed, threads)
    mod = _module(DIFF)
    for name in mod.NEGATED:
        out[f"{name}_negated/gain"] = mod.run_diffusion(name, seed=seed, negate=True).gain
    return out


def thresholds_train_diffusion() -> dict[str, float]:
    mod = _module(DIFF)
    return _train_thresholds(DIFF) | {f"{name}_negated/gain": mod.CASES[name][2] for name in mod.NEGATED}


def probe_train_ar(seed: int, threads: int, work: Path) -> dict[str, float]:
    return _train_cases(AR, "run_ar", 3, seed, threads)


def thresholds_train_ar() -> dict[str, float]:
    return _train_thresholds(AR)


def _cli(*argv: str) -> None:
    """`unirl ...`, with the overrides of MARGINS_EXTRA (space-separated) appended: a variant to
    measure before a test adopts it (e.g. MARGINS_EXTRA="sft.steps=800")."""
    from unirl.apps import cli

    i = argv.index("--run-dir")
    args = [*argv[:i], *os.environ.get("MARGINS_EXTRA", "").split(), *argv[i:]]
    rc = cli.main(args)
    if rc != 0:
        raise RuntimeError(f"unirl {' '.join(args)} exited {rc}")


def _arith(recipe: str, prefix: str, seed: int, threads: int, work: Path) -> dict[str, float]:
    mod = _module(E2E)
    run = work / prefix
    _cli("train", recipe, *mod.ARITH_SHORT, f"seed={seed}", f"threads={threads}", "--run-dir", str(run))
    return {f"{prefix}/{k}": v for k, v in mod.arith_metrics(run).items()}


def probe_e2e_arith(seed: int, threads: int, work: Path) -> dict[str, float]:
    return _arith("arithmetic_grpo", "arith", seed, threads, work)


def probe_e2e_arith_megatron(seed: int, threads: int, work: Path) -> dict[str, float]:
    return _arith("arithmetic_grpo_megatron", "arith_megatron", seed, threads, work)


def probe_e2e_shapes(seed: int, threads: int, work: Path) -> dict[str, float]:
    mod = _module(E2E)
    sft = work / "sft"
    over = (f"seed={seed}", f"threads={threads}")
    _cli("sft", "shapes_nft", *mod.SHAPES_SHORT, *over, "--run-dir", str(sft))
    out = {f"sft/{k}": v for k, v in mod.sft_metrics(sft).items()}
    for recipe, args in (("shapes_nft", mod.NFT_SHORT), ("shapes_flowgrpo", mod.FLOWGRPO_SHORT)):
        run = work / recipe
        shutil.copytree(sft, run)
        _cli("train", recipe, *mod.SHAPES_SHORT, *args, *over, "--run-dir", str(run))
        out |= {f"{recipe}/{k}": v for k, v in mod.rl_metrics(run).items()}
    return out


def thresholds_e2e() -> dict[str, float]:
    return dict(_module(E2E).THRESHOLDS)


PROBES: dict[str, tuple[Callable[[int, int, Path], dict[str, float]], Callable[[], dict[str, float]]]] = {
    "train_diffusion": (probe_train_diffusion, thresholds_train_diffusion),
    "train_ar": (probe_train_ar, thresholds_train_ar),
    "e2e_arith": (probe_e2e_arith, thresholds_e2e),
    "e2e_arith_megatron": (probe_e2e_arith_megatron, thresholds_e2e),
    "e2e_shapes": (probe_e2e_shapes, thresholds_e2e),
}


# ---- driver ---------------------------------------------------------------------------------------
def _child(probe: str, seed: int, threads: int) -> None:
    """One (probe, seed, threads) in this process; prints one JSON line."""
    import logging

    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory() as d:
        metrics = PROBES[probe][0](seed, threads, Path(d))
    print("RESULT " + json.dumps({"probe": probe, "seed": seed, "threads": threads, "metrics": metrics}))


def _spawn(probe: str, seed: int, threads: int) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, __file__, "--child", probe, str(seed), str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    return {"probe": probe, "seed": seed, "threads": threads, "error": (p.stdout + p.stderr)[-2000:]}


def summary(rows: list[dict[str, Any]]) -> str:
    values: dict[str, list[float]] = {}
    probe_of: dict[str, str] = {}
    for r in rows:
        for k, v in r.get("metrics", {}).items():
            values.setdefault(k, []).append(float(v))
            probe_of[k] = r["probe"]
    thresholds: dict[str, float] = {}
    for p in {r["probe"] for r in rows}:
        thresholds |= PROBES[p][1]()
    lines = [
        "| metric | n | mean | sd | min | max | asserted >= | margin (sd) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k in sorted(values, key=lambda k: (probe_of[k], k)):
        v = values[k]
        mean, sd = statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0
        t = thresholds.get(k)
        margin = "" if t is None else (f"{(mean - t) / sd:.1f}" if sd > 0 else "inf")
        ts = "" if t is None else f"{t:+.3f}"
        lines.append(
            f"| {k} | {len(v)} | {mean:+.3f} | {sd:.3f} | {min(v):+.3f} | {max(v):+.3f} | {ts} | {margin} |"
        )
    errors = [r for r in rows if "error" in r]
    for r in errors:
        lines.append(f"\nERROR {r['probe']} seed={r['seed']} threads={r['threads']}:\n{r['error']}")
    return "\n".join(lines)


def _range(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probes", nargs="*", default=list(PROBES))
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--summary", nargs="+", type=Path, help="print the table of saved JSONL runs and exit")
    a = ap.parse_args()
    if a.summary:
        rows = [json.loads(ln) for f in a.summary for ln in f.read_text().splitlines() if ln.strip()]
        print(summary(rows))
        return 0
    jobs = [(p, s, t) for p in a.probes for s in _range(a.seeds) for t in _range(a.threads)]
    rows: list[dict[str, Any]] = []
    with ThreadPoolExecutor(a.jobs) as pool:
        for r in pool.map(lambda j: _spawn(*j), jobs):
            rows.append(r)
            print(json.dumps(r), flush=True)
            if a.out:
                with a.out.open("a") as f:
                    f.write(json.dumps(r) + "\n")
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
