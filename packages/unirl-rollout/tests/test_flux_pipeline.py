"""The same FlowMatchPipeline on a tiny FLUX: packed latents, dynamic shift, embedded guidance."""

from __future__ import annotations

import torch
from diffusers import FluxPipeline

from unirl.rollout.models.flux import FluxBundle
from unirl.rollout.noise import initial_noise
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.rollout.schedules import calculate_shift, dynamic_shifted_sigmas
from unirl.types import DiffusionSamplingParams, NoiseRecipe, Sample, TextPrimitive

PROMPTS = ["a red circle", "two blue squares"]


def samples() -> list[Sample]:
    return [
        Sample(id=f"f{i}", group_id=f"g{i}", inputs=[TextPrimitive(text=t)]) for i, t in enumerate(PROMPTS)
    ]


def params(**kw) -> DiffusionSamplingParams:  # type: ignore[no-untyped-def]
    base = dict(
        num_steps=3, guidance_scale=1.0, height=16, width=16, dynamic_shift=True, noise=NoiseRecipe(seed=1)
    )
    return DiffusionSamplingParams(**(base | kw))


def test_flux_ode_matches_diffusers_flux_pipeline(flux_bundle) -> None:  # type: ignore[no-untyped-def]
    out = FlowMatchPipeline(flux_bundle, default_params=params(sde_strategy="ode")).generate(
        samples(), rollout_step=0
    )
    seg = out[0].part("diffusion").segment
    # 16x16 px -> 8x8 latents -> 4x4 = 16 packed tokens drive mu
    assert seg.sigmas == dynamic_shifted_sigmas(3, calculate_shift(16))
    x_T = initial_noise((4, 8, 8), seed=1, keys=["sample:f0", "sample:f1"])
    with torch.no_grad():
        ref = flux_bundle.pipe(
            prompt=PROMPTS,
            num_inference_steps=3,
            height=16,
            width=16,
            latents=FluxPipeline._pack_latents(x_T, 2, 4, 8, 8),
            output_type="latent",
            max_sequence_length=flux_bundle.max_sequence_length,
        ).images
    ref = FluxPipeline._unpack_latents(ref, 16, 16, flux_bundle.pipe.vae_scale_factor)
    ours = torch.stack([s.part("diffusion").segment.latent_at(3) for s in out])
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)


def test_flux_replay_parity_with_cfg_and_embedded_guidance(flux_bundle) -> None:  # type: ignore[no-untyped-def]
    for bundle in (flux_bundle, FluxBundle.tiny(seed=1, guidance_embeds=True)):
        pipe = FlowMatchPipeline(bundle, default_params=params(guidance_scale=3.5))
        parts = [s.part("diffusion") for s in pipe.generate(samples(), rollout_step=0)]
        has_negative = "negative_prompt_embeds" in parts[0].conditions.tensors
        assert has_negative != bundle.embedded_guidance  # true CFG stores the negative prompt
        for n, j in enumerate(parts[0].segment.sde_indices):
            r = pipe.replay_step(parts, j)
            stored = torch.stack([p.segment.log_probs[n] for p in parts])
            torch.testing.assert_close(r.log_prob, stored, atol=1e-6, rtol=0)
