"""The rollout-engine protocol: every sampling backend takes and returns Samples."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from torch import Tensor

from unirl.types import Sample, WeightStamp

__all__ = ["ClosableEngine", "DedicatedRolloutEngine", "EngineMetrics", "RolloutEngine"]


@runtime_checkable
class RolloutEngine(Protocol):
    """A sampling backend (``trainside``, ``sglang``, ``vllm``, ``composed``, ...)."""

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        """Fill the engine's generated Part(s) of each Sample; stamps each with the weight version used."""
        ...

    def wake_up(self) -> None:
        """Re-acquire device memory released by ``sleep`` (colocated train/rollout)."""
        ...

    def sleep(self) -> None:
        """Release device memory so training can use it (colocated); a no-op where nothing to free."""
        ...


@runtime_checkable
class DedicatedRolloutEngine(RolloutEngine, Protocol):
    """An engine with its own copy of the weights, updated through the weight plane."""

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], stamp: WeightStamp) -> WeightStamp:
        """Load new weights and return the stamp computed over what was received (must equal ``stamp``)."""
        ...


@runtime_checkable
class EngineMetrics(Protocol):
    """Optional engine capability: guard metrics of the rollouts since the last call (e.g. vLLM's
    log-prob parity), merged into the step's metrics."""

    def metrics(self) -> dict[str, float]: ...


@runtime_checkable
class ClosableEngine(Protocol):
    """Optional engine capability: release what the engine holds (a server process, a client)."""

    def close(self) -> None: ...
