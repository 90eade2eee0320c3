"""kill -9 at seeded points of a tiny CPU run, then resume: bit-identical to the uninterrupted run.

A small subset of ``scripts/kill_sweep.py`` (the full 20-point sweeps: docs/reliability.md). The
sweep runs in a fresh interpreter: its runs are forked children killed by a real SIGKILL at a
``unirl.types.faults`` point, and forking this pytest process -- whose earlier tests left torch,
TensorBoard and server threads behind -- can leave a child blocked on a lock one of them held.
Every run and the whole sweep have a time limit, so a hang fails the test instead of the suite.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kill_sweep.py"


def _sweep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kill_sweep", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kill_sweep"] = mod
    spec.loader.exec_module(mod)
    return mod


def _run_sweep(tmp_path: Path, *args: str, expect: int) -> None:
    cmd = [sys.executable, str(SCRIPT), "--launcher", "fork", "--work", str(tmp_path), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"kill points survived: {expect} / {expect}" in out, out[-4000:]


@pytest.mark.slow
def test_ar_run_killed_at_4_seeded_points_resumes_bit_identical(tmp_path: Path) -> None:
    _run_sweep(tmp_path, "--preset", "ar", "--points", "4", "--seed", "23", expect=4)


@pytest.mark.slow
def test_nft_resume_draws_on_from_the_checkpointed_generators(tmp_path: Path) -> None:
    """Killed in SFT after its step-3 checkpoint (FlowSFT's t / noise generator) and in RL after a
    checkpoint (DiffusionNFT's): both failed before the generators were checkpointed."""
    _run_sweep(tmp_path, "--preset", "shapes_nft", "--at", "sft:4", "trained:2", expect=2)


def test_draw_points_is_seeded_and_covers_every_kind() -> None:
    ks = _sweep()
    traced = [f"{k}:{i}" for k in ("sft", "train", "ckpt_write") for i in range(5)]
    a, b = ks.draw_points(traced, 6, 23), ks.draw_points(traced, 6, 23)
    assert a == b and len(set(a)) == 6
    assert {p.split(":")[0] for p in a} == {"sft", "train", "ckpt_write"}
    assert ks.draw_points(traced, 99, 1) != [] and len(ks.draw_points(traced, 99, 1)) == len(traced)


@pytest.mark.slow
def test_ray_nft_killed_in_a_worker_resumes_every_ranks_generator_and_schedule(tmp_path: Path) -> None:
    """DiffusionNFT on 2 train ranks + 1 rollout worker (~3 min: three Ray runs on 2 cores), killed
    in the train workers (``ckpt_write:8``: the RL step-2 checkpoint written, not renamed; the kill
    takes the driver with it). The resume must restore each rank's NFT generator (not the driver's:
    ``rng-rl-algorithm-<rank>.bin``) and put the workers' cosine LR schedule at the run's RL step;
    it failed on both before."""
    _run_sweep(tmp_path, "--preset", "shapes_nft_ray", "--at", "ckpt_write:8", expect=1)


@pytest.mark.slow
def test_pe_resume_restores_each_sides_generator(tmp_path: Path) -> None:
    """The prompt enhancer (both stacks train in RL): killed in the renderer's SFT after its step-2
    checkpoint (its FlowSFT generator) and mid-RL."""
    _run_sweep(tmp_path, "--preset", "shapes_pe", "--at", "sft:3", "scored:2", expect=2)


@pytest.mark.slow
def test_unified_resume_restores_each_tracks_generator(tmp_path: Path) -> None:
    """The unified model: killed in SFT after its step-2 checkpoint (the image track's FlowSFT) and
    mid-RL after a checkpoint (its DiffusionNFT)."""
    _run_sweep(tmp_path, "--preset", "shapes_unified", "--at", "sft:3", "trained:2", expect=2)
