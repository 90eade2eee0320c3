"""Sigma schedules for flow-matching sampling, computed exactly as diffusers does.

The schedule (T + 1 sigmas, terminal 0) is computed once per request and pinned on the Part's
sampling params; rollout and replay both read that list. Two families:

- static shift (SD3 / SD3.5): diffusers ``FlowMatchEulerDiscreteScheduler(shift=s).set_timesteps(T)``.
  Trap: it shifts T points of ``linspace(sigma_max, sigma_min)`` where ``sigma_min`` is the already
  shifted ``1 / num_train_timesteps`` and appends 0 — NOT ``linspace(1, 0, T + 1)``.
- dynamic (resolution-dependent) shift (FLUX, Qwen-Image): ``mu`` is linear in the image token
  count (``calculate_shift``), sigmas are ``time_shift(mu, 1, t)``. FLUX/Qwen-Image pipelines pass
  ``t = linspace(1, 1/T, T)`` (``base_grid="pipeline"``); plain ``set_timesteps(T, mu=mu)`` uses
  ``linspace(1, 1/num_train_timesteps, T)`` (``base_grid="scheduler"``).

The arithmetic (dtypes and order of operations) mirrors diffusers 0.3x so the values match bit for
bit; tests compare against the real scheduler.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DynamicShiftSchedule",
    "SigmaScheduleConfig",
    "StaticShiftSchedule",
    "calculate_shift",
    "dynamic_shifted_sigmas",
    "static_shifted_sigmas",
]


def _train_sigma_range(num_train_timesteps: int, shift: float | None) -> tuple[float, float]:
    """(sigma_max, sigma_min) as diffusers' scheduler __init__ computes them (torch fp32)."""
    t = torch.from_numpy(np.array([num_train_timesteps, 1], dtype=np.float32))
    s = t / num_train_timesteps
    if shift is not None:
        s = shift * s / (1 + (shift - 1) * s)
    return s[0].item(), s[1].item()


def _check_steps(num_steps: int) -> None:
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")


def _finish(sigmas: np.ndarray, shift_terminal: float | None) -> list[float]:
    if shift_terminal:
        one_minus_z = 1 - sigmas
        scale_factor = one_minus_z[-1] / (1 - shift_terminal)
        sigmas = 1 - (one_minus_z / scale_factor)
    out = torch.from_numpy(np.asarray(sigmas)).to(dtype=torch.float32)
    return [*out.tolist(), 0.0]


def static_shifted_sigmas(
    num_steps: int,
    shift: float = 3.0,
    *,
    num_train_timesteps: int = 1000,
    shift_terminal: float | None = None,
) -> list[float]:
    """T + 1 sigmas of ``FlowMatchEulerDiscreteScheduler(shift=shift).set_timesteps(num_steps)``."""
    _check_steps(num_steps)
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    sigma_max, sigma_min = _train_sigma_range(num_train_timesteps, shift)
    timesteps = np.linspace(sigma_max * num_train_timesteps, sigma_min * num_train_timesteps, num_steps)
    sigmas = timesteps / num_train_timesteps
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    return _finish(sigmas, shift_terminal)


def calculate_shift(
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """FLUX's resolution-dependent ``mu``: linear in the image token count (diffusers ``calculate_shift``)."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return image_seq_len * m + b


def dynamic_shifted_sigmas(
    num_steps: int,
    mu: float,
    *,
    time_shift_type: Literal["exponential", "linear"] = "exponential",
    base_grid: Literal["pipeline", "scheduler"] = "pipeline",
    num_train_timesteps: int = 1000,
    shift_terminal: float | None = None,
) -> list[float]:
    """T + 1 sigmas of ``set_timesteps(..., mu=mu)`` on a scheduler with ``use_dynamic_shifting``.

    ``base_grid="pipeline"``: the grid FLUX / Qwen-Image pipelines pass, ``linspace(1, 1/T, T)`` (fp32).
    ``base_grid="scheduler"``: the scheduler's own ``linspace(1, 1/num_train_timesteps, T)`` (fp64).
    """
    _check_steps(num_steps)
    t: np.ndarray
    if base_grid == "pipeline":
        t = np.array(np.linspace(1.0, 1 / num_steps, num_steps)).astype(np.float32)
    elif base_grid == "scheduler":
        sigma_max, sigma_min = _train_sigma_range(num_train_timesteps, None)
        t = np.linspace(sigma_max * num_train_timesteps, sigma_min * num_train_timesteps, num_steps)
        t = t / num_train_timesteps
    else:
        raise ValueError(f"base_grid={base_grid!r} is not one of 'pipeline', 'scheduler'")
    if time_shift_type == "exponential":
        sigmas = math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** 1.0)
    elif time_shift_type == "linear":
        sigmas = mu / (mu + (1 / t - 1) ** 1.0)
    else:
        raise ValueError(f"time_shift_type={time_shift_type!r} is not one of 'exponential', 'linear'")
    return _finish(sigmas, shift_terminal)


class StaticShiftSchedule(BaseModel):
    """Static shifted schedule (SD3: shift 3.0)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["static_shift"] = "static_shift"
    shift: float = Field(3.0, gt=0, description="sigma = shift t / (1 + (shift - 1) t)")
    num_train_timesteps: int = Field(1000, gt=0)
    shift_terminal: float | None = Field(None, description="stretch so the last non-zero sigma is this")

    def sigmas(self, num_steps: int, image_seq_len: int | None = None) -> list[float]:
        """The pinned T + 1 sigmas; ``image_seq_len`` is ignored (static)."""
        return static_shifted_sigmas(
            num_steps,
            self.shift,
            num_train_timesteps=self.num_train_timesteps,
            shift_terminal=self.shift_terminal,
        )


class DynamicShiftSchedule(BaseModel):
    """Resolution-dependent shift; defaults are FLUX.1's scheduler config."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["dynamic_shift"] = "dynamic_shift"
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_seq_len: int = Field(256, gt=0, description="image tokens at which mu = base_shift")
    max_seq_len: int = Field(4096, gt=0, description="image tokens at which mu = max_shift")
    time_shift_type: Literal["exponential", "linear"] = "exponential"
    base_grid: Literal["pipeline", "scheduler"] = "pipeline"
    num_train_timesteps: int = Field(1000, gt=0)
    shift_terminal: float | None = None

    def mu(self, image_seq_len: int) -> float:
        """``calculate_shift`` for this config."""
        return calculate_shift(
            image_seq_len, self.base_seq_len, self.max_seq_len, self.base_shift, self.max_shift
        )

    def sigmas(self, num_steps: int, image_seq_len: int | None = None) -> list[float]:
        """The pinned T + 1 sigmas for an image of ``image_seq_len`` transformer tokens (required)."""
        if image_seq_len is None:
            raise ValueError("a dynamic_shift schedule needs image_seq_len (the image token count)")
        return dynamic_shifted_sigmas(
            num_steps,
            self.mu(image_seq_len),
            time_shift_type=self.time_shift_type,
            base_grid=self.base_grid,
            num_train_timesteps=self.num_train_timesteps,
            shift_terminal=self.shift_terminal,
        )


SigmaScheduleConfig = Annotated[StaticShiftSchedule | DynamicShiftSchedule, Field(discriminator="kind")]
