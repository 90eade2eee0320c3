"""``UnifiedRolloutSide``: the async lifecycle of the unified trainer, on one process.

The rollout thread samples with copies of the one backbone, fed through verified mailboxes
(``unirl.apps.asynchronous.mailbox``) as the AR and diffusion trainers' rollout copy is. The two
tracks may sample with different weights: the text track always with the live policy, the image
track with DiffusionNFT's old policy (the backend's EMA) when that is its algorithm. Then there are
two copies, each published its own snapshot per version (the EMA's under ``ema_weights()``);
otherwise one copy serves both tracks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from unirl.apps.asynchronous.mailbox import RolloutCopy, WeightMailbox
from unirl.apps.trainers.unified_config import Recipe
from unirl.rollout.engines import TrainsideEngine
from unirl.rollout.engines.composed import ComposedEngine
from unirl.rollout.unified import UnifiedBundle, UnifiedImagePipeline, UnifiedTextPipeline
from unirl.train.backends import TrainBackend
from unirl.types import Sample


class UnifiedModel(Protocol):
    """What ``UnifiedRolloutSide`` reads of the ``UnifiedTrainer``."""

    @property
    def cfg(self) -> Recipe: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def nft(self) -> bool: ...

    @property
    def pipeline(self) -> UnifiedImagePipeline: ...

    @property
    def backend(self) -> TrainBackend: ...


class _Fed:
    """One copy of the backbone and the mailbox that feeds it."""

    def __init__(self, build: Callable[[], UnifiedBundle], device: torch.device) -> None:
        with torch.random.fork_rng(devices=[]):  # building it must not move the run's RNG
            self.bundle = build()
        self.bundle.to(device)
        self.copy = RolloutCopy(self.bundle.model)
        self.mailbox = WeightMailbox()


class UnifiedRolloutSide:
    """Implements ``unirl.apps.asynchronous.source.RolloutSide`` for ``UnifiedTrainer``."""

    shared = False  # copies of its own: the trainer's evaluations never borrow them

    def __init__(self, trainer: UnifiedModel, build: Callable[[], UnifiedBundle]) -> None:
        """``trainer``: the ``UnifiedTrainer``; ``build``: a fresh bundle like the trained one."""
        self.trainer = trainer
        self.live = _Fed(build, trainer.device)
        self.old = _Fed(build, trainer.device) if trainer.nft else self.live  # the image track's weights
        text = UnifiedTextPipeline(self.live.bundle, stage="ar", default_params=trainer.cfg.ar_sampling)
        ref = trainer.pipeline  # the trainer's image pipeline: same params, on the image copy
        image = UnifiedImagePipeline(
            self.old.bundle,
            stage=ref.stage,
            text_part="ar",
            default_params=ref.default_params,
            record_old_means=ref.record_old_means,
        )
        self.engine = ComposedEngine(
            [
                ("ar", TrainsideEngine(text, weight_version=lambda: self.live.copy.weight_version)),
                (ref.stage, TrainsideEngine(image, weight_version=lambda: self.old.copy.weight_version)),
            ]
        )

    def publish(self, version: int) -> None:
        from unirl.apps.distributed.workers import policy_tensors

        backend = self.trainer.backend
        self.live.mailbox.publish(version, backend.global_step, policy_tensors(backend))
        if self.old is not self.live:
            with backend.ema_weights():
                self.old.mailbox.publish(version, backend.global_step, policy_tensors(backend))

    def refresh(self, min_version: int) -> int:
        version = self.live.copy.refresh(self.live.mailbox, min_version)
        if self.old is not self.live:
            self.old.copy.refresh(self.old.mailbox, min_version)
        return version

    def generate(self, samples: list[Sample], step: int) -> list[Sample]:
        return self.engine.generate(samples, rollout_step=step)

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Nothing staged outside this process."""
