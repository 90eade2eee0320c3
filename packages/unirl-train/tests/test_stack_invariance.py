"""Micro-batch invariance through TrainStack + FSDPBackend (1x8 vs 8x1 vs 2x4).

The loss contract (divide by the GLOBAL BatchTotals) makes the summed gradient independent of
the split, so the pre-clip grad norm (scale-sensitive) and the parameters after the updates
must agree across splits. A loss normalised per micro-batch must NOT pass (negative control):
that shows the comparison has the power to catch the bug.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from unirl.train.algorithms.base import BatchTotals
from unirl.train.algorithms.flow_grpo import FlowGRPOConfig
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.optim import AdamWConfig
from unirl.train.stack import TrainStack

SPLITS = [8, 1, 2]  # micro_batch_size for 1x8, 8x1, 4x2


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in module.named_parameters()
    }


def run_tokens(tiny, micro: int, updates: int = 2, local_norm: bool = False):
    torch.manual_seed(0)
    module = tiny.BigramPolicy()
    backend = FSDPConfig(optimizer=AdamWConfig(lr=0.05), grad_clip=None).build(module, "cpu")
    algo = tiny.TokenPPO(local_norm=local_norm)
    stack = TrainStack(
        backend,
        algo,
        tiny.TokenPipeline(backend.module),
        BatchGeometry(micro_batch_size=micro, num_updates_per_batch=updates),
    )
    metrics = stack.train_on(tiny.token_parts(8))
    return metrics, params(backend.module), algo


def test_token_loss_is_invariant_to_the_micro_batch_split(tiny) -> None:
    runs = [run_tokens(tiny, m) for m in SPLITS]
    ref_metrics, ref_params, algo = runs[0]
    assert algo.prepared == 1  # pi_old frozen once for both updates
    assert ref_metrics["num_optimizer_steps"] == 2 and ref_metrics["global_step"] == 2
    for metrics, p, _ in runs[1:]:
        assert metrics["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], rel=1e-6)
        assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-6, abs=1e-7)
        assert metrics["ratio_mean"] == pytest.approx(ref_metrics["ratio_mean"], rel=1e-6)
        for n in ref_params:
            torch.testing.assert_close(p[n], ref_params[n], atol=1e-6, rtol=0)


def test_locally_normalised_loss_is_caught(tiny) -> None:
    whole, _, _ = run_tokens(tiny, 8, updates=1, local_norm=True)
    split, _, _ = run_tokens(tiny, 1, updates=1, local_norm=True)
    assert abs(whole["grad_norm"] - split["grad_norm"]) > 1e-3 * whole["grad_norm"]


def test_first_update_is_on_policy(tiny) -> None:
    metrics, _, _ = run_tokens(tiny, 2, updates=1)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def run_flow_grpo(tiny, micro: int):
    torch.manual_seed(0)
    module = tiny.VelocityMLP()
    backend = FSDPConfig(optimizer=AdamWConfig(lr=0.01), grad_clip=None).build(module, "cpu")
    pipe = tiny.FlowPipeline(backend.module)
    parts = pipe.rollout(8, sde_sets=[[0, 1, 2], [1], [0, 2]], seed=1)
    algo = FlowGRPOConfig(clip_range=0.2).build()
    stack = TrainStack(backend, algo, pipe, BatchGeometry(micro_batch_size=micro, num_updates_per_batch=2))
    return stack.train_on(parts), params(backend.module)


def test_real_flow_grpo_is_invariant_to_the_micro_batch_split(tiny) -> None:
    runs = [run_flow_grpo(tiny, m) for m in SPLITS]
    ref_metrics, ref_params = runs[0]
    assert ref_metrics["grad_norm"] > 0
    for metrics, p in runs[1:]:
        assert metrics["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], rel=1e-5)
        assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-5, abs=1e-7)
        for n in ref_params:
            torch.testing.assert_close(p[n], ref_params[n], atol=1e-6, rtol=0)


def test_streamed_flow_grpo_backward_equals_one_backward_of_the_sum(tiny) -> None:
    """TrainStack back-propagates FlowGRPO step by step (one step's graph alive at a time); the
    accumulated gradient must equal one backward of the summed loss."""
    torch.manual_seed(0)
    module = tiny.VelocityMLP()
    pipe = tiny.FlowPipeline(module)
    parts = pipe.rollout(4, sde_sets=[[0, 1, 2], [1], [0, 2]], seed=1)
    algo = FlowGRPOConfig(clip_range=0.2).build()
    assert algo.streams_backward
    totals = BatchTotals(*algo.count(parts))
    loss, _ = algo.loss(parts, pipe, totals)
    loss.backward()
    whole = {n: p.grad.clone() for n, p in module.named_parameters()}
    module.zero_grad()
    calls: list[bool] = []

    def backward(term: torch.Tensor, final: bool) -> None:
        calls.append(final)
        term.backward()

    streamed, _ = algo.loss(parts, pipe, totals, backward=backward)
    assert calls == [False, False, True]  # one backward per distinct SDE step, the last flagged
    assert not streamed.requires_grad and float(streamed) == pytest.approx(float(loss), rel=1e-6)
    assert any(g.abs().sum() > 0 for g in whole.values())
    for n, p in module.named_parameters():
        torch.testing.assert_close(p.grad, whole[n], atol=1e-7, rtol=1e-6)


def test_flow_grpo_train_fraction_trains_the_first_steps_of_each_part(tiny) -> None:
    torch.manual_seed(0)
    pipe = tiny.FlowPipeline(tiny.VelocityMLP())
    parts = pipe.rollout(3, sde_sets=[[0, 1, 2], [1], [0, 2]], seed=1)
    algo = FlowGRPOConfig(train_fraction=0.67).build()
    # int(3 * 0.67) = 2 of [0, 1, 2]; int(1 * 0.67) = 0 -> at least 1; int(2 * 0.67) = 1 of [0, 2]
    assert algo.count(parts) == (3, 4, 4)
    _, metrics = algo.loss(parts, pipe, BatchTotals(*algo.count(parts)))
    assert sorted(k for k in metrics if k.startswith("log_ratio_step_")) == [
        "log_ratio_step_0",
        "log_ratio_step_1",
    ]
    with pytest.raises(ValueError, match="train_fraction"):
        FlowGRPOConfig(train_fraction=0.0)


def test_a_backend_that_runs_the_micro_batches_itself_gets_them_all(tiny) -> None:
    """`MicroBatchRunner`: TrainStack hands each step's micro-batches and the loss closure to
    `backend.run_micro_batches` (as MegatronBackend's pipeline schedule needs) instead of its
    loop, and the step, metrics and weights come out as with the loop."""
    from unirl.train.backends.base import MicroBatchRunner

    class RunnerBackend:
        def __init__(self, inner) -> None:
            self.inner, self.calls = inner, []

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

        def run_micro_batches(self, micro, loss_fn):
            self.calls.append([len(mb) for mb in micro])
            out = []
            for mb in reversed(micro):  # any order: each loss is already globally normalised
                loss, m = loss_fn(mb)
                self.inner.backward(loss)
                out.append((float(loss.detach()), m))
            return out[::-1]

    ref_metrics, ref_params, _ = run_tokens(tiny, micro=2)
    torch.manual_seed(0)
    inner = FSDPConfig(optimizer=AdamWConfig(lr=0.05), grad_clip=None).build(tiny.BigramPolicy(), "cpu")
    backend = RunnerBackend(inner)
    assert isinstance(backend, MicroBatchRunner)
    stack = TrainStack(
        backend,  # type: ignore[arg-type]
        tiny.TokenPPO(),
        tiny.TokenPipeline(inner.module),
        BatchGeometry(micro_batch_size=2, num_updates_per_batch=2),
    )
    metrics = stack.train_on(tiny.token_parts(8))
    assert backend.calls == [[2, 2, 2, 2], [2, 2, 2, 2]]  # one call per optimizer step
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-6, abs=1e-7)
    assert metrics["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], rel=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(ref_metrics["ratio_mean"], rel=1e-6)
    for n, p in params(inner.module).items():
        torch.testing.assert_close(p, ref_params[n], atol=1e-6, rtol=0)
