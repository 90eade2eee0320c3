"""The TrainBackend protocol: what TrainStack and the checkpoint code need from a backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class StepStats:
    """Outcome of one `TrainBackend.step()`.

    grad_norm is the total gradient norm before clipping (over all ranks); lr the learning
    rate the step used; skipped_nonfinite whether the step was skipped because the norm was
    inf/NaN (then parameters, optimizer state, scheduler, EMA and `global_step` are unchanged).
    """

    grad_norm: float
    lr: float
    skipped_nonfinite: bool
    global_step: int


@runtime_checkable
class TrainBackend(Protocol):
    """Owns a trainable module and everything that updates it.

    `module` is the (possibly sharded) model the pipeline runs; `global_step` counts the
    optimizer steps applied so far. Collective methods (`all_reduce`, `step`, `state_dict`,
    `load_state_dict`, `full_state_dict`) must be called on every rank in the same order.
    """

    @property
    def module(self) -> torch.nn.Module:
        """The (possibly sharded) model the pipeline runs (read-only here: a backend may narrow its type)."""
        ...

    @property
    def global_step(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def zero_grad(self) -> None:
        """Drop the accumulated gradients."""

    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool = True) -> None:
        """Accumulate the gradient of `loss` (a micro-batch's share of the mini-batch loss).

        `last_micro_batch` tells the backend this is the last backward before `step()` (a
        backend may defer its gradient reduction until then).
        """

    def step(self) -> StepStats:
        """Clip, skip if non-finite, optimizer step, scheduler step, EMA update."""

    def reset_optimizer(self) -> None:
        """Drop the optimizer state (moments, step counts); weights, schedule, EMA and step stay."""

    def all_reduce(self, values: Sequence[float], op: Literal["sum", "max"] = "sum") -> list[float]:
        """Reduce a few scalars over the data-parallel ranks."""

    def ema_weights(self) -> AbstractContextManager[None]:
        """Context in which `module` holds the EMA weights (error when EMA is off)."""

    def reference_weights(self) -> AbstractContextManager[None]:
        """Context in which `module` computes the frozen reference policy (for KL)."""

    def restart_ema(self) -> None:
        """Restart the EMA at the current weights, its decay ramp counted from here."""

    def snapshot_reference(self) -> None:
        """Make the current weights the frozen reference (a backend that keeps a frozen copy)."""

    def full_state_dict(self, merge_lora: bool = True) -> dict[str, torch.Tensor]:
        """Full (unsharded, CPU) weights for weight sync; LoRA merged into the base by default."""

    def state_dict(self) -> dict[str, Any]:
        """Training state to checkpoint: model (trainable), optimizer, scheduler, EMA, step."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""


@runtime_checkable
class MicroBatchRunner(Protocol):
    """Optional backend capability: run the forward and backward of an optimizer step's
    micro-batches itself (a pipeline schedule), instead of TrainStack's loop of ``loss_fn`` +
    ``backward``.

    ``loss_fn(micro_batch) -> (loss, metrics)`` is the StageAlgorithm's loss, already divided by
    the mini-batch's global totals (the backend must not rescale it); the result is each
    micro-batch's ``(loss value, metrics)`` in order, the same on every rank of the model's
    parallel group. Gradients accumulate as with `backward`; `step()` follows.
    """

    def run_micro_batches(
        self, micro: Sequence[Any], loss_fn: Callable[[Any], tuple[torch.Tensor, dict[str, float]]]
    ) -> list[tuple[float, dict[str, float]]]: ...


@runtime_checkable
class ExportsHFWeights(Protocol):
    """Optional backend capability: the trained weights under the Hugging Face model's names
    (megatron: its layers re-sharded by TP / PP, gathered), for a rollout copy built from the
    Hugging Face model. Collective."""

    def hf_param_names(self) -> list[str]:
        """The names, in the Hugging Face model's parameter order."""
        ...

    def named_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]: ...


@runtime_checkable
class SeparateRolloutCopy(Protocol):
    """Optional backend capability: decoding runs on a separate rollout copy of the model
    (``rollout_module``, megatron: the trained module is TP/PP-sharded), which ``sync_rollout()``
    brings up to the trained weights."""

    rollout_module: torch.nn.Module

    def sync_rollout(self) -> None: ...
