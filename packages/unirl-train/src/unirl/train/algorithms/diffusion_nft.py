"""DiffusionNFT as a StageAlgorithm: forward-process training against an EMA "old" policy.

Rollouts sample with the old policy (ODE, any solver; no log-probs). Per Part, ``prepare`` draws
``timesteps_per_sample`` times ``t`` from the Part's sampling grid (its ``sigmas`` without the
terminal 0) and fresh noise, forms ``x_t = (1 - t) x_clean + t eps`` from the final latent, and
evaluates the old velocity ``v_old`` once inside the old-policy context. ``loss`` evaluates the
trainable velocity at the same points and applies ``losses.diffusion_nft.nft_sample_loss``; the
mini-batch loss is the mean over all (sample, t) pairs (``count`` tells the stack how many).

The old policy is the backend's EMA with DiffusionNFT's schedule ``d = min(0.001 step, 0.5)``
(``EMAConfig(decay=0.5, ramp=0.001)``): wire it with ``algorithm.set_old_policy(backend.ema_weights)``
and sample rollouts inside ``backend.ema_weights()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from unirl.train.algorithms.base import (
    BatchTotals,
    advantages,
    as_tensor,
    latent_segment,
    require,
    require_reference,
)
from unirl.train.algorithms.config_base import AlgorithmConfigBase
from unirl.train.algorithms.losses.diffusion_nft import (
    NFT_ADV_MAX,
    nft_mix_weight,
    nft_noisy_latent,
    nft_sample_loss,
)
from unirl.types import Conditions, Part


class DiffusionNFTConfig(AlgorithmConfigBase):
    """DiffusionNFT (Zheng et al. 2025): negative-aware fine-tuning on the forward process."""

    kind: Literal["diffusion_nft"] = "diffusion_nft"
    beta: float = Field(
        default=1.0, gt=0.0, description="strength of the implicit positive/negative policies."
    )
    adv_max: float = Field(
        default=NFT_ADV_MAX, gt=0.0, description="Amax: advantage clip for r, and loss scale."
    )
    timesteps_per_sample: int | None = Field(
        default=None, ge=1, description="t draws per Part from its sampling grid (None = every grid point)."
    )
    guidance_scale: float = Field(
        default=1.0, ge=0.0, description="CFG weight of both velocities (NFT is CFG-free: 1)."
    )
    ema_rate: float = Field(
        default=0.001, gt=0.0, description="old-policy decay ramp: d = min(rate * step, cap)."
    )
    ema_cap: float = Field(default=0.5, ge=0.0, lt=1.0, description="old-policy decay cap.")
    kl_coef: float = Field(
        default=0.0,
        ge=0.0,
        description="weight of the drift penalty to the reference policy, mean (v_theta - v_ref)^2 at the "
        "same (x_t, t) (the velocity-space KL of DiffusionNFT's reference trainer); needs a reference.",
    )
    prepare_batch_size: int = Field(default=8, ge=1, description="Parts per no-grad old-velocity evaluation.")
    seed: int = Field(default=0, ge=0, description="seed of the t / noise draws.")

    @property
    def kl_weight(self) -> float:
        return self.kl_coef

    def ema_config(self) -> dict[str, float]:
        """Backend EMA settings that make ``backend.ema_weights`` the NFT old policy."""
        return {"decay": self.ema_cap, "ramp": self.ema_rate}

    def build(self) -> DiffusionNFT:
        return DiffusionNFT(self)


@dataclass
class _Draws:
    t: Tensor  # [K]
    x_t: Tensor  # [K, ...]
    x_clean: Tensor  # [...]
    v_old: Tensor  # [K, ...]
    v_ref: Tensor | None = None  # [K, ...] with kl_coef > 0


class DiffusionNFT:
    """DiffusionNFT StageAlgorithm."""

    needs_old_logprobs = False

    def __init__(self, config: DiffusionNFTConfig) -> None:
        self.config = config
        self.name: str = config.kind
        self.old_policy: Callable[[], AbstractContextManager[Any]] | None = None
        self.reference: Any | None = None
        self._gen = torch.Generator().manual_seed(config.seed)
        self._draws: dict[int, _Draws] = {}

    def get_rng_state(self) -> Tensor:
        """The state of its t / noise generator: a checkpoint saves it, so a resumed run draws on
        where the run stopped instead of from ``seed`` again."""
        return self._gen.get_state()

    def set_rng_state(self, state: Tensor) -> None:
        """Inverse of ``get_rng_state``."""
        self._gen.set_state(state)

    def set_old_policy(self, context: Callable[[], AbstractContextManager[Any]]) -> None:
        """A zero-argument callable returning a context in which the pipeline computes with the
        old (EMA) weights, e.g. ``backend.ema_weights``."""
        self.old_policy = context

    def set_reference(self, reference: Any) -> None:
        """The reference policy for ``kl_coef > 0``: anything with ``velocity(x_t, t, conditions,
        guidance_scale)`` under no grad (e.g. ``ContextReference(pipeline, backend.reference_weights)``)."""
        self.reference = reference

    def _k(self, part: Part) -> int:
        T = latent_segment(part, self.name).num_steps
        k = self.config.timesteps_per_sample
        return T if k is None else min(k, T)

    def count(self, parts: Sequence[Part]) -> tuple[int, int, int]:
        """``(num_samples, num_tokens, num_steps)``: the loss is a mean over (sample, t) pairs."""
        n = sum(self._k(p) for p in parts)
        return len(parts), n, n

    def prepare(self, parts: Sequence[Part], pipeline: Any) -> None:
        require(
            self.old_policy is not None,
            "diffusion_nft needs the old policy: call algorithm.set_old_policy(backend.ema_weights) with the "
            f"backend EMA configured as {self.config.ema_config()}",
        )
        require_reference(self.name, self.config.kl_coef, self.reference)
        self._draws = {}
        jobs: list[tuple[Part, Tensor, Tensor, Tensor]] = []
        for p in parts:
            seg = latent_segment(p, self.name)
            require(
                seg.positions[-1] == seg.num_steps,
                f"diffusion_nft: part {p.name!r} does not store its final latent (position {seg.num_steps}); "
                f"stored positions: {seg.positions}",
            )
            _conditions(p, self.name)
            x_clean = as_tensor(seg.latents)[-1].float()
            grid = torch.tensor(seg.sigmas[:-1], dtype=torch.float32)
            idx = torch.randperm(len(grid), generator=self._gen)[: self._k(p)].sort().values
            t = grid[idx]
            noise = torch.randn((len(t), *x_clean.shape), generator=self._gen)
            x_t = nft_noisy_latent(x_clean.expand(len(t), *x_clean.shape).cpu(), noise, t)
            jobs.append((p, t, x_t, x_clean))
        bs = self.config.prepare_batch_size
        reference = self.reference if self.config.kl_coef > 0 else None
        with torch.no_grad(), self.old_policy():  # type: ignore[misc]
            for i in range(0, len(jobs), bs):
                chunk = jobs[i : i + bs]
                x_t, t, conds = _flatten([(j[1], j[2], j[0]) for j in chunk], self.name)
                v_old = pipeline.velocity(x_t, t, conds, self.config.guidance_scale).detach().float()
                v_ref = None
                if reference is not None:  # the reference replaces the old-policy context inside it
                    v_ref = reference.velocity(x_t, t, conds, self.config.guidance_scale).float()
                dev = v_old.device
                offset = 0
                for p, tp, xp, xc in chunk:
                    k = len(tp)
                    ref = None if v_ref is None else v_ref[offset : offset + k].to(dev)
                    self._draws[id(p)] = _Draws(
                        tp.to(dev), xp.to(dev), xc.to(dev), v_old[offset : offset + k], ref
                    )
                    offset += k

    def loss(
        self, parts: Sequence[Part], pipeline: Any, totals: BatchTotals
    ) -> tuple[Tensor, dict[str, float]]:
        require(
            totals.num_steps > 0, f"{self.name}: BatchTotals.num_steps is 0 (use algorithm.count for totals)"
        )
        missing = [p.name for p in parts if id(p) not in self._draws]
        require(
            not missing,
            f"{self.name}: parts {missing[:3]} were not prepared; call prepare() on the shard first",
        )
        draws = [self._draws[id(p)] for p in parts]
        x_t, t, conds = _flatten([(d.t, d.x_t, p) for d, p in zip(draws, parts)], self.name)
        v_old = torch.cat([d.v_old for d in draws])
        x_clean = torch.cat([d.x_clean.expand_as(d.x_t) for d in draws])
        reps = torch.tensor([len(d.t) for d in draws], device=v_old.device)
        adv = torch.repeat_interleave(advantages(parts, self.name, v_old.device), reps)
        v_theta = pipeline.velocity(x_t, t, conds, self.config.guidance_scale).float()
        per = nft_sample_loss(v_theta, v_old, x_t, x_clean, t, adv, self.config.beta, self.config.adv_max)
        metrics = {
            "nft_loss": per.detach().mean().item(),
            "nft_r": nft_mix_weight(adv, self.config.adv_max).mean().item(),
            "velocity_gap": (v_theta.detach() - v_old).pow(2).mean().item(),
        }
        if self.config.kl_coef > 0:
            refs = [d.v_ref for d in draws if d.v_ref is not None]
            require(len(refs) == len(draws), f"{self.name}: parts were prepared before kl_coef was set")
            kl = (v_theta - torch.cat(refs)).pow(2).flatten(1).mean(dim=1)
            per = per + self.config.kl_coef * kl
            metrics["kl"] = kl.detach().mean().item()
        return per.sum() / totals.num_steps, metrics


def _conditions(part: Part, algorithm: str) -> Conditions:
    if part.conditions is None:
        raise ValueError(
            f"{algorithm}: part {part.name!r} has no conditions; the rollout must store them for replay"
        )
    return part.conditions


def _flatten(
    items: Sequence[tuple[Tensor, Tensor, Part]], algorithm: str
) -> tuple[Tensor, Tensor, list[Conditions]]:
    """Concatenate per-Part draws into one batch: ``x_t [N, ...]``, ``t [N]``, conditions repeated."""
    x_t = torch.cat([x for _, x, _ in items])
    t = torch.cat([tt for tt, _, _ in items])
    conds = [_conditions(p, algorithm) for tt, _, p in items for _ in range(len(tt))]
    return x_t, t, conds
