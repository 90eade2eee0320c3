"""EMA: decay schedule, the update rule on worked numbers, and the weight swap."""

from __future__ import annotations

import pytest
import torch

from unirl.train.ema import EMA, EMAConfig, ema_decay, swapped_weights


def test_ema_update_worked_example() -> None:
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    ema = EMA({"w": w}, EMAConfig(decay=0.9))
    with torch.no_grad():
        w.copy_(torch.tensor([3.0, 0.0]))
    ema.update(step=0)
    # 0.9 * [1, -2] + 0.1 * [3, 0] = [1.2, -1.8]
    torch.testing.assert_close(ema.shadow["w"], torch.tensor([1.2, -1.8]))
    ema.update(step=1)
    # 0.9 * [1.2, -1.8] + 0.1 * [3, 0] = [1.38, -1.62]
    torch.testing.assert_close(ema.shadow["w"], torch.tensor([1.38, -1.62]))


def test_ramped_decay_matches_diffusion_nft() -> None:
    cfg = EMAConfig(decay=0.5, ramp=0.001)  # d = min(0.001 * step, 0.5)
    assert [ema_decay(cfg, k) for k in (0, 100, 499, 500, 2000)] == pytest.approx([0.0, 0.1, 0.499, 0.5, 0.5])
    w = torch.nn.Parameter(torch.tensor([1.0]))
    ema = EMA({"w": w}, cfg)
    with torch.no_grad():
        w.fill_(5.0)
    assert ema.update(step=0) == 0.0  # d = 0: the old policy jumps to the current one
    torch.testing.assert_close(ema.shadow["w"], torch.tensor([5.0]))


def test_applied_swaps_in_and_restores() -> None:
    lin = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
    ema = EMA(dict(lin.named_parameters()), EMAConfig(decay=0.5))
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[3.0, 4.0]]))
    ema.update(0)  # shadow = [[2, 3]]
    x = torch.tensor([[1.0, 1.0]])
    with ema.applied():
        assert lin(x).item() == pytest.approx(5.0)
    assert lin(x).item() == pytest.approx(7.0)
    assert lin.weight.requires_grad


def test_swapped_weights_restores_on_error() -> None:
    p = torch.nn.Parameter(torch.tensor([1.0]))
    with pytest.raises(RuntimeError), swapped_weights({"p": p}, {"p": torch.tensor([9.0])}):
        assert p.item() == 9.0
        raise RuntimeError("boom")
    assert p.item() == 1.0


def test_ema_config_rejects_decay_one() -> None:
    with pytest.raises(ValueError, match="decay"):
        EMAConfig(decay=1.0)
