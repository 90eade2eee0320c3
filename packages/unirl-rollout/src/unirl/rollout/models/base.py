"""The model-bundle protocol of flow-matching models, and helpers shared by bundles.

A bundle owns the modules: the trainable ``transformer`` (what RL updates) and the frozen ones
(VAE, text encoders) with their tokenizers. The pipeline never touches a module directly; it asks
the bundle to encode prompts once, predict a velocity, and decode latents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from unirl.rollout.schedules import DynamicShiftSchedule
from unirl.types import Conditions, to_torch

__all__ = [
    "NEGATIVE_PREFIX",
    "FlowBundle",
    "VideoFlowBundle",
    "freeze",
    "from_uint8_images",
    "from_uint8_videos",
    "sd3_style_velocity",
    "stack_conditions",
    "text_conditions",
    "to_uint8_images",
    "to_uint8_videos",
]

NEGATIVE_PREFIX = "negative_"
"""Conditions of the CFG negative prompt are stored next to the positive ones under this prefix."""


@runtime_checkable
class FlowBundle(Protocol):
    """A flow-matching text-to-image model: trainable transformer + frozen encoders and VAE.

    Latents are handled unpacked ``[B, C, h, w]`` everywhere outside the bundle; a bundle whose
    transformer takes packed tokens (FLUX) packs and unpacks inside ``predict_velocity``. The
    SDE kernels are elementwise, so this choice does not change any log-prob.
    """

    transformer: nn.Module
    """The trainable module (wrap it for FSDP / LoRA in place; the bundle keeps calling it)."""
    dynamic_schedule: DynamicShiftSchedule
    """The model's resolution-dependent schedule, used when ``sampling_params.dynamic_shift``."""
    embedded_guidance: bool
    """True for guidance-distilled models (FLUX.1-dev): ``guidance_scale`` is fed to the model as
    ``conditions["guidance"]`` [B] and no CFG batch is run. False: classifier-free guidance."""

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the transformer computes in (latents are cast to it for the forward)."""
        ...

    def frozen_modules(self) -> dict[str, nn.Module]:
        """The frozen modules by name (VAE, text encoders), for placement/offload."""
        ...

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """Per-sample latent shape ``(C, h, w)`` for an image of ``height`` x ``width`` pixels."""
        ...

    def image_seq_len(self, height: int, width: int) -> int:
        """Number of image tokens the transformer sees (drives the dynamic shift ``mu``)."""
        ...

    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        """Run the frozen text encoders once; one Conditions per text (no batch dim, CPU or device)."""
        ...

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        """Velocity ``v ~ eps - x0`` for ``latents`` [B, C, h, w] at ``sigma`` [B] (fp32, in [0, 1]),
        given batched conditions (the keys ``encode_prompts`` produced, each [B, ...])."""
        ...

    def decode(self, latents: Tensor) -> Tensor:
        """Final latents [B, C, h, w] -> uint8 images [B, H, W, 3]."""
        ...


@runtime_checkable
class VideoFlowBundle(FlowBundle, Protocol):
    """A flow-matching text-to-video model: a ``FlowBundle`` whose latents carry a frame axis.

    Latents are ``[B, C, F, h, w]`` (``F`` latent frames) outside the bundle; the pipeline, the SDE
    kernels and replay are the image ones (all elementwise over the latent), with frame-aware noise
    (``unirl.rollout.noise``). ``decode`` returns uint8 videos ``[B, F_out, H, W, 3]``. The pipeline
    samples a video when ``sampling_params.num_frames`` is set.
    """

    fps: float
    """Frames per second of the decoded video (stored on the VideoPrimitive)."""

    def video_latent_shape(self, height: int, width: int, num_frames: int) -> tuple[int, ...]:
        """Per-sample latent shape ``(C, F, h, w)`` for ``num_frames`` frames of ``height`` x ``width``."""
        ...

    def video_seq_len(self, height: int, width: int, num_frames: int) -> int:
        """Number of video tokens the transformer sees (drives a dynamic shift)."""
        ...


def stack_conditions(
    conditions: Sequence[Conditions],
    keys: Sequence[str],
    device: torch.device,
    dtype: torch.dtype,
    prefix: str = "",
) -> dict[str, Tensor]:
    """Batch per-Part conditions: ``{key: stack(c[prefix + key])}`` on ``device`` (floats cast to ``dtype``)."""
    out: dict[str, Tensor] = {}
    for k in keys:
        ts = [to_torch(c[prefix + k]) for c in conditions]
        t = torch.stack(ts).to(device)
        out[k] = t.to(dtype) if t.is_floating_point() else t
    return out


def freeze(*modules: nn.Module | None) -> None:
    """Put frozen modules in eval mode with ``requires_grad=False``."""
    for m in modules:
        if m is not None:
            m.eval()
            m.requires_grad_(False)


def text_conditions(embeds_BLD: Tensor, pooled_BP: Tensor) -> list[Conditions]:
    """Per-prompt Conditions under the keys SD3-style transformers read (moved to CPU)."""
    return [
        Conditions(tensors={"prompt_embeds": e, "pooled_prompt_embeds": p})
        for e, p in zip(embeds_BLD.cpu(), pooled_BP.cpu())
    ]


def sd3_style_velocity(
    transformer: nn.Module, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]
) -> Tensor:
    """Velocity from a transformer with SD3's call signature; timesteps are sigma * 1000 in fp32,
    exactly as the diffusers scheduler builds them."""
    return transformer(
        hidden_states=latents,
        timestep=sigma.to(torch.float32) * 1000.0,
        encoder_hidden_states=conditions["prompt_embeds"],
        pooled_projections=conditions["pooled_prompt_embeds"],
        return_dict=False,
    )[0]


def from_uint8_images(images_BHWC: Tensor) -> Tensor:
    """uint8 [B, H, W, 3] -> [B, 3, H, W] float in [-1, 1] (the inverse of ``to_uint8_images``)."""
    return images_BHWC.permute(0, 3, 1, 2).float() / 127.5 - 1.0


def from_uint8_videos(videos_BFHWC: Tensor) -> Tensor:
    """uint8 [B, F, H, W, 3] -> [B, 3, F, H, W] float in [-1, 1] (the inverse of ``to_uint8_videos``)."""
    return videos_BFHWC.permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0


def to_uint8_videos(videos: Tensor) -> Tensor:
    """Video VAE output in [-1, 1], [B, 3, F, H, W] -> uint8 [B, F, H, W, 3] (as diffusers' VideoProcessor)."""
    x = (videos.float() / 2 + 0.5).clamp(0, 1)
    return (x * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).contiguous().cpu()


def to_uint8_images(images: Tensor) -> Tensor:
    """VAE output in [-1, 1], [B, 3, H, W] -> uint8 [B, H, W, 3], as diffusers' VaeImageProcessor does."""
    x = (images.float() / 2 + 0.5).clamp(0, 1)
    return (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().cpu()
