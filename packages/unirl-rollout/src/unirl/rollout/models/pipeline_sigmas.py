"""The sigma schedule a diffusers pipeline builds, computed by the family's own scheduler.

Newer pipelines (Qwen-Image, FLUX.2 / Klein, Z-Image) each build the base grid ``linspace(1, 1/T, T)``
themselves (numpy fp64 or torch fp32), compute a ``mu`` (``calculate_shift`` of the image token
count, or FLUX.2's ``compute_empirical_mu`` of the token count *and* the step count) and hand both
to ``FlowMatchEulerDiscreteScheduler.set_timesteps``, whose config then decides between the dynamic
and the static shift and a terminal stretch. ``PipelineSigmas`` replays exactly that on a fresh
scheduler built from the model's own scheduler config, so the pinned sigmas are the pipeline's bit
for bit whatever its config says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

__all__ = ["PipelineSigmas", "calculate_shift_of", "empirical_mu"]


def calculate_shift_of(config: Mapping[str, Any]) -> Callable[[int, int], float]:
    """``mu(image_seq_len, num_steps)`` of diffusers' ``calculate_shift`` with the scheduler config's
    defaults, as the Qwen-Image and Z-Image pipelines read them (``num_steps`` unused)."""
    base_len = config.get("base_image_seq_len", 256)
    max_len = config.get("max_image_seq_len", 4096)
    base_shift = config.get("base_shift", 0.5)
    max_shift = config.get("max_shift", 1.15)

    def mu(image_seq_len: int, num_steps: int) -> float:
        m = (max_shift - base_shift) / (max_len - base_len)
        return image_seq_len * m + (base_shift - m * base_len)

    return mu


def empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """FLUX.2's ``compute_empirical_mu``: a fit in the token count, interpolated in the step count
    between 10 and 200 steps (above 4300 tokens only the 200-step line is used)."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if image_seq_len > 4300:
        return float(a2 * image_seq_len + b2)
    m_200 = a2 * image_seq_len + b2
    m_10 = a1 * image_seq_len + b1
    a = (m_200 - m_10) / 190.0
    return float(a * num_steps + (m_200 - 200.0 * a))


class PipelineSigmas:
    """``sigmas(num_steps, image_seq_len)`` as a diffusers pipeline pins them (implements ``SigmaPolicy``).

    Args:
        scheduler_config: the model's ``scheduler/scheduler_config.json`` (a FlowMatchEuler config).
        mu: ``mu(image_seq_len, num_steps)`` the pipeline passes to ``set_timesteps``.
        grid: ``"numpy"`` for ``np.linspace(1, 1/T, T)`` (Qwen-Image, FLUX.2), ``"torch"`` for
            ``torch.linspace(1, 1/T, T).tolist()`` (Z-Image); they differ in the last fp32 bit.
    """

    def __init__(
        self,
        scheduler_config: Mapping[str, Any],
        mu: Callable[[int, int], float],
        *,
        grid: Literal["numpy", "torch"] = "numpy",
    ) -> None:
        if grid not in ("numpy", "torch"):
            raise ValueError(f"grid={grid!r} is not one of 'numpy', 'torch'")
        self.config = dict(scheduler_config)
        self.mu = mu
        self.grid = grid

    def sigmas(self, num_steps: int, image_seq_len: int | None = None) -> list[float]:
        """The T + 1 pinned sigmas (terminal 0) for an image of ``image_seq_len`` transformer tokens."""
        if not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
        if image_seq_len is None:
            raise ValueError("this model's schedule needs image_seq_len (the image token count)")
        grid: Any
        if self.grid == "numpy":
            grid = np.linspace(1.0, 1 / num_steps, num_steps)
        else:
            grid = torch.linspace(1.0, 1 / num_steps, num_steps).tolist()
        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.config)
        mu = self.mu(image_seq_len, num_steps)
        if self.config.get("use_flow_sigmas"):  # FLUX.2 then lets the scheduler build its own grid
            scheduler.set_timesteps(num_steps, mu=mu)
        else:
            scheduler.set_timesteps(sigmas=grid, mu=mu)
        return [float(s) for s in scheduler.sigmas.tolist()]
