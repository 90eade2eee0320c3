"""Batch geometry: how one rollout shard is cut into optimizer steps and micro-batches.

Vocabulary (per rank):
- *shard*: the Parts this rank trains on for one rollout (what `TrainStack.train_on` receives);
- *update*: one pass over the shard (`num_updates_per_batch` passes reuse the same pi_old);
- *mini-batch*: the Parts of one optimizer step (`mini_batch_size`, default the whole shard);
- *micro-batch*: the Parts of one forward/backward (`micro_batch_size`); gradients of the
  micro-batches of a mini-batch are summed before the step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")


class BatchGeometry(BaseModel):
    """How a rollout shard is split into optimizer steps and micro-batches (sizes are per rank)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    micro_batch_size: int = Field(ge=1, description="Parts per forward/backward on one rank.")
    num_updates_per_batch: int = Field(
        default=1,
        ge=1,
        description="Passes over the shard per rollout; pi_old is frozen once before the first.",
    )
    mini_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="Parts per optimizer step on one rank; None = the whole shard (one step per pass).",
    )
    shuffle_seed: int | None = Field(
        default=None,
        description="Shuffle the shard before each pass with this seed (mixed with the pass index); "
        "None keeps the given order.",
    )

    def check_shard(self, shard_size: int) -> None:
        """Raise ValueError when this geometry cannot split a shard of `shard_size` Parts."""
        if shard_size < 1:
            raise ValueError("train_on got an empty shard: pass at least one Part")
        mini = self.mini_batch_size or shard_size
        if mini > shard_size:
            raise ValueError(
                f"geometry.mini_batch_size={mini} is larger than the shard ({shard_size} Parts on this "
                "rank); lower mini_batch_size or raise the rollout batch size"
            )
        if shard_size % mini:
            raise ValueError(
                f"the shard ({shard_size} Parts) is not divisible by geometry.mini_batch_size={mini}; "
                "pick a mini_batch_size that divides the per-rank shard"
            )
        if self.micro_batch_size > mini:
            raise ValueError(
                f"geometry.micro_batch_size={self.micro_batch_size} is larger than the mini-batch "
                f"({mini} Parts; shard {shard_size}, mini_batch_size={self.mini_batch_size}); "
                "lower micro_batch_size"
            )

    def mini_batches(self, shard: Sequence[T], update: int) -> list[list[T]]:
        """The mini-batches of pass `update` (0-based), shuffled when `shuffle_seed` is set."""
        self.check_shard(len(shard))
        order = list(shard)
        if self.shuffle_seed is not None:
            random.Random(self.shuffle_seed * 1_000_003 + update).shuffle(order)
        mini = self.mini_batch_size or len(order)
        return chunk(order, mini)

    def micro_batches(self, mini_batch: Sequence[T]) -> list[list[T]]:
        """The micro-batches of one mini-batch; the last one may be smaller."""
        return chunk(mini_batch, self.micro_batch_size)


def chunk(items: Sequence[T], size: int) -> list[list[T]]:
    """Consecutive slices of `items` of length `size` (the last one may be shorter)."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
