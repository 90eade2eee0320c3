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
