"""The arithmetic world as a trainer data source: prompts with reference answers, SFT targets."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from unirl.apps.loop import PromptRecord
from unirl.apps.worlds.arithmetic import ArithmeticWorld, ArithmeticWorldConfig


class ArithmeticDataConfig(BaseModel):
    """Generated integer problems ("12+7=") of graded difficulty; see ``ArithmeticWorldConfig``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["arithmetic"] = "arithmetic"
    levels: tuple[int, ...] = Field(default=(0, 1, 2, 4), description="difficulty levels 0..5 to draw from")
    held_out_fraction: float = Field(default=0.2, gt=0, lt=1)
    split_key: str = "unirl-arithmetic-v1"

    def build(self) -> ArithmeticSource:
        return ArithmeticSource(ArithmeticWorld(ArithmeticWorldConfig(**self.model_dump(exclude={"kind"}))))


class ArithmeticSource:
    name = "arithmetic"

    def __init__(self, world: ArithmeticWorld) -> None:
        self.world = world

    def _records(self, split: Literal["train", "held_out"]) -> list[PromptRecord]:
        return [
            PromptRecord(id=f"{split[0]}{i}", prompt=p.prompt, answer=p.target, spec={"level": p.level})
            for i, p in enumerate(self.world.problems(split))
        ]

    def train_records(self) -> list[PromptRecord]:
        return self._records("train")

    def eval_records(self) -> list[PromptRecord]:
        """Held-out problems in a fixed shuffled order (a prefix is a fair subset across levels)."""
        recs = self._records("held_out")
        order = np.random.default_rng(1234).permutation(len(recs))
        return [recs[int(i)] for i in order]

    def sft_pairs(self, n: int, *, seed: int, step: int) -> list[tuple[str, str]]:
        """``n`` (prompt, target completion) training pairs, seeded by ``(seed, step)``."""
        return [
            (p.prompt, p.target) for p in self.world.sample(n, seed=seed * 1_000_003 + step, split="train")
        ]
