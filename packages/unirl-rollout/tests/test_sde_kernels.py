"""SDE step kernels against hand-worked numbers, closed-form densities and the Euler sampler."""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from unirl.rollout.schedules import static_shifted_sigmas
from unirl.rollout.sde import (
    cps_step,
    dance_sde_step,
    flow_sde_step,
    get_strategy,
    ode_step,
)

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def scalar(x: float) -> torch.Tensor:
    return torch.tensor([[x]])  # [B=1, 1 element]


def test_flow_sde_worked_numbers() -> None:
    # x=1, v=0.5, sigma=0.5 -> 0.25, eta=0.7:
    # g = 0.7 sqrt(0.5 / 0.5) = 0.7, g^2 = 0.49, dt = -0.25
    # mu = 1 (1 + 0.49 / 1 * -0.25) + 0.5 (1 + 0.49 * 0.5 / 1) * -0.25 = 0.8775 - 0.155625 = 0.721875
    # s = 0.7 sqrt(0.25) = 0.35; with z = 1: x_next = 1.071875
    # logp = -1/2 - log 0.35 - 0.5 log 2pi
    r = flow_sde_step(scalar(1.0), scalar(0.5), 0.5, 0.25, 0.7, sigma_at_one=0.9, noise=scalar(1.0))
    assert r.mean.item() == pytest.approx(0.721875, abs=1e-6)
    assert r.std.item() == pytest.approx(0.35, abs=1e-7)
    assert r.x_next.item() == pytest.approx(1.071875, abs=1e-6)
    assert r.log_prob is not None
    assert r.log_prob.item() == pytest.approx(-0.5 - math.log(0.35) - HALF_LOG_2PI, abs=1e-6)


def test_flow_sde_sigma_one_uses_second_sigma() -> None:
    # sigma = 1 -> 0.8 with sigma_at_one = 0.8: g^2 = 0.49 * 1 / (1 - 0.8) = 2.45, dt = -0.2
    # mu = x (1 + 2.45 / 2 * -0.2) + v (1 + 0) * -0.2 = 0.755 x - 0.2 v = 0.655 for x = 1, v = 0.5
    # s = sqrt(2.45 * 0.2) = 0.7
    r = flow_sde_step(scalar(1.0), scalar(0.5), 1.0, 0.8, 0.7, sigma_at_one=0.8, noise=scalar(0.0))
    assert r.mean.item() == pytest.approx(0.655, abs=1e-6)
    assert r.std.item() == pytest.approx(0.7, abs=1e-6)
    assert torch.isfinite(r.log_prob).all()


def test_dance_sde_worked_numbers() -> None:
    # g = eta = 0.3: mu = 1 (1 + 0.09 * -0.25) + 0.5 (1 + 0.09 * 0.5) * -0.25 = 0.9775 - 0.130625
    r = dance_sde_step(scalar(1.0), scalar(0.5), 0.5, 0.25, 0.3, noise=scalar(-2.0))
    assert r.mean.item() == pytest.approx(0.846875, abs=1e-6)
    assert r.std.item() == pytest.approx(0.15, abs=1e-7)
    assert r.x_next.item() == pytest.approx(0.846875 - 0.3, abs=1e-6)
    # z = -2: logp = -2 - log 0.15 - 0.5 log 2pi
    assert r.log_prob.item() == pytest.approx(-2.0 - math.log(0.15) - HALF_LOG_2PI, abs=1e-5)


def test_cps_worked_numbers_and_scorings() -> None:
    # sigma 0.5 -> 0.25, eta 0.5: s = 0.25 sin(pi/4); x0_hat = 1 - 0.5*0.5 = 0.75; eps_hat = 1 + 0.5*0.5
    # mu = 0.75 * 0.75 + sqrt(0.0625 - s^2) * 1.25 = 0.5625 + 0.1767767 * 1.25
    s = 0.25 * math.sin(math.pi / 4)
    r = cps_step(scalar(1.0), scalar(0.5), 0.5, 0.25, 0.5, noise=scalar(1.0))
    assert r.mean.item() == pytest.approx(0.5625 + math.sqrt(0.0625 - s * s) * 1.25, abs=1e-6)
    assert r.std.item() == pytest.approx(s, abs=1e-7)
    assert r.log_prob.item() == pytest.approx(-0.5 - math.log(s) - HALF_LOG_2PI, abs=1e-5)
    nv = cps_step(scalar(1.0), scalar(0.5), 0.5, 0.25, 0.5, scoring="no_variance", x_next=r.x_next)
    assert nv.log_prob.item() == pytest.approx(-(s**2), abs=1e-7)  # -(x_next - mu)^2, no 1/(2 s^2)
    with pytest.raises(ValueError, match="sigma_next > 0"):
        cps_step(scalar(1.0), scalar(0.5), 0.5, 0.0, 0.5, noise=scalar(1.0))


@pytest.mark.parametrize("name", ["flow_sde", "dance_sde", "cps"])
def test_log_prob_is_closed_form_gaussian_mean_over_elements(name: str) -> None:
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(3, 4, 5, 5, generator=g), torch.randn(3, 4, 5, 5, generator=g)
    sigmas = torch.tensor([static_shifted_sigmas(6, 3.0)] * 3)
    strategy = get_strategy(name)
    r = strategy.step(x, v, sigmas, 2, 0.7, noise=torch.randn(3, 4, 5, 5, generator=g))
    std = r.std.reshape(3, 1, 1, 1).expand_as(r.mean)
    expected = torch.distributions.Normal(r.mean, std).log_prob(r.x_next).mean(dim=(1, 2, 3))
    torch.testing.assert_close(r.log_prob, expected, atol=1e-5, rtol=1e-6)
    # scoring the stored x_next reproduces the sampling-time log-prob exactly
    again = strategy.step(x, v, sigmas, 2, 0.7, x_next=r.x_next)
    assert torch.equal(again.log_prob, r.log_prob)


def test_only_mean_carries_gradient() -> None:
    x = torch.randn(2, 3)
    v = torch.randn(2, 3, requires_grad=True)
    stored = torch.randn(2, 3, requires_grad=True)
    r = flow_sde_step(x, v, 0.6, 0.4, 0.7, sigma_at_one=0.9, x_next=stored)
    r.log_prob.sum().backward()
    assert v.grad is not None and stored.grad is None


def test_ode_matches_diffusers_euler_bit_for_bit() -> None:
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(8)
    g = torch.Generator().manual_seed(1)
    x_ref = torch.randn(2, 4, 6, 6, generator=g)
    x = x_ref.clone()
    sig = sched.sigmas
    for j, t in enumerate(sched.timesteps):
        v = torch.sin(3 * x_ref) + 0.1 * j  # any deterministic velocity field
        x_ref = sched.step(v, t, x_ref, return_dict=False)[0]
        x = ode_step(x, torch.sin(3 * x) + 0.1 * j, sig[j], sig[j + 1]).x_next
        assert torch.equal(x, x_ref)


@pytest.mark.parametrize("name", ["flow_sde", "dance_sde", "cps", "cps_novar", "ode"])
def test_eta_zero_is_euler_bit_for_bit(name: str) -> None:
    g = torch.Generator().manual_seed(2)
    x, v = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    sigmas = torch.tensor([static_shifted_sigmas(4, 3.0)] * 2)
    for j in range(4):
        r = get_strategy(name).step(x, v, sigmas, j, 0.0, noise=torch.randn(2, 3, 4, generator=g))
        assert torch.equal(r.x_next, x + (sigmas[:, j + 1] - sigmas[:, j]).reshape(2, 1, 1) * v)
        assert r.log_prob is None


def test_fp32_sigma_math_from_float64() -> None:
    # float64 sigmas are rounded to fp32 first: identical to passing fp32 sigmas
    x, v = torch.randn(2, 8), torch.randn(2, 8)
    z = torch.randn(2, 8)
    a = flow_sde_step(
        x, v, torch.tensor(0.7123456789, dtype=torch.float64), 0.3, 0.7, sigma_at_one=0.9, noise=z
    )
    b = flow_sde_step(
        x, v, torch.tensor(0.7123456789, dtype=torch.float32), 0.3, 0.7, sigma_at_one=0.9, noise=z
    )
    assert torch.equal(a.log_prob, b.log_prob) and a.mean.dtype == torch.float32


def test_bad_inputs_fail_clearly() -> None:
    with pytest.raises(ValueError, match="sde_strategy='nope' is unknown"):
        get_strategy("nope")
    with pytest.raises(ValueError, match="exactly one of"):
        flow_sde_step(scalar(1.0), scalar(1.0), 0.5, 0.4, 0.7, sigma_at_one=0.9)
    sig = static_shifted_sigmas(4, 3.0)
    with pytest.raises(ValueError, match=r"out of range.*0\.\.3"):
        get_strategy("flow_sde").check(sig, [0, 4], 0.7)
    with pytest.raises(ValueError, match="eta must be >= 0"):
        get_strategy("dance_sde").check(sig, [0], -0.1)
    get_strategy("cps").check(sig, [3], 0.0)  # eta = 0: deterministic, nothing to score
    with pytest.raises(ValueError, match="cps_novar"):
        get_strategy("cps").check(sig, [3], 0.7)
    get_strategy("cps_novar").check(sig, [3], 0.7)
