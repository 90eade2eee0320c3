"""The model-bundle protocol of flow-matching models, and helpers shared by bundles.

A bundle owns the modules: the trainable ``transformer`` (what RL updates) and the frozen ones
(VAE, text encoders) with their tokenizers. The pipeline never touches a module directly; it asks
the bundle to encode prompts once, predict a velocity, and decode latents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor, nn

from unirl.types import Conditions, to_torch

__all__ = [
    "NEGATIVE_PREFIX",
    "DiffusersPipelineBundle",
    "EncodesImages",
    "FlowBundle",
    "SigmaPolicy",
    "VideoFlowBundle",
    "classic_cfg",
    "freeze",
    "from_uint8_images",
    "from_uint8_videos",
    "pad_to_length",
    "sd3_style_velocity",
    "stack_conditions",
    "text_conditions",
    "to_uint8_images",
    "to_uint8_videos",
]

NEGATIVE_PREFIX = "negative_"
"""Conditions of the CFG negative prompt are stored next to the positive ones under this prefix."""


class SigmaPolicy(Protocol):
    """A model's own sigma schedule: T + 1 sigmas (terminal 0) for ``num_steps`` at an image size."""

    def sigmas(self, num_steps: int, image_seq_len: int | None = None) -> list[float]: ...


@runtime_checkable
class FlowBundle(Protocol):
    """A flow-matching text-to-image model: trainable transformer + frozen encoders and VAE.

    Latents are handled unpacked ``[B, C, h, w]`` everywhere outside the bundle; a bundle whose
    transformer takes packed tokens (FLUX) packs and unpacks inside ``predict_velocity``. The
    SDE kernels are elementwise, so this choice does not change any log-prob.

    Optional: ``combine_cfg(v_uncond, v_cond, scale) -> Tensor``, the family's own guided
    velocity (Qwen-Image rescales it to the conditional norm); without it the pipeline uses
    ``classic_cfg``. Conditions may have a per-prompt length (dim 0): ``stack_conditions``
    right-pads them with zeros, so a bundle stores a ``*_mask`` of ones next to such a tensor and
    reads the padding back from it.
    """

    transformer: nn.Module
    """The trainable module (wrap it for FSDP / LoRA in place; the bundle keeps calling it)."""

    @property
    def dynamic_schedule(self) -> SigmaPolicy:
        """The model's resolution-dependent schedule (``DynamicShiftSchedule`` or the family's own
        policy, e.g. FLUX.2's empirical mu), used when ``sampling_params.dynamic_shift`` (read-only
        here, so a bundle may declare its own schedule class)."""
        ...

    embedded_guidance: bool
    """True for guidance-distilled models (FLUX.1-dev): ``guidance_scale`` is fed to the model as
    ``conditions["guidance"]`` [B] and no CFG batch is run. False: classifier-free guidance."""

    def replace_transformer(self, module: nn.Module) -> None:
        """Denoise with ``module`` instead of ``transformer`` from now on (a train backend that
        rebuilds the model, e.g. megatron-core's MMDiT, hands its module here)."""
        ...

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
class EncodesImages(Protocol):
    """Optional FlowBundle capability: pixels -> latents with its VAE (or the identity, in pixel
    space), which supervised flow matching trains on: uint8 ``[B, H, W, 3]`` (a video bundle:
    ``[B, F, H, W, 3]``) -> latents ``[B, ...]``."""

    def encode_images(self, images_BHWC: Tensor) -> Tensor: ...


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
    """Batch per-Part conditions: ``{key: stack(c[prefix + key])}`` on ``device`` (floats cast to ``dtype``).

    Tensors whose leading (sequence) length differs between Parts are right-padded with zeros to
    the longest (a ``*_mask`` of ones then marks the real tokens); other shape differences are errors.
    """
    out: dict[str, Tensor] = {}
    for k in keys:
        ts = [to_torch(c[prefix + k]) for c in conditions]
        t = torch.stack(pad_to_length(ts, max(x.shape[0] for x in ts) if ts[0].ndim else 0, k)).to(device)
        out[k] = t.to(dtype) if t.is_floating_point() else t
    return out


def pad_to_length(ts: Sequence[Tensor], length: int, name: str = "tensor") -> list[Tensor]:
    """Right-pad each tensor's dim 0 with zeros to ``length`` (no-op for equal lengths and scalars)."""
    if all(t.shape == ts[0].shape for t in ts) and (not ts[0].ndim or ts[0].shape[0] == length):
        return list(ts)
    if len({tuple(t.shape[1:]) for t in ts}) > 1:
        raise ValueError(
            f"condition {name!r} has shapes {sorted({tuple(t.shape) for t in ts})} across the batch: only the "
            "leading (sequence) length may differ; re-encode the prompts with one model"
        )
    return [torch.cat([t, t.new_zeros((length - t.shape[0], *t.shape[1:]))]) for t in ts]


def classic_cfg(v_uncond: Tensor, v_cond: Tensor, scale: float) -> Tensor:
    """Classifier-free guidance ``v_u + w (v_c - v_u)`` (SD3, FLUX.1 true CFG, FLUX.2, Wan)."""
    return v_uncond + scale * (v_cond - v_uncond)


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


P = TypeVar("P")


class DiffusersPipelineBundle(Generic[P]):
    """The plumbing every bundle over a diffusers pipeline shares: the pipeline, moving it, and the
    compute device / dtype. A subclass sets ``_pipe``, ``_device`` and ``transformer`` in ``__init__``."""

    _pipe: P
    _device: torch.device
    transformer: nn.Module

    @property
    def pipe(self) -> P:
        """The underlying diffusers pipeline (for reference runs and component access)."""
        return self._pipe

    def replace_transformer(self, module: nn.Module) -> None:
        """Denoise with ``module`` from now on (a train backend's rebuild of the transformer, e.g.
        megatron-core's): in the bundle and in its pipeline, so the old one is released and
        ``to()`` moves the new one."""
        self.transformer = module
        pipe: Any = self._pipe
        pipe.transformer = module

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Any:
        """Move every module to ``device`` (and ``dtype`` if given); returns self."""
        pipe: Any = self._pipe
        pipe.to(device) if dtype is None else pipe.to(device, dtype)
        self._device = torch.device(device)
        return self

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the transformer computes in."""
        return next(self.transformer.parameters()).dtype
