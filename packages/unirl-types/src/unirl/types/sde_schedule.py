"""Which denoising steps run the SDE (and are trained on); the others run the ODE.

Each schedule is a small typed config with ``resolve(num_steps, step) -> sorted indices`` where
``step`` is the rollout (training) step, so a stochastic choice is reproducible from it.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from unirl.types.base import SchemaModel


class AllSteps(SchemaModel):
    """Every denoising step is stochastic (Flow-GRPO, DanceGRPO default)."""

    kind: Literal["all"] = "all"

    def resolve(self, num_steps: int, step: int) -> list[int]:
        return list(range(num_steps))

    def check(self, num_steps: int) -> None:
        return None


class KOfWindow(SchemaModel):
    """``k`` steps drawn without replacement from a fraction window of the schedule.

    The window is ``[floor(start * T), ceil(end * T))`` of the T denoising steps, e.g. ``k=3,
    start=0, end=0.5`` with T=10 draws 3 of the first 5 steps. The draw is seeded by
    ``(seed, rollout step)``: the same step always gives the same indices.
    """

    kind: Literal["k_of_window"] = "k_of_window"
    k: int = Field(ge=1, description="number of SDE steps per rollout")
    start: float = Field(default=0.0, ge=0.0, le=1.0, description="window start, fraction of the steps")
    end: float = Field(
        default=1.0, gt=0.0, le=1.0, description="window end (exclusive), fraction of the steps"
    )
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> KOfWindow:
        if self.start >= self.end:
            raise ValueError(f"sde_schedule.start={self.start} must be < sde_schedule.end={self.end}")
        return self

    def window(self, num_steps: int) -> range:
        return range(math.floor(self.start * num_steps), math.ceil(self.end * num_steps))

    def check(self, num_steps: int) -> None:
        w = self.window(num_steps)
        if self.k > len(w):
            raise ValueError(
                f"sde_schedule.k={self.k} exceeds the window of {len(w)} steps "
                f"({w.start}..{w.stop - 1} of num_steps={num_steps}); lower k or widen start/end"
            )

    def resolve(self, num_steps: int, step: int) -> list[int]:
        self.check(num_steps)
        w = self.window(num_steps)
        rng = np.random.default_rng([self.seed, step])
        picked = rng.choice(len(w), size=self.k, replace=False)
        return sorted(int(w.start + i) for i in picked)


class SlidingWindow(SchemaModel):
    """MixGRPO's sliding window: ``size`` consecutive SDE steps that move towards the end.

    The window starts at 0 and advances by ``size - overlap`` steps every ``advance_every`` rollout
    steps. Its starts are 0, shift, 2 shift, ... clamped to the last valid start T - size; after the
    last one it stays there, or (``cycle``) starts again at 0.
    """

    kind: Literal["sliding_window"] = "sliding_window"
    size: int = Field(ge=1)
    overlap: int = Field(default=0, ge=0)
    advance_every: int = Field(default=1, ge=1, description="rollout steps between window moves")
    cycle: bool = False

    @model_validator(mode="after")
    def _overlap(self) -> SlidingWindow:
        if self.overlap >= self.size:
            raise ValueError(f"sde_schedule.overlap={self.overlap} must be < sde_schedule.size={self.size}")
        return self

    def check(self, num_steps: int) -> None:
        if self.size > num_steps:
            raise ValueError(f"sde_schedule.size={self.size} exceeds num_steps={num_steps}")

    def resolve(self, num_steps: int, step: int) -> list[int]:
        self.check(num_steps)
        shift = self.size - self.overlap
        last_start = num_steps - self.size
        n_starts = -(-last_start // shift) + 1  # ceil: the last position is clamped to last_start
        k = step // self.advance_every
        k = k % n_starts if self.cycle else min(k, n_starts - 1)
        start = min(k * shift, last_start)
        return list(range(start, start + self.size))


SDESchedule = Annotated[AllSteps | KOfWindow | SlidingWindow, Field(discriminator="kind")]
