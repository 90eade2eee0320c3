"""Seeded kill -9 sweep of a tiny CPU run: kill at N points, resume, compare with the whole run.

One uninterrupted run of the recipe traces every fault point it passes (``unirl.types.faults``:
SFT steps, rollout, reward, train steps, inside checkpoint writes). N points are drawn from that
list with a seed, round-robin over the kinds of point so every kind is hit. For each point a run
is started in a fresh directory with ``UNIRL_TEST_KILL_AT=<point>``, must die of SIGKILL there,
and is then started again without it (the resume). It survives when

- its final checkpoint is bit-identical to the whole run's: every tensor of ``state.pt`` (weights,
  optimizer, EMA / reference, scheduler) and of each train rank's ``rng-<rank>.pt``, and every
  algorithm generator file (``files/rng-<name>-algorithm[-<rank>].bin``);
- ``extra.json`` is the same but for wall times (cursor, metrics row count, global RNGs, evals);
- every SFT and RL step is logged exactly once and ``metrics.jsonl`` is the whole run's but for
  wall times: each step's batch is a pure function of (seed, step), so a step logged once with
  the whole run's loss means its Samples were trained once, none skipped. The number of Samples
  trained is counted from the step rows (steps x batch) and printed.

A partially written checkpoint is never picked: the points inside ``save_checkpoint`` kill after
all files are written (not renamed) and between moving the old one aside and renaming the new
one, and the resume must still end bit-identical.

    .venv/bin/python scripts/kill_sweep.py --preset ar --points 20        # real `python -m unirl.apps.cli`
    .venv/bin/python scripts/kill_sweep.py --preset shapes_nft --points 20
    .venv/bin/python scripts/kill_sweep.py --preset ar --points 4 --launcher fork   # forked children: fast
    .venv/bin/python scripts/kill_sweep.py --preset ar_ray --points 20   # Ray layout: 2 train ranks + 1 rollout
    .venv/bin/python scripts/kill_sweep.py --preset shapes_pe --points 10    # prompt enhancer: two stacks
    .venv/bin/python scripts/kill_sweep.py --preset shapes_unified --points 10

On the Ray layout (``*_ray``) a point inside a worker (the checkpoint writes run on every train
rank) kills the driver with the worker (``unirl.types.faults.kill_together``) and the local Ray
cluster dies with its driver: the whole job is killed, as when a node goes.

``--launcher spawn`` (default) runs ``python -m unirl.apps.cli train`` in a subprocess; ``fork``
forks this process (imports already done) and calls ``unirl.apps.cli.main`` in the child; both
end in a real SIGKILL of the run's process. Prints ``kill points survived: S / N``; exit 1 if S < N.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULT_ENV = "UNIRL_TEST_KILL_AT"  # unirl.types.faults (not imported: the spawn launcher needs no torch here)
TRACE_ENV = "UNIRL_TEST_FAULT_TRACE"
_AR = ["device=cpu", "threads=1", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
       "model.tiny.intermediate_size=64", "sft.steps=4", "sft.batch_size=8", "sft.checkpoint_every=2",
       "rl.steps=4", "rl.prompts_per_step=2", "rl.samples_per_prompt=4", "rl.geometry.micro_batch_size=8",
       "eval.num_prompts=4", "eval.grid_size=0", "eval.every=0", "checkpoint_every=1"]  # fmt: skip
_SHAPES = ["device=cpu", "threads=1", "sft.steps=6", "sft.batch_size=8", "sft.checkpoint_every=3",
           "rl.steps=4", "rl.prompts_per_step=2", "rl.samples_per_prompt=4", "rl.geometry.micro_batch_size=8",
           "rl.geometry.mini_batch_size=8", "eval.num_prompts=2", "eval.samples_per_prompt=1",
           "eval.grid_size=0", "eval.every=0", "checkpoint_every=1"]  # fmt: skip
# the Ray layout: a driver, 2 data-parallel FSDP2 train ranks (gloo) and 1 rollout worker on CPU;
# the RL geometry is per rank (4 of the 8 Parts)
_RAY = ["layout.kind=ray", "layout.placement=colocate", "layout.train_workers=2", "layout.rollout_workers=1",
        "layout.cpus_per_device=0.5", "layout.verify_weights=true", "rl.geometry.micro_batch_size=4"]  # fmt: skip
# the prompt enhancer with both stacks trained in RL (GRPO, FlowGRPO), the models of test_pe_trainer;
# a dense reward, so an untrained pair's samples differ and RL moves the weights
_PE = ["device=cpu", "threads=1", "ar.model.tiny.hidden_size=32", "ar.model.tiny.intermediate_size=64",
       "ar.model.tiny.num_layers=1", "ar.sampling.max_new_tokens=8", "diffusion.model.unet_channels=8",
       "diffusion.model.unet_text_layers=1", "diffusion.sampling.num_steps=4", "reward.scorers.0.scorer.reward=score",
       "diffusion.sft.steps=4", "diffusion.sft.batch_size=8", "diffusion.sft.checkpoint_every=2", "ar.sft.steps=4",
       "ar.sft.batch_size=8", "ar.sft.checkpoint_every=2", "rl.steps=4", "rl.prompts_per_step=2",
       "rl.samples_per_prompt=4", "rl.images_per_rewrite=1", "ar.rl.geometry.micro_batch_size=8",
       "diffusion.rl.algorithm.kind=flow_grpo", "diffusion.rl.geometry.micro_batch_size=8", "eval.num_prompts=2",
       "eval.samples_per_prompt=1", "eval.grid_size=0", "eval.every=0", "checkpoint_every=1"]  # fmt: skip
# the unified model (GRPO text track + DiffusionNFT image track on one backbone), test_unified_trainer's sizes
_UNIFIED = ["device=cpu", "threads=1", "model.hidden_size=32", "model.num_layers=1", "model.conv_channels=[8,16]",
            "image_sampling.num_steps=4", "sft.steps=4", "sft.batch_size=8", "sft.checkpoint_every=2",
            "rl.steps=4", "rl.prompts_per_step=2", "rl.samples_per_prompt=4", "rl.geometry.micro_batch_size=8",
            "eval.num_prompts=2", "eval.samples_per_prompt=1", "eval.grid_size=0", "eval.every=0",
            "checkpoint_every=1"]  # fmt: skip
PRESETS: dict[str, tuple[str, list[str]]] = {
    "ar": ("arithmetic_grpo", _AR),
    "ar_ray": ("arithmetic_grpo", [*_AR, *_RAY]),
    "shapes_nft": ("shapes_nft", _SHAPES),
    "shapes_nft_ray": ("shapes_nft", [*_SHAPES, *_RAY, "rl.geometry.mini_batch_size=4"]),
    "shapes_flowgrpo": ("shapes_flowgrpo", _SHAPES),
    "shapes_pe": ("shapes_pe", _PE),
    "shapes_unified": ("shapes_unified", _UNIFIED),
}
# every run starts its own local Ray cluster (a Ray preset's), which dies with its driver: never
# one some other job runs
_ENV = {"RAY_ADDRESS": "local", "RAY_USAGE_STATS_ENABLED": "0"}
# wall-clock values that differ between any two runs
_TIMES = ("time", "seconds", "_s")


@dataclass
class Outcome:
    point: str
    ok: bool
    why: list[str] = field(default_factory=list)
    seconds: float = 0.0


def launch(
    recipe: str, overrides: list[str], run: Path, env: dict[str, str], launcher: str, timeout_s: float = 600.0
) -> int:
    """One `unirl train` run; its return code (-9: killed by SIGKILL; 124: over ``timeout_s``, killed)."""
    args = ["train", recipe, *overrides, "--run-dir", str(run)]
    env = {**_ENV, **env}
    if launcher == "spawn":
        full = {**os.environ, **env}
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "unirl.apps.cli", *args],
                env=full,
                capture_output=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            print(f"  the run in {run} passed {timeout_s:.0f} s: killed", file=sys.stderr, flush=True)
            return 124
        if proc.returncode not in (0, -9):
            sys.stderr.write(proc.stderr.decode(errors="replace")[-3000:])
        return proc.returncode
    pid = os.fork()
    if pid == 0:  # the child: the run, then exit without running the parent's atexit / finally
        code = 1
        try:
            os.environ.update(env)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1), os.dup2(devnull, 2)
            from unirl.apps import cli

            code = cli.main(args)
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    while True:  # a forked child that hangs (a lock some thread held at fork) must not hang the sweep
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print(f"  the forked run in {run} passed {timeout_s:.0f} s: killed", file=sys.stderr, flush=True)
            return 124
        time.sleep(0.05)


def preload(recipe: str) -> None:
    """The fork launcher: import what a run imports once, here, so each forked child skips it."""
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    from unirl.apps import cli

    recipe_cfg = cli.load_dict(recipe)
    importlib.import_module(f"unirl.apps.trainers.{recipe_cfg.get('trainer', 'diffusion')}")
    importlib.import_module("unirl.apps.launch")


def trace_points(recipe: str, overrides: list[str], run: Path, launcher: str) -> list[str]:
    """Run uninterrupted into ``run``; the fault points it passed, in order, each once."""
    trace = run.parent / f"{run.name}.trace"
    rc = launch(recipe, overrides, run, {TRACE_ENV: str(trace)}, launcher)
    if rc != 0:
        raise SystemExit(f"the uninterrupted run failed (exit {rc}); see its output above")
    return list(dict.fromkeys(trace.read_text().split()))


def draw_points(points: list[str], n: int, seed: int) -> list[str]:
    """``n`` distinct points, seeded, round-robin over kinds (``sft``, ``train``, ``ckpt_write``...)."""
    rng = random.Random(seed)
    kinds: dict[str, list[str]] = {}
    for p in points:
        kinds.setdefault(p.split(":")[0], []).append(p)
    for pool in kinds.values():
        rng.shuffle(pool)
    order = sorted(kinds)
    rng.shuffle(order)
    chosen: list[str] = []
    while len(chosen) < min(n, len(points)):
        for k in order:
            if kinds[k] and len(chosen) < n:
                chosen.append(kinds[k].pop())
    return chosen


def _bits(t: Any) -> Any:
    return t.detach().cpu().contiguous().reshape(-1).view(torch_uint8())


def torch_uint8() -> Any:
    import torch

    return torch.uint8


def _equal(a: Any, b: Any, path: str, why: list[str]) -> None:
    """Bitwise comparison of nested checkpoint state (tensors: dtype, shape and every bit)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(_bits(a), _bits(b))
        )
        if not same:
            why.append(f"{path}: tensors differ")
    elif isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            why.append(f"{path}: keys differ: {sorted(set(a) ^ set(b), key=str)[:5]}")
        for k in set(a) & set(b):
            _equal(a[k], b[k], f"{path}.{k}", why)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            why.append(f"{path}: lengths differ")
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{path}[{i}]", why)
    elif a != b:
        why.append(f"{path}: {a!r} != {b!r}")


def _rows(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.endswith(_TIMES)} for r in rows]


def _untimed_extra(ckpt: Path) -> dict[str, Any]:
    extra = json.loads((ckpt / "extra.json").read_text())
    extra.get("report", {}).pop("timings", None)
    return extra


def compare(whole: Path, cut: Path) -> list[str]:
    """What differs between the two runs' final checkpoints and metrics (empty: identical)."""
    import torch

    why: list[str] = []
    a, b = whole / "checkpoints" / "latest", cut / "checkpoints" / "latest"
    if not (b / "meta.json").is_file():
        return [f"{b}: no complete final checkpoint"]
    ranks = sorted(p.name for p in a.glob("rng-*.pt"))  # one per train rank
    if ranks != sorted(p.name for p in b.glob("rng-*.pt")):
        why.append(f"the RNG files differ: {ranks} vs {sorted(p.name for p in b.glob('rng-*.pt'))}")
    for name in ("state.pt", *ranks):
        if (b / name).is_file():
            _equal(
                torch.load(a / name, weights_only=True), torch.load(b / name, weights_only=True), name, why
            )
    files_a = sorted(p.name for p in (a / "files").glob("*")) if (a / "files").is_dir() else []
    files_b = sorted(p.name for p in (b / "files").glob("*")) if (b / "files").is_dir() else []
    if files_a != files_b:
        why.append(f"checkpoint files differ: {files_a} vs {files_b}")
    why += [f"files/{n} differs" for n in files_a if n in files_b and (a / "files" / n).read_bytes()
            != (b / "files" / n).read_bytes()]  # fmt: skip
    _equal(_untimed_extra(a), _untimed_extra(b), "extra.json", why)
    rows_a, rows_b = _rows(whole), _rows(cut)
    for phase in ("sft", "rl"):
        steps = [r["step"] for r in rows_b if r["phase"] == phase]
        if steps != sorted(set(steps)) or steps != [r["step"] for r in rows_a if r["phase"] == phase]:
            why.append(f"{phase} steps logged {steps}: one twice, skipped or out of order")
    if rows_a != rows_b:
        why.append("metrics.jsonl differs from the uninterrupted run's (wall times aside)")
    return why


def _batch(cfg: dict[str, Any], row: dict[str, Any]) -> int:
    """Samples one step row trained, from the run's resolved config (PE: per stack, its rows'
    ``ar/`` or ``diffusion/`` keys; its RL step trains the rewrites and their renders)."""
    rl = cfg.get("rl") or {}
    if row["phase"] == "rl":
        n = rl["prompts_per_step"] * rl["samples_per_prompt"]
        return n * (1 + rl["images_per_rewrite"]) if "images_per_rewrite" in rl else n
    if "sft" in cfg:
        return int(cfg["sft"]["batch_size"])
    side = next(k.split("/")[0] for k in row if "/" in k)  # PE: one stack's SFT step
    return int(cfg[side]["sft"]["batch_size"])


def trained_samples(run: Path, overrides: list[str]) -> dict[str, int]:
    """Samples trained per phase: the batch of every step logged (from the run's config.yaml)."""
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    rows = [r for r in _rows(run) if r["phase"] in ("sft", "rl")]
    return {ph: sum(_batch(cfg, r) for r in rows if r["phase"] == ph) for ph in ("sft", "rl")}


def sweep(
    recipe: str, overrides: list[str], n: int | list[str], seed: int, launcher: str, work: Path
) -> list[Outcome]:
    """Kill at ``n`` seeded points (or at the named ones), resume each, compare with the whole run."""
    whole = work / "whole"
    if launcher == "fork":
        preload(recipe)
    points = trace_points(recipe, overrides, whole, launcher)
    chosen = draw_points(points, n, seed) if isinstance(n, int) else n
    if missing := [p for p in chosen if p not in points]:
        raise SystemExit(
            f"--at {' '.join(missing)}: not reached by the whole run (it passed {' '.join(points)})"
        )
    print(
        f"{recipe}: {len(points)} fault points traced; {len(chosen)} drawn (seed {seed}): {' '.join(chosen)}"
    )
    print(f"whole run trained {trained_samples(whole, overrides)} samples")
    outcomes = []
    for i, point in enumerate(chosen):
        run, t0 = work / f"cut{i:02d}", time.time()
        rc = launch(recipe, overrides, run, {FAULT_ENV: point}, launcher)
        why = [] if rc == -9 else [f"the run was not killed at {point} (exit {rc})"]
        if not why:
            rc = launch(recipe, overrides, run, {}, launcher)
            why = compare(whole, run) if rc == 0 else [f"the resumed run failed (exit {rc})"]
        if not why and trained_samples(run, overrides) != trained_samples(whole, overrides):
            why.append(
                f"samples trained {trained_samples(run, overrides)} != {trained_samples(whole, overrides)}"
            )
        outcomes.append(Outcome(point, not why, why, time.time() - t0))
        print(f"  {point:16s} {'survived' if not why else 'FAILED: ' + '; '.join(why[:4])} "
              f"({outcomes[-1].seconds:.1f} s)", flush=True)  # fmt: skip
        if not why:
            shutil.rmtree(run, ignore_errors=True)
    return outcomes


def write_json(
    args: argparse.Namespace, recipe: str, work: Path, outcomes: list[Outcome], wall_s: float
) -> None:
    """The sweep as JSON (``scripts/reliability_figures.py kill-sweep`` plots it)."""
    traced = list(dict.fromkeys((work / "whole.trace").read_text().split()))
    res = {"preset": args.preset, "recipe": recipe, "launcher": args.launcher, "seed": args.seed,
           "at": args.at, "traced": traced, "wall_s": round(wall_s, 1), "cpus": os.cpu_count(),
           "loadavg_1min": os.getloadavg()[0], "outcomes": [vars(o) for o in outcomes]}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.json}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="ar", help="recipe + tiny CPU overrides")
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--at", nargs="+", default=None, help="these fault points instead of --points drawn ones")
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--launcher", choices=["spawn", "fork"], default="spawn")
    ap.add_argument("--work", type=Path, default=None, help="run directories (default: a temporary one)")
    ap.add_argument("--json", type=Path, default=None, help="also write the points and outcomes to this file")
    ap.add_argument("overrides", nargs="*", help="extra recipe overrides (a.b=value)")
    args = ap.parse_args(argv)
    recipe, overrides = PRESETS[args.preset]
    overrides = [*overrides, *args.overrides]
    work = (
        args.work or Path(tempfile.mkdtemp(prefix="kill_sweep-"))
    ).resolve()  # Ray workers trace there too
    t0 = time.time()
    outcomes = sweep(recipe, overrides, args.at or args.points, args.seed, args.launcher, work)
    survived = sum(o.ok for o in outcomes)
    print(f"kill points survived: {survived} / {len(outcomes)} ({recipe}, {args.launcher}, "
          f"{time.time() - t0:.0f} s; runs in {work})")  # fmt: skip
    if args.json:
        write_json(args, recipe, work, outcomes, time.time() - t0)
    return 0 if survived == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
