"""Entry point: run a recipe in the layout its ``layout:`` section selects (config only)."""

from __future__ import annotations

from pathlib import Path

from unirl.apps.distributed.layout import ensure_ray
from unirl.apps.launch import run_trainer
from unirl.apps.trainers.base import Trainer
from unirl.apps.trainers.phases import RunSettings

__all__ = ["domain_trainer", "ensure_ray", "run"]


def domain_trainer(recipe: RunSettings) -> type[Trainer]:
    """The single-process trainer class of ``recipe.trainer``."""
    if recipe.trainer == "ar":
        from unirl.apps.trainers.ar import ARTrainer

        return ARTrainer
    if recipe.trainer == "diffusion":
        from unirl.apps.trainers.diffusion import DiffusionTrainer

        return DiffusionTrainer
    raise ValueError(f"recipe trainer={recipe.trainer!r} has no layout support (known: 'ar', 'diffusion')")


def run(recipe: RunSettings, run_dir: Path, *, mode: str = "train", recipe_name: str = "") -> int:
    """Run ``recipe`` single-process (``layout.kind: single``, the default) or on Ray workers;
    ``run_trainer`` reads the layout."""
    title = f"unirl {recipe.trainer} run: {recipe_name}"
    return run_trainer(
        domain_trainer(recipe), recipe, run_dir, mode=mode, recipe_name=recipe_name, title=title
    )
