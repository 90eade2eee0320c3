"""The moving-shapes video world's grammar and its programmatic checker (pure numpy).

A caption is ``"a <colour> <shape> moving <direction>"`` ("a red circle moving left"). The checker
reads a video frame by frame with the shapes checker's detector (dominant-channel colour masks,
4-connected components, fill-ratio shape) and aggregates over frames:

- ``object``: the fraction of frames showing exactly one object, of the caption's colour, and
  nothing else (a frame-level rate: one bad frame costs 1/F, not the whole video);
- ``shape``: the fraction of those clean frames whose object has the caption's shape;
- ``motion``: 1 when the object's centroid, from the first clean frame to the last, travels at
  least ``min_travel`` pixels in the caption's direction and at least twice as far along it as
  across it; also the ``travel`` (signed, pixels) is reported.

``score`` is the mean of the three (dense, for RL); ``correct`` needs all three to be 1.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs
from unirl.reward.worlds.shapes_checker import CheckerConfig, DetectedObject, detect_objects
from unirl.reward.worlds.shapes_spec import COLOURS

__all__ = [
    "DIRECTIONS",
    "VOCAB",
    "MotionCheck",
    "MotionCheckerConfig",
    "MotionSpec",
    "MovingShapesScorer",
    "all_motion_specs",
    "check_video",
]

SHAPES: tuple[str, ...] = ("circle", "square")
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
"""Direction -> unit (dx, dy) in image coordinates (x = column to the right, y = row downwards)."""
VOCAB: tuple[str, ...] = ("a", *COLOURS, *SHAPES, "moving", *DIRECTIONS)
"""Every word a caption uses (the tiny text encoder's vocabulary)."""


@dataclass(frozen=True)
class MotionSpec:
    """One object of ``colour`` and ``shape`` that moves in ``direction``."""

    colour: str
    shape: str
    direction: str

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("colour", self.colour, COLOURS),
            ("shape", self.shape, SHAPES),
            ("direction", self.direction, tuple(DIRECTIONS)),
        ):
            if value not in allowed:
                raise ValueError(f"MotionSpec.{name}={value!r}: allowed {allowed}")

    @property
    def caption(self) -> str:
        return f"a {self.colour} {self.shape} moving {self.direction}"

    @classmethod
    def parse(cls, caption: str) -> MotionSpec:
        """The spec of ``"a <colour> <shape> moving <direction>"``; ValueError for anything else."""
        words = caption.lower().split()
        if len(words) != 5 or words[0] != "a" or words[3] != "moving":
            raise ValueError(
                f"caption {caption!r} is not of the form 'a <colour> <shape> moving <direction>'"
            )
        return cls(words[1], words[2], words[4])


def all_motion_specs() -> list[MotionSpec]:
    """Every spec of the grammar in a fixed order (3 colours x 2 shapes x 4 directions = 24)."""
    return [MotionSpec(c, s, d) for c, s, d in itertools.product(COLOURS, SHAPES, DIRECTIONS)]


@dataclass(frozen=True)
class MotionCheckerConfig:
    """Thresholds: ``detector`` the per-frame detector (shapes checker), ``min_travel`` the centroid
    travel in pixels that counts as motion, ``check_shape`` False to skip the shape check (``shape``
    is then 1 whenever a clean frame exists)."""

    detector: CheckerConfig = field(default_factory=CheckerConfig)
    min_travel: float = 2.0
    check_shape: bool = True


@dataclass(frozen=True)
class MotionCheck:
    """Outcome of checking one video against one spec."""

    correct: bool
    score: float
    components: dict[str, float]
    per_frame: tuple[DetectedObject | None, ...]
    """The clean frame's object, or None for a frame that is not clean."""


def check_video(
    video_FHWC: np.ndarray, spec: MotionSpec | str, cfg: MotionCheckerConfig | None = None
) -> MotionCheck:
    """Check a uint8 video ``[F, H, W, 3]`` against a spec or caption (module docstring)."""
    cfg = cfg or MotionCheckerConfig()
    if isinstance(spec, str):
        spec = MotionSpec.parse(spec)
    video = np.asarray(video_FHWC)
    if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8:
        raise ValueError(f"video must be uint8 [F, H, W, 3], got {video.dtype} {list(video.shape)}")
    per_frame: list[DetectedObject | None] = []
    for frame in video:
        objects = detect_objects(frame, cfg.detector)
        ok = len(objects) == 1 and objects[0].colour == spec.colour
        per_frame.append(objects[0] if ok else None)
    clean = [o for o in per_frame if o is not None]
    obj_rate = len(clean) / len(per_frame)
    if not clean:
        shape_rate = 0.0
    elif cfg.check_shape:
        shape_rate = float(np.mean([o.shape == spec.shape for o in clean]))
    else:
        shape_rate = 1.0
    dx, dy = DIRECTIONS[spec.direction]
    travel = across = 0.0
    if len(clean) >= 2:
        mx, my = clean[-1].cx - clean[0].cx, clean[-1].cy - clean[0].cy
        travel = mx * dx + my * dy  # along the caption's direction (positive = the right way)
        across = abs(mx * dy) + abs(my * dx)
    moved = len(clean) >= 2 and travel >= cfg.min_travel and travel >= 2 * across
    comps = {"object": obj_rate, "shape": shape_rate, "motion": float(moved)}
    score = float(np.mean(list(comps.values())))
    return MotionCheck(
        correct=score == 1.0,
        score=score,
        components=comps | {"travel": float(travel)},
        per_frame=tuple(per_frame),
    )


class MovingShapesScorer:
    """Scores a moving-shapes video against its caption.

    reward="score": total = mean of object, shape and motion (dense, for RL); reward="correct":
    1.0 only when all three are 1. Components (always): correct, score, object, shape, motion,
    travel. A prompt outside the grammar is a caller error (ValueError).
    """

    modality: Modality = "video+text"
    output_range = (0.0, 1.0)
    version = "1"

    def __init__(
        self,
        reward: Literal["score", "correct"] = "score",
        check_shape: bool = True,
        min_travel: float = 2.0,
        name: str = "moving_shapes_checker",
    ) -> None:
        if reward not in ("score", "correct"):
            raise ValueError(f"MovingShapesScorer reward={reward!r}: allowed 'score' or 'correct'")
        self.reward = reward
        self.config = MotionCheckerConfig(min_travel=min_travel, check_shape=check_shape)
        self.name = name

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        out = []
        for i, item in enumerate(items):
            try:
                spec = MotionSpec.parse(str(item.prompt))
            except ValueError as err:
                raise ValueError(f"scorer {self.name!r}: item {i}: {err}") from err
            r = check_video(item.video, spec, self.config)  # type: ignore[arg-type]
            comps = {"correct": float(r.correct), "score": r.score, **r.components}
            out.append(ScoreResult(total=comps[self.reward], components=comps))
        return out
