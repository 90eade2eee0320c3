"""A GenEval-style programmatic checker for the shapes world (pure numpy).

Pipeline: classify each pixel by its dominant channel (red / green / blue, or background), split
each colour mask into 4-connected components, drop specks smaller than `min_area`, classify each
remaining component as a circle or square by how much of its bounding box it fills, then check the
spec: for every group the number of detected objects of its colour (and shape), no objects of
colours the spec does not mention, and the relation between the two groups' mean centroids.

`check_image` returns the per-check components and a binary `correct` (all checks pass); the
score (fraction of checks passed) is a denser reward for RL.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from unirl.reward.worlds.shapes_spec import COLOURS, ShapesSpec, parse_caption


@dataclass(frozen=True)
class CheckerConfig:
    """Thresholds of the checker (in uint8 pixel units and pixels).

    value_min: a pixel belongs to colour c when channel c >= value_min ...
    dominance: ... and channel c exceeds both other channels by at least `dominance`.
    min_area: components smaller than this many pixels are specks and ignored.
    square_fill: a component filling >= this fraction of its bounding box is a square (a raster
        disc fills ~0.75-0.8, a square 1.0).
    check_shape: when False, groups are matched on colour only.
    relation_margin: the mean centroids must differ by more than this many pixels on the axis.
    """

    value_min: int = 100
    dominance: int = 60
    min_area: int = 10
    square_fill: float = 0.9
    check_shape: bool = True
    relation_margin: float = 1.0


@dataclass(frozen=True)
class DetectedObject:
    """One connected component of one colour."""

    colour: str
    shape: str
    area: int
    cx: float  # column of the centroid (x grows to the right)
    cy: float  # row of the centroid (y grows downwards)


@dataclass(frozen=True)
class CheckResult:
    """Outcome of checking one image against one spec."""

    correct: bool
    score: float
    components: dict[str, float] = field(default_factory=dict)
    objects: tuple[DetectedObject, ...] = ()


def colour_masks(image_HWC: np.ndarray, cfg: CheckerConfig) -> dict[str, np.ndarray]:
    """Boolean [H, W] mask per colour: the channel is bright and dominates the other two."""
    img = image_HWC.astype(np.int32)
    masks: dict[str, np.ndarray] = {}
    for c, name in enumerate(COLOURS):
        others = np.delete(img, c, axis=2).max(axis=2)
        masks[name] = (img[..., c] >= cfg.value_min) & (img[..., c] - others >= cfg.dominance)
    return masks


def connected_components(mask_HW: np.ndarray) -> list[np.ndarray]:
    """4-connected components of a boolean mask, each as an [N, 2] array of (row, col)."""
    height, width = mask_HW.shape
    seen = np.zeros_like(mask_HW, dtype=bool)
    comps: list[np.ndarray] = []
    for r0, c0 in zip(*np.nonzero(mask_HW)):
        if seen[r0, c0]:
            continue
        seen[r0, c0] = True
        stack = [(int(r0), int(c0))]
        pixels = []
        while stack:
            r, c = stack.pop()
            pixels.append((r, c))
            for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if 0 <= rr < height and 0 <= cc < width and mask_HW[rr, cc] and not seen[rr, cc]:
                    seen[rr, cc] = True
                    stack.append((rr, cc))
        comps.append(np.asarray(pixels, dtype=np.int64))
    return comps


def classify_shape(pixels_N2: np.ndarray, cfg: CheckerConfig) -> str:
    """'square' if the component fills >= cfg.square_fill of its bounding box, else 'circle'."""
    rows, cols = pixels_N2[:, 0], pixels_N2[:, 1]
    box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
    return "square" if len(pixels_N2) / box >= cfg.square_fill else "circle"


def detect_objects(image_HWC: np.ndarray, cfg: CheckerConfig | None = None) -> list[DetectedObject]:
    """All coloured objects of an RGB uint8 image (specks below cfg.min_area dropped)."""
    cfg = cfg or CheckerConfig()
    image_HWC = _validate_image(image_HWC)
    found: list[DetectedObject] = []
    for name, mask in colour_masks(image_HWC, cfg).items():
        for pix in connected_components(mask):
            if len(pix) < cfg.min_area:
                continue
            cy, cx = pix.mean(axis=0)
            found.append(DetectedObject(name, classify_shape(pix, cfg), len(pix), float(cx), float(cy)))
    return found


def _relation_holds(relation: str, a: list[DetectedObject], b: list[DetectedObject], margin: float) -> bool:
    ax, ay = np.mean([o.cx for o in a]), np.mean([o.cy for o in a])
    bx, by = np.mean([o.cx for o in b]), np.mean([o.cy for o in b])
    if relation == "left of":
        return bool(ax < bx - margin)
    if relation == "right of":
        return bool(ax > bx + margin)
    if relation == "above":
        return bool(ay < by - margin)
    return bool(ay > by + margin)  # below


def check_objects(
    objects: list[DetectedObject], spec: ShapesSpec, cfg: CheckerConfig | None = None
) -> CheckResult:
    """Check detected objects against a spec (see module docstring for the checks)."""
    cfg = cfg or CheckerConfig()
    comps: dict[str, float] = {}
    members: list[list[DetectedObject]] = []
    for i, group in enumerate(spec.groups):
        same_colour = [o for o in objects if o.colour == group.colour]
        match = [o for o in same_colour if o.shape == group.shape] if cfg.check_shape else same_colour
        members.append(match)
        # Counting the whole colour (not just the matching shape) fails "a red circle" when a red
        # square is also drawn: every object of a mentioned colour must be one the spec asks for.
        comps[f"count_{i}"] = float(len(match) == group.count and len(same_colour) == group.count)
    spec_colours = {g.colour for g in spec.groups}
    comps["no_extra"] = float(all(o.colour in spec_colours for o in objects))
    if spec.relation is not None:
        ok = all(members) and _relation_holds(spec.relation, members[0], members[1], cfg.relation_margin)
        comps["relation"] = float(ok)
    score = float(np.mean(list(comps.values())))
    return CheckResult(correct=score == 1.0, score=score, components=comps, objects=tuple(objects))


def check_image(
    image_HWC: np.ndarray, spec: ShapesSpec | str, cfg: CheckerConfig | None = None
) -> CheckResult:
    """Check one RGB uint8 [H, W, 3] image against a spec or a caption of the shapes grammar."""
    cfg = cfg or CheckerConfig()
    if isinstance(spec, str):
        spec = parse_caption(spec)
    if not isinstance(spec, ShapesSpec):
        raise TypeError(f"spec must be ShapesSpec or a caption str, got {type(spec).__name__}")
    return check_objects(detect_objects(image_HWC, cfg), spec, cfg)


def _validate_image(image: np.ndarray) -> np.ndarray:
    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"image must be RGB [H, W, 3], got shape {tuple(arr.shape)}")
    if arr.dtype != np.uint8:
        raise TypeError(f"image must be uint8 (0..255), got dtype {arr.dtype}; convert with to_uint8 first")
    return arr
