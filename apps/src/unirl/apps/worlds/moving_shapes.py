"""The moving-shapes video world: one object that moves in a straight line ("a red circle moving left").

Each video is ``num_frames`` frames of ``resolution`` x ``resolution`` pixels on black: the object
(of side / diameter ``size_min..size_max``) starts at a random point from which its whole path
stays on the canvas and moves ``speed`` pixels a frame in the caption's direction; its position
across the motion is random. Frames are rasterised by the shapes world's ``render``.

Splits are disjoint by caption: ``held_out`` (colour, shape, direction) combinations are never
seen in training, while each colour, shape and direction still is (the held-out test is
compositional). The checker is ``unirl.reward.worlds.moving_shapes``.
"""

from __future__ import annotations

import random
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from unirl.apps.loop import PromptRecord
from unirl.apps.worlds.caption_noise import SFT_CAPTION_NOISE_FIELD, mislabel
from unirl.apps.worlds.shapes import PlacedObject, render
from unirl.reward.worlds.moving_shapes import DIRECTIONS, MotionSpec, all_motion_specs

__all__ = ["MovingShapesDataConfig", "MovingShapesSource", "MovingShapesWorld"]


class MovingShapesDataConfig(BaseModel):
    """The procedurally generated moving-shapes video world (data source of a video recipe)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["moving_shapes"] = "moving_shapes"
    resolution: int = Field(
        default=16, ge=8, description="frame side in pixels (must equal model.resolution)"
    )
    num_frames: int = Field(default=4, ge=2, description="frames per video (must equal sampling.num_frames)")
    size_min: int = Field(default=5, ge=3, description="object side / diameter in pixels, smallest")
    size_max: int = Field(default=6, ge=3, description="object side / diameter in pixels, largest")
    speed: int = Field(default=2, ge=1, description="pixels the object moves per frame")
    held_out: int = Field(default=5, ge=1, le=12, description="captions held out of the 24")
    split_seed: int = Field(default=0, ge=0)
    sft_caption_noise: float = SFT_CAPTION_NOISE_FIELD

    @model_validator(mode="after")
    def _fits(self) -> MovingShapesDataConfig:
        path = self.size_max + self.speed * (self.num_frames - 1)
        if self.size_min > self.size_max or path + 2 > self.resolution:
            raise ValueError(
                f"data: an object of size_max={self.size_max} moving speed={self.speed} px over "
                f"num_frames={self.num_frames} spans {path} px, more than resolution={self.resolution} - 2 "
                "(or size_min > size_max): lower speed / num_frames or raise resolution"
            )
        return self

    def build(self) -> MovingShapesSource:
        return MovingShapesSource(MovingShapesWorld(self))


class MovingShapesWorld:
    """Seeded generator of moving-shapes videos with disjoint train / held-out caption splits."""

    def __init__(self, config: MovingShapesDataConfig | None = None) -> None:
        self.config = config or MovingShapesDataConfig()
        self._train, self._held_out = self._split(all_motion_specs())

    def _split(self, specs: list[MotionSpec]) -> tuple[list[MotionSpec], list[MotionSpec]]:
        """Hold out ``held_out`` captions such that every colour, shape and direction stays in train."""
        rng = random.Random(self.config.split_seed)
        for _ in range(1000):
            order = specs[:]
            rng.shuffle(order)
            held, train = order[: self.config.held_out], order[self.config.held_out :]
            if all(
                {getattr(s, f) for s in train} == {getattr(s, f) for s in specs}
                for f in ("colour", "shape", "direction")
            ):
                return [s for s in specs if s in train], [s for s in specs if s in held]
        raise ValueError(f"no split of held_out={self.config.held_out} keeps every word in training")

    def specs(self, split: Literal["train", "held_out"]) -> list[MotionSpec]:
        return list(self._train if split == "train" else self._held_out)

    def captions(self, split: Literal["train", "held_out"]) -> list[str]:
        return [s.caption for s in self.specs(split)]

    def path(self, spec: MotionSpec, rng: np.random.Generator) -> list[PlacedObject]:
        """The object's box in each frame: a random start from which the whole path stays on the canvas."""
        cfg = self.config
        size = int(rng.integers(cfg.size_min, cfg.size_max + 1))
        travel = cfg.speed * (cfg.num_frames - 1)
        dx, dy = DIRECTIONS[spec.direction]
        lo, hi = 1, cfg.resolution - 1 - size  # top-left coordinate range of a still object
        x0 = int(rng.integers(lo + (travel if dx < 0 else 0), hi - (travel if dx > 0 else 0) + 1))
        y0 = int(rng.integers(lo + (travel if dy < 0 else 0), hi - (travel if dy > 0 else 0) + 1))
        return [
            PlacedObject(spec.colour, spec.shape, x0 + dx * cfg.speed * f, y0 + dy * cfg.speed * f, size)
            for f in range(cfg.num_frames)
        ]

    def video(self, spec: MotionSpec | str, rng: np.random.Generator) -> np.ndarray:
        """One uint8 video ``[F, H, W, 3]`` of the spec (or caption)."""
        if isinstance(spec, str):
            spec = MotionSpec.parse(spec)
        return np.stack([render([o], self.config.resolution) for o in self.path(spec, rng)])

    def sample(
        self, n: int, seed: int, split: Literal["train", "held_out"] = "train"
    ) -> list[tuple[np.ndarray, str]]:
        """``n`` (video, caption) pairs, captions uniform over ``split``; pair i is a pure function of (seed, i)."""
        specs = self.specs(split)
        out = []
        for i in range(n):
            rng = np.random.default_rng([seed, i])
            spec = specs[int(rng.integers(len(specs)))]
            out.append((self.video(spec, rng), spec.caption))
        return out


class MovingShapesSource:
    """The world as a trainer data source: prompt records for RL / evaluation, (video, caption) for SFT."""

    name = "moving_shapes"

    def __init__(self, world: MovingShapesWorld) -> None:
        self.world = world
        self._train_captions = world.captions("train")  # the pool of the noise draws

    def _records(self, split: Literal["train", "held_out"]) -> list[PromptRecord]:
        return [PromptRecord(id=f"{split[0]}{i}", prompt=c) for i, c in enumerate(self.world.captions(split))]

    def train_records(self) -> list[PromptRecord]:
        return self._records("train")

    def eval_records(self) -> list[PromptRecord]:
        """The held-out captions (never seen in training)."""
        return self._records("held_out")

    def sft_examples(self, n: int, *, seed: int, step: int) -> tuple[np.ndarray, list[str]]:
        """``n`` training videos ``uint8 [n, F, H, W, 3]`` with their captions, seeded by ``(seed, step)``.

        With ``data.sft_caption_noise`` p, a fraction ~p of the captions is a random training caption
        (``unirl.apps.worlds.caption_noise``); the videos are the clean ones.
        """
        pairs = self.world.sample(n, seed=seed * 1_000_003 + step, split="train")
        captions = mislabel(
            [c for _, c in pairs],
            self._train_captions,
            self.world.config.sft_caption_noise,
            seed=seed,
            step=step,
        )
        return np.stack([v for v, _ in pairs]), captions
