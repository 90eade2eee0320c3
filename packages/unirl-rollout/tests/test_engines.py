"""RolloutEngine contract (every engine, fakes included, passes it) and the trainside engine."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.engines import RolloutEngine, TrainsideEngine
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.types import DiffusionSamplingParams, LatentTrajectory, Part, Sample, TextPrimitive


def samples(n: int = 2) -> list[Sample]:
    return [Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text="a red circle")]) for i in range(n)]


class RolloutEngineContract:
    """Subclass and provide ``engine`` and ``stage`` fixtures."""

    def test_is_a_rollout_engine(self, engine) -> None:  # type: ignore[no-untyped-def]
        assert isinstance(engine, RolloutEngine)

    def test_generate_fills_and_stamps_every_sample(self, engine, stage) -> None:  # type: ignore[no-untyped-def]
        batch = samples(3)
        out = engine.generate(batch, rollout_step=0)
        assert [s.id for s in out] == [s.id for s in batch]
        for s in out:
            part: Part = s.part(stage)
            assert part.status in ("completed", "truncated")
            assert part.weight_version is not None and part.weight_version >= 0
            assert part.segment is not None and part.sampling_params is not None

    def test_sleep_wake_up_cycle(self, engine, stage) -> None:  # type: ignore[no-untyped-def]
        engine.sleep()
        engine.wake_up()
        engine.generate(samples(1), rollout_step=1)


class FakeEngine:
    """A minimal engine used to check the contract itself can pass and fail."""

    def __init__(self) -> None:
        self.version = 0

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        for s in samples:
            p = s.ensure_part("diffusion")
            p.segment = LatentTrajectory(
                latents=torch.zeros(1, 1), positions=[1], sigmas=[1.0, 0.0], sde_indices=[]
            )
            p.sampling_params = DiffusionSamplingParams(num_steps=1, height=8, width=8, sde_strategy="ode")
            p.status, p.weight_version = "completed", self.version
        return samples

    def wake_up(self) -> None: ...

    def sleep(self) -> None: ...


class TestFakeEngineContract(RolloutEngineContract):
    @pytest.fixture
    def engine(self) -> FakeEngine:
        return FakeEngine()

    @pytest.fixture
    def stage(self) -> str:
        return "diffusion"


def tiny_params() -> DiffusionSamplingParams:
    return DiffusionSamplingParams(num_steps=2, guidance_scale=3.0, height=16, width=16)


class TestTrainsideEngineContract(RolloutEngineContract):
    @pytest.fixture
    def engine(self, sd3_bundle) -> TrainsideEngine:  # type: ignore[no-untyped-def]
        return TrainsideEngine(FlowMatchPipeline(sd3_bundle, default_params=tiny_params()), weight_version=4)

    @pytest.fixture
    def stage(self) -> str:
        return "diffusion"


def test_trainside_stamps_version_restores_mode_and_has_no_grad(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    step = {"n": 7}
    engine = TrainsideEngine(
        FlowMatchPipeline(sd3_bundle, default_params=tiny_params()), weight_version=lambda: step["n"]
    )
    sd3_bundle.transformer.train()
    out = engine.generate(samples(), rollout_step=0)
    assert sd3_bundle.transformer.training  # restored after sampling in eval mode
    assert all(s.part("diffusion").weight_version == 7 for s in out)
    assert not out[0].part("diffusion").segment.log_probs.requires_grad
    step["n"] = 8
    assert engine.generate(samples(1), rollout_step=1)[0].part("diffusion").weight_version == 8
    sd3_bundle.transformer.eval()


def test_trainside_can_sample_in_training_mode(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    modes: list[bool] = []
    hook = sd3_bundle.transformer.register_forward_hook(lambda m, *a: modes.append(m.training))
    engine = TrainsideEngine(FlowMatchPipeline(sd3_bundle, default_params=tiny_params()), eval_mode=False)
    sd3_bundle.transformer.train()
    try:
        engine.generate(samples(1), rollout_step=0)
    finally:
        hook.remove()
        sd3_bundle.transformer.eval()
    assert modes and all(modes)  # sampled with the training-mode module (a compiled graph's guard)


def test_trainside_enters_the_sampling_context_around_each_generate(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    from contextlib import contextmanager

    events: list[str] = []

    @contextmanager
    def gathered():  # type: ignore[no-untyped-def]
        events.append("enter")
        yield
        events.append("exit")

    hook = sd3_bundle.transformer.register_forward_hook(lambda *a: events.append("forward"))
    engine = TrainsideEngine(
        FlowMatchPipeline(sd3_bundle, default_params=tiny_params()), sampling_context=gathered
    )
    try:
        engine.generate(samples(1), rollout_step=0)
    finally:
        hook.remove()
    assert events[0] == "enter" and events[-1] == "exit" and events.count("enter") == 1
    assert "forward" in events[1:-1]


def test_trainside_version_and_sleep_rules(sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    engine = TrainsideEngine(FlowMatchPipeline(sd3_bundle, default_params=tiny_params()), weight_version=2)
    engine.set_weight_version(3)
    with pytest.raises(ValueError, match="older"):
        engine.set_weight_version(1)
    engine.sleep()
    with pytest.raises(RuntimeError, match="wake_up"):
        engine.generate(samples(1), rollout_step=0)
    engine.wake_up()
    assert engine.generate(samples(1), rollout_step=0)[0].part("diffusion").weight_version == 3
