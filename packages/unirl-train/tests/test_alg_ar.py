"""AR StageAlgorithms (GRPO / DAPO / Dr.GRPO, GSPO, DRPO, TokenSFT) on the fake token pipeline."""

import copy
import math

import pytest
import torch
from pydantic import ValidationError

from unirl.train.algorithms import (
    DRPOConfig,
    GRPOConfig,
    GSPOConfig,
    OffPolicyConfig,
    OverlongConfig,
    StageAlgorithm,
    TokenSFTConfig,
)
from unirl.train.algorithms.base import BatchTotals
from unirl.train.algorithms.losses.aggregation import AGGREGATION_MODES
from unirl.train.algorithms.testing import FakeTokenPipeline, check_stage_algorithm
from unirl.types import Reward

ADV = [1.0, -0.5, 2.0, -1.5, 0.3, -0.7, 0.9, -2.0]
LENGTHS = [3, 5, 1, 4, 6, 2, 5, 3]


def _setup(seed=0):
    pipe = FakeTokenPipeline(seed=seed)
    parts = pipe.sample(8, lengths=LENGTHS, advantages=ADV, seed=seed, temperature=0.8)
    return pipe, parts


def _totals(parts):
    return BatchTotals(
        num_samples=len(parts), num_tokens=sum(len(p.segment.response_ids) for p in parts), num_steps=0
    )


def _perturb(module, scale=0.3, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        module.weight.add_(scale * torch.randn(module.weight.shape, generator=g))


def _run(alg, pipe, totals, chunks):
    pipe.module.zero_grad()
    total, ms = 0.0, []
    for c in chunks:
        loss, m = alg.loss(c, pipe, totals)
        loss.backward()
        total += loss.item()
        ms.append(m)
    return total, pipe.module.weight.grad.clone(), ms


CONFIGS = {
    **{f"grpo[{m}]": GRPOConfig(loss_agg_mode=m, horizon=6) for m in AGGREGATION_MODES},
    "dapo": GRPOConfig.dapo(),
    "dr_grpo": GRPOConfig.dr_grpo(horizon=6),
    "grpo_kl_k3+": GRPOConfig(kl_coef=0.1, kl_estimator="k3+"),
    "grpo_offpolicy": GRPOConfig(
        old_logprobs="recompute", off_policy=OffPolicyConfig(mode="truncate", cap=1.5)
    ),
    "gspo": GSPOConfig(eps_low=0.05, eps_high=0.05),
    "drpo": DRPOConfig(),
    "drpo_seqmean": DRPOConfig(token_adaptive=False, loss_agg_mode="seq-mean-token-mean"),
    "token_sft": TokenSFTConfig(),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_contract_and_micro_batch_invariance_1x8_vs_8x1(name):
    cfg = CONFIGS[name]
    pipe, parts = _setup()
    alg = cfg.build()
    assert isinstance(alg, StageAlgorithm)
    if getattr(cfg, "kl_coef", 0) > 0:
        ref = copy.deepcopy(pipe)
        _perturb(ref.module, seed=7)
        alg.set_reference(ref)
    if name == "grpo_offpolicy":  # the engine's log-probs differ from the trainer's
        for p in parts:
            p.segment.log_probs = p.segment.log_probs + 0.2 * torch.randn(len(p.segment.response_ids))
    totals = _totals(parts)
    check_stage_algorithm(alg, parts, pipe, totals)
    _perturb(pipe.module)  # off-policy so that clips / dual clip / penalties are active
    full, g_full, _ = _run(alg, pipe, totals, [parts])
    micro, g_micro, _ = _run(alg, pipe, totals, [[p] for p in parts])
    assert abs(full - micro) < 1e-6
    torch.testing.assert_close(g_full, g_micro, atol=1e-6, rtol=0)


def test_grpo_first_update_ratio_one_and_worked_loss():
    pipe, parts = _setup()
    alg = GRPOConfig(loss_agg_mode="token-mean").build()
    alg.prepare(parts, pipe)
    loss, m = alg.loss(parts, pipe, _totals(parts))
    assert (
        abs(m["ratio_mean"] - 1) < 1e-6 and abs(m["ratio_min"] - 1) < 1e-6 and abs(m["ratio_max"] - 1) < 1e-6
    )
    assert m["clip_frac"] == 0.0 and m["approx_kl"] < 1e-12
    # rho = 1: token-mean of -A over all tokens = -sum_i A_i len_i / sum_i len_i
    expected = -sum(a * n for a, n in zip(ADV, LENGTHS)) / sum(LENGTHS)
    assert abs(loss.item() - expected) < 1e-6
    # seq-mean-token-mean of -A = -mean(A); seq-mean-token-sum-norm with H = 6: -sum(A len) / (8 * 6)
    smtm = GRPOConfig(loss_agg_mode="seq-mean-token-mean").build()
    assert abs(smtm.loss(parts, pipe, _totals(parts))[0].item() + sum(ADV) / 8) < 1e-6
    dr = GRPOConfig.dr_grpo(horizon=6).build()
    assert (
        abs(dr.loss(parts, pipe, _totals(parts))[0].item() + sum(a * n for a, n in zip(ADV, LENGTHS)) / 48)
        < 1e-6
    )


def test_recompute_old_logprobs_restores_ratio_one_under_engine_mismatch():
    pipe, parts = _setup()
    g = torch.Generator().manual_seed(3)
    for p in parts:  # the engine's numerics differ from the trainer's by ~0.1 nats per token
        p.segment.log_probs = p.segment.log_probs + 0.1 * torch.randn(
            len(p.segment.response_ids), generator=g
        )
    rollout = GRPOConfig().build()
    rollout.prepare(parts, pipe)
    assert rollout.loss(parts, pipe, _totals(parts))[1]["approx_kl"] > 1e-4
    op = OffPolicyConfig(mode="mask", c_min=0.9, c_max=1.1)
    rec = GRPOConfig(old_logprobs="recompute", off_policy=op).build()
    rec.prepare(parts, pipe)
    _, m = rec.loss(parts, pipe, _totals(parts))
    assert abs(m["ratio_min"] - 1) < 1e-6 and abs(m["ratio_max"] - 1) < 1e-6
    # the mask keeps tokens whose exp(old_logprobs - behavior_logprobs) lies in [0.9, 1.1]
    old_replay = pipe.replay_logprobs(parts)
    behavior_logprobs = torch.zeros_like(old_replay.logp)
    for b, p in enumerate(parts):
        behavior_logprobs[b, : len(p.segment.response_ids)] = p.segment.log_probs
    w = torch.exp(old_replay.logp.detach() - behavior_logprobs)
    kept = ((w >= 0.9) & (w <= 1.1) & old_replay.mask).sum() / old_replay.mask.sum()
    assert abs(m["is_weight_mean"] - kept.item()) < 1e-6 and 0 < m["is_weight_mean"] < 1
    assert abs(m["is_weight_clipped_frac"] - (1 - kept.item())) < 1e-6
    assert abs(m["is_weight_raw_max"] - w[old_replay.mask.bool()].max().item()) < 1e-5
    # truncation at C = 1.05: the clipped fraction is the share of tokens whose weight exceeds C
    tis = GRPOConfig(old_logprobs="recompute", off_policy=OffPolicyConfig(mode="truncate", cap=1.05)).build()
    tis.prepare(parts, pipe)
    m = tis.loss(parts, pipe, _totals(parts))[1]
    over = ((w > 1.05) & old_replay.mask).sum() / old_replay.mask.sum()
    assert abs(m["is_weight_clipped_frac"] - over.item()) < 1e-6 and 0 < over < 1


def test_kl_needs_a_reference_and_is_zero_against_itself():
    pipe, parts = _setup()
    alg = GRPOConfig(kl_coef=0.1).build()
    with pytest.raises(
        ValueError,
        match=r"kl_coef=0.1 needs a reference policy.*backend.reference: frozen_copy.*or set kl_coef=0",
    ):
        alg.prepare(parts, pipe)
    alg.set_reference(copy.deepcopy(pipe))
    alg.prepare(parts, pipe)
    assert alg.loss(parts, pipe, _totals(parts))[1]["kl"] == 0.0


def test_gspo_uses_one_ratio_per_sequence():
    pipe, parts = _setup()
    alg = GSPOConfig(eps_low=0.99, eps_high=10.0).build()
    alg.prepare(parts, pipe)
    _perturb(pipe.module)
    loss, _ = alg.loss(parts, pipe, _totals(parts))
    rep = pipe.replay_logprobs(parts)
    # no clipping active (wide bounds): loss = mean_i -A_i exp(mean_t dlogp_it)
    expected = 0.0
    for b, p in enumerate(parts):
        n = len(p.segment.response_ids)
        d = (rep.logp[b, :n] - p.segment.log_probs).mean()
        expected += -ADV[b] * math.exp(d.item()) / 8
    assert abs(loss.item() - expected) < 1e-6


def test_token_sft_is_mean_nll_and_learns():
    pipe, parts = _setup()
    alg = TokenSFTConfig().build()
    assert not alg.needs_old_logprobs
    loss, m = alg.loss(parts, pipe, _totals(parts))
    nll = -sum(float(p.segment.log_probs.sum()) for p in parts) / sum(LENGTHS)
    # stored log-probs were taken at temperature 0.8, the replay uses the Part's temperature too
    assert abs(loss.item() - nll) < 1e-5 and abs(m["nll"] - nll) < 1e-5
    for _ in range(10):
        _sgd_step(pipe.module, alg.loss(parts, pipe, _totals(parts))[0], lr=3.0)
    assert alg.loss(parts, pipe, _totals(parts))[0].item() < 0.9 * nll


def test_dapo_reward_shaping_on_parts():
    _, parts = _setup()
    for p in parts:
        p.reward = Reward(total=1.0)
    parts[4].status = "truncated"  # 6 tokens
    alg = GRPOConfig.dapo(overlong=OverlongConfig(max_length=6, buffer=2, truncation="soft")).build()
    alg.shape_rewards(parts)
    # soft: penalty min(-(len - 4) / 2, 0): len 6 -> -1, len 5 -> -0.5, len <= 4 -> 0
    assert [p.reward.total for p in parts] == [1.0, 0.5, 1.0, 1.0, 0.0, 1.0, 0.5, 1.0]
    assert parts[1].reward.components["overlong"] == -0.5
    for p in parts:
        p.reward = Reward(total=1.0)
    GRPOConfig(overlong=OverlongConfig(max_length=6, buffer=2, truncation="zero")).build().shape_rewards(
        parts
    )
    assert [p.reward.total for p in parts] == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]


def test_config_validation_messages():
    assert GRPOConfig.dapo().eps_high == 0.28 and GRPOConfig.dapo().loss_agg_mode == "token-mean"
    with pytest.raises(ValidationError, match="horizon"):
        GRPOConfig(loss_agg_mode="seq-mean-token-sum-norm")
    with pytest.raises(ValidationError, match="recompute"):
        GRPOConfig(off_policy=OffPolicyConfig(mode="truncate", cap=2.0))
    with pytest.raises(ValidationError, match="cap"):
        OffPolicyConfig(mode="truncate")
    with pytest.raises(ValidationError, match="c_min"):
        OffPolicyConfig(mode="mask", c_min=2.0, c_max=1.0)
    with pytest.raises(ValidationError, match="eps_hihg"):
        GRPOConfig(eps_hihg=0.3)
    with pytest.raises(ValidationError, match="buffer"):
        OverlongConfig(max_length=4, buffer=8)
    with pytest.raises(ValidationError):
        GRPOConfig(dual_clip=0.5)


def _sgd_step(module, loss, lr):
    """Plain SGD by hand (torch.optim's first step imports torch._dynamo: seconds on a busy CPU)."""
    module.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in module.parameters():
            p.sub_(lr * p.grad)
