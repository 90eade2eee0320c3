"""FlowDPPO as a StageAlgorithm: unclipped ``-A rho`` with a divergence-triggered mask.

Needs the old Gaussian means mu_old of every SDE step: taken from ``segment.old_means`` when the
rollout recorded them, otherwise computed once per rollout shard in ``prepare`` (no_grad replay
with the weights pi_old had, i.e. before the first update). See ``losses/flow_dppo.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from unirl.train.algorithms import _diffusion as D
from unirl.train.algorithms.base import BatchTotals, advantages, require
from unirl.train.algorithms.config_base import AlgorithmConfigBase
from unirl.train.algorithms.losses.flow_dppo import dppo_divergence, dppo_step_loss
from unirl.train.algorithms.losses.ratio_stats import approx_kl, ratio_stats
from unirl.types import Part


class FlowDPPOConfig(AlgorithmConfigBase):
    """FlowDPPO: trust region by masking elements whose step-KL to pi_old exceeds ``tau``."""

    kind: Literal["flow_dppo"] = "flow_dppo"
    tau: float = Field(
        default=1e-5,
        gt=0.0,
        description="divergence threshold: elements with D >= tau moving away are masked.",
    )
    recompute_old_means: bool = Field(
        default=False, description="recompute old means in prepare even when the rollout stored them."
    )
    prepare_batch_size: int = Field(
        default=8, ge=1, description="Parts per no-grad replay when computing old means."
    )

    def build(self) -> FlowDPPO:
        return FlowDPPO(self)


class FlowDPPO:
    """FlowDPPO StageAlgorithm."""

    needs_old_logprobs = True

    def __init__(self, config: FlowDPPOConfig) -> None:
        self.config = config
        self.name: str = config.kind

    def prepare(self, parts: Sequence[Part], pipeline: Any) -> None:
        D.check_trainable(parts, self.name, needs_log_probs=True)
        D.fill_old_means(
            parts,
            pipeline,
            self.config.prepare_batch_size,
            self.name,
            recompute=self.config.recompute_old_means,
        )

    def loss(
        self, parts: Sequence[Part], pipeline: Any, totals: BatchTotals
    ) -> tuple[Tensor, dict[str, float]]:
        segs = D.check_trainable(parts, self.name, needs_log_probs=True)
        require(totals.num_steps > 0, f"{self.name}: BatchTotals.num_steps is 0; no SDE step to train on")
        missing = [p.name for p, s in zip(parts, segs) if s.sde_indices and s.old_means is None]
        require(not missing, f"{self.name}: parts {missing[:3]} have no old_means; call prepare() first")
        total: Tensor | None = None
        ratios, log_ratios, divs, keeps = [], [], [], []
        metrics: dict[str, float] = {}
        for g in D.group_by_step(segs):
            sub = [parts[b] for b in g.rows]
            rep = pipeline.replay_step(sub, g.step)
            new_logprobs = D.checked_log_prob(rep, sub, g.step, self.name).float()
            device = new_logprobs.device
            adv = advantages(sub, self.name, device)
            old_logprobs = D.behavior_logprobs(segs, g, device)  # no recompute: old = behaviour
            div = dppo_divergence(rep.mean.detach(), D.old_means(segs, g, device), rep.std.detach())
            per, keep = dppo_step_loss(new_logprobs, old_logprobs, adv, div, self.config.tau)
            total = per.sum() if total is None else total + per.sum()
            log_ratio = (new_logprobs - old_logprobs).detach()
            ratios.append(torch.exp(log_ratio))
            log_ratios.append(log_ratio)
            divs.append(div)
            keeps.append(keep)
            metrics[f"log_ratio_step_{g.step}"] = log_ratio.mean().item()
        if total is None:
            raise ValueError(f"{self.name}: no part in this micro-batch has an SDE step to train on")
        metrics.update(ratio_stats(torch.cat(ratios)))
        metrics["approx_kl"] = approx_kl(torch.cat(log_ratios)).item()
        metrics["divergence"] = torch.cat(divs).mean().item()
        metrics["mask_frac"] = 1.0 - torch.cat(keeps).float().mean().item()
        return total / totals.num_steps, metrics
