"""Z-Image on diffusers: ZImageTransformer2DModel (single-stream S3-DiT over a list of per-sample
token sequences) + AutoencoderKL (16 channels, FLUX-style scale/shift) + Qwen3 as text encoder
(second-to-last hidden state of the chat-formatted prompt, pad tokens dropped).

What the family does, and where it lives here:
- sigma schedule: ``torch.linspace(1, 1/T, T)`` under the scheduler config (Z-Image ships a
  static shift 3.0; a dynamic config would get ``mu = calculate_shift``): ``PipelineSigmas``.
- model parametrisation: the transformer is fed ``1 - sigma`` and predicts ``x0 - eps``, so the
  velocity is its negation.
- CFG: ZImagePipeline guides as ``v_c + g (v_c - v_u)`` for ``g > 0`` (Z-Image-Turbo: g = 0, no CFG).
  That is classic CFG with ``w = g + 1``: ``sampling_params.guidance_scale`` is ``w`` (so Z-Image's
  ``guidance_scale=4`` is ``guidance_scale: 5`` here) and ``combine_cfg`` keeps the pipeline's rounding.
  ``cfg_normalization`` / ``cfg_truncation`` (off by default in diffusers) are not supported.
- conditions: ``prompt_embeds`` [L, D] of per-prompt length and ``prompt_embeds_mask`` [L] (ones);
  ``predict_velocity`` hands the transformer the unpadded list it expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
from torch import Tensor, nn
from transformers import Qwen3Config, Qwen3Model

from unirl.rollout.ar.tokenizer import build_char_tokenizer
from unirl.rollout.models.base import DiffusersPipelineBundle, freeze, to_uint8_images
from unirl.rollout.models.loading import check_diffusers_dir
from unirl.rollout.models.pipeline_sigmas import PipelineSigmas, calculate_shift_of
from unirl.types import Conditions

__all__ = ["ZImageBundle"]

COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")


class ZImageBundle(DiffusersPipelineBundle[ZImagePipeline]):
    """Z-Image model bundle (implements ``FlowBundle``). Conditions: ``prompt_embeds`` [L, D],
    ``prompt_embeds_mask`` [L] (int64 ones; zero where a batch pads)."""

    def __init__(
        self, pipe: ZImagePipeline, *, max_sequence_length: int = 512, device: torch.device | str = "cpu"
    ) -> None:
        self._pipe = pipe
        self.transformer: nn.Module = pipe.transformer
        self.vae: AutoencoderKL = pipe.vae
        self.max_sequence_length = max_sequence_length
        self._device = torch.device(device)
        self.embedded_guidance = False
        cfg = pipe.scheduler.config
        self.dynamic_schedule = PipelineSigmas(cfg, calculate_shift_of(cfg), grid="torch")
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
    ) -> ZImageBundle:
        """Load from a local diffusers folder or a hub id (e.g. ``Tongyi-MAI/Z-Image-Turbo``)."""
        check_diffusers_dir(path, ["ZImagePipeline"], COMPONENTS)
        pipe = ZImagePipeline.from_pretrained(path, torch_dtype=dtype, **kwargs)
        pipe.set_progress_bar_config(disable=True)
        pipe.to(device)
        return cls(pipe, max_sequence_length=max_sequence_length, device=device)

    @classmethod
    def tiny_pipeline(cls, *, seed: int = 0) -> ZImagePipeline:
        """A tiny random ZImagePipeline built in code (fp32): 16x16 images -> 4x8x8 latents, 16 tokens.
        The scheduler is Z-Image's (static shift 3.0); use ``max_sequence_length=64`` with it."""
        torch.manual_seed(seed)
        tok = build_char_tokenizer()
        tok.padding_side = "right"
        te = Qwen3Model(
            Qwen3Config(
                hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=8, vocab_size=len(tok), max_position_embeddings=128,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            )
        )  # fmt: skip
        vae = AutoencoderKL(
            sample_size=16, in_channels=3, out_channels=3, block_out_channels=(4, 4),
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            layers_per_block=1, latent_channels=4, norm_num_groups=1, use_quant_conv=False,
            use_post_quant_conv=False, shift_factor=0.1159, scaling_factor=0.3611,
        )  # fmt: skip
        transformer = ZImageTransformer2DModel(
            all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=1,
            n_refiner_layers=1, n_heads=2, n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 6, 6],
            axes_lens=[256, 32, 32],
        )  # fmt: skip
        sched = FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False
        )
        pipe = ZImagePipeline(
            scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer
        )
        pipe.set_progress_bar_config(disable=True)
        return pipe

    @classmethod
    def tiny(cls, *, seed: int = 0) -> ZImageBundle:
        """The bundle over ``tiny_pipeline`` (fp32, CPU)."""
        return cls(cls.tiny_pipeline(seed=seed), max_sequence_length=64)

    # ---- FlowBundle ---------------------------------------------------------------------------
    def frozen_modules(self) -> dict[str, nn.Module]:
        return {"vae": self.vae, "text_encoder": self._pipe.text_encoder}

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        vsf = self._pipe.vae_scale_factor
        if height % (vsf * 2) or width % (vsf * 2):
            raise ValueError(
                f"height={height} and width={width} must be multiples of {vsf * 2} for this Z-Image model"
            )
        return (self.transformer.config.in_channels, height // vsf, width // vsf)

    def image_seq_len(self, height: int, width: int) -> int:
        _, h, w = self.latent_shape(height, width)
        return (h // 2) * (w // 2)

    @torch.no_grad()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        embeds, _ = self._pipe.encode_prompt(
            prompt=list(texts),  # a copy: the pipeline rewrites the list in place with the chat template
            device=self._device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return [
            Conditions(
                tensors={
                    "prompt_embeds": e.cpu(),
                    "prompt_embeds_mask": torch.ones(e.shape[0], dtype=torch.int64),
                }
            )
            for e in embeds
        ]

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        embeds, mask = conditions["prompt_embeds"], conditions["prompt_embeds_mask"].bool()
        # ZImagePipeline: t = sigma * 1000 (fp32), the model sees (1000 - t) / 1000
        timestep = (1000 - sigma.to(torch.float32) * 1000.0) / 1000
        x = latents.to(self.dtype).unsqueeze(2)  # [B, C, 1, h, w]: one frame
        out = self.transformer(
            list(x.unbind(dim=0)),
            timestep,
            [e[m] for e, m in zip(embeds, mask)],
            return_dict=False,
        )[0]
        return -torch.stack([o.float() for o in out]).squeeze(2)

    def combine_cfg(self, v_uncond: Tensor, v_cond: Tensor, scale: float) -> Tensor:
        """ZImagePipeline's CFG ``v_c + g (v_c - v_u)`` with its ``g = scale - 1`` (see the module docstring)."""
        return v_cond + (scale - 1.0) * (v_cond - v_uncond)

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        cfg = self.vae.config
        z = latents.to(self.vae.dtype) / cfg.scaling_factor + cfg.shift_factor
        return to_uint8_images(self.vae.decode(z, return_dict=False)[0])
