"""``EngineRolloutSide``: the async lifecycle on one process with a dedicated engine (vLLM).

The rollout thread drives the engine; the trainer never touches it during RL. After each RL step
the trainer ``publish``es a CPU snapshot of the policy into a ``WeightMailbox`` and trains on.
Between batches the rollout thread takes the newest snapshot: it loads it, verified, into a
rollout copy of the model (``RolloutCopy``: the snapshot's stamp recomputed, dtypes and shapes
checked, versions only forward), then pushes the copy's parameters into the engine through the
``engine`` weight plane, as the trainer does in the synchronous run (the engine checks the bytes
it loaded against their stamp, that its parameters changed, and a canary sequence against its
reference).

The copy (its pipeline and module) is the engine's parity reference during RL: the per-rollout
log-prob parity check replays through it and the canary scores with it, so both compare the
engine with weights of the engine's own version. The trained module, the reference of the
synchronous run, moves ahead of the engine while it samples, so it cannot serve. When the phase
ends, the engine takes the newest version and the trained module is its reference again.
"""

from __future__ import annotations

from typing import Any, Protocol

from unirl.apps.asynchronous.mailbox import RolloutCopy, WeightMailbox
from unirl.apps.asynchronous.source import HasRolloutCopy
from unirl.distributed.weightsync import EngineWeightPlane
from unirl.types import Sample


class EngineTrainer(HasRolloutCopy, Protocol):
    """What ``EngineRolloutSide`` reads of the ``ARTrainer``: its dedicated engine and the weight
    plane into it, its backend and a rollout copy of its policy."""

    @property
    def engine(self) -> Any:
        """The dedicated engine (a VLLMEngine): its ``pipeline`` and ``reference`` are swapped
        during RL, which no engine protocol has."""
        ...

    @property
    def weight_plane(self) -> EngineWeightPlane | None: ...


class EngineRolloutSide:
    """Implements ``unirl.apps.asynchronous.source.RolloutSide`` over the trainer's dedicated engine."""

    shared = True
    """The trainer's evaluations sample with the same engine: they borrow it between batches."""

    def __init__(self, trainer: EngineTrainer) -> None:
        """``trainer``: the ``ARTrainer`` (its engine, weight plane, backend and rollout copy)."""
        if trainer.weight_plane is None:
            raise TypeError("EngineRolloutSide needs a dedicated engine with a weight plane (rollout.engine)")
        self.trainer = trainer
        self.engine = trainer.engine
        self.plane = trainer.weight_plane
        self.mailbox = WeightMailbox()
        pipeline, module = trainer.rollout_copy()
        self.copy = RolloutCopy(module)
        # the trainer's pipeline and module: restored by close(). The engine's parity check
        # replays through its pipeline, the canary through its reference: both the copy's now
        self._held = (self.engine.pipeline, self.engine.reference)
        self.engine.pipeline, self.engine.reference = pipeline, self.copy.module

    # ---- the trainer's thread ---------------------------------------------------------------
    def publish(self, version: int) -> None:
        from unirl.apps.distributed.workers import policy_tensors

        t = self.trainer
        with t.rollout_weights():
            self.mailbox.publish(version, t.backend.global_step, policy_tensors(t.backend))

    # ---- the rollout thread -----------------------------------------------------------------
    def refresh(self, min_version: int) -> int:
        version = self.copy.refresh(self.mailbox, min_version)
        if self.copy.weight_version > self.engine.weight_version:
            self.plane.push(self.copy.module.named_parameters(), self.copy.weight_version)
        return version

    def generate(self, samples: list[Sample], step: int) -> list[Sample]:
        out: list[Sample] = self.engine.generate(samples, rollout_step=step)
        return out

    def metrics(self) -> dict[str, float]:
        return dict(self.engine.metrics())

    def close(self) -> None:
        """The engine takes the newest version (the final evaluation samples with it) and the
        trained module, equal to it now, is its reference again."""
        self.refresh(self.copy.version)
        self.engine.pipeline, self.engine.reference = self._held
