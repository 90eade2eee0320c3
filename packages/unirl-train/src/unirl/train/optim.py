"""AdamW and learning-rate schedules (pure step -> factor functions wrapped in LambdaLR).

Step convention: the learning rate of optimizer step k (0-based, k = number of steps already
applied) is `lr * schedule.factor(k)`. Warmup therefore starts at lr / warmup_steps, not 0,
so no step is wasted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator


class AdamWConfig(BaseModel):
    """torch.optim.AdamW settings; `fused` runs one kernel over all params (CUDA and CPU).

    On CPU the unfused default is a Python loop over the params; over FSDP's DTensors it cost
    82 ms a step for the 140 tensors of the tiny shapes U-Net, against 12 ms fused
    (experiments/bench_adamw_cpu.py, docs/benchmarks.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["adamw"] = "adamw"
    lr: float = Field(gt=0, description="Peak learning rate.")
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    fused: bool = Field(default=True, description="One fused kernel for all params (CUDA or CPU).")

    def build(self, params: Iterable[torch.nn.Parameter], device: torch.device) -> torch.optim.AdamW:
        """An AdamW over `params` (fused on CUDA and CPU, where torch has the kernel)."""
        params = list(params)
        if not params:
            raise ValueError(
                "the optimizer got no trainable parameters: check lora.target_modules or which "
                "modules are frozen"
            )
        fused = self.fused and device.type in ("cuda", "cpu")
        return torch.optim.AdamW(
            params,
            lr=self.lr,
            betas=self.betas,
            eps=self.eps,
            weight_decay=self.weight_decay,
            fused=fused or None,
        )


class ConstantSchedule(BaseModel):
    """factor(k) = 1."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["constant"] = "constant"

    def factor(self, step: int) -> float:
        return 1.0


class LinearWarmupSchedule(BaseModel):
    """factor(k) = (k + 1) / warmup_steps for k < warmup_steps, then 1."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["linear_warmup"] = "linear_warmup"
    warmup_steps: int = Field(ge=1)

    def factor(self, step: int) -> float:
        return warmup_factor(step, self.warmup_steps)


class CosineSchedule(BaseModel):
    """Linear warmup, then cosine from 1 down to `min_lr_ratio` at `total_steps` (flat afterwards).

    factor(k) = min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + cos(pi * p)),
    p = clamp((k - warmup_steps) / (total_steps - warmup_steps), 0, 1).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["cosine"] = "cosine"
    total_steps: int = Field(ge=1, description="Optimizer steps at which the decay reaches min_lr_ratio.")
    warmup_steps: int = Field(default=0, ge=0)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _check(self) -> CosineSchedule:
        if self.warmup_steps >= self.total_steps:
            raise ValueError(
                f"scheduler.warmup_steps={self.warmup_steps} must be < scheduler.total_steps="
                f"{self.total_steps}"
            )
        return self

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return warmup_factor(step, self.warmup_steps)
        p = min(max((step - self.warmup_steps) / (self.total_steps - self.warmup_steps), 0.0), 1.0)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


ScheduleConfig = Annotated[
    ConstantSchedule | LinearWarmupSchedule | CosineSchedule, Field(discriminator="kind")
]


def warmup_factor(step: int, warmup_steps: int) -> float:
    """(step + 1) / warmup_steps, capped at 1."""
    return min(1.0, (step + 1) / warmup_steps)


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    schedule: ConstantSchedule | LinearWarmupSchedule | CosineSchedule,
    *,
    start: int = 0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR whose factor at its `last_epoch` k is `schedule.factor(k)`, at k = `start`
    (> 0 needs each param group's ``initial_lr``, as torch's schedulers do)."""
    # A plain function (not a bound method) keeps LambdaLR.state_dict() free of objects.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: schedule.factor(k), last_epoch=start - 1
    )
    # As if stepped from 0: a scheduler rebuilt at a resumed phase's cursor then has the state
    # (``_step_count`` included) of the one the uninterrupted run stepped there.
    scheduler._step_count = start + 1
    return scheduler


def set_base_lr(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, lr: float
) -> None:
    """Change the base learning rate under ``scheduler``; its schedule keeps shaping it."""
    scheduler.base_lrs = [lr for _ in scheduler.base_lrs]
    for g, f in zip(optimizer.param_groups, scheduler.lr_lambdas):
        g["lr"] = lr * f(scheduler.last_epoch)


def phase_scheduler(
    optimizer: torch.optim.Optimizer, schedule: ScheduleConfig, lr: float, step: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A fresh scheduler for one training phase: ``lr * schedule.factor(k)`` at the phase's step
    ``k``, positioned at ``step`` (0 when the phase starts; the phase's cursor on resume, so a
    resumed phase continues the curve instead of restarting it)."""
    for g in optimizer.param_groups:
        g["lr"] = g["initial_lr"] = lr
    return build_scheduler(optimizer, schedule, start=step)
