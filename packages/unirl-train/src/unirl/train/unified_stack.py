"""UnifiedModelTrainStack: one backbone, several tracks (e.g. AR text + image), one optimizer step.

A unified model (one backbone with a text head and an image head) trains every Part kind of a
Sample in the same optimizer step. Each ``Track`` names the Part it trains (``ar``, ``image``),
its StageAlgorithm, the pipeline that replays it and a loss weight. One call of ``train_on(parts)``
per rollout:

1. the Parts are routed to their track by ``Part.name``; every track gets the same number of Parts
   (one per Sample, in Sample order), so a mini-batch is one set of Samples on every track;
2. each track's ``algorithm.prepare`` runs once, under no_grad (pi_old frozen per track);
3. per mini-batch: ``zero_grad``; for each track, its OWN BatchTotals over the mini-batch (summed
   over ranks) and, per micro-batch, ``backward(weight * loss)``; then ONE ``backend.step()``.

Each track's loss is divided by its own global denominators (AR: loss-mask tokens; image: trained
SDE steps), so the accumulated gradient is ``sum_k weight_k * grad L_k`` whatever the split, and
one step applies it: the gradient of the weighted sum of the two losses.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from unirl.train.algorithms.base import StageAlgorithm
from unirl.train.backends.base import StepStats, TrainBackend
from unirl.train.geometry import BatchGeometry
from unirl.train.stack import TrainStack, aggregate
from unirl.types import Part

__all__ = ["Track", "UnifiedModelTrainStack"]


@dataclass
class Track:
    """One trainable Part kind of the unified model: the Parts named ``name``, trained by
    ``algorithm`` through ``pipeline``, its loss scaled by ``weight``."""

    name: str
    algorithm: StageAlgorithm
    pipeline: Any
    weight: float = 1.0


class UnifiedModelTrainStack:
    """Trains the tracks of one shared backbone: ``train_on(parts) -> metrics`` (see module docstring).

    Metrics: each track's algorithm metrics and its (weighted) ``loss`` under ``<track>/``; ``loss``
    (the weighted sum); ``grad_norm``, ``lr``, ``num_optimizer_steps``, ... as ``TrainStack.train_on``.
    """

    def __init__(self, backend: TrainBackend, tracks: Sequence[Track], geometry: BatchGeometry) -> None:
        names = [t.name for t in tracks]
        if not tracks or len(set(names)) != len(names):
            raise ValueError(f"a unified stack needs one or more tracks with distinct names; got {names}")
        self.backend, self.tracks, self.geometry = backend, list(tracks), geometry
        # one single-track stack per track, for its counting (BatchTotals, algorithm.count)
        self._counters = {t.name: TrainStack(backend, t.algorithm, t.pipeline, geometry) for t in tracks}

    def route(self, parts: Sequence[Part]) -> dict[str, list[Part]]:
        """Parts by track name; every Part must belong to a track and every track get as many Parts."""
        by: dict[str, list[Part]] = {t.name: [] for t in self.tracks}
        for p in parts:
            if p.name not in by:
                raise ValueError(f"part {p.name!r} belongs to no track of this stack (tracks: {sorted(by)})")
            by[p.name].append(p)
        sizes = {n: len(v) for n, v in by.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"every track needs one Part per Sample; got Parts per track {sizes}")
        return by

    def train_on(self, parts: Sequence[Part]) -> dict[str, float]:
        by = self.route(parts)
        n = len(next(iter(by.values())))
        self.geometry.check_shard(n)
        with torch.no_grad():
            for t in self.tracks:
                t.algorithm.prepare(by[t.name], t.pipeline)
        steps: list[tuple[StepStats, dict[str, float]]] = []
        for update in range(self.geometry.num_updates_per_batch):
            for mini in self.geometry.mini_batches(list(range(n)), update):
                steps.append(self._optimizer_step({k: [v[i] for i in mini] for k, v in by.items()}))
        return aggregate(steps, self.backend.global_step)

    def _optimizer_step(self, mini: dict[str, list[Part]]) -> tuple[StepStats, dict[str, float]]:
        self.backend.zero_grad()
        metrics: dict[str, float] = defaultdict(float)
        losses: list[float] = []
        for k, track in enumerate(self.tracks):
            counter = self._counters[track.name]
            tparts = mini[track.name]
            micro = self.geometry.micro_batches(tparts)
            totals = counter.totals(tparts)
            counts = [counter._counts(mb) for mb in micro]
            denom = sum(c[1] for c in counts)
            weights = [c[1] / denom if denom else c[0] / len(tparts) for c in counts]
            streams = getattr(track.algorithm, "streams_backward", False)
            loss_sum = 0.0
            for i, (mb, w) in enumerate(zip(micro, weights)):
                last = k == len(self.tracks) - 1 and i == len(micro) - 1
                if streams:
                    loss, m = track.algorithm.loss(  # type: ignore[call-arg]
                        mb, track.pipeline, totals, backward=self._scaled_backward(track.weight, last)
                    )
                else:
                    loss, m = track.algorithm.loss(mb, track.pipeline, totals)
                    self.backend.backward(track.weight * loss, last_micro_batch=last)
                loss_sum += track.weight * float(loss.detach())
                for key, v in m.items():
                    metrics[f"{track.name}/{key}"] += w * float(v)
            metrics[f"{track.name}/loss"] = self.backend.all_reduce([loss_sum], op="sum")[0]
            losses.append(metrics[f"{track.name}/loss"])
        stats = self.backend.step()
        metrics["loss"] = sum(losses)
        return stats, dict(metrics)

    def _scaled_backward(self, weight: float, last: bool) -> Callable[[torch.Tensor, bool], None]:
        def backward(term: torch.Tensor, final: bool) -> None:
            self.backend.backward(weight * term, last_micro_batch=last and final)

        return backward
