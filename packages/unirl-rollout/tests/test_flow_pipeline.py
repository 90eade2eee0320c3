"""FlowMatchPipeline on a tiny random SD3: trajectory layout, rollout -> replay parity (ratio 1)
for each SDE strategy with CFG on, CFG batching, parity with diffusers' own SD3 pipeline."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.models.base import NEGATIVE_PREFIX, stack_conditions
from unirl.rollout.noise import initial_noise
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.rollout.schedules import static_shifted_sigmas
from unirl.types import (
    AllSteps,
    DiffusionSamplingParams,
    KOfWindow,
    LatentTrajectory,
    NoiseRecipe,
    Sample,
    SlidingWindow,
    TextPrimitive,
    from_bytes,
    to_bytes,
)

PROMPTS = ["a red circle", "two blue squares"]


def make_samples(n_per_prompt: int = 2) -> list[Sample]:
    return [
        Sample(id=f"p{g}-{i}", group_id=f"p{g}", inputs=[TextPrimitive(text=t)])
        for g, t in enumerate(PROMPTS)
        for i in range(n_per_prompt)
    ]


def params(**kw) -> DiffusionSamplingParams:  # type: ignore[no-untyped-def]
    base = dict(num_steps=4, guidance_scale=4.5, height=16, width=16, eta=0.7, noise=NoiseRecipe(seed=3))
    return DiffusionSamplingParams(**(base | kw))


def test_generate_fills_the_part(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    pipe = FlowMatchPipeline(sd3_bundle, default_params=params(sde_schedule=KOfWindow(k=2, end=0.5)))
    samples = pipe.generate(make_samples(), rollout_step=5)
    for s in samples:
        part = s.part("diffusion")
        seg = part.segment
        assert isinstance(seg, LatentTrajectory) and part.status == "completed"
        assert part.sampling_params.sigmas == static_shifted_sigmas(4, 3.0) == seg.sigmas
        assert seg.sde_indices == [0, 1]  # k=2 of the first half of 4 steps: both of them
        assert seg.positions == [0, 1, 2, 4]  # x_j, x_{j+1} per SDE step, and the final latent
        assert seg.latents.shape == (4, 4, 8, 8) and seg.latents.dtype == torch.float32
        assert seg.log_probs.shape == (2,) and seg.log_probs.dtype == torch.float32
        assert set(part.conditions.tensors) == {
            "prompt_embeds",
            "pooled_prompt_embeds",
            NEGATIVE_PREFIX + "prompt_embeds",
            NEGATIVE_PREFIX + "pooled_prompt_embeds",
        }
        img = part.outputs[0].pixels
        assert img.shape == (16, 16, 3) and img.dtype == torch.uint8
    # x_T is drawn from the sample id; siblings differ, and it equals the documented CPU draw
    a, b = samples[0].part("diffusion").segment, samples[1].part("diffusion").segment
    assert not torch.equal(a.latent_at(0), b.latent_at(0))
    assert torch.equal(a.latent_at(0), initial_noise((4, 8, 8), seed=3, keys=["sample:p0-0"])[0])


def test_group_noise_scope_shares_x_T(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    p = params(noise=NoiseRecipe(seed=3, scope="group"))
    samples = FlowMatchPipeline(sd3_bundle, default_params=p).generate(make_samples(), rollout_step=0)
    a, b, c = (samples[i].part("diffusion").segment for i in range(3))
    assert torch.equal(a.latent_at(0), b.latent_at(0)) and not torch.equal(a.latent_at(0), c.latent_at(0))
    assert not torch.equal(a.latent_at(1), b.latent_at(1))  # the SDE noise is still per sample


@pytest.mark.parametrize(
    ("strategy", "schedule", "eta"),
    [
        ("flow_sde", AllSteps(), 0.7),
        ("dance_sde", KOfWindow(k=2), 0.3),
        ("cps", SlidingWindow(size=3), 0.5),  # CPS cannot score the final step to sigma = 0
    ],
)
def test_rollout_replay_parity_ratio_one(sd3_bundle, strategy, schedule, eta) -> None:  # type: ignore[no-untyped-def]
    p = params(sde_strategy=strategy, sde_schedule=schedule, eta=eta)
    pipe = FlowMatchPipeline(sd3_bundle, default_params=p, record_old_means=True)
    samples = pipe.generate(make_samples(), rollout_step=0)
    parts = [s.part("diffusion") for s in samples]
    seg0 = parts[0].segment
    assert seg0.sde_indices
    for n, j in enumerate(seg0.sde_indices):
        r = pipe.replay_step(parts, j)
        stored = torch.stack([p.segment.log_probs[n] for p in parts])
        torch.testing.assert_close(r.log_prob, stored, atol=1e-6, rtol=0)
        ratio = torch.exp(r.log_prob - stored)
        torch.testing.assert_close(ratio, torch.ones(4), atol=1e-6, rtol=0)
        torch.testing.assert_close(
            r.mean, torch.stack([p.segment.old_means[n] for p in parts]), atol=1e-6, rtol=0
        )
        assert r.std.shape == (4,) and r.velocity.shape == (4, 4, 8, 8)


def test_replay_has_gradients_on_the_transformer_only(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    pipe = FlowMatchPipeline(sd3_bundle, default_params=params())
    parts = [s.part("diffusion") for s in pipe.generate(make_samples(1), rollout_step=0)]
    sd3_bundle.transformer.zero_grad()
    pipe.replay_step(parts, 2).log_prob.sum().backward()
    grads = [q.grad for q in sd3_bundle.transformer.parameters() if q.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    assert all(q.grad is None for m in sd3_bundle.frozen_modules().values() for q in m.parameters())
    sd3_bundle.transformer.zero_grad(set_to_none=True)


def test_replay_after_serialisation_round_trip(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    pipe = FlowMatchPipeline(sd3_bundle, default_params=params())
    samples = pipe.generate(make_samples(1), rollout_step=0)
    back = [from_bytes(Sample, to_bytes(s)) for s in samples]
    parts = [s.part("diffusion") for s in back]
    r = pipe.replay_step(parts, 1)
    torch.testing.assert_close(
        r.log_prob, torch.stack([p.segment.log_probs[1] for p in parts]), atol=1e-6, rtol=0
    )


def test_cfg_batching_equals_two_forwards(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    pipe = FlowMatchPipeline(sd3_bundle, default_params=params())
    parts = [s.part("diffusion") for s in pipe.generate(make_samples(1), rollout_step=0)]
    conds = [p.conditions for p in parts]
    x = torch.stack([p.segment.latent_at(1) for p in parts])
    sigma = torch.full((2,), parts[0].segment.sigmas[1])
    with torch.no_grad():
        batched = pipe.velocity(x, sigma, conds, 4.5)
        keys = ["prompt_embeds", "pooled_prompt_embeds"]
        c = stack_conditions(conds, keys, torch.device("cpu"), torch.float32)
        u = stack_conditions(conds, keys, torch.device("cpu"), torch.float32, prefix=NEGATIVE_PREFIX)
        v_c = sd3_bundle.predict_velocity(x, sigma, c)
        v_u = sd3_bundle.predict_velocity(x, sigma, u)
    torch.testing.assert_close(batched, v_u + 4.5 * (v_c - v_u), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(v_u, v_c)  # the negative prompt really is a different condition


def test_ode_matches_diffusers_sd3_pipeline(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    # Same x_T and the embeddings stored on the Parts -> the denoising loop (CFG batching, timesteps,
    # Euler steps) must equal diffusers' StableDiffusion3Pipeline bit for bit.
    p = params(sde_strategy="ode")
    samples = FlowMatchPipeline(sd3_bundle, default_params=p).generate(make_samples(1), rollout_step=0)
    conds = [s.part("diffusion").conditions for s in samples]
    x_T = initial_noise((4, 8, 8), seed=3, keys=[f"sample:{s.id}" for s in samples])
    with torch.no_grad():
        ref = sd3_bundle.pipe(
            prompt_embeds=torch.stack([c["prompt_embeds"] for c in conds]),
            pooled_prompt_embeds=torch.stack([c["pooled_prompt_embeds"] for c in conds]),
            negative_prompt_embeds=torch.stack([c[NEGATIVE_PREFIX + "prompt_embeds"] for c in conds]),
            negative_pooled_prompt_embeds=torch.stack(
                [c[NEGATIVE_PREFIX + "pooled_prompt_embeds"] for c in conds]
            ),
            num_inference_steps=4,
            guidance_scale=4.5,
            height=16,
            width=16,
            latents=x_T,
            output_type="latent",
        ).images
        ref_embeds = sd3_bundle.pipe.encode_prompt(
            prompt=PROMPTS, prompt_2=None, prompt_3=None, do_classifier_free_guidance=True,
            max_sequence_length=sd3_bundle.max_sequence_length,
        )  # fmt: skip
    ours = torch.stack([s.part("diffusion").segment.latent_at(4) for s in samples])
    assert torch.equal(ours, ref)
    # the stored conditions are diffusers' own prompt encodings (negative prompt "")
    torch.testing.assert_close(torch.stack([c["prompt_embeds"] for c in conds]), ref_embeds[0])
    torch.testing.assert_close(
        torch.stack([c[NEGATIVE_PREFIX + "pooled_prompt_embeds"] for c in conds]), ref_embeds[3]
    )
    seg = samples[0].part("diffusion").segment
    assert seg.sde_indices == [] and seg.log_probs is None and seg.positions == [4]


def test_eta_zero_sde_is_the_ode_sampler(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    ode = FlowMatchPipeline(sd3_bundle, default_params=params(sde_strategy="ode")).generate(
        make_samples(1), rollout_step=0
    )
    sde = FlowMatchPipeline(sd3_bundle, default_params=params(eta=0.0)).generate(
        make_samples(1), rollout_step=0
    )
    for a, b in zip(ode, sde):
        assert torch.equal(a.part("diffusion").segment.latent_at(4), b.part("diffusion").segment.latent_at(4))
        assert b.part("diffusion").segment.log_probs is None


def test_bad_configs_fail_clearly(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    pipe = FlowMatchPipeline(sd3_bundle, default_params=params(sde_schedule=KOfWindow(k=1, end=0.25)))
    parts = [s.part("diffusion") for s in pipe.generate(make_samples(1), rollout_step=0)]
    with pytest.raises(ValueError, match=r"step=3 is not an SDE step .*sde_indices=\[0\]"):
        pipe.replay_step(parts, 3)
    with pytest.raises(ValueError, match="cps_novar"):
        FlowMatchPipeline(sd3_bundle, default_params=params(sde_strategy="cps")).generate(
            make_samples(1), rollout_step=0
        )
    with pytest.raises(ValueError, match="sde_schedule.k=9 exceeds"):
        params(sde_schedule=KOfWindow(k=9))
    with pytest.raises(ValueError, match="sde_strategy"):
        params(sde_strategy="langevin")
    with pytest.raises(TypeError, match="DiffusionSamplingParams"):
        FlowMatchPipeline(sd3_bundle).generate(make_samples(1), rollout_step=0)
    with pytest.raises(ValueError, match="multiples of"):
        FlowMatchPipeline(sd3_bundle, default_params=params(height=15)).generate(
            make_samples(1), rollout_step=0
        )


def test_replay_is_exact_for_same_shape_and_close_for_other_splits(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    # Same micro-batch shape as the rollout: bit-identical log-probs. Micro-batch 1: the transformer's
    # batched kernels may round differently, measured < 5e-7 on CPU fp32; pinned at 1e-5.
    pipe = FlowMatchPipeline(sd3_bundle, default_params=params(num_steps=5))
    parts = [s.part("diffusion") for s in pipe.generate(make_samples(), rollout_step=0)]
    for n, j in enumerate(parts[0].segment.sde_indices):
        stored = torch.stack([p.segment.log_probs[n] for p in parts])
        with torch.no_grad():
            assert torch.equal(pipe.replay_step(parts, j).log_prob, stored)
            one = torch.cat([pipe.replay_step([p], j).log_prob for p in parts])
        torch.testing.assert_close(one, stored, atol=1e-5, rtol=0)


def test_prompt_from_parent_part_and_chunking(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    # prompt enhancer: the diffusion Part renders the AR Part's rewrite and records it as its parent
    from unirl.types import Part

    def enhanced() -> list[Sample]:
        out = make_samples()
        for s in out:
            s.parts.append(
                Part(name="ar", outputs=[TextPrimitive(text="a big red star")], status="completed")
            )
        return out

    whole = FlowMatchPipeline(sd3_bundle, default_params=params(), prompt_part="ar").generate(
        enhanced(), rollout_step=0
    )
    part = whole[0].part("diffusion")
    assert part.parent == "ar"
    expected = sd3_bundle.encode_prompts(["a big red star"])[0]
    torch.testing.assert_close(part.conditions["prompt_embeds"], expected["prompt_embeds"])
    # chunks of 1 draw the same noise per sample: same trajectories up to batched-kernel rounding
    chunked = FlowMatchPipeline(
        sd3_bundle, default_params=params(), prompt_part="ar", max_batch_size=1
    ).generate(enhanced(), rollout_step=0)
    for a, b in zip(whole, chunked):
        sa, sb = a.part("diffusion").segment, b.part("diffusion").segment
        assert torch.equal(sa.latent_at(0), sb.latent_at(0))
        torch.testing.assert_close(sa.latent_at(4), sb.latent_at(4), atol=1e-5, rtol=0)


def test_dynamic_shift_pins_the_sd3_pipeline_schedule(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    # SD3 with a dynamic-shifting scheduler: mu from (h / patch) * (w / patch) tokens, scheduler grid
    from diffusers import FlowMatchEulerDiscreteScheduler

    from unirl.rollout.pipelines import pin_sigmas
    from unirl.rollout.schedules import calculate_shift

    p = pin_sigmas(params(num_steps=6, dynamic_shift=True), sd3_bundle)
    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    sched.set_timesteps(6, mu=calculate_shift(sd3_bundle.image_seq_len(16, 16)))
    assert p.sigmas == sched.sigmas.tolist()
    assert pin_sigmas(p, sd3_bundle) is p  # an already pinned (echoed) schedule is kept as is


def test_rollout_autograd_samples_the_same_and_keeps_no_graph(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    """The compiled-model parity mode records autograd in rollout forwards: same samples, same
    log-probs, nothing left requiring grad, and the forwards really ran with grad enabled."""
    seen: list[bool] = []
    hook = sd3_bundle.transformer.register_forward_hook(lambda *a: seen.append(torch.is_grad_enabled()))
    try:
        plain = FlowMatchPipeline(sd3_bundle, default_params=params()).generate(
            make_samples(), rollout_step=0
        )
        n_plain = len(seen)
        grad = FlowMatchPipeline(sd3_bundle, default_params=params(), rollout_autograd=True).generate(
            make_samples(), rollout_step=0
        )
    finally:
        hook.remove()
    assert not any(seen[:n_plain]) and all(seen[n_plain:]) and len(seen) == 2 * n_plain
    for a, b in zip(plain, grad):
        sa, sb = a.part("diffusion").segment, b.part("diffusion").segment
        assert torch.equal(sa.latents, sb.latents) and torch.equal(sa.log_probs, sb.log_probs)
        assert not sb.latents.requires_grad and not sb.log_probs.requires_grad
