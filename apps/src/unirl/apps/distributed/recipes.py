"""Recipes with a ``layout:`` section (until the domain recipes carry one themselves)."""

from __future__ import annotations

from pydantic import Field

from unirl.apps.distributed.layout import LayoutConfig
from unirl.apps.trainers import ar_config, diffusion_config

__all__ = ["ARLayoutRecipe", "DiffusionLayoutRecipe"]


class ARLayoutRecipe(ar_config.Recipe):
    """The AR recipe plus ``layout`` (default: single process)."""

    layout: LayoutConfig = Field(default_factory=LayoutConfig)


class DiffusionLayoutRecipe(diffusion_config.Recipe):
    """The diffusion recipe plus ``layout`` (default: single process)."""

    layout: LayoutConfig = Field(default_factory=LayoutConfig)
