"""Wan 2.1 / 2.2 text-to-video on diffusers: WanTransformer3DModel + AutoencoderKLWan + UMT5 (implements
``VideoFlowBundle``).

- Latents ``[B, z_dim, F_lat, H/8, W/8]`` with ``F_lat = (num_frames - 1) / 4 + 1`` (the causal VAE
  keeps the first frame and compresses time 4x); the VAE's per-channel ``latents_mean`` / ``latents_std``
  normalise them, exactly as ``WanPipeline`` decodes.
- Schedule: the model's own static flow shift (``scheduler.config.flow_shift`` of Wan's UniPC
  scheduler, or ``shift`` of a flow-match Euler one), exposed as ``default_shift``; timesteps are
  ``1000 sigma`` in fp32. Wan 2.2 TI2V-5B (``expand_timesteps``) gets one timestep per video token.
- CFG: classifier-free with the negative prompt (``v_u + w (v_c - v_u)``, cond and uncond in one
  batched forward; diffusers runs two forwards, equal up to float rounding).
- Wan 2.2 A14B's two experts (``transformer`` for high noise, ``transformer_2`` below
  ``boundary_ratio * 1000``) are one trainable ``WanExperts`` module routing each sample by its
  sigma, so RL trains both and replay runs the expert the rollout ran. Both use one guidance
  scale (diffusers' ``guidance_scale_2`` is not separate here).
- Prompts go through diffusers' own ``WanPipeline.encode_prompt`` (embeddings zero-padded to
  ``max_sequence_length``, as the reference pipeline feeds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
from torch import Tensor, nn
from transformers import UMT5Config, UMT5EncoderModel

from unirl.rollout.models.base import DiffusersPipelineBundle, freeze, from_uint8_videos, to_uint8_videos
from unirl.rollout.models.tokenizers import tiny_word_tokenizer
from unirl.rollout.schedules import DynamicShiftSchedule
from unirl.types import Conditions

__all__ = ["WanBundle", "WanExperts"]


class WanExperts(nn.Module):
    """Wan 2.2 A14B's two denoisers as one module: ``high`` for timesteps >= ``boundary``, ``low`` below.

    Called with WanTransformer3DModel's signature; a batch whose samples straddle the boundary runs
    both experts and picks per sample."""

    def __init__(self, high: nn.Module, low: nn.Module, boundary_timestep: float) -> None:
        super().__init__()
        self.high, self.low = high, low
        self.boundary_timestep = float(boundary_timestep)

    @property
    def config(self) -> Any:
        return self.high.config

    def forward(self, hidden_states: Tensor, timestep: Tensor, **kwargs: Any) -> tuple[Tensor]:
        t_B = timestep if timestep.ndim == 1 else timestep[:, 0]
        use_high = t_B >= self.boundary_timestep
        if bool(use_high.all()):
            return (self.high(hidden_states=hidden_states, timestep=timestep, **kwargs)[0],)
        if not bool(use_high.any()):
            return (self.low(hidden_states=hidden_states, timestep=timestep, **kwargs)[0],)
        hi = self.high(hidden_states=hidden_states, timestep=timestep, **kwargs)[0]
        lo = self.low(hidden_states=hidden_states, timestep=timestep, **kwargs)[0]
        return (torch.where(use_high.view(-1, *([1] * (hi.ndim - 1))), hi, lo),)


class WanBundle(DiffusersPipelineBundle[WanPipeline]):
    """Wan 2.1 / 2.2 model bundle (module docstring). Conditions: ``prompt_embeds`` [L, D]."""

    def __init__(
        self,
        pipe: WanPipeline,
        *,
        max_sequence_length: int = 512,
        fps: float = 16.0,
        device: torch.device | str = "cpu",
    ) -> None:
        self._pipe = pipe
        self.vae: AutoencoderKLWan = pipe.vae
        self.max_sequence_length = max_sequence_length
        self.fps = fps
        self._device = torch.device(device)
        self.embedded_guidance = False  # classifier-free guidance with the negative prompt
        boundary = pipe.config.get("boundary_ratio", None)
        if pipe.transformer_2 is not None and boundary is not None:
            t_train = pipe.scheduler.config.get("num_train_timesteps", 1000)
            self.transformer: nn.Module = WanExperts(pipe.transformer, pipe.transformer_2, boundary * t_train)
        elif pipe.transformer is None:
            raise ValueError("this Wan checkpoint has no `transformer` (only transformer_2): not loadable")
        else:
            self.transformer = pipe.transformer
        self.expand_timesteps = bool(pipe.config.get("expand_timesteps", False))
        cfg = pipe.scheduler.config
        self.default_shift = float(cfg.get("flow_shift", None) or cfg.get("shift", None) or 5.0)
        self.dynamic_schedule = DynamicShiftSchedule(base_grid="scheduler")  # unused: Wan shifts statically
        freeze(pipe.vae, pipe.text_encoder)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        dtype: torch.dtype = torch.bfloat16,
        vae_dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_sequence_length: int = 512,
        fps: float = 16.0,
        **kwargs: Any,
    ) -> WanBundle:
        """Load a diffusers Wan folder or hub id (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``, ``...Wan2.2-T2V-A14B...``).

        The VAE loads in ``vae_dtype`` (fp32 by default, as Wan's model cards advise)."""
        vae = AutoencoderKLWan.from_pretrained(path, subfolder="vae", torch_dtype=vae_dtype)
        pipe = WanPipeline.from_pretrained(path, vae=vae, torch_dtype=dtype, **kwargs)
        pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, max_sequence_length=max_sequence_length, fps=fps, device=device)

    @classmethod
    def tiny(
        cls, *, seed: int = 0, text_len: int = 8, two_experts: bool = False, flow_shift: float = 3.0
    ) -> WanBundle:
        """A tiny random Wan built in code (fp32, CPU) for tests: latents [4, F_lat, H/8, W/8].

        ``two_experts``: a Wan 2.2 A14B-style pair (``transformer_2``, ``boundary_ratio=0.5``)."""
        torch.manual_seed(seed)
        tok = tiny_word_tokenizer(model_max_length=text_len)
        text_encoder = UMT5EncoderModel(
            UMT5Config(
                vocab_size=len(tok), d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4,
                relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=3, decoder_start_token_id=0,
            )
        )  # fmt: skip

        def transformer() -> WanTransformer3DModel:
            return WanTransformer3DModel(
                patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32,
            )  # fmt: skip

        vae = AutoencoderKLWan(
            base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
            latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.8, 1.2, 2.0],
        )  # fmt: skip
        pipe = WanPipeline(
            tokenizer=tok,
            text_encoder=text_encoder,
            vae=vae,
            scheduler=FlowMatchEulerDiscreteScheduler(shift=flow_shift),
            transformer=transformer(),
            transformer_2=transformer() if two_experts else None,
            boundary_ratio=0.5 if two_experts else None,
        )
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, max_sequence_length=text_len)

    # ---- VideoFlowBundle ----------------------------------------------------------------------
    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> WanBundle:
        """Move every module to ``device`` (the transformer(s) also to ``dtype``; the VAE keeps its own)."""
        self._pipe.to(device)
        if dtype is not None:
            self.transformer.to(dtype)
        self._device = torch.device(device)
        return self

    def frozen_modules(self) -> dict[str, nn.Module]:
        return {"vae": self._pipe.vae, "text_encoder": self._pipe.text_encoder}

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        raise ValueError(
            "WanBundle samples videos: set sampling_params.num_frames (e.g. 81, or 1 for an image)"
        )

    def image_seq_len(self, height: int, width: int) -> int:
        return self.video_seq_len(height, width, 1)

    def video_latent_shape(self, height: int, width: int, num_frames: int) -> tuple[int, ...]:
        p = self._pipe
        s, t = p.vae_scale_factor_spatial, p.vae_scale_factor_temporal
        _, ph, pw = self.transformer.config.patch_size
        if height % (s * ph) or width % (s * pw):
            raise ValueError(
                f"height={height}, width={width} must be multiples of {s * ph} for this Wan model"
            )
        if (num_frames - 1) % t:
            raise ValueError(
                f"num_frames={num_frames}: Wan needs num_frames - 1 divisible by {t} (e.g. 33, 49, 81)"
            )
        c = self.transformer.config.in_channels
        return (c, (num_frames - 1) // t + 1, height // s, width // s)

    def video_seq_len(self, height: int, width: int, num_frames: int) -> int:
        _, f, h, w = self.video_latent_shape(height, width, num_frames)
        pt, ph, pw = self.transformer.config.patch_size
        return (f // pt) * (h // ph) * (w // pw)

    @torch.no_grad()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        embeds, _ = self._pipe.encode_prompt(
            prompt=list(texts),
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self._device,
        )
        return [Conditions(tensors={"prompt_embeds": e}) for e in embeds.cpu()]

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        t = sigma.to(torch.float32) * 1000.0
        if self.expand_timesteps:  # Wan 2.2 TI2V: one timestep per video token (all equal for T2V)
            pt, ph, pw = self.transformer.config.patch_size
            _, _, f, h, w = latents.shape
            t = t[:, None].expand(-1, (f // pt) * (h // ph) * (w // pw))
        return self.transformer(
            hidden_states=latents,
            timestep=t,
            encoder_hidden_states=conditions["prompt_embeds"],
            return_dict=False,
        )[0]

    def _stats(self, like: Tensor) -> tuple[Tensor, Tensor]:
        cfg, z = self.vae.config, self.vae.config.z_dim
        mean = torch.tensor(cfg.latents_mean).view(1, z, 1, 1, 1).to(like.device, like.dtype)
        std = torch.tensor(cfg.latents_std).view(1, z, 1, 1, 1).to(like.device, like.dtype)
        return mean, std

    @torch.no_grad()
    def encode_images(self, videos_BFHWC: Tensor) -> Tensor:
        """uint8 videos [B, F, H, W, 3] -> normalised latents (the posterior mode), for SFT."""
        x = from_uint8_videos(videos_BFHWC).to(self.device, self.vae.dtype)
        z = self.vae.encode(x).latent_dist.mode()
        mean, std = self._stats(z)
        return (z - mean) / std

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        z = latents.to(self.device, self.vae.dtype)
        mean, std = self._stats(z)
        return to_uint8_videos(self.vae.decode(z * std + mean, return_dict=False)[0])
