"""UnifiedModelTrainStack: two tracks' losses -> one optimizer step with the gradient of their
weighted sum, each loss over its own global totals; on the tiny unified model, both tracks start
on-policy (first-update ratio exactly 1 in fp32) and the step equals the sum of the single-track
gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from unirl.rollout.engines.composed import ComposedEngine
from unirl.rollout.engines.trainside import TrainsideEngine
from unirl.rollout.unified import TinyUnifiedBundle, UnifiedImagePipeline, UnifiedTextPipeline
from unirl.train.algorithms import FlowGRPOConfig, GRPOConfig
from unirl.train.algorithms.base import BatchTotals
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.optim import AdamWConfig
from unirl.train.stack import TrainStack
from unirl.train.unified_stack import Track, UnifiedModelTrainStack
from unirl.types import (
    ARSamplingParams,
    DiffusionSamplingParams,
    LatentTrajectory,
    Part,
    Sample,
    TextPrimitive,
    TextSegment,
)


def spy_grads(backend: Any) -> list[dict[str, torch.Tensor]]:
    """The gradients each real optimizer step applies (recorded just before it runs)."""
    seen: list[dict[str, torch.Tensor]] = []

    def record(*_: Any) -> None:
        seen.append({n: full(p.grad) for n, p in backend.trainable.items() if p.grad is not None})

    backend.optimizer.register_step_pre_hook(record)
    return seen


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


# ---- worked numbers: two closed-form losses on theta = (theta1, theta2) = (1, 2) -----------------


class Theta(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor([1.0, 2.0]))


class TokenLinear:
    """Per token: A * theta1; summed and divided by the GLOBAL token count (token-mean)."""

    name, needs_old_logprobs = "token_linear", False

    def __init__(self, module: Theta) -> None:
        self.module = module

    def prepare(self, parts: Sequence[Part], pipeline: Any) -> None:
        pass

    def loss(
        self, parts: Sequence[Part], pipeline: Any, totals: BatchTotals
    ) -> tuple[torch.Tensor, dict[str, float]]:
        s = sum(float(p.advantage) * len(p.segment.response_ids) for p in parts)  # type: ignore[union-attr, arg-type]
        return s * self.module.theta[0] / totals.num_tokens, {}


class StepSquare:
    """Per SDE step: A * theta2^2; summed and divided by the GLOBAL (sample, step) count."""

    name, needs_old_logprobs = "step_square", False

    def __init__(self, module: Theta) -> None:
        self.module = module

    def prepare(self, parts: Sequence[Part], pipeline: Any) -> None:
        pass

    def loss(
        self, parts: Sequence[Part], pipeline: Any, totals: BatchTotals
    ) -> tuple[torch.Tensor, dict[str, float]]:
        s = sum(float(p.advantage) * len(p.segment.sde_indices) for p in parts)  # type: ignore[union-attr, arg-type]
        return s * self.module.theta[1] ** 2 / totals.num_steps, {}


def toy_parts() -> list[Part]:
    text = [
        Part(name="ar", segment=TextSegment(prompt_ids=[0], response_ids=[1] * n), advantage=a)
        for n, a in ((1, 1.0), (3, -1.0))
    ]
    lat = torch.zeros(3, 1)
    image = [
        Part(
            name="image",
            segment=LatentTrajectory(
                latents=lat, positions=[0, 1, 2], sigmas=[1.0, 0.5, 0.0], sde_indices=idx
            ),
            advantage=a,
        )
        for idx, a in (([0, 1], 2.0), ([0], 1.0))
    ]
    return text + image


@pytest.mark.parametrize("micro", [1, 2])
def test_two_losses_one_step_is_the_weighted_sum_gradient(micro: int) -> None:
    """L_ar = (1 * 1 + (-1) * 3) theta1 / 4 tokens = -0.5 theta1        -> dL/dtheta = (-0.5, 0)
    L_im = (2 * 2 + 1 * 1) theta2^2 / 3 steps = 5/3 theta2^2          -> dL/dtheta = (0, 10/3 theta2) = (0, 20/3)
    weights 2 (ar) and 0.5 (image): the one step's gradient is (2 * -0.5, 0.5 * 20/3) = (-1, 10/3),
    whatever the micro-batch split (each loss over its own global totals)."""
    module = Theta()
    backend = FSDPConfig(optimizer=AdamWConfig(lr=0.1), grad_clip=None).build(module, "cpu")
    grads = spy_grads(backend)
    tracks = [Track("ar", TokenLinear(module), None, 2.0), Track("image", StepSquare(module), None, 0.5)]
    m = UnifiedModelTrainStack(backend, tracks, BatchGeometry(micro_batch_size=micro)).train_on(toy_parts())
    assert len(grads) == 1 and m["num_optimizer_steps"] == 1.0
    torch.testing.assert_close(grads[0]["theta"], torch.tensor([-1.0, 10.0 / 3.0]), rtol=0, atol=1e-6)
    # the losses: 2 * (-0.5 * 1) = -1 and 0.5 * (5/3 * 4) = 10/3, summed
    assert m["ar/loss"] == pytest.approx(-1.0) and m["image/loss"] == pytest.approx(10.0 / 3.0)
    assert m["loss"] == pytest.approx(-1.0 + 10.0 / 3.0)


def test_parts_are_routed_one_per_sample_per_track() -> None:
    module = Theta()
    backend = FSDPConfig(optimizer=AdamWConfig(lr=0.1)).build(module, "cpu")
    stack = UnifiedModelTrainStack(
        backend, [Track("ar", TokenLinear(module), None), Track("image", StepSquare(module), None)],
        BatchGeometry(micro_batch_size=2),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"one Part per Sample; got Parts per track \{'ar': 2, 'image': 1\}"):
        stack.train_on(toy_parts()[:3])
    with pytest.raises(ValueError, match="part 'other' belongs to no track"):
        stack.train_on([*toy_parts(), Part(name="other")])


# ---- the tiny unified model: real GRPO + FlowGRPO through one backbone ----------------------------

WORDS = ["a", "two", "red", "blue", "circle", "squares", "draw", "rd", "sq"]


def rollout(bundle: TinyUnifiedBundle) -> list[Sample]:
    text = UnifiedTextPipeline(bundle, default_params=ARSamplingParams(max_new_tokens=4, temperature=1.0))
    image = UnifiedImagePipeline(
        bundle,
        default_params=DiffusionSamplingParams(
            num_steps=3, guidance_scale=1.0, height=16, width=16, shift=1.0, eta=0.7
        ),
    )
    engine = ComposedEngine([("ar", TrainsideEngine(text)), ("image", TrainsideEngine(image))])
    prompts = ["draw two rd sq", "a blue circle"]
    samples = [
        Sample(id=f"p{g}-{i}", group_id=f"p{g}", inputs=[TextPrimitive(text=t)])
        for g, t in enumerate(prompts)
        for i in range(2)
    ]
    samples = engine.generate(samples, rollout_step=0)
    for s, a in zip(samples, [1.0, -1.0, 0.5, -0.5]):
        s.part("ar").advantage = s.part("image").advantage = a
    return samples


def unified_run(
    tracks: list[str], weights: dict[str, float]
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One step of a fresh tiny unified model (seed 0) on the tracks named, its gradient recorded."""
    torch.manual_seed(0)
    bundle = TinyUnifiedBundle.tiny(
        WORDS, seed=0, image_size=16, hidden_size=32, num_layers=2, max_text_len=12
    )
    with (
        torch.no_grad()
    ):  # the image head's output conv starts at zero: open it so the image loss reaches the backbone
        bundle.model.conv_out.weight.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(1))
    backend = FSDPConfig(optimizer=AdamWConfig(lr=1e-3), grad_clip=None).build(bundle.model, "cpu")
    grads = spy_grads(backend)
    samples = rollout(bundle)
    pipes = {"ar": UnifiedTextPipeline(bundle), "image": UnifiedImagePipeline(bundle)}
    algs = {"ar": GRPOConfig().build(), "image": FlowGRPOConfig(clip_range=0.2).build()}
    geometry = BatchGeometry(micro_batch_size=4)
    if len(tracks) == 1:
        (n,) = tracks
        stack: Any = TrainStack(backend, algs[n], pipes[n], geometry)
    else:
        stack = UnifiedModelTrainStack(
            backend, [Track(n, algs[n], pipes[n], weights[n]) for n in tracks], geometry
        )
    m = stack.train_on([s.part(n) for n in tracks for s in samples])
    return m, grads[0]


def test_unified_step_equals_the_sum_of_the_single_track_gradients_and_starts_on_policy() -> None:
    torch.set_num_threads(1)
    both, g = unified_run(["ar", "image"], {"ar": 0.7, "image": 1.5})
    # first update of an on-policy batch, trainside rollout, fp32 CPU: ratio 1 on every token / step
    for track in ("ar", "image"):
        assert both[f"{track}/ratio_min"] == pytest.approx(1.0, abs=1e-6)
        assert both[f"{track}/ratio_max"] == pytest.approx(1.0, abs=1e-6)
    _, g_ar = unified_run(["ar"], {})
    _, g_im = unified_run(["image"], {})
    assert set(g) == set(g_ar) | set(g_im)
    nonzero = 0
    for name, grad in g.items():
        want = 0.7 * g_ar.get(name, torch.zeros_like(grad)) + 1.5 * g_im.get(name, torch.zeros_like(grad))
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-7)
        nonzero += bool(want.abs().sum() > 0)
    # both tracks reach the shared backbone: a block's weights get gradient from each
    shared = "blocks.0.qkv.weight"
    assert g_ar[shared].abs().sum() > 0 and g_im[shared].abs().sum() > 0
    assert nonzero > 10
