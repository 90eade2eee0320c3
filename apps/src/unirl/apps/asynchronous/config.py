"""``rl.buffer``: the bounds of the asynchronous lifecycle (``rl.lifecycle: async``)."""

from __future__ import annotations

from typing import Literal

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
    partial_rollouts: bool = Field(
        default=False,
        description="AR only (slime / AReaL style): a generation in progress when a newer policy is "
        "published is interrupted (checked every `partial_chunk_tokens` decode steps), the rollout "
        "copy swaps to the new weights and decoding continues from the tokens already generated "
        "(prompt + prefix prefilled again with the new weights); nothing restarts, no token is "
        "dropped. Each token keeps the log-prob and version of the policy that sampled it "
        "(TextSegment.versions); a Sample's staleness counts from its oldest token",
    )
    partial_chunk_tokens: int = Field(
        default=16, ge=1, description="decode steps between checks for a newer policy (partial_rollouts only)"
    )


class LifecycleFields(BaseModel):
    """``rl.lifecycle`` and ``rl.buffer``, the same in every RL phase that offers both lifecycles."""

    lifecycle: Literal["sync", "async"] = Field(
        default="sync",
        description="sync: each step samples with the latest weights, then trains; async: a rollout "
        "thread samples with copies of the policy while the trainer trains, within `buffer`'s bounds",
    )
    buffer: AsyncConfig = Field(
        default_factory=AsyncConfig, description="async only: staleness bound and buffer capacity"
    )
