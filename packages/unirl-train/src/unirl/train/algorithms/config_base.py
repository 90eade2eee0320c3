"""The base of every algorithm config: strict, frozen pydantic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class AlgorithmConfigBase(BaseModel):
    """Strict (``extra="forbid"``: a typo is an error naming the field) and frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
