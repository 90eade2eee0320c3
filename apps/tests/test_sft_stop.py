"""`sft.stop`: SFT ends at a level on training prompts (probed every N steps), not at a step count,
and a resumed run goes on to RL instead of training SFT to `sft.steps`."""

from pathlib import Path

import pytest

from unirl.apps import cli
from unirl.apps.config import RecipeError, load
from unirl.apps.run_dir import read_metrics
from unirl.apps.trainers.ar_config import Recipe

TINY = ["rl.steps=2", "rl.prompts_per_step=4", "rl.samples_per_prompt=4", "rl.geometry.micro_batch_size=16",
        "sft.batch_size=16", "eval.num_prompts=4", "eval.grid_size=2", "threads=1"]  # fmt: skip


def _phases(run: Path, phase: str) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["phase"] == phase]


@pytest.mark.slow
def test_sft_stops_at_the_level_then_resume_goes_to_rl(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # reward >= 0 holds at the first probe (step 6, after min_steps): SFT ends there, not at 40
    stop = "sft.stop={metric: reward, at_least: 0.0, every: 3, min_steps: 5, num_prompts: 4, samples_per_prompt: 1}"
    assert cli.main(["sft", "arithmetic_grpo", "sft.steps=40", stop, *TINY, "--run-dir", str(run)]) == 0
    assert [r["step"] for r in _phases(run, "sft")] == list(range(6))
    probes = _phases(run, "sft_probe")
    assert [p["step"] for p in probes] == [6] and 0.0 <= probes[0]["probe_reward"] <= 1.0
    # resumed with `train`: no more SFT (its cursor, 6, is below sft.steps), straight to RL
    assert cli.main(["train", "arithmetic_grpo", "sft.steps=40", stop, *TINY, "--run-dir", str(run)]) == 0
    assert len(_phases(run, "sft")) == 6 and [r["step"] for r in _phases(run, "rl")] == [0, 1]


@pytest.mark.slow
def test_sft_runs_its_steps_when_the_level_is_not_reached(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stop = "sft.stop={metric: accuracy, at_least: 1.01, every: 4, num_prompts: 4, samples_per_prompt: 1}"
    assert cli.main(["sft", "arithmetic_grpo", "sft.steps=9", stop, *TINY, "--run-dir", str(run)]) == 0
    assert len(_phases(run, "sft")) == 9 and [p["step"] for p in _phases(run, "sft_probe")] == [4, 8]


def test_sft_stop_config_is_strict() -> None:
    with pytest.raises(RecipeError, match="at_least"):
        load(Recipe, "arithmetic_grpo", ["sft.stop={metric: accuracy}"])
    with pytest.raises(RecipeError, match="evry"):
        load(Recipe, "arithmetic_grpo", ["sft.stop={at_least: 0.5, evry: 3}"])
