"""The procedural shapes world: seeded (image, caption, spec) triples on a flat black background.

The grammar (specs, captions, palette) lives in `unirl.reward.worlds.shapes_spec` so the checker
and the generator share it. This module samples specs from a split, lays objects out without
overlap (with a gap so same-coloured objects never touch), and rasterises them.

Splits are disjoint by *meaning*: a spec and its mirrored caption ("A left of B" / "B right of A")
always land on the same side, so no held-out caption, nor an equivalent of it, is seen in training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import numpy as np

from unirl.reward.worlds.shapes_spec import (
    BACKGROUND,
    PALETTE,
    ShapesSpec,
    all_specs,
    parse_caption,
    spec_to_caption,
)

Split = Literal["train", "held_out", "all"]


@dataclass(frozen=True)
class ShapesWorldConfig:
    """Geometry and split of the shapes world.

    resolution: image side in pixels (square RGB images).
    size_min, size_max: object side / diameter in pixels, drawn uniformly per object (inclusive).
    gap: minimum empty pixels between two objects' bounding boxes (so components never merge).
    held_out_fraction: fraction of the meaning classes (canonical specs) held out, per kind.
    split_seed: seed of the split permutation (independent of the sampling seed).
    max_count_single, max_count_pair: largest group size in one-group / relation captions.
    include_single, include_pairs, shapes, relations: the sub-grammar (e.g. one shape only, or no
        relation captions) for an easier world.
    layout: "free" places objects anywhere (pixel positions); "grid" centres each object in one
        cell of a `grid_cells` x `grid_cells` grid (objects of side cell - gap): fewer layouts, so a
        tiny model learns it in far fewer steps.
    """

    resolution: int = 32
    size_min: int = 7
    size_max: int = 9
    gap: int = 2
    held_out_fraction: float = 0.2
    split_seed: int = 0
    max_count_single: int = 3
    max_count_pair: int = 2
    layout: Literal["free", "grid"] = "free"
    grid_cells: int = 4
    include_single: bool = True
    include_pairs: bool = True
    shapes: tuple[str, ...] = ("circle", "square")
    relations: tuple[str, ...] = ("left of", "right of", "above", "below")

    def __post_init__(self) -> None:
        if self.layout not in ("free", "grid"):
            raise ValueError(f"layout={self.layout!r}: allowed 'free' or 'grid'")
        if self.layout == "grid":
            cell = self.resolution // max(self.grid_cells, 1)
            if self.grid_cells < 2 or self.resolution % self.grid_cells or cell - self.gap < 3:
                raise ValueError(
                    f"layout='grid' needs resolution ({self.resolution}) divisible by grid_cells "
                    f"({self.grid_cells}) >= 2 with cell side - gap >= 3 pixels"
                )
        if not 1 <= self.size_min <= self.size_max:
            raise ValueError(f"size_min={self.size_min}, size_max={self.size_max}: need 1 <= min <= max")
        if self.resolution < 2 * (self.size_max + self.gap) + 2:
            raise ValueError(
                f"resolution={self.resolution} too small for two objects of size_max={self.size_max} "
                f"with gap={self.gap}; use resolution >= {2 * (self.size_max + self.gap) + 2}"
            )
        if not 0.0 < self.held_out_fraction < 1.0:
            raise ValueError(f"held_out_fraction={self.held_out_fraction}: must be in (0, 1)")


@dataclass(frozen=True)
class PlacedObject:
    """One object on the canvas: top-left corner (x = column, y = row) and side `size`."""

    colour: str
    shape: str
    x: int
    y: int
    size: int


@dataclass(frozen=True)
class ShapesExample:
    """One world sample: uint8 [H, W, 3] image, its caption and its spec."""

    image: np.ndarray
    caption: str
    spec: ShapesSpec
    objects: tuple[PlacedObject, ...]


def render(objects: list[PlacedObject] | tuple[PlacedObject, ...], resolution: int) -> np.ndarray:
    """Rasterise objects onto a black canvas; circles are discs inscribed in their box."""
    image = np.empty((resolution, resolution, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    rows, cols = np.mgrid[0:resolution, 0:resolution] + 0.5  # pixel centres
    for obj in objects:
        if obj.shape == "square":
            mask = (cols >= obj.x) & (cols < obj.x + obj.size) & (rows >= obj.y) & (rows < obj.y + obj.size)
        else:
            r = obj.size / 2.0
            mask = (cols - obj.x - r) ** 2 + (rows - obj.y - r) ** 2 <= r * r
        image[mask] = PALETTE[obj.colour]
    return image


def _separated(a: PlacedObject, b: PlacedObject, gap: int) -> bool:
    return (
        a.x + a.size + gap <= b.x
        or b.x + b.size + gap <= a.x
        or a.y + a.size + gap <= b.y
        or b.y + b.size + gap <= a.y
    )


def relation_satisfied(
    relation: str | None,
    first: list[PlacedObject] | tuple[PlacedObject, ...],
    second: list[PlacedObject] | tuple[PlacedObject, ...],
) -> bool:
    """Every object of the first group lies strictly on the named side of every object of the second."""
    if relation is None:
        return True
    if relation == "left of":
        return max(o.x + o.size for o in first) <= min(o.x for o in second)
    if relation == "right of":
        return max(o.x + o.size for o in second) <= min(o.x for o in first)
    if relation == "above":
        return max(o.y + o.size for o in first) <= min(o.y for o in second)
    return max(o.y + o.size for o in second) <= min(o.y for o in first)  # below


class ShapesWorld:
    """Seeded generator of shapes-world examples with disjoint train / held-out caption splits."""

    def __init__(self, config: ShapesWorldConfig | None = None) -> None:
        self.config = config or ShapesWorldConfig()
        cfg = self.config
        specs = all_specs(
            cfg.max_count_single,
            cfg.max_count_pair,
            include_single=cfg.include_single,
            include_pairs=cfg.include_pairs,
            shapes=cfg.shapes,
            relations=cfg.relations,
        )
        if not specs:
            raise ValueError("ShapesWorldConfig selects no captions: enable include_single or include_pairs")
        self._train, self._held_out = self._split(specs)

    def _split(self, specs: list[ShapesSpec]) -> tuple[list[ShapesSpec], list[ShapesSpec]]:
        # Held out whole meaning classes (canonical specs), stratified by the number of groups.
        rng = random.Random(self.config.split_seed)
        held: set[str] = set()
        for n_groups in (1, 2):
            keys = sorted({spec_to_caption(s.canonical()) for s in specs if len(s.groups) == n_groups})
            if not keys:
                continue
            rng.shuffle(keys)
            held.update(keys[: max(1, round(self.config.held_out_fraction * len(keys)))])
        train = [s for s in specs if spec_to_caption(s.canonical()) not in held]
        held_out = [s for s in specs if spec_to_caption(s.canonical()) in held]
        return train, held_out

    def specs(self, split: Split) -> list[ShapesSpec]:
        """The specs of a split, in a fixed order."""
        if split == "train":
            return list(self._train)
        if split == "held_out":
            return list(self._held_out)
        if split == "all":
            return self._train + self._held_out
        raise ValueError(f"split={split!r}: allowed 'train', 'held_out', 'all'")

    def captions(self, split: Split) -> list[str]:
        """The captions of a split, in a fixed order."""
        return [spec_to_caption(s) for s in self.specs(split)]

    def layout(self, spec: ShapesSpec, rng: np.random.Generator, max_tries: int = 200) -> list[PlacedObject]:
        """Random non-overlapping placement of the spec's objects that satisfies its relation.

        A relation picks a random split line along its axis; the first group is placed on one side
        and the second on the other, then objects are placed one by one with per-object rejection.
        """
        cfg = self.config
        if cfg.layout == "grid":
            return self._grid_layout(spec, rng, max_tries)
        res, smax = cfg.resolution, cfg.size_max
        for _ in range(max_tries):
            # (lo, hi) ranges of the top-left coordinate per group and axis, before subtracting size.
            ranges = [[(1, res - 1), (1, res - 1)] for _ in spec.groups]
            if spec.relation is not None:
                axis = 0 if spec.relation in ("left of", "right of") else 1
                k = int(rng.integers(1 + smax, res - smax))  # split line: first|second side
                near, far = (0, 1) if spec.relation in ("left of", "above") else (1, 0)
                ranges[near][axis] = (1, k)
                ranges[far][axis] = (k, res - 1)
            placed: list[PlacedObject] = []
            ok = True
            for gi, group in enumerate(spec.groups):
                for _ in range(group.count):
                    obj = self._place(group.colour, group.shape, ranges[gi], placed, rng)
                    if obj is None:
                        ok = False
                        break
                    placed.append(obj)
                if not ok:
                    break
            if ok:
                return placed
        raise RuntimeError(
            f"no layout for {spec_to_caption(spec)!r} in {max_tries} tries; enlarge resolution"
        )

    def _grid_layout(self, spec: ShapesSpec, rng: np.random.Generator, max_tries: int) -> list[PlacedObject]:
        """Each object centred in its own grid cell; relations hold strictly between cell rows/cols."""
        cfg = self.config
        n, cell = cfg.grid_cells, cfg.resolution // cfg.grid_cells
        size = min(cfg.size_max, cell - cfg.gap)
        offset = (cell - size) // 2
        for _ in range(max_tries):
            cells = rng.permutation(n * n)[: spec.num_objects]
            rows, cols = cells // n, cells % n
            k = spec.groups[0].count
            placed = [
                PlacedObject(g.colour, g.shape, int(c) * cell + offset, int(r) * cell + offset, size)
                for g, r, c in zip(
                    [g for g in spec.groups for _ in range(g.count)], rows.tolist(), cols.tolist()
                )
            ]
            if relation_satisfied(spec.relation, placed[:k], placed[k:]):
                return placed
        raise RuntimeError(f"no grid layout for {spec_to_caption(spec)!r} in {max_tries} tries")

    def _place(
        self,
        colour: str,
        shape: str,
        ranges: list[tuple[int, int]],
        placed: list[PlacedObject],
        rng: np.random.Generator,
        tries: int = 30,
    ) -> PlacedObject | None:
        """One object whose box lies in [lo, hi) on each axis and clears every placed object."""
        cfg = self.config
        for _ in range(tries):
            size = int(rng.integers(cfg.size_min, cfg.size_max + 1))
            (xlo, xhi), (ylo, yhi) = ranges
            if xhi - size < xlo or yhi - size < ylo:
                return None
            obj = PlacedObject(
                colour,
                shape,
                int(rng.integers(xlo, xhi - size + 1)),
                int(rng.integers(ylo, yhi - size + 1)),
                size,
            )
            if all(_separated(obj, o, cfg.gap) for o in placed):
                return obj
        return None

    def example(self, spec: ShapesSpec | str, rng: np.random.Generator) -> ShapesExample:
        """Render one example of a given spec (or caption) with a random layout."""
        if isinstance(spec, str):
            spec = parse_caption(spec)
        objects = self.layout(spec, rng)
        image = render(objects, self.config.resolution)
        return ShapesExample(image=image, caption=spec_to_caption(spec), spec=spec, objects=tuple(objects))

    def sample(self, n: int, seed: int, split: Split = "train") -> list[ShapesExample]:
        """`n` examples with specs drawn uniformly from `split`.

        Example i is a pure function of (seed, i, split), so `sample(4, s)` is a prefix of `sample(16, s)`.
        """
        specs = self.specs(split)
        out = []
        for i in range(n):
            rng = np.random.default_rng([seed, i])
            out.append(self.example(specs[int(rng.integers(len(specs)))], rng))
        return out


def images_to_unit(images_BHWC: np.ndarray) -> np.ndarray:
    """uint8 [B, H, W, 3] -> float32 [B, 3, H, W] in [-1, 1] (the model's pixel space)."""
    return (images_BHWC.astype(np.float32) / 127.5 - 1.0).transpose(0, 3, 1, 2)


def unit_to_images(x_BCHW: np.ndarray) -> np.ndarray:
    """float [B, 3, H, W] in [-1, 1] -> uint8 [B, H, W, 3] (clipped and rounded)."""
    return (
        np.clip((np.asarray(x_BCHW, dtype=np.float32) + 1.0) * 127.5 + 0.5, 0, 255)
        .astype(np.uint8)
        .transpose(0, 2, 3, 1)
    )
