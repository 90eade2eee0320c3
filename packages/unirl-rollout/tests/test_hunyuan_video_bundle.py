"""HunyuanVideo (1.0) on a tiny config built in code: save_pretrained -> from_pretrained, the
pipeline's own sigmas, embedded guidance, rollout -> replay parity (ratio exactly 1, fp32 CPU) and
ODE latents equal to diffusers' HunyuanVideoPipeline for the same x_T."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from unirl.rollout.models.hunyuan_video import HunyuanVideoBundle
from unirl.rollout.noise import initial_noise
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.types import DiffusionSamplingParams, NoiseRecipe, Sample, TextPrimitive, VideoPrimitive

PROMPTS = ["a red circle", "two blue squares left"]


def make_samples() -> list[Sample]:
    return [
        Sample(id=f"h{g}", group_id=f"h{g}", inputs=[TextPrimitive(text=t)]) for g, t in enumerate(PROMPTS)
    ]


def params(**kw) -> DiffusionSamplingParams:  # type: ignore[no-untyped-def]
    base = dict(
        num_steps=3, guidance_scale=6.0, height=16, width=16, num_frames=5, eta=0.7,
        dynamic_shift=True, noise=NoiseRecipe(seed=4),
    )  # fmt: skip
    return DiffusionSamplingParams(**(base | kw))


@pytest.fixture(scope="module")
def hy(tmp_path_factory: pytest.TempPathFactory) -> HunyuanVideoBundle:
    path = tmp_path_factory.mktemp("hunyuan")
    tiny = HunyuanVideoBundle.tiny(seed=0)
    tiny.pipe.save_pretrained(path)
    loaded = HunyuanVideoBundle.from_pretrained(str(path), dtype=torch.float32, max_sequence_length=8)
    loaded.prompt_template = tiny.prompt_template  # the tiny tokenizer's template (see tiny())
    return loaded


def test_schedule_is_the_pipelines_own(hy: HunyuanVideoBundle) -> None:
    # shift 7 on linspace(1, 0, 4)[:-1] = [1, 2/3, 1/3]: 7 s / (1 + 6 s) = [1, 14/15, 7/9], then 0
    np.testing.assert_allclose(hy.dynamic_schedule.sigmas(3), [1.0, 14 / 15, 7 / 9, 0.0], rtol=1e-6)
    hy.pipe.scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, 4)[:-1])
    assert hy.dynamic_schedule.sigmas(3) == hy.pipe.scheduler.sigmas.tolist()
    assert hy.embedded_guidance and hy.video_latent_shape(16, 16, 5) == (4, 2, 2, 2)


def test_rollout_replays_with_ratio_one(hy: HunyuanVideoBundle) -> None:
    pipe = FlowMatchPipeline(hy, default_params=params(sde_strategy="dance_sde", eta=0.3))
    parts = [s.part("diffusion") for s in pipe.generate(make_samples(), rollout_step=0)]
    assert set(parts[0].conditions.tensors) == {
        "prompt_embeds",
        "prompt_attention_mask",
        "pooled_prompt_embeds",
    }
    masks = [int(p.conditions["prompt_attention_mask"].sum()) for p in parts]
    assert masks == [4, 5]  # words + </s> per prompt (<s> and the 4 template words cropped), then padding
    video = parts[0].outputs[0]
    assert isinstance(video, VideoPrimitive) and video.frames.shape == (5, 16, 16, 3)
    for j in parts[0].segment.sde_indices:
        rep = pipe.replay_step(parts, j)
        stored = torch.stack([p.segment.log_probs[j] for p in parts])
        assert torch.equal(rep.log_prob, stored), (j, rep.log_prob - stored)


def test_ode_latents_equal_diffusers_hunyuan_pipeline(hy: HunyuanVideoBundle) -> None:
    samples = FlowMatchPipeline(hy, default_params=params(sde_strategy="ode")).generate(
        make_samples(), rollout_step=0
    )
    conds = [s.part("diffusion").conditions for s in samples]
    x_T = initial_noise((4, 2, 2, 2), seed=4, keys=[f"sample:{s.id}" for s in samples], frame_axis=1)
    with torch.no_grad():
        ref = hy.pipe(
            prompt_embeds=torch.stack([c["prompt_embeds"] for c in conds]),
            prompt_attention_mask=torch.stack([c["prompt_attention_mask"] for c in conds]),
            pooled_prompt_embeds=torch.stack([c["pooled_prompt_embeds"] for c in conds]),
            num_inference_steps=3, guidance_scale=6.0, height=16, width=16, num_frames=5,
            latents=x_T, output_type="latent",
        ).frames  # fmt: skip
        emb, pooled, mask = hy.pipe.encode_prompt(
            prompt=PROMPTS, prompt_template=hy.prompt_template, max_sequence_length=8
        )
    ours = torch.stack([s.part("diffusion").segment.latent_at(3) for s in samples])
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours, x_T, atol=1e-2)
    torch.testing.assert_close(torch.stack([c["prompt_embeds"] for c in conds]), emb)
    torch.testing.assert_close(torch.stack([c["pooled_prompt_embeds"] for c in conds]), pooled)
    assert torch.equal(torch.stack([c["prompt_attention_mask"] for c in conds]), mask)
