"""Flow-GRPO (and its named variants DanceGRPO, MixGRPO) as a StageAlgorithm.

Per (sample, SDE step): replay the stored transition with gradients (``new_logprobs``),
``rho = exp(new_logprobs - old_logprobs)`` with ``old_logprobs`` from ``segment.log_probs`` (or
recomputed in ``prepare``), the clipped loss, optionally plus
``kl_coef * mean_elements (mu_theta - mu_ref)^2 / (2 s^2)`` against a reference replay. The
mini-batch loss is the mean over all (sample, SDE step) pairs (``BatchTotals.num_steps``).

DanceGRPO and MixGRPO share this loss; they differ in how the rollout samples (Dance-SDE with a
constant g; MixGRPO's sliding SDE window, the other steps ODE). Their configs check that the
rollout used the matching strategy and offer ``sampling_overrides()`` for the sampling params.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from unirl.train.algorithms import _diffusion as D
from unirl.train.algorithms.base import BatchTotals, advantages, require, require_reference
from unirl.train.algorithms.config_base import AlgorithmConfigBase
from unirl.train.algorithms.losses.flow_grpo import clipped_surrogate, gaussian_mean_kl
from unirl.train.algorithms.losses.grpo_guard import guarded_log_ratio
from unirl.train.algorithms.losses.ratio_stats import approx_kl, clip_fraction, ratio_stats
from unirl.train.algorithms.off_policy import OffPolicyConfig, off_policy_weights
from unirl.types import Part, SlidingWindow


class FlowGRPOConfig(AlgorithmConfigBase):
    """Flow-GRPO: PPO-clip on per-step Gaussian log-probs of the SDE sampler."""

    kind: Literal["flow_grpo"] = "flow_grpo"
    clip_range: float = Field(
        default=1e-4, gt=0.0, lt=1.0, description="eps of clip(rho, 1 - eps, 1 + eps); 1e-4 (1e-5 for CPS)."
    )
    kl_coef: float = Field(
        default=0.0,
        ge=0.0,
        description="weight of the exact Gaussian KL to the reference (0 = off; e.g. 0.04).",
    )
    grpo_guard: bool = Field(
        default=False,
        description="GRPO-Guard ratio normalisation: log-ratio rescaled by s with the mean-shift bias removed "
        "before clipping. Needs the old means (recorded at rollout or computed in prepare).",
    )
    recompute_old_means: bool = Field(
        default=False,
        description="with grpo_guard: recompute old means in prepare even if the rollout stored them.",
    )
    prepare_batch_size: int = Field(
        default=8, ge=1, description="Parts per no-grad replay when computing old means."
    )
    train_fraction: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="train on the first int(n * train_fraction) of each Part's n SDE steps (Flow-GRPO's "
        "timestep_fraction; e.g. 0.9 trains 9 of 10). 1.0 = every SDE step.",
    )
    old_logprobs: Literal["rollout", "recompute"] = Field(
        default="rollout",
        description="pi_old of the ratio: the sampler's stored per-step log-probs, or recomputed by the "
        "trainer in prepare (the proximal policy: a stale async rollout then starts at ratio 1)",
    )
    off_policy: OffPolicyConfig | None = Field(
        default=None,
        description="decoupled-PPO weight exp(old_logprobs - behavior_logprobs) per SDE step (level 'token'); "
        "needs old_logprobs='recompute'",
    )

    @model_validator(mode="after")
    def _off_policy(self) -> FlowGRPOConfig:
        if self.off_policy is not None and self.old_logprobs != "recompute":
            raise ValueError(
                f"off_policy needs old_logprobs='recompute' (got old_logprobs={self.old_logprobs!r}): the "
                "proximal policy is the trainer's recomputation; set old_logprobs: recompute or drop off_policy"
            )
        if self.off_policy is not None and self.off_policy.level != "token":
            raise ValueError(
                f"off_policy.level={self.off_policy.level!r}: diffusion weights are per SDE step; use 'token'"
            )
        return self

    expected_strategy: ClassVar[str | None] = None
    expected_schedule: ClassVar[str | None] = None

    @property
    def kl_weight(self) -> float:
        return self.kl_coef

    def sampling_overrides(self) -> dict[str, Any]:
        """Fields to set on ``DiffusionSamplingParams`` for this variant (none for plain Flow-GRPO)."""
        return {}

    def build(self) -> FlowGRPO:
        return FlowGRPO(self)


class DanceGRPOConfig(FlowGRPOConfig):
    """DanceGRPO: the Flow-GRPO loss on Dance-SDE rollouts (constant diffusion coefficient g = eta)."""

    kind: Literal["dance_grpo"] = "dance_grpo"  # type: ignore[assignment]
    eta: float = Field(default=0.3, gt=0.0, description="the constant g of Dance-SDE (sampling_overrides).")

    expected_strategy: ClassVar[str | None] = "dance_sde"

    def sampling_overrides(self) -> dict[str, Any]:
        return {"sde_strategy": "dance_sde", "eta": self.eta}


class MixGRPOConfig(FlowGRPOConfig):
    """MixGRPO: SDE only inside a sliding window of steps (ODE elsewhere); train on the window."""

    kind: Literal["mix_grpo"] = "mix_grpo"  # type: ignore[assignment]
    window_size: int = Field(default=4, ge=1, description="SDE steps per rollout (w).")
    window_stride: int = Field(default=1, ge=1, description="steps the window moves each advance (s).")
    advance_every: int = Field(default=25, ge=1, description="rollout steps between window moves (tau).")
    cycle: bool = Field(default=False, description="restart the window at step 0 after the last position.")

    expected_schedule: ClassVar[str | None] = "sliding_window"

    @model_validator(mode="after")
    def _stride(self) -> MixGRPOConfig:
        if self.window_stride > self.window_size:
            raise ValueError(
                f"mix_grpo.window_stride={self.window_stride} must be <= window_size={self.window_size}"
            )
        return self

    def sampling_overrides(self) -> dict[str, Any]:
        schedule = SlidingWindow(
            size=self.window_size,
            overlap=self.window_size - self.window_stride,
            advance_every=self.advance_every,
            cycle=self.cycle,
        )
        return {"sde_strategy": "flow_sde", "sde_schedule": schedule}


class FlowGRPO:
    """Flow-GRPO StageAlgorithm (also DanceGRPO / MixGRPO through their configs)."""

    needs_old_logprobs = True
    streams_backward = True
    """``loss(..., backward=f)`` back-propagates each denoising step's term as soon as it is built,
    so a micro-batch holds one step's graph at a time (not ``len(sde_indices)`` of them)."""

    def __init__(self, config: FlowGRPOConfig) -> None:
        self.config = config
        self.name: str = config.kind
        self.reference: Any | None = None
        self._old_logprobs: dict[int, Tensor] = {}  # id(part) -> [n_sde] old log-probs (recompute)

    def set_reference(self, reference: Any) -> None:
        """The reference policy for ``kl_coef > 0``: anything with ``replay_step`` (e.g.
        ``ContextReference(pipeline, backend.reference_weights)``)."""
        self.reference = reference

    def prepare(self, parts: Sequence[Part], pipeline: Any) -> None:
        cfg = self.config
        D.check_trainable(parts, self.name, needs_log_probs=True)
        D.check_sampling(parts, self.name, cfg.expected_strategy, cfg.expected_schedule)
        require_reference(self.name, cfg.kl_coef, self.reference)
        if cfg.grpo_guard:
            D.fill_old_means(
                parts, pipeline, cfg.prepare_batch_size, self.name, recompute=cfg.recompute_old_means
            )
        self._old_logprobs = {}
        if cfg.old_logprobs == "recompute":
            self._old_logprobs = D.recompute_old_logprobs(parts, pipeline, cfg.prepare_batch_size, self.name)

    def count(self, parts: Sequence[Part]) -> tuple[int, int, int]:
        """(Parts, trained steps, trained steps): the BatchTotals counts under ``train_fraction``."""
        segs = D.check_trainable(parts, self.name, needs_log_probs=True)
        steps = sum(D.trained_steps(len(s.sde_indices), self.config.train_fraction) for s in segs)
        return len(parts), steps, steps

    def loss(
        self,
        parts: Sequence[Part],
        pipeline: Any,
        totals: BatchTotals,
        backward: Callable[[Tensor, bool], None] | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """This micro-batch's share of the loss. With ``backward``, each step's term is passed to
        ``backward(term, is_last_term)`` right away and the returned loss is detached."""
        cfg = self.config
        segs = D.check_trainable(parts, self.name, needs_log_probs=True)
        require(totals.num_steps > 0, f"{self.name}: BatchTotals.num_steps is 0; no SDE step to train on")
        groups = D.group_by_step(segs, cfg.train_fraction)
        if not groups:
            raise ValueError(f"{self.name}: no part in this micro-batch has an SDE step to train on")
        total: Tensor | None = None
        log_ratios, ratios, kls = [], [], []
        weights: list[tuple[Tensor, Tensor, Tensor]] = []
        metrics: dict[str, float] = {}
        for i, g in enumerate(groups):
            sub = [parts[b] for b in g.rows]
            rep = pipeline.replay_step(sub, g.step)
            new_logprobs = D.checked_log_prob(rep, sub, g.step, self.name).float()
            device = new_logprobs.device
            adv = advantages(sub, self.name, device)
            behavior_logprobs = D.behavior_logprobs(segs, g, device)
            old_logprobs = (
                behavior_logprobs
                if cfg.old_logprobs == "rollout"
                else D.recomputed_old_logprobs(self._old_logprobs, sub, g, device)
            )
            log_ratio = new_logprobs - old_logprobs
            if cfg.grpo_guard:
                log_ratio = guarded_log_ratio(log_ratio, rep.mean, D.old_means(segs, g, device), rep.std)
            ratio = torch.exp(log_ratio)
            per = clipped_surrogate(ratio, adv, cfg.clip_range, cfg.clip_range)
            if cfg.off_policy is not None:
                w, _ = off_policy_weights(
                    cfg.off_policy, old_logprobs, behavior_logprobs, torch.ones_like(old_logprobs)
                )
                per = per * w.view(-1, *([1] * (per.dim() - 1)))
                weights.append((w, old_logprobs, behavior_logprobs))
            if cfg.kl_coef > 0:
                with torch.no_grad():
                    ref_mean = self.reference.replay_step(sub, g.step).mean  # type: ignore[union-attr]
                kl = gaussian_mean_kl(rep.mean, ref_mean, rep.std.detach())
                per = per + cfg.kl_coef * kl
                kls.append(kl.detach())
            term = per.sum() / totals.num_steps
            if backward is not None:
                backward(term, i == len(groups) - 1)
                term = term.detach()
            total = term if total is None else total + term
            log_ratios.append(log_ratio.detach())
            ratios.append(ratio.detach())
            metrics[f"log_ratio_step_{g.step}"] = log_ratio.detach().mean().item()
        assert total is not None
        r, lr = torch.cat(ratios), torch.cat(log_ratios)
        metrics.update(ratio_stats(r))
        metrics["clip_frac"] = clip_fraction(r, cfg.clip_range, cfg.clip_range).item()
        metrics["approx_kl"] = approx_kl(lr).item()
        if kls:
            metrics["kl"] = torch.cat(kls).mean().item()
        if weights:
            w, old_logprobs, behavior_logprobs = (torch.cat(t) for t in zip(*weights))
            ones = torch.ones_like(old_logprobs)
            metrics |= off_policy_weights(cfg.off_policy, old_logprobs, behavior_logprobs, ones)[1]  # type: ignore[arg-type]
        return total, metrics
