"""A pixel-space flow bundle for tiny from-scratch worlds (implements ``FlowBundle``).

The "latents" are the RGB image itself in [-1, 1] (identity VAE); the velocity model is either a
tiny diffusers ``SD3Transformer2DModel`` (``arch="sd3"``, in_channels=3) or ``TinyUNet``
(``arch="unet"``); prompts go through ``WordTokenizer`` + ``TinyTextEncoder``. Conditions keys
match ``SD3Bundle``: ``prompt_embeds`` [L, D] and ``pooled_prompt_embeds`` [P].

The text encoder is frozen (RL conditions are computed once per prompt). For SFT from scratch
`train_text_encoder=True` keeps it trainable; the caller then encodes inside the loss (see
`encode_trainable`) instead of reusing stored conditions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from diffusers import SD3Transformer2DModel
from torch import Tensor, nn

from unirl.rollout.models.base import (
    freeze,
    from_uint8_images,
    sd3_style_velocity,
    text_conditions,
    to_uint8_images,
)
from unirl.rollout.models.tiny.text_encoder import TinyTextEncoder, WordTokenizer
from unirl.rollout.models.tiny.unet import TinyUNet
from unirl.rollout.schedules import DynamicShiftSchedule
from unirl.types import Conditions

__all__ = ["SHAPES_VOCAB", "PixelFlowBundle"]

SHAPES_VOCAB: tuple[str, ...] = (
    *("a", "two", "three", "red", "green", "blue", "circle", "square", "circles", "squares"),
    *("left", "right", "of", "above", "below"),
)
"""The shapes world's words (unirl.reward.worlds.shapes_spec.VOCAB; rollout may not import reward,
so it is repeated here and a test keeps the two equal)."""


class PixelFlowBundle:
    """Tiny pixel-space text-to-image flow model: velocity net + word-level text encoder."""

    def __init__(
        self,
        transformer: nn.Module,
        text_encoder: TinyTextEncoder,
        tokenizer: WordTokenizer,
        *,
        patch_size: int = 1,
        default_shift: float = 1.0,
        train_text_encoder: bool = False,
    ) -> None:
        self.transformer = transformer
        self.text_encoder = text_encoder
        self.tokenizer = tokenizer
        self.patch_size = patch_size
        self.default_shift = default_shift
        self.embedded_guidance = False  # classifier-free guidance with the empty prompt
        self.dynamic_schedule = DynamicShiftSchedule(base_grid="scheduler")
        if not train_text_encoder:
            freeze(text_encoder)

    @classmethod
    def tiny(
        cls,
        vocab: Sequence[str],
        *,
        arch: Literal["unet", "sd3"] = "unet",
        resolution: int = 32,
        text_dim: int = 64,
        text_layers: int = 2,
        max_words: int = 11,
        unet_channels: int = 32,
        unet_coord_channels: bool = False,
        unet_text_layers: int = 0,
        text_pos_std: float = 0.02,
        sd3_patch_size: int = 4,
        sd3_layers: int = 4,
        sd3_heads: int = 4,
        sd3_head_dim: int = 16,
        seed: int = 0,
        train_text_encoder: bool = False,
    ) -> PixelFlowBundle:
        """Randomly initialised (seeded) bundle built in code: no download."""
        if arch not in ("unet", "sd3"):
            raise ValueError(f"arch={arch!r}: allowed 'unet' or 'sd3'")
        tokenizer = WordTokenizer(vocab, max_length=max_words + 1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            text = TinyTextEncoder(
                tokenizer.vocab_size,
                tokenizer.max_length,
                text_dim,
                text_layers,
                4,
                text_dim,
                text_dim,
                pos_init_std=text_pos_std,
            )
            if arch == "unet":
                net: nn.Module = TinyUNet(
                    3,
                    unet_channels,
                    text_dim,
                    text_dim,
                    coord_channels=unet_coord_channels,
                    text_layers=unet_text_layers,
                )
                patch = 1
            else:
                if resolution % sd3_patch_size:
                    raise ValueError(
                        f"resolution={resolution} must be a multiple of sd3_patch_size={sd3_patch_size}"
                    )
                net = SD3Transformer2DModel(
                    sample_size=resolution,
                    patch_size=sd3_patch_size,
                    in_channels=3,
                    out_channels=3,
                    num_layers=sd3_layers,
                    attention_head_dim=sd3_head_dim,
                    num_attention_heads=sd3_heads,
                    joint_attention_dim=text_dim,
                    caption_projection_dim=sd3_heads * sd3_head_dim,
                    pooled_projection_dim=text_dim,
                    pos_embed_max_size=resolution // sd3_patch_size,
                )
                patch = sd3_patch_size
        return cls(net, text, tokenizer, patch_size=patch, train_text_encoder=train_text_encoder)

    @classmethod
    def shapes(
        cls,
        *,
        arch: Literal["unet", "sd3"] = "unet",
        resolution: int = 32,
        patch_size: int = 4,
        num_layers: int = 4,
        num_heads: int = 4,
        head_dim: int = 16,
        text_dim: int = 64,
        text_layers: int = 2,
        text_pos_std: float = 0.02,
        unet_channels: int = 32,
        unet_coord_channels: bool = False,
        unet_text_layers: int = 0,
        seed: int = 0,
        train_text_encoder: bool = False,
    ) -> PixelFlowBundle:
        """The shapes-world model over `SHAPES_VOCAB`. patch_size / num_layers / num_heads / head_dim
        apply to arch="sd3" only; unet_* to arch="unet" (the default: on a 2-core CPU budget the
        pixel SD3 transformer had not formed coherent objects after ~2k steps, the U-Net had after ~300)."""
        return cls.tiny(
            SHAPES_VOCAB,
            arch=arch,
            resolution=resolution,
            text_dim=text_dim,
            text_layers=text_layers,
            text_pos_std=text_pos_std,
            unet_channels=unet_channels,
            unet_coord_channels=unet_coord_channels,
            unet_text_layers=unet_text_layers,
            sd3_patch_size=patch_size,
            sd3_layers=num_layers,
            sd3_heads=num_heads,
            sd3_head_dim=head_dim,
            seed=seed,
            train_text_encoder=train_text_encoder,
        )

    # ---- FlowBundle ---------------------------------------------------------------------------
    def replace_transformer(self, module: nn.Module) -> None:
        """Denoise with ``module`` from now on (a train backend's rebuild of the transformer)."""
        self.transformer = module

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> PixelFlowBundle:
        self.transformer.to(device=device, dtype=dtype)
        self.text_encoder.to(device=device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    def frozen_modules(self) -> dict[str, nn.Module]:
        return {"text_encoder": self.text_encoder}

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(
                f"height={height}, width={width} must be multiples of patch_size={self.patch_size}"
            )
        return (3, height, width)

    def image_seq_len(self, height: int, width: int) -> int:
        return (height // self.patch_size) * (width // self.patch_size)

    def encode_trainable(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Batched (prompt_embeds [B, L, D], pooled_prompt_embeds [B, P]) with autograd (for SFT)."""
        ids, mask = self.tokenizer(list(texts))
        return self.text_encoder(ids.to(self.device), mask.to(self.device))

    @torch.no_grad()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        embeds, pooled = self.encode_trainable(texts)
        return text_conditions(embeds, pooled)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        return sd3_style_velocity(self.transformer, latents, sigma, conditions)

    @torch.no_grad()
    def encode_images(self, images_BHWC: Tensor) -> Tensor:
        """Identity 'VAE': uint8 [B, H, W, 3] -> latents (pixels in [-1, 1], [B, 3, H, W]) for SFT."""
        return from_uint8_images(images_BHWC).to(self.device)

    def decode(self, latents: Tensor) -> Tensor:
        """Identity 'VAE': pixels in [-1, 1] -> uint8 [B, H, W, 3]."""
        return to_uint8_images(latents)
