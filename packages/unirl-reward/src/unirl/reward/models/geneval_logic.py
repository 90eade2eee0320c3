"""GenEval-style checks on detector boxes: presence, count, colour, relative position (pure numpy).

A spec (from `ScoreItem.metadata`, i.e. `SampleMetadata.spec`) names what the image must show:
- `objects`: list of class names, e.g. ["cube", "ball"] (required)
- `counts`: exact count per object (optional; without it an object must appear at least once)
- `colors`: colour name per object, "" for any (optional; names from `PALETTE`)
- `position`: "left of" | "right of" | "above" | "below": objects[0] relative to objects[1]

Position follows GenEval's `relative_position` (Ghosh et al. 2023): centre offset shrunk by
0.1 x the summed box sizes, then a direction counts when its share of the unit offset > 0.5.
Colour is the nearest `PALETTE` entry to the mean RGB of the box's central half (a pixel rule
that fits synthetic worlds; GenEval itself classifies crops with CLIP).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

POSITION_THRESHOLD = 0.1
RELATIONS = ("left of", "right of", "above", "below")
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 180, 30),
    "blue": (30, 60, 220),
    "yellow": (230, 220, 40),
    "orange": (240, 140, 20),
    "purple": (140, 40, 180),
    "pink": (240, 130, 180),
    "brown": (120, 70, 30),
    "black": (15, 15, 15),
    "white": (240, 240, 240),
    "gray": (128, 128, 128),
}


@dataclass(frozen=True)
class Detection:
    """A box in pixel coordinates (x0, y0, x1, y1), its class label and confidence."""

    label: str
    score: float
    box: tuple[float, float, float, float]


@dataclass(frozen=True)
class Spec:
    objects: tuple[str, ...]
    counts: tuple[int, ...] | None = None
    colors: tuple[str, ...] | None = None
    position: str | None = None

    @classmethod
    def from_metadata(cls, meta: Mapping[str, object]) -> Spec:
        """Validate a metadata dict into a Spec; ValueError names the bad key."""
        objs = meta.get("objects")
        if not isinstance(objs, list) or not objs or not all(isinstance(o, str) and o for o in objs):
            raise ValueError(
                f"geneval spec needs metadata['objects'] = non-empty list of names, got {objs!r}"
            )
        counts, colors, pos = meta.get("counts"), meta.get("colors"), meta.get("position")
        if counts is not None and (
            not isinstance(counts, list)
            or len(counts) != len(objs)
            or not all(isinstance(c, int) and c >= 0 for c in counts)
        ):
            raise ValueError(f"metadata['counts'] must be {len(objs)} non-negative ints, got {counts!r}")
        if colors is not None and (
            not isinstance(colors, list)
            or len(colors) != len(objs)
            or not all(c == "" or c in PALETTE for c in colors)
        ):
            raise ValueError(
                f"metadata['colors'] must be {len(objs)} names from {sorted(PALETTE)} or '', got {colors!r}"
            )
        if pos is not None and (pos not in RELATIONS or len(objs) < 2):
            raise ValueError(f"metadata['position'] must be one of {RELATIONS} with two objects, got {pos!r}")
        return cls(tuple(objs), tuple(counts) if counts else None, tuple(colors) if colors else None, pos)  # type: ignore[arg-type]


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def nms(dets: Sequence[Detection], iou_threshold: float = 0.5) -> list[Detection]:
    """Greedy per-label non-maximum suppression (highest score first)."""
    kept: list[Detection] = []
    for d in sorted(dets, key=lambda d: -d.score):
        if all(k.label != d.label or iou(k.box, d.box) <= iou_threshold for k in kept):
            kept.append(d)
    return kept


def relative_position(a: Sequence[float], b: Sequence[float]) -> set[str]:
    """Relations of box a with respect to box b, GenEval's rule (see module docstring)."""
    boxes = np.array([a, b], dtype=np.float64).reshape(2, 2, 2)
    center_a, center_b = boxes.mean(axis=-2)
    dim_a, dim_b = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
    offset = center_a - center_b
    revised = np.maximum(np.abs(offset) - POSITION_THRESHOLD * (dim_a + dim_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    rel = set()
    if dx < -0.5:
        rel.add("left of")
    if dx > 0.5:
        rel.add("right of")
    if dy < -0.5:
        rel.add("above")
    if dy > 0.5:
        rel.add("below")
    return rel


def box_color(image: np.ndarray, box: Sequence[float]) -> str:
    """Nearest PALETTE colour to the mean RGB of the central half of the box."""
    x0, y0, x1, y1 = box
    cx0, cx1 = int(x0 + (x1 - x0) / 4), int(np.ceil(x1 - (x1 - x0) / 4))
    cy0, cy1 = int(y0 + (y1 - y0) / 4), int(np.ceil(y1 - (y1 - y0) / 4))
    crop = image[max(cy0, 0) : max(cy1, cy0 + 1), max(cx0, 0) : max(cx1, cx0 + 1)].reshape(-1, 3)
    if crop.size == 0:
        return ""
    mean = crop.astype(np.float64).mean(axis=0)
    return min(PALETTE, key=lambda k: float(np.sum((mean - np.array(PALETTE[k])) ** 2)))


def evaluate(spec: Spec, dets: Sequence[Detection], image: np.ndarray) -> dict[str, float]:
    """Per-check pass (1.0) / fail (0.0) for the checks the spec asks for, plus `strict` (all pass)."""
    by_label = {o: [d for d in dets if d.label == o] for o in spec.objects}
    checks: dict[str, float] = {}
    if spec.counts is None:
        checks["presence"] = float(all(by_label[o] for o in spec.objects))
    else:
        checks["count"] = float(all(len(by_label[o]) == c for o, c in zip(spec.objects, spec.counts)))
    if spec.colors is not None:
        ok = True
        for o, c in zip(spec.objects, spec.colors):
            if c:  # every detected instance must have the colour, and there must be one
                ok = ok and bool(by_label[o]) and all(box_color(image, d.box) == c for d in by_label[o])
        checks["color"] = float(ok)
    if spec.position is not None:
        a, b = by_label[spec.objects[0]], by_label[spec.objects[1]]
        checks["position"] = float(bool(a and b) and spec.position in relative_position(a[0].box, b[0].box))
    checks["strict"] = float(all(v == 1.0 for v in checks.values()))
    return checks
