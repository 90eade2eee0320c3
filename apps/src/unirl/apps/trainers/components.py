"""What a domain builds once, as typed objects, for the single-process trainer and the Ray workers.

- :class:`Policy`: the model bundle, the pipeline that samples and replays it, and the trainable
  module; built by the domain recipe's ``build_policy`` (the trainer's own policy, a Ray rollout
  worker's copy and the async rollout copy come from the same function).
- :class:`DomainSteps`: the few steps that differ by domain but need no model (reward shaping,
  an evaluation's grid and diversity); the trainer and the Ray controller both hold one, so neither
  calls another class's methods with itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar, runtime_checkable

import torch

from unirl.rollout.pipelines import Pipeline
from unirl.types import Part, Reward, Sample

__all__ = ["DomainSteps", "NoSteps", "Policy", "PolicyRecipe", "SampleScorer"]

B = TypeVar("B", covariant=True)
P = TypeVar("P", bound=Pipeline, covariant=True)


@dataclass(frozen=True)
class Policy(Generic[B, P]):
    """A domain's policy: ``bundle`` (the modules), ``pipeline`` (sampling + replay over them) and
    ``module`` (the trainable one, which a backend wraps or the weight plane fills)."""

    bundle: B
    pipeline: P
    module: torch.nn.Module


@runtime_checkable
class PolicyRecipe(Protocol):
    """A recipe that builds its domain's policy (the diffusion and AR recipes)."""

    def build_policy(
        self, device: torch.device, *, stage: str, rollout_copy: bool = False
    ) -> Policy[object, Pipeline]:
        """Bundle + pipeline as the trainer builds them; ``rollout_copy``: for a sampler that never
        trains (a Ray rollout worker, the async rollout thread)."""
        ...


class SampleScorer(Protocol):
    """What a trainer scores with: ``unirl.reward.RewardService``, or a wrapper of it (PE's
    ``OriginalPromptReward`` scores against the original prompt)."""

    def score_samples(
        self, samples: list[Sample], part_name: str, prompt_part: str | None = None
    ) -> list[Reward]:
        """Score ``part_name`` of every Sample, set its ``Part.reward`` and return the rewards in order."""
        ...


class DomainSteps(Protocol):
    """The model-free domain steps of the lifecycle."""

    def shape_rewards(self, parts: list[Part]) -> None:
        """Reward shaping before advantages (e.g. DAPO's overlong penalty)."""
        ...

    def save_grid(self, samples: list[Sample], rewards: list[float], path: Path) -> Path | None:
        """An evaluation's samples as a picture / table at (about) ``path``; None: the domain has none."""
        ...

    def sample_diversity(self, samples: list[Sample]) -> float | None:
        """How different one prompt's samples are; None where the domain has no measure."""
        ...


class NoSteps:
    """The defaults: no shaping, no grid, no diversity."""

    def shape_rewards(self, parts: list[Part]) -> None:
        return None

    def save_grid(self, samples: list[Sample], rewards: list[float], path: Path) -> Path | None:
        return None

    def sample_diversity(self, samples: list[Sample]) -> float | None:
        return None
