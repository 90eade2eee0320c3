"""Rewards on a Part: a total and its named components."""

from __future__ import annotations

import math

from pydantic import Field, field_validator

from unirl.types.base import SchemaModel


class Reward(SchemaModel):
    """The reward of one Part: ``total`` (what advantages use) and named ``components``."""

    total: float
    components: dict[str, float] = Field(default_factory=dict)

    @field_validator("total")
    @classmethod
    def _finite_total(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"reward total must be finite; got {v}: a scorer returned NaN/inf")
        return v

    @field_validator("components")
    @classmethod
    def _finite_components(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not math.isfinite(x)}
        if bad:
            raise ValueError(f"reward components must be finite; got {bad}")
        return v
