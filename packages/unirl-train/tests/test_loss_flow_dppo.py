"""Worked numbers for the FlowDPPO divergence mask."""

import torch

from unirl.train.algorithms.losses.flow_dppo import dppo_divergence, dppo_mask, dppo_step_loss
from unirl.train.algorithms.losses.flow_grpo import gaussian_mean_kl


def test_dppo_mask_and_loss_worked():
    # tau = 1e-3.  D, rho, A -> away from old?  blocked = D >= tau and away
    #   0.01  1.2   1   yes (A>0, rho>1)  blocked -> 0
    #   0.01  0.8   1   no                kept    -> -A rho = -0.8
    #   0.01  1.2  -1   no                kept    -> 1.2
    #   0.01  0.8  -1   yes (A<0, rho<1)  blocked -> 0
    #   1e-4  1.2   1   yes but D < tau   kept    -> -1.2
    div = torch.tensor([0.01, 0.01, 0.01, 0.01, 1e-4])
    rho = torch.tensor([1.2, 0.8, 1.2, 0.8, 1.2])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0])
    logp = torch.log(rho).requires_grad_(True)
    loss, keep = dppo_step_loss(logp, torch.zeros(5), adv, div, tau=1e-3)
    assert keep.tolist() == [False, True, True, False, True]
    torch.testing.assert_close(loss, torch.tensor([0.0, -0.8, 1.2, 0.0, -1.2]))
    loss.sum().backward()
    # d(-A rho)/dlogp = -A rho where kept, 0 where blocked
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -0.8, 1.2, 0.0, -1.2]))


def test_dppo_boundary_is_blocked_and_zero_advantage_never_blocked():
    # D == tau counts as "too far" (>=); A == 0 is never "away"
    keep = dppo_mask(torch.tensor([1e-3, 1.0]), torch.tensor([2.0, 2.0]), torch.tensor([1.0, 0.0]), 1e-3)
    assert keep.tolist() == [False, True]


def test_dppo_divergence_is_the_gaussian_kl():
    mean = torch.tensor([[1.0, 2.0]])
    old = torch.tensor([[0.0, 0.0]])
    s = torch.tensor([2.0])
    torch.testing.assert_close(dppo_divergence(mean, old, s), gaussian_mean_kl(mean, old, s))
    assert abs(dppo_divergence(mean, old, s).item() - 0.3125) < 1e-7
