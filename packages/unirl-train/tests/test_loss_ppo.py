"""Worked numbers for the token PPO loss: ratio clamp, clip-higher, dual clip."""

import math

import pytest
import torch

from unirl.train.algorithms.losses.ppo import ppo_token_loss, token_ratio

# eps_low = 0.2, eps_high = 0.28 (DAPO clip-higher), c = 3. One token per sequence:
#  A    rho  -A rho  -A clip(rho, 0.8, 1.28)  max    dual (A<0: min(., 3|A|))  grad d/dlogp
#  1    1.5  -1.5    -1.28                   -1.28   -                         0 (clipped)
#  1    0.5  -0.5    -0.8                    -0.5    -                         -A rho = -0.5
# -1    0.5   0.5     0.8                     0.8    0.8                       0 (clipped)
# -1    5.0   5.0     1.28                    5.0    3.0                       0 (dual clip)
# -1    2.0   2.0     1.28                    2.0    2.0                       -A rho = 2.0
#  1    5.0  -5.0    -1.28                   -1.28   -                         0
ADV = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, 1.0])
RHO = torch.tensor([1.5, 0.5, 0.5, 5.0, 2.0, 5.0])


def test_ppo_clip_higher_and_dual_clip_worked():
    logp = torch.log(RHO).unsqueeze(-1).requires_grad_(True)
    loss, ratio = ppo_token_loss(logp, torch.zeros(6, 1), ADV, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    torch.testing.assert_close(loss.squeeze(-1), torch.tensor([-1.28, -0.5, 0.8, 3.0, 2.0, -1.28]))
    torch.testing.assert_close(ratio.squeeze(-1), RHO)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad.squeeze(-1), torch.tensor([0.0, -0.5, 0.0, 0.0, 2.0, 0.0]))


def test_ppo_without_dual_clip_and_token_advantages():
    logp = torch.log(RHO).view(2, 3)
    loss, _ = ppo_token_loss(logp, torch.zeros(2, 3), ADV.view(2, 3), 0.2, 0.28, dual_clip=None)
    # the 4th element is no longer capped at 3
    assert abs(loss.view(-1)[3].item() - 5.0) < 1e-6
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_token_loss(logp, logp, ADV.view(2, 3), 0.2, 0.28, dual_clip=0.5)


def test_token_ratio_is_clamped_in_log_space():
    # dlogp = 25 -> clamp to 20 -> rho = e^20, and the clamp stops the gradient
    logp = torch.tensor([25.0, -25.0, 0.5], requires_grad=True)
    r = token_ratio(logp, torch.zeros(3))
    torch.testing.assert_close(r, torch.tensor([math.exp(20), math.exp(-20), math.exp(0.5)]))
    r.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, math.exp(0.5)]))
