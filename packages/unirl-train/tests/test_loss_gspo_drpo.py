"""Worked numbers for GSPO (sequence ratio) and DRPO (token-adaptive quadratic trust region)."""

import math

import pytest
import torch

from unirl.train.algorithms.losses.drpo import drpo_token_loss
from unirl.train.algorithms.losses.gspo import gspo_sequence_loss, sequence_log_ratio


def test_gspo_sequence_ratio_worked():
    # seq 0: mask [1, 1], dlogp [0.1, 0.3] -> mean 0.2 -> s = e^0.2 = 1.2214; A = 1, eps 0.1
    #        -> max(-1.2214, -1.1) = -1.1 (clipped: no gradient)
    # seq 1: mask [1, 0], dlogp [-0.05, 9 (masked)] -> s = e^-0.05 = 0.951229; A = -2
    #        -> inside [0.9, 1.1]: loss = 2 * 0.951229 = 1.902459
    #        d/dlogp_0 = -A * s * (1 / |y| = 1) = 1.902459; masked token: 0
    logp = torch.tensor([[0.1, 0.3], [-0.05, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    torch.testing.assert_close(sequence_log_ratio(logp, torch.zeros(2, 2), mask), torch.tensor([0.2, -0.05]))
    loss, s = gspo_sequence_loss(logp, torch.zeros(2, 2), torch.tensor([1.0, -2.0]), mask, 0.1, 0.1)
    torch.testing.assert_close(s, torch.tensor([math.exp(0.2), math.exp(-0.05)]))
    torch.testing.assert_close(loss, torch.tensor([-1.1, 2 * math.exp(-0.05)]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0], [2 * math.exp(-0.05), 0.0]]))


def test_drpo_worked():
    # token 0: old_logprobs = ln 0.5 (w = 0.5), logp = 0 -> rho = 2, A = 1, eps = 12.5
    #   l = -2 + 1 * 0.5 * (2 - 1)^2 / 25 = -1.98
    #   dl/dlogp = (-A + |A| w (rho - 1) / eps) * rho = (-1 + 0.5 / 12.5) * 2 = -1.92
    # token 1: old_logprobs = ln 0.8 (w = 0.8), logp = ln 0.4 -> rho = 0.5, A = -1
    #   l = 0.5 + 0.8 * 0.25 / 25 = 0.508
    #   dl/dlogp = (1 + 0.8 * (-0.5) / 12.5) * 0.5 = (1 - 0.032) * 0.5 = 0.484
    old_logprobs = torch.log(torch.tensor([[0.5, 0.8]]))
    logp = torch.log(torch.tensor([[1.0, 0.4]])).requires_grad_(True)
    loss, ratio = drpo_token_loss(logp, old_logprobs, torch.tensor([[1.0, -1.0]]))
    torch.testing.assert_close(loss, torch.tensor([[-1.98, 0.508]]))
    torch.testing.assert_close(ratio, torch.tensor([[2.0, 0.5]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.92, 0.484]]))
    # w = 1 (not token-adaptive): token 0 -> -2 + 1/25 = -1.96; the ratio is never clipped
    loss1, _ = drpo_token_loss(logp.detach(), old_logprobs, torch.tensor([1.0]), token_adaptive=False)
    assert abs(loss1[0, 0].item() - (-1.96)) < 1e-6
    with pytest.raises(ValueError, match="eps"):
        drpo_token_loss(logp, old_logprobs, torch.tensor([1.0]), eps=0.0)
