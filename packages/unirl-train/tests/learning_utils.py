"""Shared RL loops for the "each algorithm learns" tests (real pipelines, real stack, CPU).

A loop is: rollout a batch of groups with the current policy (trainside, on the FSDP-wrapped
module), score every Part with a small pure reward function, group z-score advantages
(``compute_sample_advantages``), one ``TrainStack.train_on``. Learning is judged on a fixed
evaluation set (fixed prompts and noise) scored before and after training, so the before/after
numbers differ only through the weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from unirl.train.stack import TrainStack
from unirl.types import Part, Reward, Sample, TextPrimitive, compute_sample_advantages


@dataclass
class LearningRun:
    """What a learning run measured: eval reward before/after and the per-step train rewards."""

    before: float
    after: float
    train_rewards: list[float] = field(default_factory=list)
    seconds: float = 0.0
    metrics: list[dict[str, float]] = field(default_factory=list)

    @property
    def gain(self) -> float:
        return self.after - self.before

    def __str__(self) -> str:
        tr = ", ".join(f"{r:.3f}" for r in self.train_rewards)
        return f"before={self.before:.4f} after={self.after:.4f} gain={self.gain:+.4f} ({self.seconds:.1f}s) train=[{tr}]"


def make_samples(prompts: Sequence[str], group_size: int, tag: str) -> list[Sample]:
    """``group_size`` Samples per prompt; ids carry ``tag`` so each rollout step draws new noise."""
    return [
        Sample(id=f"{tag}-p{g}-{i}", group_id=f"{tag}-p{g}", inputs=[TextPrimitive(text=t)])
        for g, t in enumerate(prompts)
        for i in range(group_size)
    ]


def score(samples: Sequence[Sample], stage: str, reward_fn: Callable[[Part], float]) -> float:
    """Set ``Part.reward`` of ``stage`` on every Sample; returns the mean reward."""
    total = 0.0
    for s in samples:
        p = s.part(stage)
        r = float(reward_fn(p))
        p.reward = Reward(total=r, components={"target": r})
        total += r
    return total / len(samples)


def rl_loop(
    stack: TrainStack,
    pipeline: Any,
    stage: str,
    reward_fn: Callable[[Part], float],
    *,
    prompts: Sequence[str],
    group_size: int,
    steps: int,
    eval_fn: Callable[[], float],
    rollout_context: Callable[[], AbstractContextManager[Any]] | None = None,
    prepare_samples: Callable[[list[Sample], int], None] | None = None,
) -> LearningRun:
    """``steps`` rollout -> reward -> advantage -> train_on iterations between two evaluations.

    ``rollout_context`` wraps each rollout (DiffusionNFT samples with the EMA old policy);
    ``prepare_samples(samples, step)`` may set per-Part sampling params before generation.
    """
    t0 = time.perf_counter()
    run = LearningRun(before=eval_fn(), after=float("nan"))
    ctx = rollout_context or nullcontext
    for step in range(steps):
        samples = make_samples(prompts, group_size, tag=f"r{step}")
        if prepare_samples is not None:
            prepare_samples(samples, step)
        with ctx():
            pipeline.generate(samples, rollout_step=step)
        run.train_rewards.append(score(samples, stage, reward_fn))
        compute_sample_advantages(samples, stage)
        run.metrics.append(stack.train_on([s.part(stage) for s in samples]))
    run.after = eval_fn()
    run.seconds = time.perf_counter() - t0
    return run


def eval_reward(
    pipeline: Any,
    stage: str,
    reward_fn: Callable[[Part], float],
    prompts: Sequence[str],
    per_prompt: int,
    *,
    prepare_samples: Callable[[list[Sample], int], None] | None = None,
    context: Callable[[], AbstractContextManager[Any]] | None = None,
) -> float:
    """Mean reward of a fixed evaluation set (same ids -> same noise every call)."""
    samples = make_samples(prompts, per_prompt, tag="eval")
    if prepare_samples is not None:
        prepare_samples(samples, 0)
    with torch.no_grad(), (context or nullcontext)():
        pipeline.generate(samples, rollout_step=0)
    return score(samples, stage, reward_fn)
