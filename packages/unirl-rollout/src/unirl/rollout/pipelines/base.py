"""The pipeline protocol: a stage that fills one Part of each Sample."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from unirl.types import Sample

__all__ = ["Pipeline"]


@runtime_checkable
class Pipeline(Protocol):
    """Samples one stage (e.g. ``"diffusion"`` or ``"ar"``) of a batch of Samples."""

    stage: str
    """Name of the Part this pipeline fills."""

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        """Append (or fill) the Part named ``stage`` of each Sample: segment, conditions, outputs,
        sampling params and status. Returns the same Sample objects."""
        ...
