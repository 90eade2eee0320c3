"""Qwen-Image on diffusers: QwenImageTransformer2DModel (packed 2x2 latent tokens, MSRoPE) +
AutoencoderKLQwenImage (a one-frame video VAE, per-channel latent mean / std) + the
Qwen2.5-VL language model as text encoder (last hidden state after a system-prompt template).

What the family does, and where it lives here:
- sigma schedule: ``linspace(1, 1/T, T)`` shifted with ``mu = calculate_shift(image tokens)``
  under the model's own scheduler config (dynamic shift, ``shift_terminal``): ``PipelineSigmas``.
- CFG: "true CFG" with a negative prompt, the guided velocity rescaled per token to the norm of
  the conditional one (``combine_cfg``); ``guidance_scale`` is QwenImagePipeline's ``true_cfg_scale``.
- conditions: ``prompt_embeds`` [L, D] with a per-prompt length L and ``prompt_embeds_mask`` [L]
  (ones); batches are right-padded (``stack_conditions``), the padding masked in attention.

Latents stay unpacked ``[B, C, h, w]`` (the VAE's single frame dropped) outside the bundle.
Prompt encoding is diffusers' own ``QwenImagePipeline.encode_prompt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import (
    AutoencoderKLQwenImage,
    FlowMatchEulerDiscreteScheduler,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
)
from torch import Tensor, nn
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from unirl.rollout.ar.tokenizer import build_char_tokenizer
from unirl.rollout.models.base import DiffusersPipelineBundle, freeze, to_uint8_images
from unirl.rollout.models.loading import check_diffusers_dir
from unirl.rollout.models.pipeline_sigmas import PipelineSigmas, calculate_shift_of
from unirl.types import Conditions

__all__ = ["QwenImageBundle"]

COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")


class QwenImageBundle(DiffusersPipelineBundle[QwenImagePipeline]):
    """Qwen-Image model bundle (implements ``FlowBundle``). Conditions: ``prompt_embeds`` [L, D],
    ``prompt_embeds_mask`` [L] (int64 ones; zero where a batch pads)."""

    def __init__(
        self, pipe: QwenImagePipeline, *, max_sequence_length: int = 512, device: torch.device | str = "cpu"
    ) -> None:
        self._pipe = pipe
        self.transformer: nn.Module = pipe.transformer
        self.vae: AutoencoderKLQwenImage = pipe.vae
        self.max_sequence_length = max_sequence_length
        self._device = torch.device(device)
        # guidance_embeds exists in the config but no released Qwen-Image uses it: true CFG only
        self.embedded_guidance = False
        cfg = pipe.scheduler.config
        self.dynamic_schedule = PipelineSigmas(cfg, calculate_shift_of(cfg), grid="numpy")
        freeze(pipe.vae, pipe.text_encoder)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        max_sequence_length: int = 512,
        **kwargs: Any,
    ) -> QwenImageBundle:
        """Load from a local diffusers folder or a hub id (e.g. ``Qwen/Qwen-Image``)."""
        check_diffusers_dir(path, ["QwenImagePipeline"], COMPONENTS)
        pipe = QwenImagePipeline.from_pretrained(path, torch_dtype=dtype, **kwargs)
        pipe.set_progress_bar_config(disable=True)
        pipe.to(device)
        return cls(pipe, max_sequence_length=max_sequence_length, device=device)

    @classmethod
    def tiny_pipeline(cls, *, seed: int = 0) -> QwenImagePipeline:
        """A tiny random QwenImagePipeline built in code (fp32): 16x16 images -> 8x8x4 latents, 16 tokens.

        The scheduler config is Qwen-Image's (dynamic shift 0.5..0.9 over 256..8192 tokens,
        ``shift_terminal=0.02``); the tokenizer is character-level with a ChatML template."""
        torch.manual_seed(seed)
        tok = build_char_tokenizer()
        tok.padding_side = "right"
        text = dict(
            hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=2048,
            rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )  # fmt: skip
        vision = dict(
            depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32, patch_size=2,
            spatial_merge_size=1, temporal_patch_size=1,
        )  # fmt: skip
        te = Qwen2_5_VLForConditionalGeneration(
            Qwen2_5_VLConfig(text_config=text, vision_config=vision, vocab_size=len(tok))
        )
        vae = AutoencoderKLQwenImage(
            base_dim=4, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False],
            latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.8, 1.2, 1.0],
        )  # fmt: skip
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 6, 6),
        )  # fmt: skip
        sched = FlowMatchEulerDiscreteScheduler(
            use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
            max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential", shift=1.0,
        )  # fmt: skip
        pipe = QwenImagePipeline(
            scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer
        )
        pipe.set_progress_bar_config(disable=True)
        return pipe

    @classmethod
    def tiny(cls, *, seed: int = 0) -> QwenImageBundle:
        """The bundle over ``tiny_pipeline`` (fp32, CPU)."""
        return cls(cls.tiny_pipeline(seed=seed))

    # ---- FlowBundle ---------------------------------------------------------------------------
    def frozen_modules(self) -> dict[str, nn.Module]:
        return {"vae": self.vae, "text_encoder": self._pipe.text_encoder}

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        vsf = self._pipe.vae_scale_factor
        if height % (vsf * 2) or width % (vsf * 2):
            raise ValueError(
                f"height={height} and width={width} must be multiples of {vsf * 2} for this Qwen-Image model"
            )
        return (self.vae.config.z_dim, height // vsf, width // vsf)

    def image_seq_len(self, height: int, width: int) -> int:
        _, h, w = self.latent_shape(height, width)
        return (h // 2) * (w // 2)

    @torch.no_grad()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        embeds, mask = self._pipe.encode_prompt(
            prompt=list(texts), device=self._device, max_sequence_length=self.max_sequence_length
        )
        lengths = [embeds.shape[1]] * len(texts) if mask is None else mask.sum(dim=1).tolist()
        return [
            Conditions(
                tensors={
                    "prompt_embeds": e[:n].cpu(),
                    "prompt_embeds_mask": torch.ones(int(n), dtype=torch.int64),
                }
            )
            for e, n in zip(embeds, lengths)
        ]

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        b, c, h, w = latents.shape
        mask = conditions["prompt_embeds_mask"]
        # QwenImagePipeline: (sigma * 1000 in fp32, cast to the latent dtype) / 1000; no mask when none pads
        timestep = (sigma.to(torch.float32) * 1000.0).to(latents.dtype) / 1000
        out = self.transformer(
            hidden_states=QwenImagePipeline._pack_latents(latents, b, c, h, w),
            timestep=timestep,
            encoder_hidden_states=conditions["prompt_embeds"],
            encoder_hidden_states_mask=None if bool(mask.all()) else mask,
            img_shapes=[[(1, h // 2, w // 2)]] * b,
            return_dict=False,
        )[0]
        return self._unpack(out, h, w)

    def combine_cfg(self, v_uncond: Tensor, v_cond: Tensor, scale: float) -> Tensor:
        """QwenImagePipeline's true CFG: ``v_u + w (v_c - v_u)`` rescaled to ``|v_c|`` per packed token."""
        b, c, h, w = v_cond.shape
        pu = QwenImagePipeline._pack_latents(v_uncond, b, c, h, w)
        pc = QwenImagePipeline._pack_latents(v_cond, b, c, h, w)
        comb = pu + scale * (pc - pu)
        comb = comb * (torch.norm(pc, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))
        return self._unpack(comb, h, w)

    def _unpack(self, packed: Tensor, h: int, w: int) -> Tensor:
        vsf = self._pipe.vae_scale_factor
        return QwenImagePipeline._unpack_latents(packed, h * vsf, w * vsf, vsf)[:, :, 0]

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        cfg = self.vae.config
        z = latents.to(self.vae.dtype)[:, :, None]
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(z.device, z.dtype)
        std = torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(z.device, z.dtype)
        z = z / (1.0 / std) + mean  # the pipeline divides by the reciprocal: keep its rounding
        return to_uint8_images(self.vae.decode(z, return_dict=False)[0][:, :, 0])
