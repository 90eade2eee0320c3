"""The in-process async weight plane (WeightMailbox -> RolloutCopy) under seeded faults.

A snapshot corrupted after publish (one flipped bit, 50 seeded positions), one missing tensor,
or a stale / repeated version must be refused, and the rollout copy must keep the weights and
the version it held: rollout never samples with weights the trainer did not publish.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from unirl.apps.asynchronous.mailbox import RolloutCopy, WeightMailbox
from unirl.distributed.errors import StaleWeightVersionError
from unirl.rollout.engines.guards import StampMismatchError


def policy(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    m[2].to(torch.bfloat16)  # mixed dtypes, as a half-precision head would be
    return m


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def held() -> tuple[WeightMailbox, RolloutCopy, dict[str, torch.Tensor]]:
    """A rollout copy that loaded policy v1 from a mailbox."""
    box, copy = WeightMailbox(), RolloutCopy(policy(0))
    box.publish(1, 10, policy(1).named_parameters())
    assert copy.refresh(box, 1) == 1
    return box, copy, state(copy.module)


@pytest.mark.parametrize("seed", range(50))
def test_flipped_bit_in_snapshot_is_refused_before_loading(held, seed: int) -> None:
    box, copy, before = held
    box.publish(2, 11, policy(2).named_parameters())
    snap = box.latest()
    assert snap is not None
    rng = random.Random(seed)
    _, t = snap.tensors[rng.randrange(len(snap.tensors))]
    raw = t.reshape(-1).view(torch.uint8)  # the snapshot's own bytes (a view, not a copy)
    bit = rng.randrange(raw.numel() * 8)
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(StampMismatchError, match="async weight snapshot: weight sync v11 stamp mismatch"):
        copy.refresh(box, 1)
    assert same(state(copy.module), before)  # nothing of the corrupted snapshot was loaded
    assert (copy.version, copy.weight_version) == (1, 10)


def test_snapshot_missing_a_tensor_is_refused(held) -> None:
    box, copy, before = held
    named = list(policy(2).named_parameters())
    box.publish(2, 11, named[:1] + named[2:])  # one tensor dropped on the way
    with pytest.raises(RuntimeError, match=r"missing \['0.bias'\]"):
        copy.refresh(box, 1)
    assert same(state(copy.module), before) and copy.version == 1


@pytest.mark.parametrize("seed", range(10))
def test_stale_or_repeated_version_is_refused(held, seed: int) -> None:
    _, copy, before = held
    rng = random.Random(seed)
    box = WeightMailbox()  # e.g. a trainer restarted with a fresh mailbox and an old version count
    box.publish(rng.randrange(0, 2), 10, policy(3).named_parameters())  # v0: stale, v1: repeated
    with pytest.raises(
        StaleWeightVersionError, match="async rollout copy holds policy v1; the mailbox offers"
    ):
        copy.refresh(box, 0)
    assert same(state(copy.module), before) and copy.version == 1


def test_mailbox_refuses_a_version_that_does_not_increase(held) -> None:
    box, _, _ = held
    for v in (0, 1):
        with pytest.raises(ValueError, match=f"policy version {v} is not newer than the published 1"):
            box.publish(v, 10, policy(2).named_parameters())


def test_control_a_good_snapshot_loads(held) -> None:
    box, copy, _ = held
    box.publish(2, 11, policy(2).named_parameters())
    assert copy.refresh(box, 2) == 2
    assert same(state(copy.module), state(policy(2)))
    assert copy.refresh(box, 2) == 2  # the same snapshot again: a no-op, not a "repeat"


def test_snapshot_of_another_dtype_is_refused_not_cast(held) -> None:
    box, _, _ = held
    copy = RolloutCopy(policy(0).float())  # a copy built in fp32 where the policy's head is bf16
    before = state(copy.module)
    box.publish(2, 11, policy(2).named_parameters())
    with pytest.raises(
        RuntimeError, match=r"'2.weight' is torch.bfloat16 \(4, 16\), the rollout copy's is torch.float32"
    ):
        copy.refresh(box, 1)
    assert same(state(copy.module), before) and copy.version == -1
