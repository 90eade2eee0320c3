"""Model configs of the diffusers families beyond SD3: FLUX.1, Qwen-Image, FLUX.2 [klein], Z-Image,
and the video families Wan 2.1 / 2.2 and HunyuanVideo. Each builds its bundle through the real loader (``from_pretrained`` of a local diffusers
folder or hub id); ``path: null`` builds the family's tiny random model in code (same classes),
the CPU variant each family's recipe has."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypedDict

import torch
from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from unirl.rollout.models.base import FlowBundle

__all__ = [
    "Flux2KleinModelConfig",
    "FluxModelConfig",
    "HunyuanVideoModelConfig",
    "QwenImageModelConfig",
    "WanModelConfig",
    "ZImageModelConfig",
    "torch_dtype",
]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a recipe's ``dtype`` name (float32 | bfloat16 | float16)."""
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


class _DiffusersFamilyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = Field(
        default=None, description="a local diffusers folder (model_index.json) or hub id; null = tiny model"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_sequence_length: int | None = Field(
        default=None, ge=1, description="text tokens per prompt; null = the family's default"
    )

    def build(self, device: torch.device, seed: int) -> FlowBundle:
        """The family's tiny model (``path: null``) or ``from_pretrained(path, **self.loading(device))``;
        each family imports its bundle class here (diffusers loads only when a model is built)."""
        raise NotImplementedError

    def loading(self, device: torch.device) -> _Loading:
        """The ``from_pretrained`` keywords every family takes."""
        kw = _Loading(dtype=torch_dtype(self.dtype), device=device)
        if self.max_sequence_length is not None:
            kw["max_sequence_length"] = self.max_sequence_length
        return kw


class _Loading(TypedDict, total=False):
    dtype: torch.dtype
    device: torch.device
    max_sequence_length: int


class FluxModelConfig(_DiffusersFamilyConfig):
    """FLUX.1 (dev: guidance-distilled, the scale is a model input and no CFG batch runs; schnell:
    no guidance) through ``FluxPipeline``'s components."""

    kind: Literal["flux"] = "flux"

    tiny_guidance_embeds: bool = Field(
        default=True, description="path: null only: build the tiny model guidance-distilled (FLUX.1-dev-like)"
    )

    def build(self, device: torch.device, seed: int) -> FlowBundle:
        from unirl.rollout.models.flux import FluxBundle

        if self.path is None:
            return FluxBundle.tiny(seed=seed, guidance_embeds=self.tiny_guidance_embeds).to(device)
        return FluxBundle.from_pretrained(self.path, **self.loading(device))


class QwenImageModelConfig(_DiffusersFamilyConfig):
    """Qwen-Image: true CFG with a negative prompt (``sampling.guidance_scale`` is ``true_cfg_scale``),
    dynamic shift (set ``sampling.dynamic_shift: true``)."""

    kind: Literal["qwen_image"] = "qwen_image"

    def build(self, device: torch.device, seed: int) -> FlowBundle:
        from unirl.rollout.models.qwen_image import QwenImageBundle

        if self.path is None:
            return QwenImageBundle.tiny(seed=seed).to(device)
        return QwenImageBundle.from_pretrained(self.path, **self.loading(device))


class Flux2KleinModelConfig(_DiffusersFamilyConfig):
    """FLUX.2 [klein]: classic CFG against the empty prompt (base models) or none (distilled ones),
    empirical-mu schedule (set ``sampling.dynamic_shift: true``)."""

    kind: Literal["flux2_klein"] = "flux2_klein"

    tiny_distilled: bool = Field(
        default=False, description="path: null only: build a step-distilled tiny Klein"
    )

    def build(self, device: torch.device, seed: int) -> FlowBundle:
        from unirl.rollout.models.flux2 import Flux2KleinBundle

        if self.path is None:
            return Flux2KleinBundle.tiny(seed=seed, is_distilled=self.tiny_distilled).to(device)
        return Flux2KleinBundle.from_pretrained(self.path, **self.loading(device))


class ZImageModelConfig(_DiffusersFamilyConfig):
    """Z-Image: ``sampling.guidance_scale`` is ZImagePipeline's ``guidance_scale + 1`` (1 = no CFG,
    as Z-Image-Turbo samples); the scheduler's own shift (set ``sampling.dynamic_shift: true``)."""

    kind: Literal["z_image"] = "z_image"

    def build(self, device: torch.device, seed: int) -> FlowBundle:
        from unirl.rollout.models.z_image import ZImageBundle

        if self.path is None:
            return ZImageBundle.tiny(seed=seed).to(device)
        return ZImageBundle.from_pretrained(self.path, **self.loading(device))


class WanModelConfig(_DiffusersFamilyConfig):
    """Wan 2.1 / 2.2 text-to-video (``WanTransformer3DModel``, ``AutoencoderKLWan``; the A14B pair of
    experts switches at the checkpoint's ``boundary_ratio``): CFG with ``sampling.negative_prompt``,
    the scheduler's static ``flow_shift``. ``sampling.num_frames`` must be 4k + 1 (the causal VAE)."""

    kind: Literal["wan"] = "wan"

    vae_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="the VAE's dtype (fp32, as Wan's model cards advise)"
    )
    fps: float = Field(default=16.0, gt=0, description="frame rate of the decoded videos")
    tiny_two_experts: bool = Field(
        default=False, description="path: null only: a Wan 2.2 A14B-style pair of experts"
    )
    tiny_flow_shift: float = Field(default=3.0, gt=0, description="path: null only: the scheduler's shift")

    def build(self, device: torch.device, seed: int) -> FlowBundle:
        from unirl.rollout.models.wan import WanBundle

        if self.path is None:
            tiny = WanBundle.tiny(
                seed=seed, two_experts=self.tiny_two_experts, flow_shift=self.tiny_flow_shift
            )
            return tiny.to(device)
        return WanBundle.from_pretrained(
            self.path, **self.loading(device), vae_dtype=torch_dtype(self.vae_dtype), fps=self.fps
        )


class HunyuanVideoModelConfig(_DiffusersFamilyConfig):
    """HunyuanVideo 1.0 (``HunyuanVideoTransformer3DModel``, Llama + CLIP text encoders; guidance-
    distilled: the scale is a model input, no CFG batch). ``sampling.num_frames`` must be 4k + 1."""

    kind: Literal["hunyuan_video"] = "hunyuan_video"

    fps: float = Field(default=24.0, gt=0, description="frame rate of the decoded videos")

    def build(self, device: torch.device, seed: int) -> FlowBundle:
        from unirl.rollout.models.hunyuan_video import HunyuanVideoBundle

        if self.path is None:
            return HunyuanVideoBundle.tiny(seed=seed).to(device)
        return HunyuanVideoBundle.from_pretrained(self.path, **self.loading(device), fps=self.fps)
