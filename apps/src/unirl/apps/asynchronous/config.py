"""``rl.buffer``: the bounds of the asynchronous lifecycle (``rl.lifecycle: async``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AsyncConfig(BaseModel):
    """How far rollout may run ahead of training.

    A policy *version* is the number of RL steps trained (one weight publication per step). A
    batch generated with version ``g`` and trained at version ``v`` has staleness ``v - g``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_staleness: int = Field(
        default=1,
        ge=0,
        description="versions a batch may lag the policy it trains: a rollout that would exceed it "
        "waits for newer weights; a buffered batch older than it is dropped (and counted). 0 is the "
        "synchronous run, step for step (rollout always waits for the latest weights)",
    )
    capacity: int = Field(
        default=2, ge=1, description="rollout batches (one RL step's groups each) buffered at most"
    )
    rollout_threads: int | None = Field(
        default=None,
        ge=1,
        description="torch CPU threads of the rollout thread (None = the recipe's `threads`); "
        "on a small CPU, 1 each for rollout and training lets the two run side by side",
    )
