"""Shared plumbing of the AR policy losses (GRPO, GSPO, DRPO): old / proximal log-probs,
decoupled off-policy weights, the KL penalty to a reference, aggregation and metrics.

Subclasses implement ``token_loss(new_logprobs, old_logprobs, adv, mask) -> (loss [B, T], ratio [B, T])``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from unirl.train.algorithms.base import (
    BatchTotals,
    advantages,
    as_tensor,
    require,
    require_reference,
    text_segment,
)
from unirl.train.algorithms.config_base import AlgorithmConfigBase
from unirl.train.algorithms.losses.aggregation import AggregationMode, aggregate
from unirl.train.algorithms.losses.kl import KLEstimator, kl_estimate
from unirl.train.algorithms.losses.ratio_stats import approx_kl, ratio_stats
from unirl.train.algorithms.off_policy import OffPolicyConfig, off_policy_weights
from unirl.types import Part


class ARPolicyConfig(AlgorithmConfigBase):
    """Fields shared by the AR policy-gradient algorithms."""

    loss_agg_mode: AggregationMode = Field(
        default="token-mean", description="token/sequence aggregation (denominators are global)."
    )
    horizon: int | None = Field(
        default=None, ge=1, description="constant H of 'seq-mean-token-sum-norm' (e.g. max_new_tokens)."
    )
    kl_coef: float = Field(
        default=0.0, ge=0.0, description="weight of the KL penalty to the reference (0 = off)."
    )
    kl_estimator: KLEstimator = Field(default="k3", description="per-token KL estimator: k1, k2, k3, k3+.")
    old_logprobs: Literal["rollout", "recompute"] = Field(
        default="rollout",
        description="pi_old: the sampler's stored log-probs, or recomputed by the trainer in prepare "
        "(needed when the engine's numerics differ from the trainer's).",
    )
    off_policy: OffPolicyConfig | None = Field(
        default=None,
        description="decoupled-PPO weights exp(old_logprobs - behavior_logprobs); needs old_logprobs='recompute'.",
    )
    prepare_batch_size: int = Field(default=8, ge=1, description="Parts per no-grad replay when recomputing.")

    @property
    def kl_weight(self) -> float:
        return self.kl_coef

    @model_validator(mode="after")
    def _shared(self) -> ARPolicyConfig:
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.horizon is None:
            raise ValueError("loss_agg_mode='seq-mean-token-sum-norm' needs horizon (e.g. max_new_tokens)")
        if self.off_policy is not None and self.old_logprobs != "recompute":
            raise ValueError(
                f"off_policy needs old_logprobs='recompute' (got old_logprobs={self.old_logprobs!r}): the "
                "proximal policy is the trainer's recomputation; set old_logprobs: recompute or drop off_policy"
            )
        return self


def pad_rows(rows: Sequence[Tensor], T: int, device: torch.device) -> Tensor:
    """Right-pad 1-D fp32 rows with 0 into ``[B, T]`` (rows longer than T are an error)."""
    out = torch.zeros((len(rows), T), dtype=torch.float32, device=device)
    for b, r in enumerate(rows):
        require(r.shape[0] <= T, f"stored log-probs of row {b} have {r.shape[0]} tokens, replay has {T}")
        out[b, : r.shape[0]] = r.to(device=device, dtype=torch.float32)
    return out


class ARPolicyAlgorithm:
    """Base of GRPO / GSPO / DRPO: everything but the per-token loss."""

    needs_old_logprobs = True
    config: ARPolicyConfig

    def __init__(self, config: ARPolicyConfig, name: str) -> None:
        self.config = config
        self.name = name
        self.reference: Any | None = None
        self._old_logprobs: dict[int, Tensor] = {}

    def set_reference(self, reference: Any) -> None:
        """Reference policy for ``kl_coef > 0``: anything with ``replay_logprobs`` (e.g.
        ``ContextReference(pipeline, backend.reference_weights)``)."""
        self.reference = reference

    def token_loss(
        self, new_logprobs: Tensor, old_logprobs: Tensor, adv: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def clip_metrics(self, ratio: Tensor, mask: Tensor) -> dict[str, float]:
        return {}

    def prepare(self, parts: Sequence[Part], pipeline: Any) -> None:
        cfg = self.config
        segs = [text_segment(p, self.name) for p in parts]
        if cfg.old_logprobs == "rollout" or cfg.off_policy is not None:
            missing = [p.name for p, s in zip(parts, segs) if s.log_probs is None]
            require(
                not missing, f"{self.name}: parts {missing[:3]} have no stored log_probs (sampler log-probs)"
            )
        require_reference(self.name, cfg.kl_coef, self.reference)
        self._old_logprobs = {}
        if cfg.old_logprobs == "recompute":
            with torch.no_grad():
                for i in range(0, len(parts), cfg.prepare_batch_size):
                    chunk = parts[i : i + cfg.prepare_batch_size]
                    old_logprobs = pipeline.replay_logprobs(chunk).logp.detach().float()
                    for b, (p, s) in enumerate(zip(chunk, segs[i : i + cfg.prepare_batch_size])):
                        self._old_logprobs[id(p)] = old_logprobs[b, : len(s.response_ids)].clone()

    def _old(self, parts: Sequence[Part], T: int, device: torch.device) -> tuple[Tensor, Tensor | None]:
        """``(old_logprobs [B, T], behavior_logprobs [B, T] or None)``."""
        segs = [text_segment(p, self.name) for p in parts]
        behavior_logprobs = None
        if all(s.log_probs is not None for s in segs):
            behavior_logprobs = pad_rows([as_tensor(s.log_probs).float() for s in segs], T, device)
        if self.config.old_logprobs == "recompute":
            missing = [p.name for p in parts if id(p) not in self._old_logprobs]
            require(not missing, f"{self.name}: parts {missing[:3]} were not prepared; call prepare() first")
            return pad_rows([self._old_logprobs[id(p)] for p in parts], T, device), behavior_logprobs
        require(behavior_logprobs is not None, f"{self.name}: a part has no stored log_probs")
        return behavior_logprobs, behavior_logprobs  # type: ignore[return-value]

    def loss(
        self, parts: Sequence[Part], pipeline: Any, totals: BatchTotals
    ) -> tuple[Tensor, dict[str, float]]:
        cfg = self.config
        rep = pipeline.replay_logprobs(parts)
        new_logprobs, mask = rep.logp.float(), rep.mask.bool()
        device = new_logprobs.device
        old_logprobs, behavior_logprobs = self._old(parts, new_logprobs.shape[1], device)
        adv = advantages(parts, self.name, device)
        loss_bt, ratio = self.token_loss(new_logprobs, old_logprobs, adv, mask)
        metrics: dict[str, float] = {}
        if cfg.off_policy is not None:
            if behavior_logprobs is None:
                raise ValueError(f"{self.name}: off_policy needs the sampler's log_probs on every part")
            w, stats = off_policy_weights(cfg.off_policy, old_logprobs, behavior_logprobs, mask)
            loss_bt = loss_bt * w
            metrics |= stats
        if cfg.kl_coef > 0:
            with torch.no_grad():
                ref = self.reference.replay_logprobs(parts).logp.detach().float()  # type: ignore[union-attr]
            kl = kl_estimate(new_logprobs, ref, cfg.kl_estimator)
            loss_bt = loss_bt + cfg.kl_coef * kl
            metrics["kl"] = (kl.detach() * mask).sum().item() / max(int(mask.sum()), 1)
        loss = aggregate(
            loss_bt,
            mask,
            cfg.loss_agg_mode,
            num_tokens=totals.num_tokens,
            num_samples=totals.num_samples,
            horizon=cfg.horizon,
        )
        metrics.update(ratio_stats(ratio, mask))
        metrics.update(self.clip_metrics(ratio, mask))
        metrics["approx_kl"] = approx_kl(new_logprobs.detach() - old_logprobs, mask).item()
        return loss, metrics
