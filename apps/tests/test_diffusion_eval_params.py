"""Held-out evaluation samples with the ODE, each sample from its own initial noise."""

from pathlib import Path

import pytest

from unirl.apps.config import load
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.diffusion import DiffusionTrainer, Recipe


@pytest.mark.parametrize("scope", ["sample", "group"])
def test_eval_params_are_ode_with_per_sample_noise(tmp_path: Path, scope: str) -> None:
    recipe = load(Recipe, "shapes_flowgrpo", [f"sampling.noise.scope={scope}", "threads=1"])
    run = RunDir(tmp_path / "run", recipe.model_dump(mode="json"))
    try:
        trainer = DiffusionTrainer(recipe, run)
        ev = trainer.eval_params()
        assert (ev.eta, ev.sde_strategy, ev.noise.scope) == (0.0, "ode", "sample")
        assert ev.noise.seed == recipe.sampling.noise.seed
        assert trainer.pipeline.default_params.noise.scope == scope  # RL's rollout keeps the recipe's
    finally:
        run.close()
