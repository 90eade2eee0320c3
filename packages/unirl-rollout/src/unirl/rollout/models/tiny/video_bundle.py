"""A pixel-space text-to-video flow bundle for tiny from-scratch worlds (implements ``VideoFlowBundle``).

The "latents" are the RGB frames themselves in [-1, 1], ``[B, 3, F, H, W]`` (identity VAE); the
velocity model is ``TinyVideoUNet`` (factorised space / time); prompts go through the same
``WordTokenizer`` + frozen ``TinyTextEncoder`` as the image ``PixelFlowBundle`` (conditions keys
``prompt_embeds`` [L, D] and ``pooled_prompt_embeds`` [P]).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from unirl.rollout.models.base import (
    freeze,
    from_uint8_videos,
    sd3_style_velocity,
    text_conditions,
    to_uint8_videos,
)
from unirl.rollout.models.tiny.text_encoder import TinyTextEncoder, WordTokenizer
from unirl.rollout.models.tiny.video_unet import TinyVideoUNet
from unirl.rollout.schedules import DynamicShiftSchedule
from unirl.types import Conditions

__all__ = ["MOVING_SHAPES_VOCAB", "PixelVideoBundle"]

MOVING_SHAPES_VOCAB: tuple[str, ...] = (
    *("a", "red", "green", "blue", "circle", "square"),
    *("moving", "left", "right", "up", "down"),
)
"""The moving-shapes world's words (unirl.reward.worlds.moving_shapes.VOCAB; rollout may not import
reward, so it is repeated here and a test keeps the two equal)."""


class PixelVideoBundle:
    """Tiny pixel-space text-to-video flow model: ``TinyVideoUNet`` + word-level text encoder."""

    def __init__(
        self,
        transformer: nn.Module,
        text_encoder: TinyTextEncoder,
        tokenizer: WordTokenizer,
        *,
        fps: float = 4.0,
        default_shift: float = 1.0,
    ) -> None:
        self.transformer = transformer
        self.text_encoder = text_encoder
        self.tokenizer = tokenizer
        self.fps = fps
        self.default_shift = default_shift
        self.embedded_guidance = False  # classifier-free guidance with the empty prompt
        self.dynamic_schedule = DynamicShiftSchedule(base_grid="scheduler")
        freeze(text_encoder)

    @classmethod
    def tiny(
        cls,
        vocab: Sequence[str] = MOVING_SHAPES_VOCAB,
        *,
        channels: int = 16,
        text_dim: int = 64,
        text_layers: int = 2,
        unet_text_layers: int = 1,
        max_words: int = 6,
        max_frames: int = 16,
        text_pos_std: float = 1.0,
        fps: float = 4.0,
        seed: int = 0,
    ) -> PixelVideoBundle:
        """Randomly initialised (seeded) bundle built in code: no download."""
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
            net = TinyVideoUNet(
                3,
                channels,
                text_dim,
                text_dim,
                max_frames=max_frames,
                coord_channels=True,
                text_layers=unet_text_layers,
            )
        return cls(net, text, tokenizer, fps=fps)

    # ---- VideoFlowBundle ----------------------------------------------------------------------
    def replace_transformer(self, module: nn.Module) -> None:
        """Denoise with ``module`` from now on (a train backend's rebuild of the transformer)."""
        self.transformer = module

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> PixelVideoBundle:
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
        raise ValueError(
            "PixelVideoBundle samples videos: set sampling_params.num_frames (latents [3, F, H, W])"
        )

    def image_seq_len(self, height: int, width: int) -> int:
        return height * width

    def video_latent_shape(self, height: int, width: int, num_frames: int) -> tuple[int, ...]:
        if height % 8 or width % 8:
            raise ValueError(
                f"height={height}, width={width} must be multiples of 8 (three 2x downsamplings)"
            )
        return (3, num_frames, height, width)

    def video_seq_len(self, height: int, width: int, num_frames: int) -> int:
        return num_frames * height * width

    @torch.no_grad()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        ids, mask = self.tokenizer(list(texts))
        embeds, pooled = self.text_encoder(ids.to(self.device), mask.to(self.device))
        return text_conditions(embeds, pooled)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        return sd3_style_velocity(self.transformer, latents, sigma, conditions)

    @torch.no_grad()
    def encode_images(self, videos_BFHWC: Tensor) -> Tensor:
        """Identity 'VAE' for SFT: uint8 videos [B, F, H, W, 3] -> latents [B, 3, F, H, W] in [-1, 1]."""
        return from_uint8_videos(videos_BFHWC).to(self.device)

    def decode(self, latents: Tensor) -> Tensor:
        """Identity 'VAE': [B, 3, F, H, W] in [-1, 1] -> uint8 videos [B, F, H, W, 3]."""
        return to_uint8_videos(latents)
