"""The StageAlgorithm contract, global batch totals, and the replay interfaces algorithms call.

A StageAlgorithm is the loss of one trainable Part: it replays the Part's stage through the
pipeline (``replay_step`` for diffusion, ``replay_logprobs`` for AR), computes this micro-batch's
share of the mini-batch loss and returns it with float metrics. The TrainStack calls
``backward()``; the loss is already divided by the GLOBAL denominators in ``BatchTotals``, so
summing micro-batch gradients equals the full-batch gradient whatever the split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from unirl.types import Conditions, LatentTrajectory, Part, TextSegment, to_torch


@dataclass(frozen=True)
class BatchTotals:
    """Global denominators over the WHOLE mini-batch (all micro-batches, all ranks).

    ``num_samples``: Parts; ``num_tokens``: AR loss-mask tokens (diffusion: trained SDE steps);
    ``num_steps``: diffusion (sample, trained step) pairs.
    """

    num_samples: int
    num_tokens: int
    num_steps: int


@runtime_checkable
class StageAlgorithm(Protocol):
    """The loss of one trainable stage (see the module docstring).

    Optional: ``count(parts) -> (samples, tokens, steps)`` when the algorithm trains on a subset
    of what the Parts hold; ``streams_backward = True`` when ``loss`` accepts
    ``backward=f(term, is_last_term)`` and back-propagates term by term (bounded activation memory;
    the gradient is the same as one backward of the sum).
    """

    name: str
    needs_old_logprobs: bool

    def prepare(self, parts: Sequence[Part], pipeline: Any) -> None:
        """Once per rollout shard, under no_grad: freeze what pi_old needs (e.g. old means)."""
        ...

    def loss(
        self, parts: Sequence[Part], pipeline: Any, totals: BatchTotals
    ) -> tuple[Tensor, dict[str, float]]:
        """This micro-batch's share of the mini-batch loss and its metrics."""
        ...


@runtime_checkable
class UsesReference(Protocol):
    """Optional StageAlgorithm capability: a KL / drift term against a reference policy, set by the
    composition when the config ``needs_reference`` (e.g. ``ContextReference(pipeline,
    backend.reference_weights)``). Flow-GRPO, DiffusionNFT and the AR policy-gradient family have it."""

    def set_reference(self, reference: Any) -> None: ...


@runtime_checkable
class UsesOldPolicy(Protocol):
    """Optional StageAlgorithm capability: the old policy is a weight context the composition
    supplies (DiffusionNFT: ``backend.ema_weights``, in which the module holds the EMA)."""

    def set_old_policy(self, context: Callable[[], AbstractContextManager[Any]]) -> None: ...


@runtime_checkable
class ShapesRewards(Protocol):
    """Optional StageAlgorithm capability: reshape the rewards of one rollout batch in place
    before advantages (DAPO's overlong penalty, ``GRPO.shape_rewards``)."""

    def shape_rewards(self, parts: Sequence[Part]) -> None: ...


@runtime_checkable
class DrawsOwnRNG(Protocol):
    """Optional StageAlgorithm capability: it draws from its own torch generator (FlowSFT's and
    DiffusionNFT's t / noise), whose state a checkpoint saves so a resumed run draws on where the
    run stopped instead of from the seed again."""

    def get_rng_state(self) -> Tensor: ...

    def set_rng_state(self, state: Tensor) -> None: ...


class StepReplayLike(Protocol):
    """What ``FlowMatchPipeline.replay_step`` returns for one step ``j`` of B parts."""

    log_prob: Tensor | None  # [B] mean-over-elements Gaussian log-prob of the stored x_{j+1}
    mean: Tensor  # [B, ...] mu_theta
    std: Tensor  # [B] step std s
    velocity: Tensor  # [B, ...]


class DiffusionReplayer(Protocol):
    """The part of a flow-matching pipeline the diffusion algorithms use."""

    def replay_step(self, parts: Sequence[Part], step: int) -> StepReplayLike: ...


class VelocityModel(Protocol):
    """The part of a flow-matching pipeline DiffusionNFT and flow SFT use."""

    def velocity(
        self, latents: Tensor, sigma: Tensor, conditions: list[Conditions], guidance: float
    ) -> Tensor: ...


class TokenReplayLike(Protocol):
    logp: Tensor  # [B, T] with grad
    mask: Tensor  # [B, T] bool


class TokenReplayer(Protocol):
    """The part of an AR pipeline the AR algorithms use."""

    def replay_logprobs(self, parts: Sequence[Part]) -> TokenReplayLike: ...


class ContextReference:
    """A reference policy: the same pipeline replayed inside a context (e.g. LoRA adapters off).

    ``ContextReference(pipeline, lambda: peft_model.disable_adapter())`` gives the base-model
    reference for KL penalties without a second copy of the weights. A separate frozen pipeline
    can be used directly as a reference instead. Replays run under ``torch.no_grad``.
    """

    def __init__(self, pipeline: Any, context: Any) -> None:
        self.pipeline = pipeline
        self.context = context

    def _ctx(self) -> AbstractContextManager[Any]:
        return self.context()

    def replay_step(self, parts: Sequence[Part], step: int) -> StepReplayLike:
        with torch.no_grad(), self._ctx():
            return self.pipeline.replay_step(parts, step)

    def replay_logprobs(self, parts: Sequence[Part]) -> TokenReplayLike:
        with torch.no_grad(), self._ctx():
            return self.pipeline.replay_logprobs(parts)

    def velocity(self, x_t: Tensor, t: Tensor, conditions: Sequence[Any], guidance_scale: float) -> Tensor:
        """The reference velocity at ``(x_t, t)`` (DiffusionNFT's drift penalty), under no grad."""
        with torch.no_grad(), self._ctx():
            return self.pipeline.velocity(x_t, t, conditions, guidance_scale).detach()


# ---- small helpers shared by the algorithms ---------------------------------------------------


def latent_segment(part: Part, algorithm: str) -> LatentTrajectory:
    """The Part's LatentTrajectory, or a TypeError naming the algorithm and the Part."""
    seg = part.segment
    if not isinstance(seg, LatentTrajectory):
        raise TypeError(
            f"{algorithm} trains diffusion Parts (segment kind 'latent'); part {part.name!r} has "
            f"segment {type(seg).__name__ if seg is not None else None}"
        )
    return seg


def text_segment(part: Part, algorithm: str) -> TextSegment:
    """The Part's TextSegment, or a TypeError naming the algorithm and the Part."""
    seg = part.segment
    if not isinstance(seg, TextSegment):
        raise TypeError(
            f"{algorithm} trains text Parts (segment kind 'text'); part {part.name!r} has "
            f"segment {type(seg).__name__ if seg is not None else None}"
        )
    return seg


def advantages(parts: Sequence[Part], algorithm: str, device: torch.device) -> Tensor:
    """``[B]`` fp32 advantages from ``part.advantage``; a ValueError if any is missing."""
    missing = [i for i, p in enumerate(parts) if p.advantage is None]
    if missing:
        raise ValueError(
            f"{algorithm}: parts at micro-batch positions {missing[:5]} have no advantage; compute "
            "advantages (Part.compute_advantages) before training"
        )
    return torch.tensor([float(p.advantage) for p in parts], dtype=torch.float32, device=device)  # type: ignore[arg-type]


def as_tensor(x: Any, device: torch.device | None = None, dtype: torch.dtype | None = None) -> Tensor:
    """A schema tensor field (torch or numpy) as a torch tensor on ``device``."""
    return to_torch(x, device=device, dtype=dtype)


def require(cond: bool, message: str) -> None:
    """Raise ValueError(message) unless ``cond`` (for user-facing checks; never ``assert``)."""
    if not cond:
        raise ValueError(message)


def require_reference(algorithm: str, kl_coef: float, reference: object | None) -> None:
    """A KL / drift term (``kl_coef`` > 0) needs the reference policy set on the algorithm."""
    require(
        kl_coef == 0.0 or reference is not None,
        f"{algorithm}.kl_coef={kl_coef} needs a reference policy: call algorithm.set_reference("
        "ContextReference(pipeline, backend.reference_weights)) (recipe: backend.reference: frozen_copy) "
        "or set kl_coef=0",
    )
