"""FLUX.2 [klein] on diffusers: Flux2Transformer2DModel (4-axis rotary ids, no guidance embedding) +
AutoencoderKLFlux2 (32 channels, 2x2 patchified and batch-norm normalised) + Qwen3 as text
encoder (hidden states of three layers stacked along the feature axis).

What the family does, and where it lives here:
- sigma schedule: ``linspace(1, 1/T, T)`` under the scheduler config with FLUX.2's *empirical*
  ``mu`` (a function of the image token count and of the step count): ``PipelineSigmas``.
- CFG: Klein base models run classic CFG against the empty prompt (``guidance_scale`` > 1);
  step-distilled Klein (``is_distilled`` in model_index.json) runs none and ignores the scale,
  so the bundle reports ``embedded_guidance`` (no CFG batch) and the transformer gets no guidance.
- conditions: ``prompt_embeds`` [L, 3 D] padded by the tokenizer to ``max_sequence_length``,
  unmasked (the pipeline attends to the pad tokens too, so the bundle does the same).

Latents outside the bundle are the *patchified* normalised latents ``[B, 4 C, H/16, W/16]`` the
pipeline denoises; ``predict_velocity`` flattens them to tokens, ``decode`` undoes the batch norm
and the 2x2 patchify. FLUX.2 [dev] (Mistral text encoder, embedded guidance) is not covered here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import (
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Transformer2DModel,
)
from torch import Tensor, nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from unirl.rollout.ar.tokenizer import build_char_tokenizer
from unirl.rollout.models.base import DiffusersPipelineBundle, freeze, to_uint8_images
from unirl.rollout.models.loading import check_diffusers_dir
from unirl.rollout.models.pipeline_sigmas import PipelineSigmas, empirical_mu
from unirl.types import Conditions

__all__ = ["Flux2KleinBundle"]

COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
TEXT_ENCODER_OUT_LAYERS = (9, 18, 27)
"""The Qwen3 hidden states Flux2KleinPipeline stacks (its default ``text_encoder_out_layers``)."""


class Flux2KleinBundle(DiffusersPipelineBundle[Flux2KleinPipeline]):
    """FLUX.2 [klein] model bundle (implements ``FlowBundle``). Conditions: ``prompt_embeds`` [L, 3 D]."""

    def __init__(
        self,
        pipe: Flux2KleinPipeline,
        *,
        max_sequence_length: int = 512,
        text_encoder_out_layers: Sequence[int] = TEXT_ENCODER_OUT_LAYERS,
        device: torch.device | str = "cpu",
    ) -> None:
        self._pipe = pipe
        self.transformer: nn.Module = pipe.transformer
        self.vae: AutoencoderKLFlux2 = pipe.vae
        self.max_sequence_length = max_sequence_length
        self.text_encoder_out_layers = tuple(text_encoder_out_layers)
        self._device = torch.device(device)
        self.is_distilled = bool(pipe.config.get("is_distilled", False))
        # a distilled Klein runs no CFG batch (the pipeline ignores guidance_scale); the scale
        # then reaches predict_velocity as conditions["guidance"], which this family never reads
        self.embedded_guidance = self.is_distilled
        self.dynamic_schedule = PipelineSigmas(pipe.scheduler.config, empirical_mu, grid="numpy")
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
    ) -> Flux2KleinBundle:
        """Load from a local diffusers folder or a hub id (e.g. ``black-forest-labs/FLUX.2-klein-4B``)."""
        check_diffusers_dir(path, ["Flux2KleinPipeline"], COMPONENTS)
        pipe = Flux2KleinPipeline.from_pretrained(path, torch_dtype=dtype, **kwargs)
        pipe.set_progress_bar_config(disable=True)
        pipe.to(device)
        return cls(pipe, max_sequence_length=max_sequence_length, device=device)

    @classmethod
    def tiny_pipeline(cls, *, seed: int = 0, is_distilled: bool = False) -> Flux2KleinPipeline:
        """A tiny random Flux2KleinPipeline built in code (fp32): 16x16 images -> 16x4x4 patchified
        latents, 16 tokens. The Qwen3 text encoder has 27 layers of width 16 so the pipeline's own
        ``text_encoder_out_layers`` (9, 18, 27) apply; use ``max_sequence_length=64`` with it."""
        torch.manual_seed(seed)
        tok = build_char_tokenizer()
        tok.padding_side = "right"
        te = Qwen3ForCausalLM(
            Qwen3Config(
                hidden_size=16, intermediate_size=24, num_hidden_layers=27, num_attention_heads=2,
                num_key_value_heads=1, head_dim=8, vocab_size=len(tok), max_position_embeddings=128,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            )
        )  # fmt: skip
        vae = AutoencoderKLFlux2(
            block_out_channels=(4, 4), down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
            norm_num_groups=1, sample_size=16, use_quant_conv=False, use_post_quant_conv=False,
        )  # fmt: skip
        g = torch.Generator().manual_seed(seed)
        vae.bn.running_mean.copy_(0.3 * torch.randn(vae.bn.running_mean.shape, generator=g))
        vae.bn.running_var.copy_(0.5 + torch.rand(vae.bn.running_var.shape, generator=g))
        transformer = Flux2Transformer2DModel(
            patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=48, timestep_guidance_channels=32,
            axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False,
        )  # fmt: skip
        sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)
        pipe = Flux2KleinPipeline(
            scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer,
            is_distilled=is_distilled,
        )  # fmt: skip
        pipe.set_progress_bar_config(disable=True)
        return pipe

    @classmethod
    def tiny(cls, *, seed: int = 0, is_distilled: bool = False) -> Flux2KleinBundle:
        """The bundle over ``tiny_pipeline`` (fp32, CPU)."""
        return cls(cls.tiny_pipeline(seed=seed, is_distilled=is_distilled), max_sequence_length=64)

    # ---- FlowBundle ---------------------------------------------------------------------------
    def frozen_modules(self) -> dict[str, nn.Module]:
        return {"vae": self.vae, "text_encoder": self._pipe.text_encoder}

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        f = self._pipe.vae_scale_factor * 2
        if height % f or width % f:
            raise ValueError(
                f"height={height} and width={width} must be multiples of {f} for this FLUX.2 model"
            )
        return (self.transformer.config.in_channels, height // f, width // f)

    def image_seq_len(self, height: int, width: int) -> int:
        _, h, w = self.latent_shape(height, width)
        return h * w

    @torch.no_grad()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        embeds, _ = self._pipe.encode_prompt(
            prompt=list(texts),
            device=self._device,
            max_sequence_length=self.max_sequence_length,
            text_encoder_out_layers=self.text_encoder_out_layers,
        )
        return [Conditions(tensors={"prompt_embeds": e}) for e in embeds.cpu()]

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        b, c, h, w = latents.shape
        embeds = conditions["prompt_embeds"]
        # Flux2KleinPipeline: (sigma * 1000 in fp32, cast to the latent dtype) / 1000, no guidance input
        timestep = (sigma.to(torch.float32) * 1000.0).to(latents.dtype) / 1000
        out = self.transformer(
            hidden_states=Flux2KleinPipeline._pack_latents(latents),
            timestep=timestep,
            guidance=None,
            encoder_hidden_states=embeds,
            txt_ids=Flux2KleinPipeline._prepare_text_ids(embeds).to(latents.device),
            img_ids=Flux2KleinPipeline._prepare_latent_ids(latents).to(latents.device),
            return_dict=False,
        )[0]
        return out[:, : h * w].permute(0, 2, 1).reshape(b, c, h, w)  # tokens are in raster order

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        bn = self.vae.bn
        z = latents.to(self.vae.dtype)
        mean = bn.running_mean.view(1, -1, 1, 1).to(z.device, z.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(
            z.device, z.dtype
        )
        z = Flux2KleinPipeline._unpatchify_latents(z * std + mean)
        return to_uint8_images(self.vae.decode(z, return_dict=False)[0])
