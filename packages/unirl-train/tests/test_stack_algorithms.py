"""The real StageAlgorithms through TrainStack + FSDPBackend: micro-batch invariance (1x8, 8x1,
4x2) for GRPO in every aggregation mode (with a KL term against the backend's reference) and for
DiffusionNFT with the backend's EMA as its old policy."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from unirl.train.algorithms.base import ContextReference
from unirl.train.algorithms.diffusion_nft import DiffusionNFTConfig
from unirl.train.algorithms.grpo import GRPOConfig
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.ema import EMAConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.optim import AdamWConfig
from unirl.train.stack import TrainStack

SPLITS = [8, 1, 2]


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in module.named_parameters()
    }


def assert_same(runs, rel: float = 1e-5) -> None:
    (ref_m, ref_p), *rest = runs
    assert ref_m["grad_norm"] > 0
    for m, p in rest:
        assert m["grad_norm"] == pytest.approx(ref_m["grad_norm"], rel=rel)
        assert m["loss"] == pytest.approx(ref_m["loss"], rel=rel, abs=1e-7)
        for n in ref_p:
            torch.testing.assert_close(p[n], ref_p[n], atol=1e-6, rtol=0)


def run_grpo(tiny, micro: int, mode: str):
    torch.manual_seed(0)
    backend = FSDPConfig(optimizer=AdamWConfig(lr=0.05), grad_clip=None, reference="frozen_copy").build(
        tiny.BigramPolicy(), "cpu"
    )
    pipe = tiny.TokenPipeline(backend.module)
    cfg = GRPOConfig(
        old_logprobs="recompute",
        loss_agg_mode=mode,
        kl_coef=0.1,
        horizon=4 if mode == "seq-mean-token-sum-norm" else None,
    )
    algo = cfg.build()
    algo.set_reference(ContextReference(pipe, backend.reference_weights))
    stack = TrainStack(backend, algo, pipe, BatchGeometry(micro_batch_size=micro, num_updates_per_batch=2))
    return stack.train_on(tiny.token_parts(8)), params(backend.module)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_grpo_is_invariant_to_the_micro_batch_split(tiny, mode: str) -> None:
    assert_same([run_grpo(tiny, m, mode) for m in SPLITS])


def run_nft(tiny, micro: int):
    torch.manual_seed(0)
    cfg = DiffusionNFTConfig(timesteps_per_sample=2)
    backend = FSDPConfig(
        optimizer=AdamWConfig(lr=0.01), grad_clip=None, ema=EMAConfig(**cfg.ema_config())
    ).build(tiny.VelocityMLP(), "cpu")
    pipe = tiny.FlowPipeline(backend.module)
    parts = pipe.rollout(8, sde_sets=[[0, 1, 2]], seed=2)
    algo = cfg.build()
    algo.set_old_policy(backend.ema_weights)
    stack = TrainStack(backend, algo, pipe, BatchGeometry(micro_batch_size=micro, num_updates_per_batch=2))
    return stack.train_on(parts), params(backend.module)


def test_diffusion_nft_is_invariant_to_the_micro_batch_split(tiny) -> None:
    assert_same([run_nft(tiny, m) for m in SPLITS])
