"""The video recipe, shortened (slow tier): SFT of the tiny text-to-video model from scratch on
the moving-shapes world, then two DanceGRPO steps on video rollouts. Asserts that SFT learns
(held-out checker reward rises from ~0) and that RL runs on video Samples and keeps it.

Opt-in (``UNIRL_VIDEO_LEARNING=1``): it passed once in 882 s wall / 409 s CPU on this machine under
contention (six sessions on 2 cores), far over the slow tier's 60 s budget; shortening it further
(fewer SFT steps) is not yet measured to still learn."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from unirl.apps import cli
from unirl.apps.run_dir import read_metrics

SHORT = (
    "threads=2", "sft.steps=150", "sft.batch_size=16", "backend.optimizer.lr=2e-3",
    "backend.scheduler.warmup_steps=20", "eval.samples_per_prompt=4", "eval.every=0", "eval.grid_size=4",
    "sampling.num_steps=6", "sampling.sde_schedule={kind: k_of_window, k: 2, start: 0.0, end: 0.6}",
    "rl.steps=2", "rl.prompts_per_step=2", "rl.samples_per_prompt=4",
    "rl.geometry={micro_batch_size: 8, mini_batch_size: 8, num_updates_per_batch: 1}",
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("UNIRL_VIDEO_LEARNING"), reason="~400 CPU-s: over the slow tier's budget (opt-in)"
)
def test_moving_shapes_dance_short_run_learns(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert cli.main(["train", "moving_shapes_dance", *SHORT, "--run-dir", str(run)]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    init, sft, final = (r["eval_reward"] for r in rows if r["phase"] == "eval")
    assert init < 0.05  # an untrained model draws no clean object
    assert sft >= init + 0.3, (init, sft)  # SFT: objects of the caption's colour that move
    rl = [r for r in rows if r["phase"] == "rl"]
    assert len(rl) == 2 and all(abs(r["ratio_mean"] - 1) < 0.05 for r in rl)
    assert final >= sft - 0.15, (sft, final)  # two small RL steps keep what SFT learned
    assert (run / "samples" / "rl.png").exists()
