"""Arithmetic word problems as a trainer data source: stories with integer reference answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from unirl.apps.loop import PromptRecord
from unirl.apps.worlds.word_problems import WordProblem, WordProblemsConfig, WordProblemsWorld


class WordProblemsDataConfig(BaseModel):
    """Generated English word problems (add/sub, mul/div, two-step); see ``word_problems``.

    ``num_train`` / ``num_eval`` problems with distinct skeletons are drawn once with ``seed``
    from the disjoint train / held-out splits. ``sft_pairs`` targets are worked solutions ending
    in ``#### <answer>``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["word_problems"] = "word_problems"
    levels: tuple[int, ...] = Field(default=(0, 1, 2), description="0: add/sub, 1: mul/div, 2: two-step")
    max_operand: int = Field(default=20, ge=2, description="largest additive operand")
    held_out_fraction: float = Field(default=0.2, gt=0, lt=1)
    split_key: str = "unirl-word-problems-v1"
    num_train: int = Field(default=2000, ge=1, description="training problems (distinct skeletons)")
    num_eval: int = Field(default=200, ge=0, description="held-out problems (distinct skeletons)")
    seed: int = Field(default=0, ge=0, description="seed of the drawn problem sets")

    def build(self) -> WordProblemsSource:
        world = WordProblemsWorld(
            WordProblemsConfig(
                levels=self.levels,
                max_operand=self.max_operand,
                held_out_fraction=self.held_out_fraction,
                split_key=self.split_key,
            )
        )
        return WordProblemsSource(world, num_train=self.num_train, num_eval=self.num_eval, seed=self.seed)


class WordProblemsSource:
    name = "word_problems"

    def __init__(self, world: WordProblemsWorld, *, num_train: int, num_eval: int, seed: int) -> None:
        self.world = world
        self.train = world.sample(num_train, seed=seed, split="train", unique=True)
        self.held_out = world.sample(num_eval, seed=seed, split="held_out", unique=True)

    @staticmethod
    def _records(problems: list[WordProblem], prefix: str) -> list[PromptRecord]:
        return [
            PromptRecord(
                id=f"{prefix}{i}",
                prompt=p.prompt,
                answer=p.target,
                spec={"kind": p.kind, "level": p.level, "skeleton": p.skeleton},
            )
            for i, p in enumerate(problems)
        ]

    def train_records(self) -> list[PromptRecord]:
        return self._records(self.train, "t")

    def eval_records(self) -> list[PromptRecord]:
        """Held-out problems in draw order (already shuffled across kinds: a prefix is a fair subset)."""
        return self._records(self.held_out, "h")

    def sft_pairs(self, n: int, *, seed: int, step: int) -> list[tuple[str, str]]:
        """``n`` (prompt, worked solution) training pairs, seeded by ``(seed, step)``."""
        return [
            (p.prompt, p.solution) for p in self.world.sample(n, seed=seed * 1_000_003 + step, split="train")
        ]
