"""``TrainsideEngine``: direct sampling with the training module itself (no weight sync)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from unirl.rollout.pipelines.base import Pipeline
from unirl.types import Sample

__all__ = ["TrainsideEngine"]


class TrainsideEngine:
    """Runs ``pipeline.generate`` under ``torch.no_grad`` with the trainable modules in eval mode
    (restored afterwards) and stamps every generated Part with the current weight version.

    Args:
        pipeline: the stage pipeline (e.g. a ``FlowMatchPipeline``) over the training modules.
        weight_version: the policy version, an int kept by ``set_weight_version`` or a callable
            read at each ``generate`` (e.g. the backend's optimizer-step counter).
        offload_frozen: on ``sleep`` move the bundle's frozen modules to CPU, back on ``wake_up``
            (only for pipelines with a ``bundle`` exposing ``frozen_modules()`` and ``device``).
        sampling_context: a context manager factory entered around every ``generate``, e.g. a
            train backend's ``gathered`` (weights gathered once for the whole rollout).
        eval_mode: sample with the trainable modules in eval mode (restored afterwards). False
            keeps the training mode, e.g. so a compiled module reuses its training graph (the
            mode is part of what a compiled graph is specialised on).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        weight_version: int | Callable[[], int] = 0,
        offload_frozen: bool = False,
        eval_mode: bool = True,
        sampling_context: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.sampling_context = sampling_context
        self.eval_mode = eval_mode
        self._version = weight_version
        self.offload_frozen = offload_frozen
        self.asleep = False

    @property
    def weight_version(self) -> int:
        v = self._version() if callable(self._version) else self._version
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"weight_version must be a non-negative int, got {v!r}")
        return v

    def set_weight_version(self, version: int) -> None:
        """Record a new policy version (after an optimizer step); versions only move forward."""
        if callable(self._version):
            raise TypeError("this engine reads its weight version from a callable; update that instead")
        if version < self._version:
            raise ValueError(f"weight version {version} is older than the engine's {self._version}")
        self._version = version

    def _trainable(self) -> list[nn.Module]:
        """The pipeline's trainable module (``bundle.transformer`` or ``bundle.model``), if any."""
        bundle = getattr(self.pipeline, "bundle", None)
        for name in ("transformer", "model"):
            mod = getattr(bundle, name, None)
            if isinstance(mod, nn.Module):
                return [mod]
        return []

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        """Sample with the live training weights; Parts of ``pipeline.stage`` get ``weight_version``."""
        if self.asleep:
            raise RuntimeError("TrainsideEngine.generate called while asleep; call wake_up() first")
        version = self.weight_version
        mods = self._trainable() if self.eval_mode else []
        was_training = [m.training for m in mods]
        for m in mods:
            m.eval()
        try:
            ctx = self.sampling_context() if self.sampling_context is not None else nullcontext()
            with torch.no_grad(), ctx:
                out = self.pipeline.generate(samples, rollout_step=rollout_step)
        finally:
            for m, t in zip(mods, was_training):
                m.train(t)
        for s in out:
            s.part(self.pipeline.stage).weight_version = version
        return out

    def _move_frozen(self, device: torch.device | str) -> None:
        bundle = getattr(self.pipeline, "bundle", None)
        if bundle is None or not hasattr(bundle, "frozen_modules"):
            raise TypeError("offload_frozen=True needs a pipeline with a bundle exposing frozen_modules()")
        for m in bundle.frozen_modules().values():
            m.to(device)

    def sleep(self) -> None:
        """Nothing to free for the shared training module itself; optionally offload frozen modules."""
        if self.offload_frozen and not self.asleep:
            self._move_frozen("cpu")
        self.asleep = True

    def wake_up(self) -> None:
        if self.offload_frozen and self.asleep:
            self._move_frozen(self.pipeline.bundle.device)  # type: ignore[attr-defined]
        self.asleep = False
