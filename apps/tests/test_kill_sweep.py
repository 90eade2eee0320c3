"""kill -9 at seeded points of a tiny CPU run, then resume: bit-identical to the uninterrupted run.

A small subset of ``scripts/kill_sweep.py`` (the full 20-point sweeps: docs/reliability.md). Each
run is a forked child of this process killed by a real SIGKILL at a ``unirl.types.faults`` point.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _sweep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kill_sweep", ROOT / "scripts" / "kill_sweep.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kill_sweep"] = mod
    spec.loader.exec_module(mod)
    return mod


def _check(ks: ModuleType, preset: str, points: list[str] | int, tmp_path: Path) -> None:
    recipe, overrides = ks.PRESETS[preset]
    ks.preload(recipe)
    whole = tmp_path / "whole"
    traced = ks.trace_points(recipe, overrides, whole, "fork")
    chosen = ks.draw_points(traced, points, seed=23) if isinstance(points, int) else points
    assert set(chosen) <= set(traced), f"{chosen} not all reached: {traced}"
    want = ks.trained_samples(whole, overrides)
    for i, point in enumerate(chosen):
        run = tmp_path / f"cut{i}"
        assert ks.launch(recipe, overrides, run, {ks.FAULT_ENV: point}, "fork") == -9, point
        assert ks.launch(recipe, overrides, run, {}, "fork") == 0, point
        assert ks.compare(whole, run) == [], point
        assert ks.trained_samples(run, overrides) == want, point


@pytest.mark.slow
def test_ar_run_killed_at_4_seeded_points_resumes_bit_identical(tmp_path: Path) -> None:
    _check(_sweep(), "ar", 4, tmp_path)


@pytest.mark.slow
def test_nft_resume_draws_on_from_the_checkpointed_generators(tmp_path: Path) -> None:
    """Killed in SFT after its step-3 checkpoint (FlowSFT's t / noise generator) and in RL after a
    checkpoint (DiffusionNFT's): both failed before the generators were checkpointed."""
    _check(_sweep(), "shapes_nft", ["sft:4", "trained:2"], tmp_path)


def test_draw_points_is_seeded_and_covers_every_kind() -> None:
    ks = _sweep()
    traced = [f"{k}:{i}" for k in ("sft", "train", "ckpt_write") for i in range(5)]
    a, b = ks.draw_points(traced, 6, 23), ks.draw_points(traced, 6, 23)
    assert a == b and len(set(a)) == 6
    assert {p.split(":")[0] for p in a} == {"sft", "train", "ckpt_write"}
    assert ks.draw_points(traced, 99, 1) != [] and len(ks.draw_points(traced, 99, 1)) == len(traced)
