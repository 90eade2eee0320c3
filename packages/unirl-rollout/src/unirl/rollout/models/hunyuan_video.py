"""HunyuanVideo (1.0) text-to-video on diffusers: HunyuanVideoTransformer3DModel + AutoencoderKLHunyuanVideo +
a Llama text encoder (prompt template, hidden state of the third-to-last layer) + CLIP pooled
(implements ``VideoFlowBundle``).

- Latents ``[B, C, (F - 1) / 4 + 1, H/8, W/8]``, scaled by the VAE's ``scaling_factor``.
- Guidance is *embedded* (HunyuanVideo is guidance-distilled): ``guidance_scale`` reaches the model
  as ``1000 w`` and no CFG batch runs (``embedded_guidance``), as in ``HunyuanVideoPipeline``.
- Schedule: the pipeline's own, ``HunyuanVideoSigmas`` (the flow-match Euler scheduler of the
  checkpoint, static shift 7 for HunyuanVideo, on the base grid ``linspace(1, 0, T + 1)[:-1]``);
  it is pinned when ``sampling_params.dynamic_shift`` is true (the bundle's ``dynamic_schedule``),
  otherwise the generic static shift of ``sampling_params.shift`` (``default_shift``) is used.
- Conditions: ``prompt_embeds`` [L, D], ``prompt_attention_mask`` [L] (the template's padded
  tokens), ``pooled_prompt_embeds`` [P], from diffusers' own ``encode_prompt``.

HunyuanVideo 1.5 (``HunyuanVideo15Transformer3DModel``) takes a Qwen2.5-VL and a byT5 text stream
and its own pipeline; it is not wrapped here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from diffusers import (
    AutoencoderKLHunyuanVideo,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideoPipeline,
    HunyuanVideoTransformer3DModel,
)
from torch import Tensor, nn
from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

from unirl.rollout.models.base import DiffusersPipelineBundle, freeze, from_uint8_videos, to_uint8_videos
from unirl.rollout.models.tokenizers import tiny_word_tokenizer
from unirl.types import Conditions

__all__ = ["HunyuanVideoBundle", "HunyuanVideoSigmas"]


class HunyuanVideoSigmas:
    """The T + 1 sigmas ``HunyuanVideoPipeline`` pins: its scheduler (fresh, from the checkpoint's
    config) set with ``sigmas = linspace(1, 0, T + 1)[:-1]`` (implements ``SigmaPolicy``)."""

    def __init__(self, scheduler_config: Mapping[str, Any]) -> None:
        self.config = dict(scheduler_config)

    def sigmas(self, num_steps: int, image_seq_len: int | None = None) -> list[float]:
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        sched = FlowMatchEulerDiscreteScheduler.from_config(self.config)
        sched.set_timesteps(sigmas=np.linspace(1.0, 0.0, num_steps + 1)[:-1], device="cpu")
        return [float(s) for s in sched.sigmas.tolist()]


class HunyuanVideoBundle(DiffusersPipelineBundle[HunyuanVideoPipeline]):
    """HunyuanVideo model bundle (module docstring)."""

    def __init__(
        self,
        pipe: HunyuanVideoPipeline,
        *,
        max_sequence_length: int = 256,
        prompt_template: dict[str, Any] | None = None,
        fps: float = 24.0,
        device: torch.device | str = "cpu",
    ) -> None:
        self._pipe = pipe
        self.transformer: nn.Module = pipe.transformer
        self.vae: AutoencoderKLHunyuanVideo = pipe.vae
        self.max_sequence_length = max_sequence_length
        self.prompt_template = prompt_template
        self.fps = fps
        self._device = torch.device(device)
        self.embedded_guidance = bool(pipe.transformer.config.guidance_embeds)
        cfg = pipe.scheduler.config
        self.default_shift = float(cfg.get("shift", 7.0))
        self.dynamic_schedule = HunyuanVideoSigmas(cfg)
        freeze(pipe.vae, pipe.text_encoder, pipe.text_encoder_2)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        max_sequence_length: int = 256,
        fps: float = 24.0,
        **kwargs: Any,
    ) -> HunyuanVideoBundle:
        """Load a diffusers HunyuanVideo folder or hub id (``hunyuanvideo-community/HunyuanVideo``)."""
        pipe = HunyuanVideoPipeline.from_pretrained(path, torch_dtype=dtype, **kwargs)
        pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, max_sequence_length=max_sequence_length, fps=fps, device=device)

    @classmethod
    def tiny(cls, *, seed: int = 0, text_len: int = 8) -> HunyuanVideoBundle:
        """A tiny random HunyuanVideo built in code (fp32, CPU) for tests: latents [4, F_lat, H/8, W/8].

        The prompt template is a short one (``"describe the video : {}"``, its 5 leading tokens
        cropped), since the word-level tiny tokenizer does not know Llama's chat tokens."""
        torch.manual_seed(seed)
        tok = tiny_word_tokenizer(model_max_length=text_len + 8)
        clip_tok = tiny_word_tokenizer(model_max_length=77)
        llama = LlamaModel(
            LlamaConfig(
                vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
            )
        )  # fmt: skip
        clip = CLIPTextModel(
            CLIPTextConfig(
                bos_token_id=2, eos_token_id=3, pad_token_id=0, hidden_size=8, intermediate_size=16,
                num_attention_heads=2, num_hidden_layers=1, vocab_size=len(clip_tok), projection_dim=8,
                max_position_embeddings=77,
            )
        )  # fmt: skip
        transformer = HunyuanVideoTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
            num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
            text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4),
        )  # fmt: skip
        vae = AutoencoderKLHunyuanVideo(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8, 8, 8),
            layers_per_block=1, norm_num_groups=4, spatial_compression_ratio=8, temporal_compression_ratio=4,
        )  # fmt: skip
        pipe = HunyuanVideoPipeline(
            text_encoder=llama,
            tokenizer=tok,
            transformer=transformer,
            vae=vae,
            scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
            text_encoder_2=clip,
            tokenizer_2=clip_tok,
        )
        pipe.set_progress_bar_config(disable=True)
        template = {"template": "describe the video : {}", "crop_start": 5}
        return cls(pipe, max_sequence_length=text_len, prompt_template=template)

    # ---- VideoFlowBundle ----------------------------------------------------------------------
    def frozen_modules(self) -> dict[str, nn.Module]:
        p = self._pipe
        return {"vae": p.vae, "text_encoder": p.text_encoder, "text_encoder_2": p.text_encoder_2}

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        raise ValueError("HunyuanVideoBundle samples videos: set sampling_params.num_frames (e.g. 33, 129)")

    def image_seq_len(self, height: int, width: int) -> int:
        return self.video_seq_len(height, width, 1)

    def video_latent_shape(self, height: int, width: int, num_frames: int) -> tuple[int, ...]:
        p, cfg = self._pipe, self.transformer.config
        s, t = p.vae_scale_factor_spatial, p.vae_scale_factor_temporal
        if height % (s * cfg.patch_size) or width % (s * cfg.patch_size):
            raise ValueError(
                f"height={height}, width={width} must be multiples of {s * cfg.patch_size} for this model"
            )
        if (num_frames - 1) % t:
            raise ValueError(f"num_frames={num_frames}: HunyuanVideo needs num_frames - 1 divisible by {t}")
        return (cfg.in_channels, (num_frames - 1) // t + 1, height // s, width // s)

    def video_seq_len(self, height: int, width: int, num_frames: int) -> int:
        _, f, h, w = self.video_latent_shape(height, width, num_frames)
        cfg = self.transformer.config
        return (f // cfg.patch_size_t) * (h // cfg.patch_size) * (w // cfg.patch_size)

    @torch.no_grad()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        kw = {} if self.prompt_template is None else {"prompt_template": self.prompt_template}
        embeds, pooled, mask = self._pipe.encode_prompt(
            prompt=list(texts), device=self._device, max_sequence_length=self.max_sequence_length, **kw
        )
        return [
            Conditions(tensors={"prompt_embeds": e, "prompt_attention_mask": m, "pooled_prompt_embeds": p})
            for e, m, p in zip(embeds.cpu(), mask.cpu(), pooled.cpu())
        ]

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        guidance = conditions["guidance"]  # [B] w: the pipeline adds it for an embedded-guidance bundle
        return self.transformer(
            hidden_states=latents,
            timestep=sigma.to(torch.float32) * 1000.0,
            encoder_hidden_states=conditions["prompt_embeds"],
            encoder_attention_mask=conditions["prompt_attention_mask"].to(self.dtype),
            pooled_projections=conditions["pooled_prompt_embeds"],
            guidance=guidance.to(self.dtype) * 1000.0,  # the pipeline casts w, then scales
            return_dict=False,
        )[0]

    @torch.no_grad()
    def encode_images(self, videos_BFHWC: Tensor) -> Tensor:
        """uint8 videos [B, F, H, W, 3] -> scaled latents (the posterior mode), for SFT."""
        x = from_uint8_videos(videos_BFHWC).to(self.device, self.vae.dtype)
        return self.vae.encode(x).latent_dist.mode() * self.vae.config.scaling_factor

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        z = latents.to(self.device, self.vae.dtype) / self.vae.config.scaling_factor
        return to_uint8_videos(self.vae.decode(z, return_dict=False)[0])
