"""Sampling parameters carried on each generated Part: the single source of truth for replay."""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from unirl.types.base import SchemaModel
from unirl.types.sde_schedule import AllSteps, SDESchedule

SDEStrategyName = Literal["flow_sde", "dance_sde", "cps", "cps_novar", "ode"]
"""`cps_novar` scores CPS steps as -mean((x_next - mu)^2) (no variance term): ratios have another scale."""


class NoiseRecipe(SchemaModel):
    """How the initial noise x_T is drawn: on CPU, fp32, from ``(seed, id)``.

    ``scope="group"`` gives every sibling of a prompt the same starting noise (their trajectories
    then differ only through the SDE noise); ``"sample"`` gives each sample its own; ``"cousins"``
    (children of a staged pipeline, ids ``<prompt group>/<k>/c<j>``) gives child ``j`` of every
    sibling parent the same starting AND SDE noise: common random numbers, so the parents' rewards
    (e.g. a prompt enhancer's rewrites, each credited with its renders) differ by the parent, not
    by the noise.
    """

    seed: int = Field(default=0, ge=0)
    scope: Literal["sample", "group", "cousins"] = "sample"


class DiffusionSamplingParams(SchemaModel):
    """How a diffusion / flow-matching Part was (or is to be) sampled."""

    kind: Literal["diffusion"] = "diffusion"
    num_steps: int = Field(ge=1, description="denoising steps T")
    guidance_scale: float = Field(default=1.0, ge=0.0, description="CFG weight w; <= 1 disables CFG")
    height: int = Field(gt=0, description="output height in pixels")
    width: int = Field(gt=0, description="output width in pixels")
    num_frames: int | None = Field(
        default=None,
        ge=1,
        description="output frames of a video model (latents [C, F, h, w], a VideoPrimitive output); "
        "None = an image model (latents [C, h, w], an ImagePrimitive)",
    )
    eta: float = Field(default=0.7, ge=0.0, description="SDE noise level; 0 = deterministic")
    sde_strategy: SDEStrategyName = "flow_sde"
    sde_schedule: SDESchedule = Field(default_factory=AllSteps)
    shift: float = Field(default=3.0, gt=0.0, description="static sigma shift (ignored when dynamic_shift)")
    dynamic_shift: bool = Field(default=False, description="resolution-dependent shift (FLUX, Qwen-Image)")
    sigmas: list[float] | None = Field(
        default=None, description="the pinned T+1 sigma schedule; filled once at rollout, reused by replay"
    )
    negative_prompt: str = ""
    noise: NoiseRecipe = Field(default_factory=NoiseRecipe)

    @property
    def cfg(self) -> bool:
        return self.guidance_scale > 1.0

    @field_validator("sigmas")
    @classmethod
    def _sigmas(cls, v: list[float] | None) -> list[float] | None:
        if v is None:
            return v
        if not all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in v):
            raise ValueError(f"sigmas must be finite and in [0, 1]; got {v}")
        if any(b > a for a, b in itertools.pairwise(v)):
            raise ValueError(f"sigmas must be non-increasing (noise -> data); got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> DiffusionSamplingParams:
        if self.sigmas is not None and len(self.sigmas) != self.num_steps + 1:
            raise ValueError(
                f"sigmas has {len(self.sigmas)} values; num_steps={self.num_steps} needs {self.num_steps + 1}"
            )
        if self.sde_strategy != "ode":
            self.sde_schedule.check(self.num_steps)
        return self

    def resolve_sde_indices(self, step: int) -> list[int]:
        """The sorted denoising-step indices that run the SDE at rollout step ``step``.

        Empty for the ``ode`` strategy (and when eta == 0 nothing is stochastic either; those
        indices still exist but carry no log-prob signal).
        """
        if step < 0:
            raise ValueError(f"rollout step must be >= 0, got {step}")
        if self.sde_strategy == "ode":
            return []
        return self.sde_schedule.resolve(self.num_steps, step)


class ARSamplingParams(SchemaModel):
    """How an autoregressive text Part was (or is to be) sampled."""

    kind: Literal["ar"] = "ar"
    max_new_tokens: int = Field(ge=1)
    temperature: float = Field(
        default=1.0, gt=0.0, description="log-probs are of the temperature-scaled distribution"
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 disables top-k")
    stop: list[str] = Field(default_factory=list, description="stop strings (not included in the response)")
    stop_token_ids: list[int] = Field(default_factory=list, description="stop tokens (included, e.g. EOS)")
    seed: int = Field(default=0, ge=0)


class ComposedSamplingParams(SchemaModel):
    """Sampling params of a composed run (prompt enhancer: an AR rewrite then a diffusion render)."""

    kind: Literal["composed"] = "composed"
    ar: ARSamplingParams
    diffusion: DiffusionSamplingParams


SamplingParams = Annotated[
    DiffusionSamplingParams | ARSamplingParams | ComposedSamplingParams, Field(discriminator="kind")
]
