"""DiffusionNFT and flow-matching SFT StageAlgorithms on the fake flow pipeline."""

import copy
from contextlib import contextmanager

import pytest
import torch

from unirl.train.algorithms import (
    BatchTotals,
    ContextReference,
    DiffusionNFTConfig,
    FlowSFTConfig,
    StageAlgorithm,
)
from unirl.train.algorithms.losses.diffusion_nft import nft_noisy_latent, nft_old_decay, nft_sample_loss
from unirl.train.algorithms.losses.flow_sft import flow_sft_sample_loss, sample_timesteps
from unirl.train.algorithms.testing import FakeFlowPipeline, check_stage_algorithm
from unirl.train.ema import EMAConfig, ema_decay

ADV = [3.0, -2.0, 0.5, -6.0, 1.0, 0.0, -1.0, 2.0]


def _old_policy(pipe):
    """Old policy = a frozen snapshot swapped into the live module (what backend.ema_weights does)."""
    snapshot = copy.deepcopy(pipe.module.state_dict())

    @contextmanager
    def ctx():
        cur = copy.deepcopy(pipe.module.state_dict())
        pipe.module.load_state_dict(snapshot)
        try:
            yield
        finally:
            pipe.module.load_state_dict(cur)

    return ctx


def _nft(k=2, **kw):
    pipe = FakeFlowPipeline(seed=3)
    parts = pipe.sample(8, sde_indices=[], advantages=ADV, seed=3)  # ODE rollout, no log-probs
    alg = DiffusionNFTConfig(timesteps_per_sample=k, **kw).build()
    alg.set_old_policy(_old_policy(pipe))
    return pipe, parts, alg


def _totals(alg, parts):
    s, t, n = alg.count(parts)
    return BatchTotals(num_samples=s, num_tokens=t, num_steps=n)


def test_nft_contract_count_and_missing_old_policy():
    pipe, parts, alg = _nft(k=3)
    assert isinstance(alg, StageAlgorithm) and not alg.needs_old_logprobs
    assert alg.count(parts) == (8, 24, 24)
    assert DiffusionNFTConfig().build().count(parts) == (8, 32, 32)  # None = every grid point (T = 4)
    check_stage_algorithm(alg, parts, pipe, _totals(alg, parts))
    with pytest.raises(ValueError, match="set_old_policy"):
        DiffusionNFTConfig().build().prepare(parts, pipe)


def test_nft_loss_matches_the_pure_function_after_an_update():
    pipe, parts, alg = _nft(k=2, beta=0.5)
    alg.prepare(parts, pipe)
    old_pipe = copy.deepcopy(pipe)
    with torch.no_grad():
        pipe.module.bias.add_(0.3)  # the trainable policy moves away from the old one
    loss, m = alg.loss(parts[:3], pipe, _totals(alg, parts))
    # recompute by hand from the stored draws
    per = []
    for i, p in enumerate(parts[:3]):
        d = alg._draws[id(p)]
        x_clean = p.segment.latents[-1].expand_as(d.x_t)
        assert set(d.t.tolist()) <= set(torch.tensor(p.segment.sigmas[:-1]).tolist())  # t from the grid
        conds = [p.conditions] * len(d.t)
        v_old = old_pipe.velocity(d.x_t, d.t, conds, 1.0)
        torch.testing.assert_close(d.v_old, v_old)  # v_old came from the old weights
        v = pipe.velocity(d.x_t, d.t, conds, 1.0)
        per.append(nft_sample_loss(v, v_old, d.x_t, x_clean, d.t, torch.full((2,), ADV[i]), beta=0.5))
    expected = torch.cat(per).sum() / 16
    assert abs(loss.item() - expected.item()) < 1e-5
    assert m["velocity_gap"] > 0


def test_nft_kl_to_the_reference_is_the_velocity_mse_and_pulls_back():
    pipe, parts, alg0 = _nft(k=2)
    reference = ContextReference(pipe, _old_policy(pipe))  # the weights before the move below
    _, _, alg = _nft(k=2, kl_coef=0.5)
    with pytest.raises(ValueError, match="kl_coef=0.5 needs a reference"):
        alg.prepare(parts, pipe)
    alg.set_reference(reference)
    alg.prepare(parts, pipe)
    alg0.prepare(parts, pipe)  # same seed: the same (t, noise) draws
    with torch.no_grad():
        pipe.module.bias.add_(0.3)
    totals = _totals(alg, parts)
    loss, m = alg.loss(parts, pipe, totals)
    base, _ = alg0.loss(parts, pipe, totals)
    kl = []
    for p in parts:
        d = alg._draws[id(p)]
        v_ref = reference.velocity(d.x_t, d.t, [p.conditions] * len(d.t), 1.0)
        kl.append(
            (pipe.velocity(d.x_t, d.t, [p.conditions] * len(d.t), 1.0) - v_ref).pow(2).flatten(1).mean(1)
        )
    kl = torch.cat(kl)
    assert abs(m["kl"] - kl.mean().item()) < 1e-6 and m["kl"] > 0
    assert abs((loss - base).item() - 0.5 * kl.sum().item() / totals.num_steps) < 1e-5
    # a strong penalty walks the policy back to the reference
    strong = DiffusionNFTConfig(timesteps_per_sample=2, kl_coef=50.0).build()
    strong.set_old_policy(_old_policy(pipe))
    strong.set_reference(reference)
    strong.prepare(parts, pipe)
    before = strong.loss(parts, pipe, totals)[1]["kl"]
    for _ in range(20):
        _sgd_step(pipe.module, strong.loss(parts, pipe, totals)[0], lr=0.01)
    assert strong.loss(parts, pipe, totals)[1]["kl"] < 0.5 * before


def test_nft_micro_batch_invariance_1x8_vs_8x1():
    pipe, parts, alg = _nft(k=2)
    alg.prepare(parts, pipe)
    with torch.no_grad():
        pipe.module.weight.mul_(1.1)
    totals = _totals(alg, parts)

    def run(chunks):
        pipe.module.zero_grad()
        tot = 0.0
        for c in chunks:
            loss, _ = alg.loss(c, pipe, totals)
            loss.backward()
            tot += loss.item()
        return tot, [p.grad.clone() for p in pipe.module.parameters()]

    full, gf = run([parts])
    micro, gm = run([[p] for p in parts])
    assert abs(full - micro) < 1e-5 * max(1.0, abs(full))
    for a, b in zip(gf, gm):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_nft_ema_schedule_matches_the_backend_ema():
    cfg = DiffusionNFTConfig()
    ema = EMAConfig(**cfg.ema_config())
    for step in (0, 1, 250, 499, 500, 10_000):
        assert ema_decay(ema, step) == nft_old_decay(step)


def test_flow_sft_matches_the_pure_function_and_learns():
    pipe = FakeFlowPipeline(seed=4)
    parts = pipe.sample(8, sde_indices=[], seed=4)
    alg = FlowSFTConfig(timestep_sampling="uniform", seed=7).build()
    assert isinstance(alg, StageAlgorithm) and not alg.needs_old_logprobs
    totals = BatchTotals(num_samples=8, num_tokens=0, num_steps=0)
    alg.prepare(parts, pipe)
    loss, m = alg.loss(parts, pipe, totals)
    # the same draws by hand: t first, then the noise, from a generator seeded like the config
    g = torch.Generator().manual_seed(7)
    t = sample_timesteps(8, "uniform", g)
    x0 = torch.stack([p.segment.latents[-1] for p in parts])
    noise = torch.randn(x0.shape, generator=g)
    v = pipe.velocity(nft_noisy_latent(x0, noise, t), t, [p.conditions for p in parts], 1.0)
    expected = flow_sft_sample_loss(v, x0, noise).mean().item()
    assert abs(loss.item() - expected) < 1e-6 and abs(m["flow_mse"] - expected) < 1e-6
    # a few SGD steps lower the loss on fresh draws (averaged to damp the noise)

    def avg_loss():
        with torch.no_grad():
            return sum(alg.loss(parts, pipe, totals)[0].item() for _ in range(20)) / 20

    before = avg_loss()
    for _ in range(60):
        _sgd_step(pipe.module, alg.loss(parts, pipe, totals)[0], lr=0.05)
    assert avg_loss() < 0.8 * before
    with pytest.raises(ValueError, match="conditions"):
        parts[0].conditions = None
        alg.prepare(parts, pipe)


def _sgd_step(module, loss, lr):
    """Plain SGD by hand (torch.optim's first step imports torch._dynamo: seconds on a busy CPU)."""
    module.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in module.parameters():
            p.sub_(lr * p.grad)
