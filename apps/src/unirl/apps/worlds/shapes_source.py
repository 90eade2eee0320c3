"""The shapes world as a trainer data source: prompt records for RL/eval, (image, caption) for SFT."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from unirl.apps.loop import PromptRecord
from unirl.apps.worlds.caption_noise import SFT_CAPTION_NOISE_FIELD, mislabel
from unirl.apps.worlds.shapes import ShapesWorld, ShapesWorldConfig


class ShapesDataConfig(BaseModel):
    """The procedurally generated shapes world (see ``ShapesWorldConfig`` for each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["shapes"] = "shapes"
    resolution: int = Field(default=32, ge=8)
    size_min: int = Field(default=7, ge=1)
    size_max: int = Field(default=9, ge=1)
    gap: int = Field(default=2, ge=0)
    held_out_fraction: float = Field(default=0.2, gt=0, lt=1)
    split_seed: int = Field(default=0, ge=0)
    max_count_single: int = Field(default=3, ge=1, le=3)
    max_count_pair: int = Field(default=1, ge=1, le=2, description="objects per group in relation captions")
    layout: Literal["free", "grid"] = "free"
    grid_cells: int = Field(default=4, ge=2)
    include_single: bool = True
    include_pairs: bool = True
    shapes: tuple[Literal["circle", "square"], ...] = ("circle", "square")
    relations: tuple[Literal["left of", "right of", "above", "below"], ...] = (
        "left of",
        "right of",
        "above",
        "below",
    )
    sft_caption_noise: float = SFT_CAPTION_NOISE_FIELD

    def build(self) -> ShapesSource:
        world = ShapesWorld(ShapesWorldConfig(**self.model_dump(exclude={"kind", "sft_caption_noise"})))
        return ShapesSource(world, sft_caption_noise=self.sft_caption_noise)


class ShapesSource:
    name = "shapes"

    def __init__(self, world: ShapesWorld, *, sft_caption_noise: float = 0.0) -> None:
        self.world = world
        self.sft_caption_noise = sft_caption_noise
        self._train_captions = world.captions("train")  # the pool of the noise draws

    def _records(self, split: Literal["train", "held_out"]) -> list[PromptRecord]:
        return [PromptRecord(id=f"{split[0]}{i}", prompt=c) for i, c in enumerate(self.world.captions(split))]

    def train_records(self) -> list[PromptRecord]:
        return self._records("train")

    def eval_records(self) -> list[PromptRecord]:
        """Held-out captions (never seen in training), in a fixed shuffled order so a prefix is a fair subset."""
        recs = self._records("held_out")
        order = np.random.default_rng(1234).permutation(len(recs))
        return [recs[int(i)] for i in order]

    def sft_examples(self, n: int, *, seed: int, step: int) -> tuple[np.ndarray, list[str]]:
        """``n`` training renders ``uint8 [n, H, W, 3]`` with their captions, seeded by ``(seed, step)``.

        With ``sft_caption_noise`` p, each example independently (probability p) gets a caption drawn
        uniformly from the training captions instead of its own: the SFT policy then converges to a
        mixture that ignores the prompt about a fraction p of the time, whatever the machine, and
        only a reward that reads the image against the prompt can remove it.
        """
        ex = self.world.sample(n, seed=seed * 1_000_003 + step, split="train")
        captions = mislabel(
            [e.caption for e in ex], self._train_captions, self.sft_caption_noise, seed=seed, step=step
        )
        return np.stack([e.image for e in ex]), captions
