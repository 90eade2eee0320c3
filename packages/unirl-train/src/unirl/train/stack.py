"""TrainStack: batch geometry + one StageAlgorithm + one backend, for one trainable Part.

One call of `train_on(shard)` per rollout:
1. `algorithm.prepare(shard, pipeline)` once, under no_grad (freezes pi_old: old means, ...);
2. `num_updates_per_batch` passes over the shard; each pass splits it into mini-batches (one
   optimizer step each) and each mini-batch into micro-batches;
3. per mini-batch: BatchTotals counted over the whole mini-batch and summed over ranks, then
   for each micro-batch `loss = algorithm.loss(micro, pipeline, totals)` and `backward(loss)`;
   the loss is already divided by the global denominators, so the summed gradient does not
   depend on how the mini-batch is split; then `backend.step()`.

A backend that must drive the micro-batches itself (megatron-core's pipeline schedule interleaves
the forwards and backwards of several micro-batches across stages) offers
``run_micro_batches(micro, loss_fn) -> [(loss value, metrics)]`` (`MicroBatchRunner`); the stack
then hands it the micro-batches and the loss closure instead of looping. Everything else (totals,
weights, metrics, the step) is the same code either way.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from unirl.train.algorithms.base import BatchTotals, StageAlgorithm
from unirl.train.backends.base import StepStats, TrainBackend
from unirl.train.geometry import BatchGeometry
from unirl.types import LatentTrajectory, Part, TextSegment


def local_counts(parts: Sequence[Part]) -> tuple[int, int, int]:
    """(num_samples, num_tokens, num_steps) of `parts` on this rank.

    Text: tokens = loss-mask tokens (all response tokens when there is no mask), steps = 0.
    Latent: tokens = steps = number of SDE steps (the steps the policy losses train on).
    An algorithm that trains on other units (e.g. DiffusionNFT's forward-process timesteps)
    supplies its own `count(parts) -> (num_samples, num_tokens, num_steps)`.
    """
    tokens = steps = 0
    for p in parts:
        seg = p.segment
        if isinstance(seg, TextSegment):
            tokens += len(seg.response_ids) if seg.loss_mask is None else int(seg.loss_mask.sum())
        elif isinstance(seg, LatentTrajectory):
            tokens += len(seg.sde_indices)
            steps += len(seg.sde_indices)
        elif seg is not None:
            raise TypeError(f"part {p.name!r} has an unknown segment type {type(seg).__name__}")
    return len(parts), tokens, steps


class TrainStack:
    """Trains one Part stage: `train_on(parts) -> metrics`."""

    def __init__(
        self, backend: TrainBackend, algorithm: StageAlgorithm, pipeline: Any, geometry: BatchGeometry
    ) -> None:
        self.backend = backend
        self.algorithm = algorithm
        self.pipeline = pipeline
        self.geometry = geometry

    def _counts(self, parts: Sequence[Part]) -> tuple[int, int, int]:
        count = getattr(self.algorithm, "count", None)
        return tuple(count(parts)) if count is not None else local_counts(parts)  # type: ignore[return-value]

    def totals(self, mini_batch: Sequence[Part]) -> BatchTotals:
        """Global BatchTotals of a mini-batch: this rank's counts summed over all ranks."""
        s, t, n = self.backend.all_reduce(list(self._counts(mini_batch)), op="sum")
        return BatchTotals(num_samples=int(s), num_tokens=int(t), num_steps=int(n))

    def train_on(self, parts: Sequence[Part]) -> dict[str, float]:
        """Prepare once, run every update of this shard, return aggregated metrics.

        Metrics: the algorithm's metrics averaged over micro-batches (weighted by each
        micro-batch's share of the mini-batch's tokens, or samples when it has none) and then
        over optimizer steps; `loss` (global mini-batch loss, mean over steps); `grad_norm`
        (mean over applied steps, pre-clip) and `grad_norm_max`; `lr` (of the last step);
        `skipped_nonfinite` (steps skipped for a non-finite grad norm); `num_optimizer_steps`
        (applied); `global_step`.
        """
        parts = list(parts)
        self.geometry.check_shard(len(parts))
        with torch.no_grad():
            self.algorithm.prepare(parts, self.pipeline)
        steps: list[tuple[StepStats, dict[str, float]]] = []
        for update in range(self.geometry.num_updates_per_batch):
            for mini in self.geometry.mini_batches(parts, update):
                steps.append(self._optimizer_step(mini))
        return aggregate(steps, self.backend.global_step)

    def _optimizer_step(self, mini: list[Part]) -> tuple[StepStats, dict[str, float]]:
        micro = self.geometry.micro_batches(mini)
        hi, neg_lo = self.backend.all_reduce([len(micro), -len(micro)], op="max")
        if hi != -neg_lo:
            raise ValueError(
                f"ranks disagree on the number of micro-batches per step ({int(-neg_lo)}..{int(hi)}); "
                "give every rank a shard of the same size"
            )
        totals = self.totals(mini)
        counts = [self._counts(mb) for mb in micro]
        denom_tokens = sum(c[1] for c in counts)
        weights = [c[1] / denom_tokens if denom_tokens else c[0] / len(mini) for c in counts]
        self.backend.zero_grad()
        runner = getattr(self.backend, "run_micro_batches", None)
        if runner is not None and not getattr(self.algorithm, "streams_backward", False):
            results = runner(micro, lambda mb: self.algorithm.loss(mb, self.pipeline, totals))
        else:
            results = self._run_sequential(micro, totals)
        metrics: dict[str, float] = defaultdict(float)
        for (_, m), w in zip(results, weights):
            for k, v in m.items():
                metrics[k] += w * float(v)
        stats = self.backend.step()
        metrics["loss"] = self.backend.all_reduce([sum(loss for loss, _ in results)], op="sum")[0]
        return stats, dict(metrics)

    def _run_sequential(
        self, micro: Sequence[list[Part]], totals: BatchTotals
    ) -> list[tuple[float, dict[str, float]]]:
        """Forward + backward of each micro-batch in turn: its loss value and metrics."""
        streams = getattr(self.algorithm, "streams_backward", False)
        results = []
        for i, mb in enumerate(micro):
            last = i == len(micro) - 1
            if streams:  # the algorithm back-propagates term by term (one step's graph at a time)

                def backward(term: torch.Tensor, final: bool, last: bool = last) -> None:
                    self.backend.backward(term, last_micro_batch=last and final)

                loss, m = self.algorithm.loss(mb, self.pipeline, totals, backward=backward)  # type: ignore[call-arg]
            else:
                loss, m = self.algorithm.loss(mb, self.pipeline, totals)
                self.backend.backward(loss, last_micro_batch=last)
            results.append((float(loss.detach()), {k: float(v) for k, v in m.items()}))
        return results


def aggregate(steps: Sequence[tuple[StepStats, dict[str, float]]], global_step: int) -> dict[str, float]:
    """Combine per-step results into one metrics dict (see `TrainStack.train_on`)."""
    sums: dict[str, float] = defaultdict(float)
    for _, m in steps:
        for k, v in m.items():
            sums[k] += v
    out = {k: v / len(steps) for k, v in sums.items()}
    applied = [s.grad_norm for s, _ in steps if not s.skipped_nonfinite]
    out["grad_norm"] = sum(applied) / len(applied) if applied else math.nan
    out["grad_norm_max"] = max(applied) if applied else math.nan
    out["lr"] = steps[-1][0].lr
    out["skipped_nonfinite"] = float(sum(s.skipped_nonfinite for s, _ in steps))
    out["num_optimizer_steps"] = float(len(applied))
    out["global_step"] = float(global_step)
    return out
