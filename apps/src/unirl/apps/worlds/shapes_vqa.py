"""A visual-question world over the shapes renderer: "how many red circles?", "what colour is the square?".

A scene is 1..``max_objects`` coloured circles / squares, each centred in its own cell of a
``grid_cells`` x ``grid_cells`` grid (the layout of ``ShapesWorld``'s grid mode), rasterised by
``unirl.apps.worlds.shapes.render``. Each scene gets one question with an exact answer:
- count: "how many {colour} {shape}s?" -> "0".."max_objects" (the asked pair is present in the
  scene with probability ``present_fraction``, else any pair: "0" is a real answer too);
- colour: "what colour is the {shape}?" -> "red" | "green" | "blue", asked only of a scene with
  exactly one object of that shape.

Held-out scenes are a fixed set drawn from their own seed; training scenes (RL records and the
endless SFT stream) never repeat one of them (exact layout and question compared). With
``sft_answer_noise`` p, each SFT answer is with probability p a random answer of its question's kind
(a noisy labeller): SFT then samples a wrong answer a fraction of the time on any machine, and only
the exact-answer reward removes it. RL records and held-out scenes keep their true answers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from unirl.apps.loop import PromptRecord
from unirl.apps.worlds.caption_noise import mislabel
from unirl.apps.worlds.shapes import PlacedObject, render
from unirl.reward.worlds.shapes_spec import PALETTE

COLOURS: tuple[str, ...] = tuple(PALETTE)
SHAPES: tuple[str, ...] = ("circle", "square")
QUESTION_KINDS = ("count", "colour")


@dataclass(frozen=True)
class VQAExample:
    """One scene and its question: ``image`` uint8 ``[H, W, 3]``, ``answer`` the exact reply."""

    image: np.ndarray
    question: str
    answer: str
    kind: Literal["count", "colour"]
    objects: tuple[PlacedObject, ...]

    @property
    def key(self) -> tuple[object, ...]:
        return (self.question, self.objects)


class ShapesVQAConfig(BaseModel):
    """The visual-question world's geometry, question mix and split sizes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["shapes_vqa"] = "shapes_vqa"
    resolution: int = Field(default=32, ge=8, description="image side in pixels")
    grid_cells: int = Field(default=4, ge=2, description="cells per side; one object per cell")
    gap: int = Field(default=2, ge=0, description="empty pixels between neighbouring objects")
    max_objects: int = Field(default=4, ge=1, description="objects per scene: 1..max_objects")
    colour_fraction: float = Field(
        default=0.4, ge=0, le=1, description="share of colour questions (when askable)"
    )
    present_fraction: float = Field(
        default=0.75, ge=0, le=1, description="count questions about a pair in the scene"
    )
    num_train: int = Field(default=2000, ge=1, description="RL training scenes")
    num_eval: int = Field(default=200, ge=1, description="held-out scenes")
    seed: int = Field(default=0, ge=0, description="seed of the two scene sets")
    sft_answer_noise: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="fraction of SFT answers replaced by a random answer of the question's kind "
        "(mislabelled data); RL and evaluation never see it",
    )  # fmt: skip

    def build(self) -> ShapesVQASource:
        return ShapesVQASource(self)


def make_example(cfg: ShapesVQAConfig, rng: np.random.Generator) -> VQAExample:
    """One random scene and question."""
    n_cells, cell = cfg.grid_cells, cfg.resolution // cfg.grid_cells
    size = max(cell - cfg.gap, 2)
    offset = (cell - size) // 2
    k = int(rng.integers(1, min(cfg.max_objects, n_cells * n_cells) + 1))
    cells = rng.permutation(n_cells * n_cells)[:k]
    objects = tuple(
        PlacedObject(
            COLOURS[int(rng.integers(len(COLOURS)))], SHAPES[int(rng.integers(len(SHAPES)))],
            int(c % n_cells) * cell + offset, int(c // n_cells) * cell + offset, size,
        )
        for c in sorted(cells.tolist())
    )  # fmt: skip
    image = render(objects, cfg.resolution)
    single = [s for s in SHAPES if sum(o.shape == s for o in objects) == 1]
    if single and rng.random() < cfg.colour_fraction:
        shape = single[int(rng.integers(len(single)))]
        colour = next(o.colour for o in objects if o.shape == shape)
        return VQAExample(image, f"what colour is the {shape}?", colour, "colour", objects)
    if rng.random() < cfg.present_fraction:
        o = objects[int(rng.integers(len(objects)))]
        colour, shape = o.colour, o.shape
    else:
        colour, shape = COLOURS[int(rng.integers(len(COLOURS)))], SHAPES[int(rng.integers(len(SHAPES)))]
    count = sum(o.colour == colour and o.shape == shape for o in objects)
    return VQAExample(image, f"how many {colour} {shape}s?", str(count), "count", objects)


def corpus() -> list[str]:
    """Every question and answer string of the world (what a tokenizer for it must cover)."""
    qs = [f"how many {c} {s}s?" for c in COLOURS for s in SHAPES] + [
        f"what colour is the {s}?" for s in SHAPES
    ]
    return [*qs, *COLOURS, *(str(i) for i in range(10))]


class ShapesVQASource:
    """Prompt records with images: RL training and held-out scenes, and an endless SFT stream."""

    name = "shapes_vqa"

    def __init__(self, cfg: ShapesVQAConfig) -> None:
        self.cfg = cfg
        self._held_keys: set[tuple[object, ...]] = set()
        self._held = self._fresh(cfg.num_eval, [cfg.seed, 1], distinct=True)
        self._held_keys = {e.key for e in self._held}
        self._train = self._fresh(cfg.num_train, [cfg.seed, 0])

    def _fresh(self, n: int, seed: list[int], *, distinct: bool = False) -> list[VQAExample]:
        """``n`` examples from ``seed``, none equal to a held-out one (``distinct``: nor to each other)."""
        out: list[VQAExample] = []
        seen: set[tuple[object, ...]] = set()
        i = 0
        while len(out) < n:
            e = make_example(self.cfg, np.random.default_rng([*seed, i]))
            i += 1
            if e.key in self._held_keys or (distinct and e.key in seen):
                continue
            seen.add(e.key)
            out.append(e)
        return out

    @staticmethod
    def _record(prefix: str, i: int, e: VQAExample) -> PromptRecord:
        return PromptRecord(
            id=f"{prefix}{i}", prompt=e.question, answer=e.answer, spec={"kind": e.kind}, images=(e.image,)
        )

    def train_records(self) -> list[PromptRecord]:
        return [self._record("t", i, e) for i, e in enumerate(self._train)]

    def eval_records(self) -> list[PromptRecord]:
        return [self._record("h", i, e) for i, e in enumerate(self._held)]

    def sft_records(self, n: int, *, seed: int, step: int) -> list[PromptRecord]:
        """``n`` fresh training examples for SFT step ``step`` (never a held-out scene), each answer
        mislabelled with probability ``sft_answer_noise`` (a draw from its kind's answers)."""
        examples = self._fresh(n, [self.cfg.seed, 2, seed, step])
        pools = {"count": [str(k) for k in range(self.cfg.max_objects + 1)], "colour": list(COLOURS)}
        for j, (kind, pool) in enumerate(pools.items()):
            idx = [i for i, e in enumerate(examples) if e.kind == kind]
            noisy = mislabel(
                [examples[i].answer for i in idx],
                pool,
                self.cfg.sft_answer_noise,
                seed=seed,
                step=2 * step + j,
            )
            for i, a in zip(idx, noisy, strict=True):
                examples[i] = replace(examples[i], answer=a)
        return [self._record(f"s{step}-", i, e) for i, e in enumerate(examples)]
