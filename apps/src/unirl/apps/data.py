"""Prompt sources for the trainers: the procedurally generated worlds and plain prompt lists.

Every source is seeded and indexable by step, so the data cursor of a run is just its step and a
resumed run draws exactly the prompts the uninterrupted run would have drawn.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from unirl.apps.loop import PromptRecord

_STRICT = ConfigDict(extra="forbid", frozen=True)


class PromptSource(Protocol):
    name: str

    def train_records(self) -> list[PromptRecord]: ...

    def eval_records(self) -> list[PromptRecord]: ...


# Optional capabilities of a built source (SFT data) and of a data config (sizes the model must match).
@runtime_checkable
class SFTPairs(Protocol):
    """A source of (prompt, target text) pairs for token SFT (arithmetic, word problems, paraphrase)."""

    def sft_pairs(self, n: int, *, seed: int, step: int) -> list[tuple[str, str]]: ...


@runtime_checkable
class SFTRecords(Protocol):
    """A source of whole SFT records (prompt, answer and images: a visual-question world)."""

    def sft_records(self, n: int, *, seed: int, step: int) -> list[PromptRecord]: ...


@runtime_checkable
class SFTImages(Protocol):
    """A source of (images ``[N, H, W, 3]`` or videos ``[N, F, H, W, 3]`` uint8, captions) for flow SFT."""

    def sft_examples(self, n: int, *, seed: int, step: int) -> tuple[np.ndarray, list[str]]: ...


@runtime_checkable
class SizedImages(Protocol):
    """A data config whose images have one side length (the tiny models must sample that size)."""

    resolution: int


@runtime_checkable
class FramedVideos(Protocol):
    """A data config whose videos have a fixed number of frames."""

    num_frames: int


def draw(records: list[PromptRecord], n: int, *, seed: int, step: int) -> list[PromptRecord]:
    """``n`` records for ``step``: a seeded permutation per epoch, so every record is seen once per epoch."""
    if not records:
        raise ValueError("the prompt source has no training records")
    out: list[PromptRecord] = []
    start = step * n
    while len(out) < n:
        epoch, offset = divmod(start + len(out), len(records))
        perm = np.random.default_rng([seed, epoch]).permutation(len(records))
        take = min(n - len(out), len(records) - offset)
        out += [records[int(i)] for i in perm[offset : offset + take]]
    return out


class PromptListConfig(BaseModel):
    """Fixed prompt lists (e.g. for a real model with a JPEG or model-based reward)."""

    model_config = _STRICT
    kind: Literal["prompts"] = "prompts"
    train: list[str] = Field(min_length=1)
    eval: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _disjoint(self) -> PromptListConfig:
        both = sorted(set(self.train) & set(self.eval))
        if both:
            raise ValueError(f"data.eval must be disjoint from data.train; both contain {both[:3]}")
        return self

    def build(self) -> PromptSource:
        return _ListSource(self)


class _ListSource:
    name = "prompts"

    def __init__(self, cfg: PromptListConfig) -> None:
        self.cfg = cfg

    def train_records(self) -> list[PromptRecord]:
        return [PromptRecord(id=f"t{i}", prompt=p) for i, p in enumerate(self.cfg.train)]

    def eval_records(self) -> list[PromptRecord]:
        return [PromptRecord(id=f"e{i}", prompt=p) for i, p in enumerate(self.cfg.eval)]
