"""Shared fixtures of the apps tests: a small local Ray cluster, rollouts sampled in-process, and a
finished run's held-out evaluation outcomes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local Ray of 4 CPUs for the tests of one module (workers get one torch thread each)."""
    import ray

    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # workers inherit it: keep the shared cores free
    try:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    finally:
        os.environ.pop("OMP_NUM_THREADS") if saved is None else os.environ.update(OMP_NUM_THREADS=saved)
    yield ray
    ray.shutdown()


def sample_rl_batches(recipe: Any, n: int) -> list[list[Any]]:
    """``n`` batches of AR Parts sampled in this process, rewards 0, 1, 2, 0, ... and group advantages."""
    import torch

    from unirl.apps.distributed.workers import build_rollout
    from unirl.apps.loop import make_samples
    from unirl.rollout.engines import TrainsideEngine
    from unirl.types import Reward, compute_sample_advantages

    torch.manual_seed(0)
    _, pipeline, _ = build_rollout(recipe, "ar", torch.device("cpu"))
    engine = TrainsideEngine(pipeline)
    records = recipe.data.build().train_records()[: recipe.rl.prompts_per_step]
    batches = []
    for step in range(n):
        samples = make_samples(
            records, step=step, samples_per_prompt=recipe.rl.samples_per_prompt, split="train", dataset="t"
        )
        samples = engine.generate(samples, rollout_step=step)
        for i, s in enumerate(samples):
            s.part("ar").reward = Reward(total=float(i % 3), components={})
        compute_sample_advantages(samples, "ar", recipe.rl.advantage)
        batches.append([s.part("ar") for s in samples])
    return batches


@pytest.fixture
def rl_batches() -> Callable[[Any, int], list[list[Any]]]:
    """``sample_rl_batches`` (test modules cannot import each other under importlib mode)."""
    return sample_rl_batches


def read_eval_outcomes(run: Path) -> dict[str, dict[str, list[float]]]:
    """Each evaluation's per-prompt, per-sample successes, as the run's last checkpoint holds them."""
    extra = json.loads((run / "checkpoints" / "latest" / "extra.json").read_text())
    return {e["name"]: {str(p): list(v) for p, v in e["outcomes"]} for e in extra["report"]["evals"]}


@pytest.fixture
def eval_outcomes() -> Callable[[Path], dict[str, dict[str, list[float]]]]:
    """``read_eval_outcomes`` (test modules cannot import each other under importlib mode)."""
    return read_eval_outcomes
