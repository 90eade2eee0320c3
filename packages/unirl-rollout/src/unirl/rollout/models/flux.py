"""FLUX.1 on diffusers: FluxTransformer2DModel (packed 2x2 latent tokens, rotary ids) + AutoencoderKL +
CLIPTextModel (pooled) + T5. Dynamic (resolution-dependent) sigma shift; FLUX.1-dev's guidance is
*embedded* (a model input), not classifier-free, so the pipeline passes it instead of batching CFG.

Latents stay unpacked ``[B, C, h, w]`` outside the bundle; ``predict_velocity`` packs and unpacks.
Prompt encoding is diffusers' own ``FluxPipeline.encode_prompt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from torch import Tensor, nn
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

from unirl.rollout.models.base import DiffusersPipelineBundle, freeze, to_uint8_images
from unirl.rollout.models.loading import check_diffusers_dir
from unirl.rollout.models.tokenizers import tiny_word_tokenizer
from unirl.rollout.schedules import DynamicShiftSchedule
from unirl.types import Conditions

__all__ = ["FluxBundle"]


class FluxBundle(DiffusersPipelineBundle[FluxPipeline]):
    """FLUX.1 model bundle (implements ``FlowBundle``). Conditions: ``prompt_embeds`` [L, D],
    ``pooled_prompt_embeds`` [P]; the pipeline adds ``guidance`` [B] when ``embedded_guidance``."""

    def __init__(
        self, pipe: FluxPipeline, *, max_sequence_length: int = 512, device: torch.device | str = "cpu"
    ) -> None:
        self._pipe = pipe
        self.transformer: nn.Module = pipe.transformer
        self.vae: AutoencoderKL = pipe.vae
        self.max_sequence_length = max_sequence_length
        self._device = torch.device(device)
        self.embedded_guidance = bool(pipe.transformer.config.guidance_embeds)
        cfg = pipe.scheduler.config
        self.dynamic_schedule = DynamicShiftSchedule(
            base_shift=cfg.get("base_shift", 0.5),
            max_shift=cfg.get("max_shift", 1.15),
            base_seq_len=cfg.get("base_image_seq_len", 256),
            max_seq_len=cfg.get("max_image_seq_len", 4096),
            time_shift_type=cfg.get("time_shift_type", "exponential"),
            shift_terminal=cfg.get("shift_terminal", None),
            base_grid="pipeline",  # FluxPipeline passes sigmas = linspace(1, 1/T, T)
        )
        freeze(pipe.vae, pipe.text_encoder, pipe.text_encoder_2)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        max_sequence_length: int = 512,
        **kwargs: Any,
    ) -> FluxBundle:
        """Load from a local diffusers folder or a hub id (e.g. ``black-forest-labs/FLUX.1-dev``)."""
        check_diffusers_dir(
            path,
            ["FluxPipeline"],
            ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler"),
        )
        pipe = FluxPipeline.from_pretrained(path, torch_dtype=dtype, **kwargs)
        pipe.to(device)
        return cls(pipe, max_sequence_length=max_sequence_length, device=device)

    @classmethod
    def tiny(cls, *, seed: int = 0, text_len: int = 8, guidance_embeds: bool = False) -> FluxBundle:
        """A tiny random FLUX built in code (fp32, CPU): 16x16 images -> 8x8x4 latents, 16 packed tokens."""
        torch.manual_seed(seed)
        tok = tiny_word_tokenizer(model_max_length=text_len)
        clip = CLIPTextModel(
            CLIPTextConfig(
                bos_token_id=2, eos_token_id=3, pad_token_id=0, hidden_size=32, intermediate_size=37,
                num_attention_heads=4, num_hidden_layers=2, vocab_size=len(tok), projection_dim=32,
                max_position_embeddings=text_len,
            )
        )  # fmt: skip
        t5 = T5EncoderModel(
            T5Config(
                vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=3, decoder_start_token_id=0,
            )
        )  # fmt: skip
        transformer = FluxTransformer2DModel(
            patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
            guidance_embeds=guidance_embeds,
        )  # fmt: skip
        vae = AutoencoderKL(
            sample_size=16, in_channels=3, out_channels=3, block_out_channels=(4, 4),
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            layers_per_block=1, latent_channels=4, norm_num_groups=1, use_quant_conv=False,
            use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035,
        )  # fmt: skip
        sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)
        pipe = FluxPipeline(
            scheduler=sched, vae=vae, text_encoder=clip, tokenizer=tok, text_encoder_2=t5, tokenizer_2=tok,
            transformer=transformer,
        )  # fmt: skip
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, max_sequence_length=text_len)

    def frozen_modules(self) -> dict[str, nn.Module]:
        mods = {
            "vae": self.vae,
            "text_encoder": self._pipe.text_encoder,
            "text_encoder_2": self._pipe.text_encoder_2,
        }
        return {k: m for k, m in mods.items() if m is not None}

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        f = self._pipe.vae_scale_factor * 2  # VAE downsampling, then 2x2 packing
        if height % f or width % f:
            raise ValueError(
                f"height={height} and width={width} must be multiples of {f} for this FLUX model"
            )
        c = self.transformer.config.in_channels // 4
        return (c, height // self._pipe.vae_scale_factor, width // self._pipe.vae_scale_factor)

    def image_seq_len(self, height: int, width: int) -> int:
        _, h, w = self.latent_shape(height, width)
        return (h // 2) * (w // 2)

    @torch.no_grad()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        embeds, pooled, _ = self._pipe.encode_prompt(
            prompt=list(texts),
            prompt_2=None,
            device=self._device,
            max_sequence_length=self.max_sequence_length,
        )
        return [
            Conditions(tensors={"prompt_embeds": e, "pooled_prompt_embeds": p})
            for e, p in zip(embeds.cpu(), pooled.cpu())
        ]

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        b, c, h, w = latents.shape
        packed = FluxPipeline._pack_latents(latents, b, c, h, w)
        img_ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, latents.device, latents.dtype)
        embeds = conditions["prompt_embeds"]
        txt_ids = torch.zeros(embeds.shape[1], 3, device=latents.device, dtype=embeds.dtype)
        # FluxPipeline feeds (sigma * 1000 in fp32, cast to the latent dtype) / 1000
        timestep = (sigma.to(torch.float32) * 1000.0).to(latents.dtype) / 1000
        guidance = conditions.get("guidance") if self.embedded_guidance else None
        out = self.transformer(
            hidden_states=packed,
            timestep=timestep,
            guidance=guidance,
            pooled_projections=conditions["pooled_prompt_embeds"],
            encoder_hidden_states=embeds,
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]
        vsf = self._pipe.vae_scale_factor
        return FluxPipeline._unpack_latents(out, h * vsf, w * vsf, vsf)

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        cfg = self.vae.config
        z = latents.to(self.vae.dtype) / cfg.scaling_factor + cfg.shift_factor
        return to_uint8_images(self.vae.decode(z, return_dict=False)[0])
