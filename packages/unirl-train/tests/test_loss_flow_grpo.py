"""Worked numbers for the Flow-GRPO loss, the Gaussian KL, the diagnostics and GRPO-Guard."""

import math

import torch

from unirl.train.algorithms.losses.flow_grpo import flow_grpo_step_loss, gaussian_mean_kl
from unirl.train.algorithms.losses.grpo_guard import guarded_log_ratio
from unirl.train.algorithms.losses.ratio_stats import approx_kl, clip_fraction, ratio_stats

# Five (sample, step) elements with eps = 0.1:
#   A   rho   -A rho  -A clip(rho)   max      d/dlogp (= -A rho if unclipped branch wins, else 0)
#   1   1.2   -1.2    -1.1          -1.1     0
#   1   0.8   -0.8    -0.9          -0.8     -0.8
#  -1   1.2    1.2     1.1           1.2     1.2
#  -1   0.8    0.8     0.9           0.9     0
#   2   1.0   -2.0    -2.0          -2.0     -2.0 (the tie counts as unclipped: ratio is inside the band)
# mean over the 5 elements = (-1.1 - 0.8 + 1.2 + 0.9 - 2.0) / 5 = -1.8 / 5 = -0.36
RHO = torch.tensor([1.2, 0.8, 1.2, 0.8, 1.0])
ADV = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0])


def _logp():
    return torch.log(RHO).clone().requires_grad_(True)


def test_flow_grpo_worked_values_and_gradient():
    logp = _logp()
    per = flow_grpo_step_loss(logp, torch.zeros(5), ADV, eps=0.1)
    torch.testing.assert_close(per, torch.tensor([-1.1, -0.8, 1.2, 0.9, -2.0]), atol=1e-6, rtol=0)
    loss = per.sum() / 5
    assert abs(loss.item() - (-0.36)) < 1e-6
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -0.8, 1.2, 0.0, -2.0]) / 5, atol=1e-6, rtol=0)


def test_flow_grpo_old_logprobs_and_advantage_carry_no_gradient():
    old_logprobs = torch.zeros(5, requires_grad=True)
    adv = ADV.clone().requires_grad_(True)
    flow_grpo_step_loss(_logp(), old_logprobs, adv, eps=0.1).sum().backward()
    assert old_logprobs.grad is None and adv.grad is None


def test_diagnostics_worked_values():
    dlogp = torch.log(RHO)
    # ln 1.2 = 0.18232156, ln 0.8 = -0.22314355; 0.5 * (2 * 0.0332412 + 2 * 0.0497930 + 0) / 5 = 0.0166068
    expected = 0.5 * (2 * math.log(1.2) ** 2 + 2 * math.log(0.8) ** 2) / 5
    assert abs(approx_kl(dlogp).item() - expected) < 1e-7
    # |rho - 1| > 0.1 for the first four elements only -> 4/5
    assert abs(clip_fraction(RHO, 0.1, 0.1).item() - 0.8) < 1e-7
    stats = ratio_stats(RHO)
    assert abs(stats["ratio_mean"] - 1.0) < 1e-6 and abs(stats["ratio_min"] - 0.8) < 1e-6
    assert abs(stats["ratio_max"] - 1.2) < 1e-6
    # masked: only the first two -> mean 1.0, clip frac 1.0; empty selection is neutral, not NaN
    mask = torch.tensor([1, 1, 0, 0, 0])
    assert clip_fraction(RHO, 0.1, 0.1, mask).item() == 1.0
    assert ratio_stats(RHO, torch.zeros(5))["ratio_mean"] == 1.0
    assert approx_kl(dlogp, torch.zeros(5)).item() == 0.0


def test_gaussian_mean_kl_uses_step_std_squared():
    # sample 0: diff [1, 2], s = 2   -> [1, 4] / (2 * 4)    = [0.125, 0.5] -> mean 0.3125
    # sample 1: diff [-1, -1], s=0.5 -> [1, 1] / (2 * 0.25) = [2, 2]        -> mean 2.0
    mean = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    ref = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    kl = gaussian_mean_kl(mean, ref, torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(kl, torch.tensor([0.3125, 2.0]))
    # equals the log-density difference averaged over x ~ N(mu, s^2) (Monte Carlo, loose tolerance)
    g = torch.Generator().manual_seed(0)
    x = mean[0] + 2.0 * torch.randn(200_000, 2, generator=g)
    lp = -((x - mean[0]) ** 2) / 8
    lq = -((x - ref[0]) ** 2) / 8
    assert abs((lp - lq).mean().item() - 0.3125) < 0.02


def _gauss_logp(x, mu, s):
    return (-((x - mu) ** 2) / (2 * s**2) - math.log(s) - 0.5 * math.log(2 * math.pi)).mean()


def test_grpo_guard_removes_the_negative_bias():
    # mu_old = [0, 0], mu = [0.1, -0.2], x = [0.3, 0.1], s = 0.5
    # dlogp = mean[(x - mu_old)^2 - (x - mu)^2] / (2 s^2) = mean[0.09 - 0.04, 0.01 - 0.09] / 0.5 = -0.03
    # guarded = s dlogp + mean(diff^2) / (2 s) = -0.015 + mean(0.01, 0.04) / 1.0 = 0.01
    #         = mean[(mu - mu_old)(x - mu_old)] / s = mean[0.03, -0.02] / 0.5 = 0.01
    x = torch.tensor([0.3, 0.1])
    mu_old = torch.zeros(2)
    mu = torch.tensor([0.1, -0.2])
    dlogp = _gauss_logp(x, mu, 0.5) - _gauss_logp(x, mu_old, 0.5)
    assert abs(dlogp.item() - (-0.03)) < 1e-6
    g = guarded_log_ratio(dlogp.view(1), mu.view(1, 2), mu_old.view(1, 2), torch.tensor([0.5]))
    assert abs(g.item() - 0.01) < 1e-6
