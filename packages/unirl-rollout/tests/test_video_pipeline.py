"""Video latents [B, C, F, h, w] through FlowMatchPipeline: frame-aware noise, decoded video Samples,
rollout -> replay parity (ratio 1, fp32 CPU) on the tiny pixel video bundle, and a clear error when
an image model is asked for frames."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.models.tiny.video_bundle import PixelVideoBundle
from unirl.rollout.noise import FrameNoise, initial_noise
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.types import (
    DiffusionSamplingParams,
    LatentTrajectory,
    NoiseRecipe,
    Sample,
    TextPrimitive,
    VideoPrimitive,
)


@pytest.fixture(scope="module")
def video_bundle() -> PixelVideoBundle:
    torch.manual_seed(0)
    bundle = PixelVideoBundle.tiny(channels=8, text_dim=16, text_layers=1, unet_text_layers=0, seed=1)
    # the zero-initialised output convs would make every velocity 0 (every log-prob equal): perturb
    with torch.no_grad():
        for p in bundle.transformer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return bundle


def params(**kw) -> DiffusionSamplingParams:  # type: ignore[no-untyped-def]
    base = dict(num_steps=3, guidance_scale=2.0, height=8, width=8, num_frames=3, eta=0.7, shift=1.0)
    return DiffusionSamplingParams(**(base | {"noise": NoiseRecipe(seed=5)} | kw))


def samples() -> list[Sample]:
    prompts = ["a red circle moving left", "a blue square moving up"]
    return [
        Sample(id=f"v{g}-{i}", group_id=f"v{g}", inputs=[TextPrimitive(text=t)])
        for g, t in enumerate(prompts)
        for i in range(2)
    ]


def test_frame_aware_noise_does_not_depend_on_the_frame_count() -> None:
    long = initial_noise((3, 5, 4, 4), seed=2, keys=["sample:a", "sample:b"], frame_axis=1)
    short = initial_noise((3, 2, 4, 4), seed=2, keys=["sample:a", "sample:b"], frame_axis=1)
    assert long.shape == (2, 3, 5, 4, 4)
    assert torch.equal(long[:, :, :2], short)  # frame f's noise is the same in a 2- and a 5-frame video
    assert not torch.equal(long[:, :, 0], long[:, :, 1])  # frames are independent draws
    assert not torch.equal(long[0], long[1])
    # the per-step stream: the k-th draw of a frame is the same whatever the number of frames
    a, b = FrameNoise(2, "k", (3, 4, 2, 2), 1, "sde"), FrameNoise(2, "k", (3, 1, 2, 2), 1, "sde")
    a.draw(), b.draw()
    assert torch.equal(a.draw()[:, :1], b.draw())
    # standard normal: the 3 * 5 * 16 * 2 = 480 draws have mean ~0 and std ~1
    assert abs(float(long.mean())) < 0.15 and abs(float(long.std()) - 1.0) < 0.1


def test_video_rollout_fills_a_video_part_and_replays_with_ratio_one(video_bundle) -> None:  # type: ignore[no-untyped-def]
    pipe = FlowMatchPipeline(video_bundle, default_params=params(sde_strategy="dance_sde"))
    out = pipe.generate(samples(), rollout_step=3)
    parts = [s.part("diffusion") for s in out]
    seg = parts[0].segment
    assert isinstance(seg, LatentTrajectory) and seg.sde_indices == [0, 1, 2]
    assert seg.latents.shape == (len(seg.positions), 3, 3, 8, 8)  # [S, C, F, h, w]
    video = parts[0].outputs[0]
    assert isinstance(video, VideoPrimitive) and video.fps == video_bundle.fps
    assert video.frames.shape == (3, 8, 8, 3) and video.frames.dtype == torch.uint8
    # x_T is the frame-aware draw of the sample id
    x_T = initial_noise((3, 3, 8, 8), seed=5, keys=["sample:v0-0"], frame_axis=1)[0]
    assert torch.equal(seg.latent_at(0), x_T)
    for j in seg.sde_indices:
        rep = pipe.replay_step(parts, j)
        stored = torch.stack([p.segment.log_probs[p.segment.sde_indices.index(j)] for p in parts])
        ratio = torch.exp(rep.log_prob - stored)
        assert torch.equal(rep.log_prob, stored), (j, ratio)  # first-update ratio exactly 1 in fp32
    assert len({float(p.segment.log_probs[0]) for p in parts}) == 4  # a real, sample-dependent score


def test_image_bundle_asked_for_frames_fails_clearly(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    pipe = FlowMatchPipeline(sd3_bundle, default_params=params(height=16, width=16))
    with pytest.raises(TypeError, match="num_frames=3 asks for a video.*SD3Bundle"):
        pipe.generate(samples()[:1], rollout_step=0)
