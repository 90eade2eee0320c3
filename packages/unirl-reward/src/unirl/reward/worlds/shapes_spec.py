"""The grammar of the procedural shapes world: structured specs, captions, and the colour palette.

A spec is one or two object groups. One group: ``"two red circles"`` (count 1..3). Two groups: each
group holds 1..2 objects of one colour and shape, the colours differ, and a spatial relation holds
between the groups: ``"two red circles left of a blue square"``. Captions and specs round-trip
exactly (`spec_to_caption`, `parse_caption`).

This module is pure Python (no numpy, no torch) so that the world generator (unirl.apps) and the
checker (unirl.reward) share one grammar.
"""

from __future__ import annotations

from dataclasses import dataclass

COLOURS: tuple[str, ...] = ("red", "green", "blue")
SHAPES: tuple[str, ...] = ("circle", "square")
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
# RGB of each colour on the black background. Pure primaries keep segmentation a per-pixel
# "which channel dominates" test that survives the blur of an undertrained generator.
PALETTE: dict[str, tuple[int, int, int]] = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
BACKGROUND: tuple[int, int, int] = (0, 0, 0)

_COUNT_WORDS: dict[int, str] = {1: "a", 2: "two", 3: "three"}
_WORD_COUNTS: dict[str, int] = {"a": 1, "one": 1, "two": 2, "three": 3}
# Every word a caption can contain (the tiny text encoder's vocabulary).
VOCAB: tuple[str, ...] = (
    "a",
    "two",
    "three",
    *COLOURS,
    *SHAPES,
    *(s + "s" for s in SHAPES),
    "left",
    "right",
    "of",
    "above",
    "below",
)


@dataclass(frozen=True)
class ObjectGroup:
    """`count` objects that share one `colour` and one `shape`."""

    count: int
    colour: str
    shape: str

    def __post_init__(self) -> None:
        if self.count not in _COUNT_WORDS:
            raise ValueError(f"ObjectGroup.count={self.count!r}: allowed 1, 2 or 3")
        if self.colour not in COLOURS:
            raise ValueError(f"ObjectGroup.colour={self.colour!r}: allowed {COLOURS}")
        if self.shape not in SHAPES:
            raise ValueError(f"ObjectGroup.shape={self.shape!r}: allowed {SHAPES}")


@dataclass(frozen=True)
class ShapesSpec:
    """What an image must show: one group, or two differently coloured groups and a relation.

    `relation` reads "groups[0] <relation> groups[1]" ("above" = smaller row index).
    """

    groups: tuple[ObjectGroup, ...]
    relation: str | None = None

    def __post_init__(self) -> None:
        if len(self.groups) not in (1, 2):
            raise ValueError(f"ShapesSpec.groups has {len(self.groups)} groups: allowed 1 or 2")
        if len(self.groups) == 1 and self.relation is not None:
            raise ValueError(f"ShapesSpec.relation={self.relation!r} needs two groups; got one")
        if len(self.groups) == 2:
            if self.relation not in RELATIONS:
                raise ValueError(f"ShapesSpec.relation={self.relation!r}: allowed {RELATIONS}")
            if self.groups[0].colour == self.groups[1].colour:
                raise ValueError(
                    f"ShapesSpec groups share colour {self.groups[0].colour!r}: the two groups of a "
                    "relation must have different colours (the checker segments by colour)"
                )

    @property
    def num_objects(self) -> int:
        return sum(g.count for g in self.groups)

    def canonical(self) -> ShapesSpec:
        """The equivalent spec with the relation normalised ("B right of A" -> "A left of B")."""
        if self.relation in ("right of", "below"):
            flipped = {"right of": "left of", "below": "above"}[self.relation]
            return ShapesSpec(groups=(self.groups[1], self.groups[0]), relation=flipped)
        return self


def _group_phrase(group: ObjectGroup) -> str:
    noun = group.shape + ("s" if group.count > 1 else "")
    return f"{_COUNT_WORDS[group.count]} {group.colour} {noun}"


def spec_to_caption(spec: ShapesSpec) -> str:
    """The caption of a spec, e.g. ``"two red circles left of a blue square"``."""
    head = _group_phrase(spec.groups[0])
    if spec.relation is None:
        return head
    return f"{head} {spec.relation} {_group_phrase(spec.groups[1])}"


def _parse_group(words: list[str], caption: str) -> ObjectGroup:
    if len(words) != 3:
        raise ValueError(f"caption {caption!r}: expected '<count> <colour> <shape>', got {' '.join(words)!r}")
    count_word, colour, noun = words
    if count_word not in _WORD_COUNTS:
        raise ValueError(
            f"caption {caption!r}: unknown count word {count_word!r}; allowed {list(_WORD_COUNTS)}"
        )
    count = _WORD_COUNTS[count_word]
    shape = noun[:-1] if noun.endswith("s") else noun
    if (count > 1) != noun.endswith("s"):
        raise ValueError(f"caption {caption!r}: count {count_word!r} disagrees with noun {noun!r}")
    return ObjectGroup(count=count, colour=colour, shape=shape)


def parse_caption(caption: str) -> ShapesSpec:
    """Parse a caption of the shapes grammar back into its spec; ValueError if it is not one."""
    if not isinstance(caption, str):
        raise TypeError(f"caption must be str, got {type(caption).__name__}")
    words = caption.strip().lower().split()
    for i, word in enumerate(words):
        two = " ".join(words[i : i + 2])
        if two in ("left of", "right of") or word in ("above", "below"):
            rel_len = 2 if two in ("left of", "right of") else 1
            relation = two if rel_len == 2 else word
            first = _parse_group(words[:i], caption)
            second = _parse_group(words[i + rel_len :], caption)
            return ShapesSpec(groups=(first, second), relation=relation)
    return ShapesSpec(groups=(_parse_group(words, caption),))


def all_specs(
    max_count_single: int = 3,
    max_count_pair: int = 2,
    *,
    include_single: bool = True,
    include_pairs: bool = True,
    shapes: tuple[str, ...] = SHAPES,
    relations: tuple[str, ...] = RELATIONS,
) -> list[ShapesSpec]:
    """Every spec of the grammar (or of a sub-grammar), in a fixed order.

    Defaults: 18 single-group specs (3 counts x 3 colours x 2 shapes) + 384 relation specs.
    """
    bad = [s for s in shapes if s not in SHAPES] + [r for r in relations if r not in RELATIONS]
    if bad or not shapes:
        raise ValueError(f"unknown shapes/relations {bad!r}: allowed {SHAPES} and {RELATIONS}")
    specs: list[ShapesSpec] = []
    if include_single:
        for count in range(1, max_count_single + 1):
            for colour in COLOURS:
                for shape in shapes:
                    specs.append(ShapesSpec(groups=(ObjectGroup(count, colour, shape),)))
    if include_pairs:
        for relation in relations:
            for c1 in COLOURS:
                for s1 in shapes:
                    for n1 in range(1, max_count_pair + 1):
                        for c2 in COLOURS:
                            if c2 == c1:
                                continue
                            for s2 in shapes:
                                for n2 in range(1, max_count_pair + 1):
                                    groups = (ObjectGroup(n1, c1, s1), ObjectGroup(n2, c2, s2))
                                    specs.append(ShapesSpec(groups=groups, relation=relation))
    return specs
