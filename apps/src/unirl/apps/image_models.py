"""Model configs of the diffusers families beyond SD3: FLUX.1, Qwen-Image, FLUX.2 [klein], Z-Image,
and the video families Wan 2.1 / 2.2 and HunyuanVideo. Each builds its bundle through the real loader (``from_pretrained`` of a local diffusers
folder or hub id); ``path: null`` builds the family's tiny random model in code (same classes),
the CPU variant each family's recipe has."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

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

    def bundle_class(self) -> Any:
        """The family's bundle class (imported here: diffusers loads only when a model is built)."""
        raise NotImplementedError

    def tiny_kwargs(self) -> dict[str, Any]:
        return {}

    def load_kwargs(self) -> dict[str, Any]:
        """Extra ``from_pretrained`` keywords of the family."""
        return {}

    def build(self, device: torch.device, seed: int) -> Any:
        cls = self.bundle_class()
        if self.path is None:
            return cls.tiny(seed=seed, **self.tiny_kwargs()).to(device)
        kw = {} if self.max_sequence_length is None else {"max_sequence_length": self.max_sequence_length}
        return cls.from_pretrained(
            self.path, dtype=torch_dtype(self.dtype), device=device, **kw, **self.load_kwargs()
        )


class FluxModelConfig(_DiffusersFamilyConfig):
    """FLUX.1 (dev: guidance-distilled, the scale is a model input and no CFG batch runs; schnell:
    no guidance) through ``FluxPipeline``'s components."""

    kind: Literal["flux"] = "flux"

    tiny_guidance_embeds: bool = Field(
        default=True, description="path: null only: build the tiny model guidance-distilled (FLUX.1-dev-like)"
    )

    def bundle_class(self) -> Any:
        from unirl.rollout.models.flux import FluxBundle

        return FluxBundle

    def tiny_kwargs(self) -> dict[str, Any]:
        return {"guidance_embeds": self.tiny_guidance_embeds}


class QwenImageModelConfig(_DiffusersFamilyConfig):
    """Qwen-Image: true CFG with a negative prompt (``sampling.guidance_scale`` is ``true_cfg_scale``),
    dynamic shift (set ``sampling.dynamic_shift: true``)."""

    kind: Literal["qwen_image"] = "qwen_image"

    def bundle_class(self) -> Any:
        from unirl.rollout.models.qwen_image import QwenImageBundle

        return QwenImageBundle


class Flux2KleinModelConfig(_DiffusersFamilyConfig):
    """FLUX.2 [klein]: classic CFG against the empty prompt (base models) or none (distilled ones),
    empirical-mu schedule (set ``sampling.dynamic_shift: true``)."""

    kind: Literal["flux2_klein"] = "flux2_klein"

    tiny_distilled: bool = Field(
        default=False, description="path: null only: build a step-distilled tiny Klein"
    )

    def bundle_class(self) -> Any:
        from unirl.rollout.models.flux2 import Flux2KleinBundle

        return Flux2KleinBundle

    def tiny_kwargs(self) -> dict[str, Any]:
        return {"is_distilled": self.tiny_distilled}


class ZImageModelConfig(_DiffusersFamilyConfig):
    """Z-Image: ``sampling.guidance_scale`` is ZImagePipeline's ``guidance_scale + 1`` (1 = no CFG,
    as Z-Image-Turbo samples); the scheduler's own shift (set ``sampling.dynamic_shift: true``)."""

    kind: Literal["z_image"] = "z_image"

    def bundle_class(self) -> Any:
        from unirl.rollout.models.z_image import ZImageBundle

        return ZImageBundle


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

    def bundle_class(self) -> Any:
        from unirl.rollout.models.wan import WanBundle

        return WanBundle

    def tiny_kwargs(self) -> dict[str, Any]:
        return {"two_experts": self.tiny_two_experts, "flow_shift": self.tiny_flow_shift}

    def load_kwargs(self) -> dict[str, Any]:
        return {"vae_dtype": torch_dtype(self.vae_dtype), "fps": self.fps}


class HunyuanVideoModelConfig(_DiffusersFamilyConfig):
    """HunyuanVideo 1.0 (``HunyuanVideoTransformer3DModel``, Llama + CLIP text encoders; guidance-
    distilled: the scale is a model input, no CFG batch). ``sampling.num_frames`` must be 4k + 1."""

    kind: Literal["hunyuan_video"] = "hunyuan_video"

    fps: float = Field(default=24.0, gt=0, description="frame rate of the decoded videos")

    def bundle_class(self) -> Any:
        from unirl.rollout.models.hunyuan_video import HunyuanVideoBundle

        return HunyuanVideoBundle

    def load_kwargs(self) -> dict[str, Any]:
        return {"fps": self.fps}
