"""Recipe aliases kept for callers that named the layout-carrying recipes: every domain recipe has
a ``layout`` section now (``unirl.apps.trainers.phases.RunSettings``)."""

from __future__ import annotations

from unirl.apps.trainers.ar_config import Recipe as ARLayoutRecipe
from unirl.apps.trainers.diffusion_config import Recipe as DiffusionLayoutRecipe

__all__ = ["ARLayoutRecipe", "DiffusionLayoutRecipe"]
