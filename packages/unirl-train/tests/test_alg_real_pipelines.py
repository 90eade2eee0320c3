"""The algorithms against the REAL replay implementations of unirl.rollout (tiny models built in
code): FlowMatchPipeline on a tiny random SD3, ARPipeline on a tiny random Qwen3.

Checks the two invariants end to end: the first update of an on-policy batch has ratio == 1,
and the loss / gradient do not depend on the micro-batch split.
"""

import pytest
import torch

from unirl.rollout.ar.bundle import CausalLMBundle
from unirl.rollout.ar.pipeline import ARPipeline
from unirl.rollout.models.sd3 import SD3Bundle
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.train.algorithms import BatchTotals, DiffusionNFTConfig, FlowDPPOConfig, FlowGRPOConfig, GRPOConfig
from unirl.train.ema import EMA, EMAConfig
from unirl.types import ARSamplingParams, DiffusionSamplingParams, NoiseRecipe, Sample, TextPrimitive

PROMPTS = ["a red circle", "two blue squares"]
ADV = [1.0, -1.0, 0.5, -0.5]


def _samples():
    return [
        Sample(id=f"p{g}-{i}", group_id=f"p{g}", inputs=[TextPrimitive(text=t)])
        for g, t in enumerate(PROMPTS)
        for i in range(2)
    ]


@pytest.fixture(scope="module")
def flow_parts():
    bundle = SD3Bundle.tiny(seed=0)
    params = DiffusionSamplingParams(
        num_steps=3, guidance_scale=1.0, height=16, width=16, eta=0.7, noise=NoiseRecipe(seed=1)
    )
    pipe = FlowMatchPipeline(bundle, default_params=params, record_old_means=True)
    parts = [s.part("diffusion") for s in pipe.generate(_samples(), rollout_step=0)]
    for p, a in zip(parts, ADV):
        p.advantage = a
    return pipe, parts


def _grads(module):
    return [q.grad.clone() for q in module.parameters() if q.requires_grad and q.grad is not None]


def _run(alg, pipe, module, parts, totals, chunks):
    module.zero_grad(set_to_none=True)
    total, ms = 0.0, []
    for c in chunks:
        loss, m = alg.loss(c, pipe, totals)
        loss.backward()
        total += loss.item()
        ms.append(m)
    return total, _grads(module), ms


@pytest.mark.parametrize("cfg", [FlowGRPOConfig(), FlowDPPOConfig()], ids=["flow_grpo", "flow_dppo"])
def test_flow_real_pipeline_ratio_one_and_split_invariance(flow_parts, cfg):
    pipe, parts = flow_parts
    n = sum(len(p.segment.sde_indices) for p in parts)
    totals = BatchTotals(num_samples=4, num_tokens=n, num_steps=n)
    alg = cfg.build()
    alg.prepare(parts, pipe)
    module = pipe.bundle.transformer
    full, g_full, ms = _run(alg, pipe, module, parts, totals, [parts])
    m = ms[0]
    assert abs(m["ratio_min"] - 1) < 1e-5 and abs(m["ratio_max"] - 1) < 1e-5
    assert abs(full + sum(ADV) / 4) < 1e-5  # rho = 1: loss = -mean(A) = 0
    micro, g_micro, _ = _run(alg, pipe, module, parts, totals, [parts[:1], parts[1:3], parts[3:]])
    assert abs(full - micro) < 1e-6
    assert g_full and len(g_full) == len(g_micro)
    for a, b in zip(g_full, g_micro):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    module.zero_grad(set_to_none=True)


def test_nft_real_pipeline_with_the_train_ema_as_old_policy(flow_parts):
    pipe, parts = flow_parts
    module = pipe.bundle.transformer
    cfg = DiffusionNFTConfig(timesteps_per_sample=2)
    ema = EMA(dict(module.named_parameters()), EMAConfig(**cfg.ema_config()))
    alg = cfg.build()
    alg.set_old_policy(ema.applied)
    alg.prepare(parts, pipe)
    s, t, n = alg.count(parts)
    totals = BatchTotals(num_samples=s, num_tokens=t, num_steps=n)
    full, g_full, ms = _run(alg, pipe, module, parts, totals, [parts])
    assert ms[0]["velocity_gap"] < 1e-10  # EMA == current weights before any step: v_theta == v_old
    micro, g_micro, _ = _run(alg, pipe, module, parts, totals, [parts[:2], parts[2:]])
    assert abs(full - micro) < 1e-5 * max(1.0, abs(full))
    assert g_full and any(g.abs().sum() > 0 for g in g_full)
    for a, b in zip(g_full, g_micro):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    module.zero_grad(set_to_none=True)


def test_ar_real_pipeline_ratio_one_and_split_invariance():
    bundle = CausalLMBundle.tiny_qwen3(seed=2)
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=5, temperature=0.9))
    parts = [s.part("ar") for s in pipe.generate(_samples(), rollout_step=0)]
    for p, a in zip(parts, ADV):
        p.advantage = a
    ntok = sum(len(p.segment.response_ids) for p in parts)
    totals = BatchTotals(num_samples=4, num_tokens=ntok, num_steps=0)
    alg = GRPOConfig.dapo().build()
    alg.prepare(parts, pipe)
    full, g_full, ms = _run(alg, pipe, bundle.model, parts, totals, [parts])
    assert abs(ms[0]["ratio_min"] - 1) < 1e-5 and abs(ms[0]["ratio_max"] - 1) < 1e-5
    micro, g_micro, _ = _run(alg, pipe, bundle.model, parts, totals, [[p] for p in parts])
    assert abs(full - micro) < 1e-6
    for a, b in zip(g_full, g_micro):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
