"""The pipeline protocol: a stage that fills one Part of each Sample."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from unirl.types import Part, Sample

__all__ = ["Pipeline", "PreparesPrompts"]


@runtime_checkable
class Pipeline(Protocol):
    """Samples one stage (e.g. ``"diffusion"`` or ``"ar"``) of a batch of Samples."""

    stage: str
    """Name of the Part this pipeline fills."""

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        """Append (or fill) the Part named ``stage`` of each Sample: segment, conditions, outputs,
        sampling params and status. Returns the same Sample objects."""
        ...


@runtime_checkable
class PreparesPrompts(Protocol):
    """Optional AR-pipeline capability: build a Part's prompt ids itself, caching what replay needs
    on the Part (the VLM pipeline encodes the Sample's images into ``part.conditions`` once)."""

    def prepare_prompt(self, sample: Sample, part: Part) -> list[int]: ...
