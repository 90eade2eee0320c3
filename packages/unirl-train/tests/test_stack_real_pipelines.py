"""The train half end to end on the real rollout pipelines: the bundle's trainable module wrapped
in place by FSDPBackend (FSDP2, world size 1), trainside rollout with the sharded module, then
TrainStack updates. Tiny SD3 with FlowGRPO; tiny Qwen3 with LoRA + GRPO + KL to the LoRA-off base."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from unirl.rollout.ar.bundle import CausalLMBundle
from unirl.rollout.ar.pipeline import ARPipeline
from unirl.rollout.models.sd3 import SD3Bundle
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.train.algorithms import FlowGRPOConfig, GRPOConfig
from unirl.train.algorithms.base import ContextReference
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.lora import LoRAConfig
from unirl.train.optim import AdamWConfig
from unirl.train.stack import TrainStack
from unirl.types import ARSamplingParams, DiffusionSamplingParams, NoiseRecipe, Sample, TextPrimitive

ADV = [1.0, -1.0, 0.5, -0.5]


def samples() -> list[Sample]:
    prompts = ["a red circle", "two blue squares"]
    return [
        Sample(id=f"p{g}-{i}", group_id=f"p{g}", inputs=[TextPrimitive(text=t)])
        for g, t in enumerate(prompts)
        for i in range(2)
    ]


def full(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in module.named_parameters()
    }


def sd3_run(micro: int):
    bundle = SD3Bundle.tiny(seed=0)
    backend = FSDPConfig(optimizer=AdamWConfig(lr=1e-3), grad_clip=None).build(bundle.transformer, "cpu")
    params = DiffusionSamplingParams(
        num_steps=3, guidance_scale=1.0, height=16, width=16, eta=0.7, noise=NoiseRecipe(seed=1)
    )
    pipe = FlowMatchPipeline(bundle, default_params=params)
    parts = [s.part("diffusion") for s in pipe.generate(samples(), rollout_step=0)]
    for p, a in zip(parts, ADV):
        p.advantage = a
    stack = TrainStack(backend, FlowGRPOConfig().build(), pipe, BatchGeometry(micro_batch_size=micro))
    return stack.train_on(parts), full(backend.module), backend


def test_sd3_flow_grpo_through_fsdp_is_on_policy_and_split_invariant() -> None:
    m4, p4, backend = sd3_run(4)
    assert backend.num_sharded_blocks == len(backend.module.transformer_blocks)
    # first update of an on-policy batch: replay under FSDP2 reproduces the rollout log-probs
    assert m4["ratio_min"] == pytest.approx(1.0, abs=1e-5) and m4["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert m4["num_optimizer_steps"] == 1 and m4["grad_norm"] > 0
    m1, p1, _ = sd3_run(1)
    assert m1["grad_norm"] == pytest.approx(m4["grad_norm"], rel=1e-4)
    # 1e-5, not 1e-6: a real transformer sums in another order per batch shape, and AdamW's first
    # step (m / sqrt(v)) amplifies that fp32 noise on near-zero gradient entries.
    for n in p4:
        torch.testing.assert_close(p1[n], p4[n], atol=1e-5, rtol=0)


def test_qwen3_lora_grpo_with_base_reference() -> None:
    bundle = CausalLMBundle.tiny_qwen3(seed=2)
    cfg = FSDPConfig(
        optimizer=AdamWConfig(lr=1e-2),
        lora=LoRAConfig(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"]),
        reference="lora_base",
    )
    backend = cfg.build(bundle.model, "cpu")
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=5, temperature=0.9))
    before = full(backend.module)
    algo = GRPOConfig(kl_coef=0.05).build()
    algo.set_reference(ContextReference(pipe, backend.reference_weights))
    stack = TrainStack(backend, algo, pipe, BatchGeometry(micro_batch_size=2, num_updates_per_batch=2))
    for step in range(2):
        parts = [s.part("ar") for s in pipe.generate(samples(), rollout_step=step)]
        for p, a in zip(parts, ADV):
            p.advantage = a
        metrics = stack.train_on(parts)
        assert metrics["num_optimizer_steps"] == 2 and metrics["skipped_nonfinite"] == 0
    assert metrics["kl"] > 0  # the adapters moved the policy away from the LoRA-off base
    after = full(backend.module)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all("lora_" in n for n in changed)


def test_gathered_backend_samples_the_same_and_reshards_after() -> None:
    """Trainside sampling inside ``FSDPBackend.gathered()`` (weights gathered once, not per
    forward) draws exactly what it draws through per-forward all-gathers; training still works after."""
    bundle = CausalLMBundle.tiny_qwen3(seed=0)
    backend = FSDPConfig(optimizer=AdamWConfig(lr=1e-3)).build(bundle.model, "cpu")
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=6, seed=1))

    def draw() -> list[list[int]]:
        s = [Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text="1+2=")]) for i in range(3)]
        return [x.part("ar").segment.response_ids for x in pipe.generate(s, rollout_step=0)]

    per_forward = draw()
    gathers = []
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in backend.module.modules() if isinstance(m, FSDPModule)]
    hooks = [u.register_forward_pre_hook(lambda *a: gathers.append(1)) for u in units]
    with backend.gathered():
        assert draw() == per_forward
    for h in hooks:
        h.remove()
    assert gathers  # the forwards ran through the FSDP units
    assert all(isinstance(p, DTensor) for p in backend.module.parameters())  # resharded
    parts = [x.part("ar") for x in pipe.generate(
        [Sample(id=f"t{i}", group_id="g", inputs=[TextPrimitive(text="1+2=")]) for i in range(2)], rollout_step=1
    )]  # fmt: skip
    for p, a in zip(parts, [1.0, -1.0]):
        p.advantage = a
    metrics = TrainStack(backend, GRPOConfig().build(), pipe, BatchGeometry(micro_batch_size=1)).train_on(
        parts
    )
    assert metrics["num_optimizer_steps"] == 1 and metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
