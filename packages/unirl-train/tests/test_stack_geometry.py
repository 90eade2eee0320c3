"""BatchGeometry validation and splitting; TrainStack metrics aggregation and non-finite skips."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from unirl.train.backends.base import StepStats
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.geometry import BatchGeometry, chunk
from unirl.train.optim import AdamWConfig
from unirl.train.stack import TrainStack, aggregate, local_counts


def test_micro_batch_larger_than_shard_names_field_and_values() -> None:
    with pytest.raises(
        ValueError, match=r"micro_batch_size=16 is larger than the mini-batch \(8 Parts; shard 8"
    ):
        BatchGeometry(micro_batch_size=16).check_shard(8)
    with pytest.raises(ValueError, match=r"mini_batch_size=4.*divides"):
        BatchGeometry(micro_batch_size=2, mini_batch_size=4).check_shard(6)
    with pytest.raises(ValueError, match=r"mini_batch_size=12 is larger than the shard \(8"):
        BatchGeometry(micro_batch_size=2, mini_batch_size=12).check_shard(8)
    with pytest.raises(ValueError, match="empty shard"):
        BatchGeometry(micro_batch_size=1).check_shard(0)
    with pytest.raises(ValidationError, match="micro_batch_size"):
        BatchGeometry(micro_batch_size=0)
    with pytest.raises(ValidationError, match="extra"):
        BatchGeometry(micro_batch_size=1, micro_batchsize=2)


def test_splitting_and_shuffling() -> None:
    g = BatchGeometry(micro_batch_size=3, mini_batch_size=4)
    assert g.mini_batches(list(range(8)), update=0) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g.micro_batches([0, 1, 2, 3]) == [[0, 1, 2], [3]]
    assert chunk([1, 2, 3], 5) == [[1, 2, 3]]
    s = BatchGeometry(micro_batch_size=1, shuffle_seed=7)
    a, b = s.mini_batches(list(range(8)), 0), s.mini_batches(list(range(8)), 1)
    assert sorted(a[0]) == list(range(8)) and a != b  # a permutation, different per pass
    assert a == s.mini_batches(list(range(8)), 0)  # reproducible


def test_local_counts(tiny) -> None:
    parts = tiny.token_parts(4)  # lengths 1..4, token 1 masked out when length > 2
    assert local_counts(parts) == (4, 1 + 2 + 2 + 3, 0)
    flow = tiny.FlowPipeline(tiny.VelocityMLP()).rollout(3, sde_sets=[[0, 1, 2], [1], [0, 2]])
    assert local_counts(flow) == (3, 6, 6)


def test_aggregate_worked_example() -> None:
    steps = [
        (StepStats(grad_norm=2.0, lr=0.1, skipped_nonfinite=False, global_step=1), {"loss": 1.0, "kl": 0.5}),
        (
            StepStats(grad_norm=math.nan, lr=0.2, skipped_nonfinite=True, global_step=1),
            {"loss": 3.0, "kl": 1.5},
        ),
        (StepStats(grad_norm=4.0, lr=0.3, skipped_nonfinite=False, global_step=2), {"loss": 2.0, "kl": 1.0}),
    ]
    m = aggregate(steps, global_step=2)
    assert m["loss"] == pytest.approx(2.0) and m["kl"] == pytest.approx(1.0)
    assert m["grad_norm"] == pytest.approx(3.0) and m["grad_norm_max"] == 4.0  # skipped step excluded
    assert (m["lr"], m["skipped_nonfinite"], m["num_optimizer_steps"], m["global_step"]) == (
        0.3,
        1.0,
        2.0,
        2.0,
    )


def test_micro_batch_metrics_are_token_weighted(tiny) -> None:
    class Const(tiny.TokenPPO):
        def loss(self, parts, pipeline, totals):
            loss, _ = super().loss(parts, pipeline, totals)
            return loss, {"tokens_seen": float(local_counts(parts)[1])}

    torch.manual_seed(0)
    backend = FSDPConfig(optimizer=AdamWConfig(lr=0.01)).build(tiny.BigramPolicy(), "cpu")
    stack = TrainStack(
        backend, Const(), tiny.TokenPipeline(backend.module), BatchGeometry(micro_batch_size=2)
    )
    m = stack.train_on(tiny.token_parts(4))  # micro-batches of 1+2 and 2+3 tokens
    assert m["tokens_seen"] == pytest.approx(3 * 3 / 8 + 5 * 5 / 8)


def test_nonfinite_loss_skips_the_step_and_reports_it(tiny) -> None:
    torch.manual_seed(0)
    backend = FSDPConfig(optimizer=AdamWConfig(lr=0.01)).build(tiny.BigramPolicy(), "cpu")
    before = {n: p.full_tensor().clone() for n, p in backend.module.named_parameters()}
    stack = TrainStack(
        backend,
        tiny.TokenPPO(),
        tiny.TokenPipeline(backend.module),
        BatchGeometry(micro_batch_size=2, mini_batch_size=4),
    )
    parts = tiny.token_parts(8)
    parts[5].advantage = math.nan  # poisons the second mini-batch only
    m = stack.train_on(parts)
    assert m["skipped_nonfinite"] == 1.0 and m["num_optimizer_steps"] == 1.0 and backend.global_step == 1
    assert math.isfinite(m["grad_norm"])
    changed = any(not torch.equal(before[n], p.full_tensor()) for n, p in backend.module.named_parameters())
    assert changed and all(torch.isfinite(p.full_tensor()).all() for p in backend.module.parameters())


def test_train_on_checks_geometry_before_any_work(tiny) -> None:
    algo = tiny.TokenPPO()
    backend = FSDPConfig(optimizer=AdamWConfig(lr=0.01)).build(tiny.BigramPolicy(), "cpu")
    stack = TrainStack(backend, algo, tiny.TokenPipeline(backend.module), BatchGeometry(micro_batch_size=16))
    with pytest.raises(ValueError, match="micro_batch_size=16"):
        stack.train_on(tiny.token_parts(8))
    assert algo.prepared == 0
