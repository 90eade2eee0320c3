"""Worked numbers for DiffusionNFT: noisy latent, mixing weight r, the loss, the EMA schedule."""

import pytest
import torch

from unirl.train.algorithms.losses.diffusion_nft import (
    nft_ema_update,
    nft_mix_weight,
    nft_noisy_latent,
    nft_old_decay,
    nft_sample_loss,
)


def test_noisy_latent_and_mix_weight():
    # x_t = (1 - t) x0 + t eps: t = 0.5, x0 = 1, eps = -1 -> 0; t = 0.25, x0 = 0, eps = 2 -> 0.5
    xt = nft_noisy_latent(
        torch.tensor([[1.0], [0.0]]), torch.tensor([[-1.0], [2.0]]), torch.tensor([0.5, 0.25])
    )
    torch.testing.assert_close(xt, torch.tensor([[0.0], [0.5]]))
    # r = clip(clip(A, -5, 5) / 5 / 2 + 0.5, 0, 1): -10 -> 0, -5 -> 0, 0 -> 0.5, 2.5 -> 0.75, 5 -> 1, 7 -> 1
    r = nft_mix_weight(torch.tensor([-10.0, -5.0, 0.0, 2.5, 5.0, 7.0]))
    torch.testing.assert_close(r, torch.tensor([0.0, 0.0, 0.5, 0.75, 1.0, 1.0]))


def test_nft_loss_worked_values_and_gradient():
    # beta = 0.5.
    # sample 0: x0 = 1, x_t = 0, t = 0.5, v_theta = 2, v_old = 1, A = 2.5 -> r = 0.75
    #   v+ = 0.5*2 + 0.5*1 = 1.5, v- = 1.5*1 - 0.5*2 = 0.5
    #   x0+ = 0 - 0.5*1.5 = -0.75 (w+ = 1.75), x0- = -0.25 (w- = 1.25)
    #   pos = 1.75^2/1.75 = 1.75, neg = 1.25^2/1.25 = 1.25
    #   loss = 5 * (0.75*1.75 + 0.25*1.25) / 0.5 = 16.25
    #   d/dv: dx0+/dv = -t beta = -0.25 -> dpos = 2(-1.75)/1.75 * -0.25 = 0.5
    #         dx0-/dv = +t beta = 0.25  -> dneg = 2(-1.25)/1.25 * 0.25 = -0.5
    #         dloss = 5 * (0.75*0.5 + 0.25*(-0.5)) / 0.5 = 2.5
    # sample 1: x0 = 0, x_t = 0.5, t = 0.25, v_theta = 2, v_old = 0, A = -10 -> r = 0
    #   v+ = 1, v- = -1; x0+ = 0.25 (w+ = 0.25), x0- = 0.75 (w- = 0.75); neg = 0.5625/0.75 = 0.75
    #   loss = 5 * 0.75 / 0.5 = 7.5; dneg/dv = 2*0.75/0.75 * (0.25*0.5) = 0.25 -> dloss = 5*0.25/0.5 = 2.5
    v = torch.tensor([[2.0], [2.0]], requires_grad=True)
    loss = nft_sample_loss(
        v,
        torch.tensor([[1.0], [0.0]]),
        torch.tensor([[0.0], [0.5]]),
        torch.tensor([[1.0], [0.0]]),
        torch.tensor([0.5, 0.25]),
        torch.tensor([2.5, -10.0]),
        beta=0.5,
    )
    torch.testing.assert_close(loss, torch.tensor([16.25, 7.5]))
    loss.sum().backward()
    torch.testing.assert_close(v.grad, torch.tensor([[2.5], [2.5]]))


def test_nft_weight_floor_and_beta_validation():
    # perfect positive prediction: |x0+ - x0| = 0 -> w+ floored at 1e-5, loss term 0 (no NaN)
    v = torch.tensor([[2.0]])
    loss = nft_sample_loss(
        v,
        v,
        torch.tensor([[0.5]]),
        torch.tensor([[0.0]]),
        torch.tensor([0.25]),
        torch.tensor([5.0]),
        beta=1.0,
    )
    assert loss.item() == 0.0
    with pytest.raises(ValueError, match="beta"):
        nft_sample_loss(v, v, v, v, torch.tensor([0.5]), torch.tensor([1.0]), beta=0.0)


def test_old_policy_decay_schedule_and_update():
    # d = min(0.001 * step, 0.5)
    assert [nft_old_decay(s) for s in (0, 100, 500, 1000)] == [0.0, 0.1, 0.5, 0.5]
    old, new = [torch.tensor([1.0])], [torch.tensor([3.0])]
    nft_ema_update(old, new, 0.25)  # 0.25 * 1 + 0.75 * 3 = 2.5
    assert old[0].item() == 2.5
    with pytest.raises(ValueError):
        nft_old_decay(-1)
