"""Composed engine: a real tiny Qwen3 rewriter (trainside AR) feeding a real tiny SD3 (trainside flow)."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.ar import ARPipeline, CausalLMBundle
from unirl.rollout.engines import ComposedEngine, ComposedEngineConfig, RolloutEngine, TrainsideEngine
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.types import ARSamplingParams, DiffusionSamplingParams, Sample, TextPrimitive


def samples(n: int = 3) -> list[Sample]:
    return [
        Sample(id=f"s{i}", group_id=f"g{i // 2}", inputs=[TextPrimitive(text="a red circle")])
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def rewriter() -> TrainsideEngine:
    bundle = CausalLMBundle.tiny_qwen3(seed=1)
    return TrainsideEngine(
        ARPipeline(bundle, ARSamplingParams(max_new_tokens=6, temperature=1.0)), weight_version=2
    )


def test_ar_rewrite_conditions_the_diffusion_render(rewriter, sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    params = DiffusionSamplingParams(num_steps=2, guidance_scale=1.0, height=16, width=16)
    render = TrainsideEngine(
        FlowMatchPipeline(sd3_bundle, default_params=params, prompt_part="ar"), weight_version=5
    )
    engine = ComposedEngineConfig().build([rewriter, render])
    assert isinstance(engine, RolloutEngine)
    out = engine.generate(samples(3), rollout_step=0)
    for s in out:
        assert [p.name for p in s.parts] == ["ar", "diffusion"]
        ar, diff = s.part("ar"), s.part("diffusion")
        assert diff.parent == "ar" and ar.parent is None
        assert ar.weight_version == 2 and diff.weight_version == 5
        assert ar.segment.kind == "text" and diff.segment.kind == "latent"
        # the render was conditioned on the rewrite, not on the original prompt
        expected = sd3_bundle.encode_prompts([ar.text])[0]
        for k, v in expected.tensors.items():  # batched vs alone: fp32 rounding only (SIMD-width dependent)
            torch.testing.assert_close(
                torch.as_tensor(diff.conditions[k]), torch.as_tensor(v), rtol=1e-4, atol=1e-5
            )
    texts = {s.part("ar").text for s in out}
    original = sd3_bundle.encode_prompts(["a red circle"])[0]
    k0 = next(iter(original.tensors))
    if "a red circle" not in texts:
        assert not torch.allclose(
            torch.as_tensor(out[0].part("diffusion").conditions[k0]), torch.as_tensor(original[k0])
        )
    engine.sleep()
    engine.wake_up()


class EmptyRewriter:
    """Writes an empty rewrite (what an untrained rewriter emitting EOS at once produces)."""

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        for s in samples:
            p = s.ensure_part("ar")
            p.outputs, p.status = [TextPrimitive(text="")], "completed"
        return samples

    def wake_up(self) -> None: ...

    def sleep(self) -> None: ...


def test_empty_rewrite_policy_and_validation(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    params = DiffusionSamplingParams(num_steps=1, guidance_scale=1.0, height=16, width=16, sde_strategy="ode")
    render = TrainsideEngine(FlowMatchPipeline(sd3_bundle, default_params=params, prompt_part="ar"))
    with pytest.raises(ValueError, match="empty text"):
        ComposedEngine([("ar", EmptyRewriter()), ("diffusion", render)], empty_text="error").generate(
            samples(1), rollout_step=0
        )
    out = ComposedEngine([("ar", EmptyRewriter()), ("diffusion", render)]).generate(
        samples(1), rollout_step=0
    )
    assert out[0].part("diffusion").status == "completed"
    with pytest.raises(ValueError, match=">= 2 stages"):
        ComposedEngine([("ar", EmptyRewriter())])
    with pytest.raises(TypeError, match="not a RolloutEngine"):
        ComposedEngine([("ar", EmptyRewriter()), ("diffusion", object())])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="unique"):
        ComposedEngineConfig(stages=["ar", "ar"])
