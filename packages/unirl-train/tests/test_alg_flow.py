"""Diffusion StageAlgorithms (FlowGRPO + variants, FlowDPPO) on the fake flow pipeline."""

import copy

import pytest
import torch

from unirl.train.algorithms import (
    AlgorithmConfig,
    BatchTotals,
    ContextReference,
    DanceGRPOConfig,
    FlowDPPOConfig,
    FlowGRPOConfig,
    MixGRPOConfig,
    StageAlgorithm,
)
from unirl.train.algorithms.losses.flow_dppo import dppo_divergence, dppo_mask
from unirl.train.algorithms.losses.flow_grpo import gaussian_mean_kl
from unirl.train.algorithms.testing import FakeFlowPipeline, check_stage_algorithm
from unirl.types import DiffusionSamplingParams

ADV = [1.0, -0.5, 2.0, -1.5, 0.3, -0.7, 0.9, -2.0]


def _totals(parts):
    steps = sum(len(p.segment.sde_indices) for p in parts)
    return BatchTotals(num_samples=len(parts), num_tokens=steps, num_steps=steps)


def _setup(n=8, sde=None, record_old_means=False, seed=0):
    pipe = FakeFlowPipeline(seed=seed)
    parts = pipe.sample(n, sde_indices=sde, advantages=ADV[:n], seed=seed, record_old_means=record_old_means)
    return pipe, parts


def _perturb(module, scale=0.05, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def _run(alg, parts, pipe, totals, chunks):
    pipe.module.zero_grad()
    total, metrics = 0.0, []
    for c in chunks:
        loss, m = alg.loss(c, pipe, totals)
        loss.backward()
        total += loss.item()
        metrics.append(m)
    return total, [p.grad.clone() for p in pipe.module.parameters()], metrics


def test_protocol_and_contract():
    pipe, parts = _setup()
    for cfg in (FlowGRPOConfig(), FlowDPPOConfig(), FlowGRPOConfig(grpo_guard=True)):
        alg = cfg.build()
        assert isinstance(alg, StageAlgorithm) and alg.needs_old_logprobs
        check_stage_algorithm(alg, parts, pipe, _totals(parts))


def test_flow_grpo_first_update_ratio_is_one_and_loss_is_minus_mean_advantage():
    pipe, parts = _setup()
    alg = FlowGRPOConfig(clip_range=1e-4).build()
    alg.prepare(parts, pipe)
    loss, m = alg.loss(parts, pipe, _totals(parts))
    assert (
        abs(m["ratio_mean"] - 1) < 1e-6 and abs(m["ratio_min"] - 1) < 1e-6 and abs(m["ratio_max"] - 1) < 1e-6
    )
    assert m["clip_frac"] == 0.0 and m["approx_kl"] < 1e-12
    assert all(abs(m[f"log_ratio_step_{j}"]) < 1e-6 for j in range(4))
    # rho = 1 everywhere: l = -A per (sample, step); every sample has 4 steps -> loss = -mean(A)
    assert abs(loss.item() + sum(ADV) / 8) < 1e-6


def test_flow_grpo_gradient_at_rho_one_is_the_policy_gradient():
    # d rho / d theta = d logp / d theta at rho = 1, so grad = -(1/N) sum_(i,j) A_i grad logp_ij
    pipe, parts = _setup(n=4)
    alg = FlowGRPOConfig().build()
    _, grads, _ = _run(alg, parts, pipe, _totals(parts), [parts])
    pipe.module.zero_grad()
    ref = sum((-torch.tensor(ADV[:4]) * pipe.replay_step(parts, j).log_prob).sum() for j in range(4)) / 16
    ref.backward()
    for g, p in zip(grads, pipe.module.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "cfg",
    [
        FlowGRPOConfig(clip_range=0.02),
        FlowGRPOConfig(clip_range=0.02, kl_coef=0.1),
        FlowGRPOConfig(clip_range=0.02, grpo_guard=True),
        FlowDPPOConfig(tau=1e-4),
    ],
    ids=["grpo", "grpo_kl", "grpo_guard", "dppo"],
)
def test_micro_batch_invariance_1x8_vs_8x1(cfg):
    pipe, parts = _setup()
    # ragged: the last four parts train on steps 1 and 3 only
    parts = parts[:4] + FakeFlowPipeline(seed=0).sample(4, sde_indices=[1, 3], advantages=ADV[4:], seed=5)
    alg = cfg.build()
    if cfg.kind == "flow_grpo" and cfg.kl_coef > 0:
        alg.set_reference(copy.deepcopy(pipe))
    alg.prepare(parts, pipe)
    _perturb(pipe.module)  # move away from pi_old so the clip / mask / KL are active
    totals = _totals(parts)
    full, g_full, m_full = _run(alg, parts, pipe, totals, [parts])
    micro, g_micro, _ = _run(alg, parts, pipe, totals, [[p] for p in parts])
    assert abs(full - micro) < 1e-6
    for a, b in zip(g_full, g_micro):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert abs(m_full[0]["ratio_mean"] - 1) > 1e-4  # the perturbation did move the ratios


def test_flow_grpo_kl_to_reference_is_the_exact_gaussian_kl():
    pipe, parts = _setup(n=2, sde=[0])
    ref_pipe = copy.deepcopy(pipe)
    alg = FlowGRPOConfig(kl_coef=0.5).build()
    with pytest.raises(
        ValueError,
        match=r"kl_coef=0.5 needs a reference policy.*backend.reference: frozen_copy.*or set kl_coef=0",
    ):
        alg.prepare(parts, pipe)
    alg.set_reference(ref_pipe)
    alg.prepare(parts, pipe)
    assert alg.loss(parts, pipe, _totals(parts))[1]["kl"] == 0.0
    _perturb(pipe.module)
    loss, m = alg.loss(parts, pipe, _totals(parts))
    cur, ref = pipe.replay_step(parts, 0), ref_pipe.replay_step(parts, 0)
    kl = gaussian_mean_kl(cur.mean, ref.mean, cur.std)
    assert abs(m["kl"] - kl.mean().item()) < 1e-6 and m["kl"] > 0
    # the loss is the clipped term plus 0.5 * KL, both averaged over the 2 (sample, step) pairs
    no_kl = FlowGRPOConfig().build().loss(parts, pipe, _totals(parts))[0]
    assert abs(loss.item() - (no_kl.item() + 0.5 * kl.mean().item())) < 1e-6


def test_context_reference_runs_replay_inside_the_context():
    pipe, parts = _setup(n=2, sde=[0])
    saved = copy.deepcopy(pipe.module.state_dict())
    _perturb(pipe.module)
    entered = []

    class Swap:
        def __enter__(self):
            entered.append(True)
            self.cur = copy.deepcopy(pipe.module.state_dict())
            pipe.module.load_state_dict(saved)

        def __exit__(self, *exc):
            pipe.module.load_state_dict(self.cur)

    ref = ContextReference(pipe, Swap)
    out = ref.replay_step(parts, 0)
    assert entered and not out.mean.requires_grad
    # the reference is the pre-perturbation policy, which produced the stored log-probs
    torch.testing.assert_close(out.log_prob, torch.stack([p.segment.log_probs[0] for p in parts]))


def test_grpo_guard_old_means_match_the_rollout_and_ratio_is_one():
    pipe, parts = _setup(n=3, record_old_means=True)
    recorded = [p.segment.old_means.clone() for p in parts]
    alg = FlowGRPOConfig(grpo_guard=True, recompute_old_means=True, prepare_batch_size=2).build()
    alg.prepare(parts, pipe)
    for r, p in zip(recorded, parts):
        torch.testing.assert_close(p.segment.old_means, r, atol=1e-6, rtol=0)
    _, m = alg.loss(parts, pipe, _totals(parts))
    assert abs(m["ratio_min"] - 1) < 1e-6 and abs(m["ratio_max"] - 1) < 1e-6


def test_flow_dppo_mask_follows_the_pure_function():
    pipe, parts = _setup(n=4, sde=[2])
    alg = FlowDPPOConfig(tau=1e-4).build()
    alg.prepare(parts, pipe)
    loss0, m0 = alg.loss(parts, pipe, _totals(parts))
    assert m0["mask_frac"] == 0.0 and m0["divergence"] < 1e-12
    assert abs(loss0.item() + sum(ADV[:4]) / 4) < 1e-6
    _perturb(pipe.module, scale=0.2)
    loss, m = alg.loss(parts, pipe, _totals(parts))
    rep = pipe.replay_step(parts, 2)
    old_logprobs = torch.stack([p.segment.log_probs[0] for p in parts])
    ratio = torch.exp(rep.log_prob - old_logprobs)
    div = dppo_divergence(rep.mean, torch.stack([p.segment.old_means[0] for p in parts]), rep.std)
    adv = torch.tensor(ADV[:4])
    keep = dppo_mask(div, ratio, adv, 1e-4)
    assert abs(m["mask_frac"] - (1 - keep.float().mean().item())) < 1e-7 and m["mask_frac"] > 0
    expected = torch.where(keep, -adv * ratio, torch.zeros(4)).sum() / 4
    assert abs(loss.item() - expected.item()) < 1e-6


def test_named_variants_check_the_rollout_and_give_sampling_overrides():
    pipe, parts = _setup(n=2)
    with pytest.raises(ValueError, match="dance_sde"):
        DanceGRPOConfig().build().prepare(parts, pipe)
    with pytest.raises(ValueError, match="sliding_window"):
        MixGRPOConfig().build().prepare(parts, pipe)
    params = DiffusionSamplingParams(num_steps=10, height=8, width=8, **MixGRPOConfig().sampling_overrides())
    assert params.resolve_sde_indices(0) == [0, 1, 2, 3] and params.resolve_sde_indices(25) == [1, 2, 3, 4]
    dance = DiffusionSamplingParams(num_steps=10, height=8, width=8, **DanceGRPOConfig().sampling_overrides())
    assert dance.sde_strategy == "dance_sde" and dance.eta == 0.3
    assert DanceGRPOConfig().build().name == "dance_grpo"


def test_configs_are_strict_and_selected_by_kind():
    from pydantic import TypeAdapter, ValidationError

    ta = TypeAdapter(AlgorithmConfig)
    assert isinstance(ta.validate_python({"kind": "mix_grpo", "window_size": 3}), MixGRPOConfig)
    with pytest.raises(ValidationError, match="clip_rnage"):
        ta.validate_python({"kind": "flow_grpo", "clip_rnage": 0.1})
    with pytest.raises(ValidationError, match="window_stride"):
        MixGRPOConfig(window_size=2, window_stride=3)
    with pytest.raises(ValidationError, match="flow_dppo"):
        ta.validate_python({"kind": "flowdppo"})


def test_untrainable_parts_give_clear_errors():
    pipe, parts = _setup(n=2)
    parts[0].advantage = None
    with pytest.raises(ValueError, match="advantage"):
        FlowGRPOConfig().build().loss(parts, pipe, _totals(parts))
    _, parts = _setup(n=1)
    parts[0].segment.log_probs = None
    with pytest.raises(ValueError, match="log_probs"):
        FlowGRPOConfig().build().prepare(parts, pipe)


def test_flow_grpo_decoupled_off_policy_on_a_stale_rollout():
    """A rollout sampled by an older policy (async): with the stored log-probs the first update's
    ratio is off 1 and the tiny clip range zeroes most of the gradient; recomputed (proximal)
    log-probs give ratio 1, and each SDE step is weighted by min(exp(old_logprobs - behavior_logprobs), C)."""
    from unirl.train.algorithms import OffPolicyConfig

    pipe, parts = _setup()
    _perturb(pipe.module, scale=0.02)  # the trainer moved on since the rollout
    stale = FlowGRPOConfig(clip_range=1e-4).build()
    stale.prepare(parts, pipe)
    assert stale.loss(parts, pipe, _totals(parts))[1]["clip_frac"] > 0.5
    cap = 1.02
    alg = FlowGRPOConfig(
        clip_range=1e-4, old_logprobs="recompute", off_policy=OffPolicyConfig(mode="truncate", cap=cap)
    ).build()
    alg.prepare(parts, pipe)
    loss, m = alg.loss(parts, pipe, _totals(parts))
    assert abs(m["ratio_min"] - 1) < 1e-5 and abs(m["ratio_max"] - 1) < 1e-5 and m["clip_frac"] == 0.0
    # rho = 1: the loss is -sum_(i,j) w_ij A_i / N with w_ij = min(exp(old_logprobs_ij - behavior_logprobs_ij), C)
    old_logprobs = torch.stack([pipe.replay_step(parts, j).log_prob.detach() for j in range(4)], dim=1)
    behavior_logprobs = torch.stack([p.segment.log_probs for p in parts])
    w = torch.clamp(torch.exp(old_logprobs - behavior_logprobs), max=cap)
    expected = -(w * torch.tensor(ADV)[:, None]).sum() / 32
    assert abs(loss.item() - expected.item()) < 1e-5
    assert 0 < m["is_weight_clipped_frac"] < 1
    assert (
        abs(
            m["is_weight_clipped_frac"]
            - (torch.exp(old_logprobs - behavior_logprobs) > cap).float().mean().item()
        )
        < 1e-6
    )
    with pytest.raises(ValueError, match="needs old_logprobs='recompute'"):
        FlowGRPOConfig(off_policy=OffPolicyConfig(mode="truncate", cap=2.0))
