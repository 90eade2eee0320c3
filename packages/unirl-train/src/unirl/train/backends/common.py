"""What every backend does the same way once its trainable parameters exist.

`OptimizedBackend` holds the trainable parameters by name, the AdamW optimizer and LR schedule
over them, the EMA, the frozen reference copy and the step counters, and implements the
protocol methods that only touch those (step, reset_optimizer, restart_ema, snapshot_reference,
ema_weights, the frozen-copy reference). A backend subclass builds the module and calls
`_init_optimization`; it supplies the total gradient norm (`_total_grad_norm`: sharded or
tensor-parallel gradients need their own reduction) and may reduce gradients before clipping
(`_reduce_grads`).
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist

from unirl.train.backends.base import StepStats
from unirl.train.ema import EMA, EMAConfig, swapped_weights
from unirl.train.optim import AdamWConfig, ScheduleConfig, build_scheduler


class OptimizedBackend:
    """Base of FSDPBackend and MegatronBackend: optimizer, schedule, EMA, reference, step."""

    config: Any
    device: torch.device
    trainable: dict[str, torch.nn.Parameter]

    def _init_optimization(
        self,
        trainable: dict[str, torch.nn.Parameter],
        optimizer: AdamWConfig,
        scheduler: ScheduleConfig,
        ema: EMAConfig | None,
        frozen_reference: bool,
    ) -> None:
        self.trainable = trainable
        self.optimizer = optimizer.build(trainable.values(), self.device)
        self.scheduler = build_scheduler(self.optimizer, scheduler)
        self.ema = EMA(trainable, ema) if ema is not None else None
        self._reference: dict[str, torch.Tensor] | None = None
        self._frozen_reference = frozen_reference
        if frozen_reference:
            self.snapshot_reference()
        self._step = 0
        self._ema_start = 0  # the step the EMA (re)started at: its ramp counts updates from there

    # -- hooks ----------------------------------------------------------------------------
    def _reduce_grads(self) -> None:
        """Make every rank's gradients the global ones before clipping (default: already are)."""

    def _total_grad_norm(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """The L2 norm of all gradients over all ranks (a tensor or a replicated DTensor; non-finite
        allowed). The default: torch's, which reduces DTensor (FSDP2) gradients itself."""
        return torch.nn.utils.get_total_norm([p.grad for p in params], error_if_nonfinite=False)

    # -- identity -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    @property
    def global_step(self) -> int:
        """Optimizer steps applied so far (skipped non-finite steps do not count)."""
        return self._step

    # -- training -------------------------------------------------------------------------
    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def reset_optimizer(self) -> None:
        """Drop the optimizer's per-parameter state (AdamW's moments and step counts); the
        weights, the schedule, the EMA and `global_step` are kept. A new phase that should not
        inherit the previous phase's moments (RL after SFT) calls this before its first step."""
        self.optimizer.state.clear()

    def restart_ema(self) -> None:
        """Restart the EMA at the current weights, its decay ramp from its first update (``d_k``
        with k counted from here). A phase whose EMA should not average the previous phase's
        weights (DiffusionNFT's old policy, RL after SFT) calls this before its first step."""
        if self.ema is None:
            raise ValueError("restart_ema() needs backend.ema to be configured (e.g. ema: {decay: 0.9})")
        self.ema.reset()
        self._ema_start = self._step

    def snapshot_reference(self) -> None:
        """Make the current trainable weights the frozen KL reference (``reference='frozen_copy'``).

        The copy is first taken when the backend is built; a phase that regularises towards the
        policy it starts from (RL after SFT) takes it again at its first step. It is checkpointed,
        so a resumed run keeps the reference its RL phase started with."""
        if not self._frozen_reference:
            raise ValueError(
                f"snapshot_reference() needs backend.reference='frozen_copy' (got {self.config.reference!r})"
            )
        self._reference = {n: p.detach().clone() for n, p in self.trainable.items()}

    def step(self) -> StepStats:
        """Clip to `grad_clip`, skip on a non-finite norm, else AdamW + schedule + EMA."""
        self._reduce_grads()
        params = [p for p in self.trainable.values() if p.grad is not None]
        norm = self._total_grad_norm(params)
        grad_norm = float(full_tensor(norm))
        # the rate this step applies: the optimizer's, which a phase's set_base_lr changes directly
        # (the scheduler's get_last_lr() keeps the previous phase's until its next step)
        lr = float(self.optimizer.param_groups[0]["lr"])
        if not math.isfinite(grad_norm):
            self.zero_grad()
            return StepStats(grad_norm=grad_norm, lr=lr, skipped_nonfinite=True, global_step=self._step)
        if self.config.grad_clip is not None:
            torch.nn.utils.clip_grads_with_norm_(params, self.config.grad_clip, norm)
        self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self._step - self._ema_start)
        self._step += 1
        self.zero_grad()
        return StepStats(grad_norm=grad_norm, lr=lr, skipped_nonfinite=False, global_step=self._step)

    # -- weight views ---------------------------------------------------------------------
    def ema_weights(self) -> AbstractContextManager[None]:
        """Context with the EMA weights swapped into `module` (EMA rollout, DiffusionNFT's old policy)."""
        if self.ema is None:
            raise ValueError("ema_weights() needs backend.ema to be configured (e.g. ema: {decay: 0.9})")
        return self.ema.applied()

    def _frozen_copy_weights(self) -> AbstractContextManager[None]:
        if self._reference is None:
            raise ValueError("reference_weights() needs backend.reference='frozen_copy' or 'lora_base'")
        return swapped_weights(self.trainable, self._reference)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (collective), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
