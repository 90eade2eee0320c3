"""Weight-version stamps: which policy produced a Part, and what a weight sync published."""

from __future__ import annotations

from pydantic import Field

from unirl.types.base import SchemaModel


class WeightStamp(SchemaModel):
    """A published policy version: monotonically increasing ``version`` plus the weights' checksum.

    The trainer publishes one per weight sync; a receiver acknowledges it by returning the stamp it
    computed over what it received, which must equal the trainer's.
    """

    version: int = Field(ge=0)
    checksum: str = Field(min_length=1, description="deterministic hash over the synced tensors' bytes")
    num_tensors: int = Field(ge=0)
    num_bytes: int = Field(ge=0)

    def check_newer_than(self, current: int | None) -> None:
        """Reject a stale or repeated version (a receiver at ``current`` must only move forward)."""
        if current is not None and self.version <= current:
            raise ValueError(
                f"weight version {self.version} is not newer than the receiver's {current}: "
                "a stale or repeated sync was rejected"
            )


class VersionSpan(SchemaModel):
    """Response tokens ``start`` up to the next span's ``start`` (or the end) were sampled by one
    policy. A partial rollout (async lifecycle) continued across weight updates has several spans."""

    start: int = Field(ge=0, description="the span's first response token")
    version: int = Field(ge=0, description="policy version: RL steps trained (the async buffer's counter)")
    weight_version: int = Field(ge=0, description="its optimizer step (the counter of Part.weight_version)")
