"""Sample and Part: the typed boundary between rollout, reward and training."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from unirl.types.advantages import AdvantageConfig, compute_advantages
from unirl.types.base import SchemaModel
from unirl.types.media import Primitive, TextPrimitive
from unirl.types.params import SamplingParams
from unirl.types.reward import Reward
from unirl.types.segment import Segment
from unirl.types.tensor import Tensor

SCHEMA_VERSION = 4
"""Bump when the schema changes; unirl/types/sample.schema.json is its committed snapshot.
2: ``TextSegment.versions`` (partial rollouts: the policy version of each span of tokens)."""

PartStatus = Literal["pending", "completed", "truncated", "aborted"]
Scalar = str | int | float | bool


class Conditions(SchemaModel):
    """What replay needs besides the trajectory, computed once at rollout by frozen encoders.

    E.g. ``prompt_embeds`` / ``pooled_prompt_embeds`` and their ``negative_`` twins for CFG, so
    training never re-runs the text encoders. Tensors have no batch dimension (one Part).
    """

    tensors: dict[str, Tensor] = Field(default_factory=dict)

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"condition {name!r} missing; present: {sorted(self.tensors)}") from None


class Part(SchemaModel):
    """One stage's contribution to a Sample (e.g. the ``ar`` rewrite, the ``diffusion`` render)."""

    name: str = Field(min_length=1, description="stage name, unique within the Sample")
    parent: str | None = Field(default=None, description="name of the Part this one was conditioned on")
    segment: Segment | None = None
    conditions: Conditions | None = None
    outputs: list[Primitive] = Field(default_factory=list, description="decoded media / text")
    sampling_params: SamplingParams | None = None
    reward: Reward | None = None
    advantage: float | None = None
    status: PartStatus = "pending"
    weight_version: int | None = Field(default=None, ge=0, description="policy version that generated it")

    @property
    def text(self) -> str:
        """The first text output (generated text of an AR Part)."""
        for o in self.outputs:
            if isinstance(o, TextPrimitive):
                return o.text
        raise ValueError(f"part {self.name!r} has no text output")

    @classmethod
    def compute_advantages(
        cls,
        parts: Sequence[Part],
        group_ids: Sequence[str],
        config: AdvantageConfig | None = None,
    ) -> np.ndarray:
        """Fill ``advantage`` of each Part from its ``reward.total``, grouped by ``group_ids``."""
        missing = [i for i, p in enumerate(parts) if p.reward is None]
        if missing:
            raise ValueError(f"parts at {missing[:5]} have no reward; score them before computing advantages")
        adv = compute_advantages([p.reward.total for p in parts], group_ids, config)  # type: ignore[union-attr]
        for p, a in zip(parts, adv):
            p.advantage = float(a)
        return adv


class SampleMetadata(SchemaModel):
    """Typed facts about where a Sample came from."""

    dataset: str | None = None
    index: int | None = Field(default=None, ge=0, description="position in the dataset (data cursor)")
    split: Literal["train", "eval"] | None = None
    answer: str | None = Field(default=None, description="reference answer for verifiable rewards")
    spec: dict[str, Scalar | list[Scalar]] = Field(
        default_factory=dict, description="structured ground truth a programmatic checker reads"
    )
    labels: dict[str, Scalar] = Field(default_factory=dict, description="free labels for logging only")


class Sample(SchemaModel):
    """One prompt's one rollout: inputs, and the ordered lineage of generated Parts."""

    schema_version: int = SCHEMA_VERSION
    id: str = Field(min_length=1)
    group_id: str = Field(min_length=1, description="the prompt this sample belongs to; siblings share it")
    inputs: list[Primitive] = Field(default_factory=list)
    parts: list[Part] = Field(default_factory=list)
    metadata: SampleMetadata = Field(default_factory=SampleMetadata)

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version={v} but this unirl-types reads version {SCHEMA_VERSION}; "
                "re-generate the data or install the matching unirl-types"
            )
        return v

    @model_validator(mode="after")
    def _lineage(self) -> Sample:
        seen: set[str] = set()
        for p in self.parts:
            if p.name in seen:
                raise ValueError(f"sample {self.id!r}: duplicate part name {p.name!r}")
            if p.parent is not None and p.parent not in seen:
                raise ValueError(
                    f"sample {self.id!r}: part {p.name!r} has parent {p.parent!r}, which is not an earlier part"
                )
            seen.add(p.name)
        return self

    @property
    def prompt(self) -> str:
        """The first text input."""
        for x in self.inputs:
            if isinstance(x, TextPrimitive):
                return x.text
        raise ValueError(f"sample {self.id!r} has no text input")

    def part(self, name: str) -> Part:
        for p in self.parts:
            if p.name == name:
                return p
        raise KeyError(f"sample {self.id!r} has no part {name!r}; parts: {[p.name for p in self.parts]}")

    def ensure_part(self, name: str, parent: str | None = None) -> Part:
        """The Part named ``name``, appended (empty, pending) when absent."""
        for p in self.parts:
            if p.name == name:
                return p
        part = Part(name=name, parent=parent)
        self.parts.append(part)
        return part


def compute_sample_advantages(
    samples: Sequence[Sample], part_name: str, config: AdvantageConfig | None = None
) -> np.ndarray:
    """Advantages for ``part_name`` of each Sample, grouped by ``Sample.group_id``."""
    parts = [s.part(part_name) for s in samples]
    for s, p in zip(samples, parts):
        if p.reward is None:
            raise ValueError(f"sample {s.id!r} part {part_name!r} has no reward")
    adv = compute_advantages(
        [p.reward.total for p in parts],  # type: ignore[union-attr]
        [s.group_id for s in samples],
        config,
        sample_ids=[s.id for s in samples],
    )
    for p, a in zip(parts, adv):
        p.advantage = float(a)
    return adv


__all__ = [
    "SCHEMA_VERSION",
    "Conditions",
    "Part",
    "Sample",
    "SampleMetadata",
    "Tensor",
    "compute_sample_advantages",
]
