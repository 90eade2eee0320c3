"""`rollout.engine.decoder` switches the trainside AR decode loop by config alone, and the static
loop (the CUDA-graph path's step, eagerly on CPU, with weights gathered once per rollout) trains
exactly like the dynamic one."""

from __future__ import annotations

from pathlib import Path

import pytest

from unirl.apps.cli import main
from unirl.apps.run_dir import read_metrics


def _rl_rows(tmp_path: Path, decoder: str) -> list[dict]:
    run = tmp_path / decoder
    rc = main(
        [
            "train", "arithmetic_grpo", f"rollout.engine.decoder={decoder}", "sft.steps=20", "rl.steps=2",
            "eval.num_prompts=0", "threads=1", "--run-dir", str(run),
        ]
    )  # fmt: skip
    assert rc == 0
    return [r for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "rl"]


@pytest.mark.slow
@pytest.mark.parametrize("decoder", ["static", "fused"])
def test_static_decoder_recipe_trains_like_the_dynamic_one(tmp_path: Path, decoder: str) -> None:
    """``fused`` on CPU: the whole step compiled by inductor, attention through SDPA."""
    dyn, sta = _rl_rows(tmp_path, "dynamic"), _rl_rows(tmp_path, decoder)
    assert len(dyn) == len(sta) == 2
    for a, b in zip(dyn, sta):
        assert a["reward_mean"] == b["reward_mean"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7)
        assert abs(b["ratio_mean"] - 1.0) < 1e-3


def test_unknown_decoder_names_the_options() -> None:
    from unirl.apps.config import RecipeError, load
    from unirl.apps.trainers.ar_config import Recipe

    with pytest.raises(RecipeError, match="rollout.engine.trainside.decoder|decoder"):
        load(Recipe, "arithmetic_grpo", ["rollout.engine.decoder=cuda"])
