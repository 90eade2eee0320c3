"""Stable Diffusion 3 / 3.5 on diffusers: SD3Transformer2DModel + AutoencoderKL + two CLIP text
encoders with projection + T5. Prompt encoding is diffusers' own ``StableDiffusion3Pipeline.encode_prompt``
so embeddings match the reference pipeline exactly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import (
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
)
from torch import Tensor, nn
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

from unirl.rollout.models.base import (
    DiffusersPipelineBundle,
    freeze,
    from_uint8_images,
    sd3_style_velocity,
    text_conditions,
    to_uint8_images,
)
from unirl.rollout.models.loading import check_diffusers_dir
from unirl.rollout.models.tokenizers import tiny_word_tokenizer
from unirl.rollout.schedules import DynamicShiftSchedule
from unirl.types import Conditions

__all__ = ["SD3Bundle"]


class SD3Bundle(DiffusersPipelineBundle[StableDiffusion3Pipeline]):
    """SD3 / SD3.5 model bundle (implements ``FlowBundle``).

    Conditions keys: ``prompt_embeds`` [L, D] and ``pooled_prompt_embeds`` [P].
    """

    def __init__(
        self,
        pipe: StableDiffusion3Pipeline,
        *,
        max_sequence_length: int = 256,
        device: torch.device | str = "cpu",
    ) -> None:
        self._pipe = pipe
        self.transformer: nn.Module = pipe.transformer
        self.vae: AutoencoderKL = pipe.vae
        self.max_sequence_length = max_sequence_length
        self._device = torch.device(device)
        self.embedded_guidance = False  # SD3 uses classifier-free guidance
        cfg = pipe.scheduler.config
        self.dynamic_schedule = DynamicShiftSchedule(
            base_shift=cfg.get("base_shift", 0.5) or 0.5,
            max_shift=cfg.get("max_shift", 1.15) or 1.15,
            base_seq_len=cfg.get("base_image_seq_len", 256),
            max_seq_len=cfg.get("max_image_seq_len", 4096),
            base_grid="scheduler",  # the SD3 pipeline lets the scheduler build its grid
        )
        self.default_shift = float(cfg.get("shift", 3.0))
        freeze(pipe.vae, pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        max_sequence_length: int = 256,
        **kwargs: Any,
    ) -> SD3Bundle:
        """Load from a local diffusers folder or a hub id (e.g. ``stabilityai/stable-diffusion-3.5-medium``)."""
        check_diffusers_dir(
            path,
            ["StableDiffusion3Pipeline"],
            ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler"),
        )
        pipe = StableDiffusion3Pipeline.from_pretrained(path, torch_dtype=dtype, **kwargs)
        pipe.to(device)
        return cls(pipe, max_sequence_length=max_sequence_length, device=device)

    @classmethod
    def tiny(cls, *, seed: int = 0, vocab_words: Sequence[str] | None = None, text_len: int = 8) -> SD3Bundle:
        """A tiny random SD3 built in code (fp32, CPU) for tests: 8x8x4 latents for 16x16 images."""
        torch.manual_seed(seed)
        tok = (
            tiny_word_tokenizer(model_max_length=text_len)
            if vocab_words is None
            else tiny_word_tokenizer(vocab_words, model_max_length=text_len)
        )
        clip_cfg = dict(
            bos_token_id=2, eos_token_id=3, pad_token_id=0, hidden_size=32, intermediate_size=37,
            num_attention_heads=4, num_hidden_layers=2, vocab_size=len(tok), hidden_act="gelu",
            projection_dim=32, max_position_embeddings=text_len,
        )  # fmt: skip
        te1 = CLIPTextModelWithProjection(CLIPTextConfig(**clip_cfg))
        te2 = CLIPTextModelWithProjection(CLIPTextConfig(**clip_cfg))
        te3 = T5EncoderModel(
            T5Config(
                vocab_size=len(tok),
                d_model=64,
                d_kv=8,
                d_ff=64,
                num_layers=1,
                num_heads=4,
                relative_attention_num_buckets=8,
                pad_token_id=0,
                eos_token_id=3,
                decoder_start_token_id=0,
            )
        )
        transformer = SD3Transformer2DModel(
            sample_size=8, patch_size=1, in_channels=4, num_layers=1, attention_head_dim=8,
            num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=64,
            pooled_projection_dim=64, out_channels=4, pos_embed_max_size=16,
        )  # fmt: skip
        vae = AutoencoderKL(
            sample_size=16, in_channels=3, out_channels=3, block_out_channels=(4, 4),
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            layers_per_block=1, latent_channels=4, norm_num_groups=1, use_quant_conv=False,
            use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035,
        )  # fmt: skip
        pipe = StableDiffusion3Pipeline(
            transformer=transformer,
            scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
            vae=vae,
            text_encoder=te1,
            tokenizer=tok,
            text_encoder_2=te2,
            tokenizer_2=tok,
            text_encoder_3=te3,
            tokenizer_3=tok,
        )
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, max_sequence_length=text_len)

    # ---- FlowBundle ---------------------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def frozen_modules(self) -> dict[str, nn.Module]:
        mods = {
            "vae": self._pipe.vae,
            "text_encoder": self._pipe.text_encoder,
            "text_encoder_2": self._pipe.text_encoder_2,
            "text_encoder_3": self._pipe.text_encoder_3,
        }
        return {k: m for k, m in mods.items() if m is not None}

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        f = self.vae_scale_factor * self._pipe.patch_size
        if height % f or width % f:
            raise ValueError(f"height={height} and width={width} must be multiples of {f} for this SD3 model")
        c = self._pipe.transformer.config.in_channels
        return (c, height // self.vae_scale_factor, width // self.vae_scale_factor)

    def image_seq_len(self, height: int, width: int) -> int:
        _, h, w = self.latent_shape(height, width)
        p = self._pipe.patch_size
        return (h // p) * (w // p)

    @torch.no_grad()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        embeds, _, pooled, _ = self._pipe.encode_prompt(
            prompt=list(texts),
            prompt_2=None,
            prompt_3=None,
            device=self._device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return text_conditions(embeds, pooled)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        return sd3_style_velocity(self.transformer, latents, sigma, conditions)

    @torch.no_grad()
    def encode_images(self, images_BHWC: Tensor) -> Tensor:
        """uint8 [B, H, W, 3] -> scaled VAE latents (the posterior mean), as SD3 training uses them."""
        cfg = self.vae.config
        x = from_uint8_images(images_BHWC).to(self.device, self.vae.dtype)
        z = self.vae.encode(x).latent_dist.mode()
        return (z - cfg.shift_factor) * cfg.scaling_factor

    def decode(self, latents: Tensor) -> Tensor:
        cfg = self.vae.config
        z = latents.to(self.vae.dtype) / cfg.scaling_factor + cfg.shift_factor
        return to_uint8_images(self.vae.decode(z, return_dict=False)[0])
