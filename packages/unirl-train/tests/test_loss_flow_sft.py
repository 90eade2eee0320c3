"""Worked numbers for the flow-matching SFT loss."""

import pytest
import torch

from unirl.train.algorithms.losses.flow_sft import flow_sft_sample_loss, sample_timesteps


def test_flow_sft_worked():
    # target v = eps - x0.  sample 0: x0 = [1, 2], eps = 0 -> target [-1, -2]; v_pred = 0 -> mse (1 + 4)/2 = 2.5
    # sample 1: x0 = 0, eps = [1, 1] -> target [1, 1] = v_pred -> 0
    x0 = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    eps = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    v = torch.tensor([[0.0, 0.0], [1.0, 1.0]], requires_grad=True)
    loss = flow_sft_sample_loss(v, x0, eps)
    torch.testing.assert_close(loss, torch.tensor([2.5, 0.0]))
    loss.sum().backward()
    # d/dv mean((v - target)^2) = 2 (v - target) / 2 = v - target
    torch.testing.assert_close(v.grad, torch.tensor([[1.0, 2.0], [0.0, 0.0]]))


def test_timestep_sampling():
    g = torch.Generator().manual_seed(0)
    for kind in ("uniform", "logit_normal"):
        t = sample_timesteps(1000, kind, g)
        assert t.shape == (1000,) and (t > 0).all() and (t < 1).all()
    assert abs(sample_timesteps(20000, "logit_normal", g).mean().item() - 0.5) < 0.01
    with pytest.raises(ValueError, match="uniform"):
        sample_timesteps(1, "beta")
