"""The Scorer protocol: what every reward scorer (rule-based or model-based) implements.

A scorer is batched: `score(items)` takes a list of `ScoreItem` and returns one `ScoreResult`
per item, in order. It declares which inputs it reads (`modality`) and the range its totals
fall in (`output_range`, inclusive; +-inf where unbounded). Model output is untrusted: a scorer
returns its worst value for a malformed item instead of raising; it raises only for items that
lack the inputs its modality requires (a caller error).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np

Modality = Literal["text", "image", "video", "image+text", "video+text"]
"""Inputs a scorer reads. "text" reads `response` (and `reference`/`prompt` where it needs them)."""

Scalar = str | int | float | bool
MetadataValue = Scalar | list[Scalar]


@dataclass(frozen=True)
class ScoreItem:
    """One thing to score.

    Attributes:
        prompt: conditioning text (text-to-image prompt, question).
        response: generated text to judge.
        reference: ground truth (gold answer, correct choice, expected text).
        image: uint8 array [H, W, 3] (RGB).
        video: uint8 array [T, H, W, 3] (RGB frames).
        metadata: scorer-specific scalars.
    """

    prompt: str | None = None
    response: str | None = None
    reference: str | None = None
    image: np.ndarray | None = None
    video: np.ndarray | None = None
    metadata: Mapping[str, MetadataValue] = field(default_factory=dict)


@dataclass(frozen=True)
class ScoreResult:
    """A scorer's answer for one item: `total` plus optional named sub-scores (`components`)."""

    total: float
    components: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not math.isfinite(self.total):
            raise ValueError(f"ScoreResult.total must be finite, got {self.total}")


@runtime_checkable
class Scorer(Protocol):
    """A batched reward function. See the module docstring for the contract."""

    @property
    def name(self) -> str:
        """Short stable identifier (e.g. "jpeg_incompressibility")."""
        ...

    @property
    def version(self) -> str:
        """Changes whenever the same inputs could score differently (code or weights)."""
        ...

    @property
    def modality(self) -> Modality: ...

    @property
    def output_range(self) -> tuple[float, float]: ...

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]: ...


_NEEDS: dict[str, tuple[str, ...]] = {
    "text": ("response",),
    "image": ("image",),
    "video": ("video",),
    "image+text": ("image", "prompt"),
    "video+text": ("video", "prompt"),
}


def required_inputs(modality: Modality) -> tuple[str, ...]:
    """The ScoreItem fields a scorer of `modality` needs (not None)."""
    return _NEEDS[modality]


def check_inputs(scorer_name: str, modality: Modality, items: Sequence[ScoreItem]) -> None:
    """Raise ValueError naming the first item that lacks an input `modality` requires."""
    for i, item in enumerate(items):
        for attr in _NEEDS[modality]:
            if getattr(item, attr) is None:
                raise ValueError(
                    f"scorer {scorer_name!r} (modality {modality!r}) needs item.{attr}, "
                    f"but item {i} has none; send it or remove this scorer"
                )
        if item.image is not None:
            _check_pixels(scorer_name, i, "image", item.image, 3)
        if item.video is not None:
            _check_pixels(scorer_name, i, "video", item.video, 4)


def _check_pixels(scorer: str, i: int, attr: str, arr: np.ndarray, ndim: int) -> None:
    if arr.dtype != np.uint8 or arr.ndim != ndim or arr.shape[-1] != 3:
        want = "[H, W, 3]" if ndim == 3 else "[T, H, W, 3]"
        raise ValueError(
            f"scorer {scorer!r}: item {i}.{attr} must be uint8 RGB {want}, got dtype {arr.dtype} "
            f"shape {tuple(arr.shape)}; convert with unirl.reward.media.to_rgb_uint8"
        )
