"""``PERolloutSide``: the async lifecycle of the prompt-enhancer trainer, on one process.

The rollout thread rewrites and renders with copies of both stacks (the enhancer's causal LM and
the renderer's transformer), each fed through its own verified mailbox
(``unirl.apps.asynchronous.mailbox``), as the AR and diffusion trainers' rollout copy is. A stack
that trains publishes a snapshot per policy version; a frozen one once, when RL starts. LoRA
adapters are injected into a copy as into the trained module (same names, same forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from unirl.apps.asynchronous.mailbox import RolloutCopy, WeightMailbox
from unirl.apps.trainers.pe_config import Recipe
from unirl.rollout.ar import ARPipeline
from unirl.rollout.engines import RolloutEngine, TrainsideEngine
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.train.backends import TrainBackend
from unirl.train.lora import LoRAConfig
from unirl.types import Sample
from unirl.types.lineage import expand_children

AR, DIFFUSION = "ar", "diffusion"


class PEStacks(Protocol):
    """What ``PERolloutSide`` reads of the ``PETrainer``: recipe, device, backends, renderer pipeline."""

    @property
    def cfg(self) -> Recipe: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def pipeline(self) -> FlowMatchPipeline: ...

    @property
    def backend(self) -> TrainBackend: ...

    @property
    def ar_backend(self) -> TrainBackend: ...


class _Fed:
    """One stack's rollout copy, its mailbox and its engine."""

    def __init__(
        self,
        module: nn.Module,
        pipeline: ARPipeline | FlowMatchPipeline,
        lora: LoRAConfig | None,
        backend: TrainBackend,
        trains: bool,
    ) -> None:
        if lora is not None:
            from unirl.train.lora import inject_lora

            inject_lora(module, lora)
        self.copy = RolloutCopy(module)
        self.mailbox = WeightMailbox()
        self.engine = TrainsideEngine(pipeline, weight_version=lambda: self.copy.weight_version)
        self.backend, self.trains = backend, trains

    def publish(self, version: int) -> None:
        from unirl.apps.distributed.workers import policy_tensors

        if self.trains or self.mailbox.latest() is None:  # a frozen stack: once
            self.mailbox.publish(version, self.backend.global_step, policy_tensors(self.backend))

    def refresh(self, min_version: int) -> int:
        snap = self.mailbox.latest()
        floor = min_version if self.trains else (snap.version if snap is not None else min_version)
        return self.copy.refresh(self.mailbox, floor)


class PERolloutSide:
    """Implements ``unirl.apps.asynchronous.source.RolloutSide`` for ``PETrainer``."""

    shared = False  # copies of its own: the trainer's evaluations never borrow them

    def __init__(self, trainer: PEStacks) -> None:
        """``trainer``: the ``PETrainer`` (its recipe, device, backends and renderer pipeline)."""
        self.trainer = trainer
        a, d, device = trainer.cfg.ar, trainer.cfg.diffusion, trainer.device
        with torch.random.fork_rng(devices=[]):  # building them must not move the run's RNG
            ar_bundle = a.model.model_copy(update={"device": str(device)}).build()
            d_bundle = d.model.build(device, trainer.cfg.seed)
        ref = trainer.pipeline  # the trainer's renderer pipeline: the same parameters, on the copy
        renderer = FlowMatchPipeline(
            d_bundle,
            stage=ref.stage,
            default_params=ref.default_params,
            prompt_part=ref.prompt_part,
            record_old_means=ref.record_old_means,
        )
        enhancer = ARPipeline(ar_bundle, a.sampling, stage=AR, prompt_template=a.prompt_template)
        self.ar = _Fed(ar_bundle.model, enhancer, a.backend.lora, trainer.ar_backend, a.rl is not None)
        self.diffusion = _Fed(
            d_bundle.transformer, renderer, d.backend.lora, trainer.backend, d.rl is not None
        )

    def publish(self, version: int) -> None:
        self.ar.publish(version)
        self.diffusion.publish(version)

    def refresh(self, min_version: int) -> int:
        versions = [f.refresh(min_version) for f in (self.ar, self.diffusion) if f.trains]
        for f in (self.ar, self.diffusion):
            if not f.trains:
                f.refresh(min_version)
        return min(versions) if versions else min_version

    def generate(self, samples: list[Sample], step: int) -> list[Sample]:
        assert self.trainer.cfg.rl is not None
        return rewrite_and_render(
            self.ar.engine, self.diffusion.engine, samples, step, self.trainer.cfg.rl.images_per_rewrite
        )

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Nothing staged outside this process."""


def rewrite_and_render(
    ar: RolloutEngine, diffusion: RolloutEngine, samples: list[Sample], step: int, images_per_rewrite: int
) -> list[Sample]:
    """The enhancer rewrites ``samples`` (the parents); the renderer draws ``images_per_rewrite`` of
    each rewrite (the children). Returns the parents, then the children."""
    parents = ar.generate(samples, rollout_step=step)
    children = expand_children(parents, images_per_rewrite, AR)
    return parents + diffusion.generate(children, rollout_step=step)


def split_batch(samples: Sequence[Sample]) -> tuple[list[Sample], list[Sample]]:
    """(rewrites, renders) of a PE batch: a render is a Sample with a diffusion Part."""
    renders = [any(p.name == DIFFUSION for p in s.parts) for s in samples]
    return [s for s, r in zip(samples, renders) if not r], [s for s, r in zip(samples, renders) if r]
