"""Wan 2.1 / 2.2 on tiny configs built in code: save_pretrained -> WanBundle.from_pretrained, video
rollout -> replay parity (first-update ratio exactly 1, fp32 CPU) with CFG, ODE latents equal to
diffusers' WanPipeline for the same x_T, and Wan 2.2's two experts routed by sigma."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.models.base import NEGATIVE_PREFIX
from unirl.rollout.models.wan import WanBundle, WanExperts
from unirl.rollout.noise import initial_noise
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.types import DiffusionSamplingParams, NoiseRecipe, Sample, TextPrimitive, VideoPrimitive

PROMPTS = ["a red circle", "two blue squares"]


def make_samples() -> list[Sample]:
    return [
        Sample(id=f"w{g}", group_id=f"w{g}", inputs=[TextPrimitive(text=t)]) for g, t in enumerate(PROMPTS)
    ]


def params(bundle: WanBundle, **kw) -> DiffusionSamplingParams:  # type: ignore[no-untyped-def]
    base = dict(
        num_steps=4, guidance_scale=3.0, height=16, width=16, num_frames=5, eta=0.7,
        shift=bundle.default_shift, noise=NoiseRecipe(seed=2),
    )  # fmt: skip
    return DiffusionSamplingParams(**(base | kw))


@pytest.fixture(scope="module")
def wan(tmp_path_factory: pytest.TempPathFactory) -> WanBundle:
    """A tiny Wan saved with save_pretrained and loaded back through the real loading path."""
    path = tmp_path_factory.mktemp("wan")
    WanBundle.tiny(seed=0, flow_shift=3.0).pipe.save_pretrained(path)
    return WanBundle.from_pretrained(str(path), dtype=torch.float32, max_sequence_length=8)


def test_loaded_bundle_has_the_models_own_schedule_and_shapes(wan: WanBundle) -> None:
    ref = WanBundle.tiny(seed=0)
    for (k, a), (_, b) in zip(wan.transformer.state_dict().items(), ref.transformer.state_dict().items()):
        assert torch.equal(a, b), k  # the saved weights came back
    assert wan.default_shift == 3.0 and wan.vae.dtype == torch.float32
    assert wan.video_latent_shape(16, 16, 5) == (4, 2, 2, 2)  # (5 - 1) / 4 + 1 latent frames, 16 / 8
    assert wan.video_seq_len(16, 16, 5) == 2 * 1 * 1  # patch (1, 2, 2)
    with pytest.raises(ValueError, match="num_frames - 1 divisible by 4"):
        wan.video_latent_shape(16, 16, 4)


@pytest.mark.parametrize("strategy", ["flow_sde", "dance_sde"])
def test_video_rollout_replays_with_ratio_one(wan: WanBundle, strategy: str) -> None:
    pipe = FlowMatchPipeline(wan, default_params=params(wan, sde_strategy=strategy))
    parts = [s.part("diffusion") for s in pipe.generate(make_samples(), rollout_step=0)]
    seg = parts[0].segment
    assert seg.latents.shape == (5, 4, 2, 2, 2)  # [T + 1 stored, C, F_lat, h, w]
    assert NEGATIVE_PREFIX + "prompt_embeds" in parts[0].conditions.tensors  # CFG's negative prompt
    video = parts[0].outputs[0]
    assert isinstance(video, VideoPrimitive) and video.frames.shape == (5, 16, 16, 3)
    for j in seg.sde_indices:
        rep = pipe.replay_step(parts, j)
        stored = torch.stack([p.segment.log_probs[j] for p in parts])
        assert torch.equal(rep.log_prob, stored), (j, rep.log_prob - stored)


def test_ode_latents_equal_diffusers_wan_pipeline(wan: WanBundle) -> None:
    p = params(wan, sde_strategy="ode")
    samples = FlowMatchPipeline(wan, default_params=p).generate(make_samples(), rollout_step=0)
    conds = [s.part("diffusion").conditions for s in samples]
    x_T = initial_noise((4, 2, 2, 2), seed=2, keys=[f"sample:{s.id}" for s in samples], frame_axis=1)
    with torch.no_grad():
        ref = wan.pipe(
            prompt_embeds=torch.stack([c["prompt_embeds"] for c in conds]),
            negative_prompt_embeds=torch.stack([c[NEGATIVE_PREFIX + "prompt_embeds"] for c in conds]),
            num_inference_steps=4, guidance_scale=3.0, height=16, width=16, num_frames=5,
            latents=x_T, output_type="latent",
        ).frames  # fmt: skip
        ref_embeds, ref_neg = wan.pipe.encode_prompt(
            prompt=PROMPTS, do_classifier_free_guidance=True, max_sequence_length=8
        )
    ours = torch.stack([s.part("diffusion").segment.latent_at(4) for s in samples])
    # diffusers runs cond and uncond as two forwards, we batch them: equal up to fp32 rounding
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours, x_T, atol=1e-2)  # the loop really moved the latents
    torch.testing.assert_close(torch.stack([c["prompt_embeds"] for c in conds]), ref_embeds)
    torch.testing.assert_close(torch.stack([c[NEGATIVE_PREFIX + "prompt_embeds"] for c in conds]), ref_neg)


def test_wan22_two_experts_route_by_sigma_and_match_diffusers() -> None:
    bundle = WanBundle.tiny(seed=1, two_experts=True)
    experts = bundle.transformer
    assert isinstance(experts, WanExperts) and experts.boundary_timestep == 500.0
    x = torch.randn(2, 4, 2, 2, 2)
    emb = bundle.encode_prompts(PROMPTS)
    c = {"prompt_embeds": torch.stack([e["prompt_embeds"] for e in emb])}
    with torch.no_grad():
        mixed = bundle.predict_velocity(x, torch.tensor([0.9, 0.2]), c)  # one sample per expert
        hi = bundle.pipe.transformer(hidden_states=x, timestep=torch.tensor([900.0, 200.0]),
                                     encoder_hidden_states=c["prompt_embeds"], return_dict=False)[0]  # fmt: skip
        lo = bundle.pipe.transformer_2(hidden_states=x, timestep=torch.tensor([900.0, 200.0]),
                                       encoder_hidden_states=c["prompt_embeds"], return_dict=False)[0]  # fmt: skip
    assert torch.equal(mixed[0], hi[0]) and torch.equal(mixed[1], lo[1]) and not torch.allclose(hi, lo)
    # the whole ODE loop (experts switching at sigma 0.5) equals WanPipeline with boundary_ratio 0.5
    p = params(bundle, sde_strategy="ode", guidance_scale=1.0)
    samples = FlowMatchPipeline(bundle, default_params=p).generate(make_samples(), rollout_step=0)
    x_T = initial_noise((4, 2, 2, 2), seed=2, keys=[f"sample:{s.id}" for s in samples], frame_axis=1)
    with torch.no_grad():
        ref = bundle.pipe(
            prompt_embeds=c["prompt_embeds"], num_inference_steps=4, guidance_scale=1.0, height=16,
            width=16, num_frames=5, latents=x_T, output_type="latent",
        ).frames  # fmt: skip
    ours = torch.stack([s.part("diffusion").segment.latent_at(4) for s in samples])
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
