"""Flow-matching SFT as a StageAlgorithm: velocity regression on clean latents.

Each Part carries its clean (data) latent as the last stored latent of a LatentTrajectory (e.g.
``positions=[1]``, ``sigmas=[1.0, 0.0]``, no SDE steps) and its text conditions. Per Part, one
``t`` is drawn (uniform or SD3's logit-normal) with fresh noise; the loss is the mean over Parts
of ``mean_elements (v_theta(x_t, t) - (eps - x0))^2`` (``BatchTotals.num_samples``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from unirl.train.algorithms.base import BatchTotals, as_tensor, latent_segment, require
from unirl.train.algorithms.config_base import AlgorithmConfigBase
from unirl.train.algorithms.losses.diffusion_nft import nft_noisy_latent
from unirl.train.algorithms.losses.flow_sft import flow_sft_sample_loss, sample_timesteps
from unirl.types import Part


class FlowSFTConfig(AlgorithmConfigBase):
    """Flow-matching supervised fine-tuning."""

    kind: Literal["flow_sft"] = "flow_sft"
    timestep_sampling: Literal["uniform", "logit_normal"] = Field(
        default="logit_normal", description="distribution of t in (0, 1) (SD3 uses logit_normal)."
    )
    logit_mean: float = Field(default=0.0, description="logit_normal: mean of the normal before the sigmoid.")
    logit_std: float = Field(
        default=1.0, gt=0.0, description="logit_normal: std of the normal before the sigmoid."
    )
    guidance_scale: float = Field(
        default=1.0, ge=0.0, description="CFG weight at training (1 = conditional only)."
    )
    seed: int = Field(default=0, ge=0, description="seed of the t / noise draws.")

    def build(self) -> FlowSFT:
        return FlowSFT(self)


class FlowSFT:
    """Flow-matching SFT StageAlgorithm."""

    needs_old_logprobs = False

    def __init__(self, config: FlowSFTConfig) -> None:
        self.config = config
        self.name: str = config.kind
        self._gen = torch.Generator().manual_seed(config.seed)

    def get_rng_state(self) -> Tensor:
        """The state of its t / noise generator: a checkpoint saves it, so a resumed run draws on
        where the run stopped instead of from ``seed`` again."""
        return self._gen.get_state()

    def set_rng_state(self, state: Tensor) -> None:
        """Inverse of ``get_rng_state``."""
        self._gen.set_state(state)

    def prepare(self, parts: Sequence[Part], pipeline: Any) -> None:
        for p in parts:
            latent_segment(p, self.name)
            require(
                p.conditions is not None, f"{self.name}: part {p.name!r} has no conditions (text embeddings)"
            )

    def loss(
        self, parts: Sequence[Part], pipeline: Any, totals: BatchTotals
    ) -> tuple[Tensor, dict[str, float]]:
        require(totals.num_samples > 0, f"{self.name}: BatchTotals.num_samples is 0")
        cfg = self.config
        x0 = torch.stack([as_tensor(latent_segment(p, self.name).latents)[-1].float() for p in parts])
        t = sample_timesteps(len(parts), cfg.timestep_sampling, self._gen, cfg.logit_mean, cfg.logit_std)
        noise = torch.randn(x0.shape, generator=self._gen)
        x_t = nft_noisy_latent(x0.cpu(), noise, t)
        conds = [p.conditions for p in parts]
        v = pipeline.velocity(x_t, t, conds, cfg.guidance_scale).float()
        per = flow_sft_sample_loss(v, x0.to(v.device), noise.to(v.device))
        return per.sum() / totals.num_samples, {"flow_mse": per.detach().mean().item()}
