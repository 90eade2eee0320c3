"""``AsyncSource``: where ``Trainer.rl`` gets its batches in the asynchronous lifecycle.

A rollout thread runs the trainer's own ``collect`` (prompts -> rollout -> reward -> shaping ->
advantages, dynamic sampling included) with a rollout copy of the policy, slot after slot, into
the ``SampleBuffer``. The trainer ``take``s a batch per RL step and, after the step, ``publish``es
the new policy. With ``max_staleness: 0`` every batch is sampled with the latest weights and the
run is the synchronous one, step for step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol

import torch

from unirl.apps.asynchronous.buffer import Batch, BufferState, SampleBuffer
from unirl.apps.asynchronous.config import AsyncConfig
from unirl.apps.asynchronous.mailbox import RolloutCopy, WeightMailbox
from unirl.apps.asynchronous.partial import MailboxSwap, oldest_version, version_metrics
from unirl.apps.loop import PromptRecord
from unirl.rollout.ar import ARPipeline
from unirl.rollout.ar.partial import PartialRollouts
from unirl.rollout.engines import TrainsideEngine
from unirl.rollout.pipelines import Pipeline
from unirl.train.backends import TrainBackend
from unirl.types import Sample
from unirl.types.faults import FAULT_ENV as FAULT_ENV  # re-exported: the tests' kill switch
from unirl.types.faults import fault_point

log = logging.getLogger("unirl")


class RolloutSide(Protocol):
    """Who samples in the async lifecycle, and how a new policy version reaches it.

    ``publish`` runs on the trainer's thread after each RL step and must not wait for a rollout in
    progress; ``refresh`` and ``generate`` run on the rollout thread, between and during batches.
    ``shared``: the trainer's own evaluations sample with it too (a dedicated engine, the Ray
    layout's rollout workers), so they borrow it between batches (``AsyncSource.borrowed``)."""

    shared: bool

    def publish(self, version: int) -> None:
        """Stage the trainer's current weights as policy ``version`` (the newest replaces older ones)."""
        ...

    def refresh(self, min_version: int) -> int:
        """Swap in the newest staged version (verified); the version now held (>= ``min_version``)."""
        ...

    def generate(self, samples: list[Sample], step: int) -> list[Sample]:
        """Sample ``samples`` (rollout step ``step``) with the version held."""
        ...

    def close(self) -> None:
        """The phase is over: bring the rollout side to the newest version and free staged weights."""
        ...

    def metrics(self) -> dict[str, float]:
        """The last ``generate``'s engine checks (a dedicated engine's parity and canary; {} else),
        logged with the batch they belong to."""
        ...


class RLBatches(Protocol):
    """What ``AsyncSource`` reads of the RL phase (every trainer's ``rl``)."""

    @property
    def steps(self) -> int: ...

    @property
    def buffer(self) -> AsyncConfig: ...


class _Threads(Protocol):
    @property
    def threads(self) -> int | None: ...


class RLRecipe(Protocol):
    """A recipe's ``rl`` as the async lifecycle reads it."""

    @property
    def rl(self) -> RLBatches | None: ...


Collect = Callable[..., tuple[list[Sample], dict[str, float]]]
"""A trainer's ``collect(phase, records, step, rollout=...)`` (its phase type is the trainer's own)."""


class AsyncTrainer(Protocol):
    """What ``AsyncSource`` reads of the trainer (``Trainer``, the Ray driver)."""

    stage: str

    @property
    def cfg(self) -> _Threads: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def rl_step(self) -> int: ...

    @property
    def collect(self) -> Collect: ...


class HasRolloutCopy(Protocol):
    """What ``LocalRolloutSide`` reads of the trainer: a rollout copy of its policy and its weights."""

    @property
    def cfg(self) -> RLRecipe: ...

    @property
    def backend(self) -> TrainBackend: ...

    def rollout_copy(self) -> tuple[Pipeline, torch.nn.Module]: ...

    def rollout_weights(self) -> AbstractContextManager[None]: ...


class LocalRolloutSide:
    """One process: a rollout copy of the policy, fed through a verified, double-buffered mailbox."""

    shared = False  # a copy of its own: the trainer's evaluations sample with the trainer's engine

    def __init__(self, trainer: HasRolloutCopy) -> None:
        self.trainer = trainer
        self.mailbox = WeightMailbox()
        pipeline, module = trainer.rollout_copy()
        self.copy = RolloutCopy(module)
        self.engine = TrainsideEngine(pipeline, weight_version=lambda: self.copy.weight_version)
        rl = trainer.cfg.rl
        if rl is None:
            raise ValueError("the async lifecycle needs an `rl` phase (rl.buffer)")
        buffer = rl.buffer
        self.swap: MailboxSwap | None = None
        if buffer.partial_rollouts:  # the decode loop swaps to a newer policy between chunks
            if not isinstance(pipeline, ARPipeline):
                raise TypeError(
                    f"rl.buffer.partial_rollouts needs an AR pipeline, not {type(pipeline).__name__}"
                )
            self.swap = MailboxSwap(self.copy, self.mailbox)
            pipeline.enable_partial(PartialRollouts(self.swap, buffer.partial_chunk_tokens))

    def publish(self, version: int) -> None:
        from unirl.apps.distributed.workers import policy_tensors

        t = self.trainer
        with t.rollout_weights():
            self.mailbox.publish(version, t.backend.global_step, policy_tensors(t.backend))

    def refresh(self, min_version: int) -> int:
        return self.copy.refresh(self.mailbox, min_version)

    def generate(self, samples: list[Sample], step: int) -> list[Sample]:
        return self.engine.generate(samples, rollout_step=step)

    def close(self) -> None:
        """Nothing staged outside this process."""

    def metrics(self) -> dict[str, float]:
        return {}


class AsyncSource:
    """Rollout thread + buffer for one RL phase of ``trainer``; ``side`` samples and takes weights."""

    def __init__(
        self,
        trainer: AsyncTrainer,
        phase: RLBatches,
        records: list[PromptRecord],
        state: tuple[BufferState, bytes] | None,
        side: RolloutSide,
    ) -> None:
        self.trainer, self.phase, self.records, self.side = trainer, phase, records, side
        cfg = phase.buffer
        self.buffer = SampleBuffer(
            capacity=cfg.capacity, max_staleness=cfg.max_staleness, total_steps=phase.steps
        )
        self.buffer.version = self.buffer.trained = trainer.rl_step
        self.buffer.next_slot = trainer.rl_step
        if state is not None:
            self.buffer.restore(*state)
            if self.buffer.trained != trainer.rl_step:
                raise ValueError(
                    f"async buffer checkpoint counts {self.buffer.trained} trained batches but the run is "
                    f"at rl step {trainer.rl_step}; the checkpoint is inconsistent"
                )
            self.buffer.version = trainer.rl_step
        # OpenMP's thread count is per thread: a new thread would not inherit the recipe's `threads`
        self.threads = cfg.rollout_threads or trainer.cfg.threads or torch.get_num_threads()
        self.exclusive = threading.Lock()
        """Held by the rollout thread for each batch; the trainer takes it to use the rollout side
        itself (an evaluation on the Ray layout's rollout workers)."""
        self.publish(trainer.rl_step)
        self._thread = threading.Thread(target=self._produce, name="unirl-rollout", daemon=True)
        self._thread.start()

    # ---- the rollout thread ---------------------------------------------------------------
    def _produce(self) -> None:
        try:
            torch.set_num_threads(self.threads)
            # on a GPU, a stream of its own: the rollout's kernels then overlap the trainer's
            stream = torch.cuda.Stream(self.trainer.device) if self.trainer.device.type == "cuda" else None
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                self._produce_batches(stream)
        except BaseException as e:  # handed to the trainer, which re-raises it
            log.exception("async rollout thread failed")
            self.buffer.fail(e)

    def _produce_batches(self, stream: torch.cuda.Stream | None) -> None:
        while True:
            t_wait = time.time()
            if (reserved := self.buffer.reserve()) is None:
                break
            slot, min_version = reserved
            with self.exclusive:  # the trainer may borrow the rollout side between batches
                wait_s = time.time() - t_wait  # idle: held back by the bounds (or an evaluation)
                version = self.side.refresh(min_version)
                t0 = time.time()
                samples, extra = self.trainer.collect(
                    self.phase, self.records, slot, rollout=self.side.generate
                )
                extra = extra | self.side.metrics()
            if stream is not None:
                stream.synchronize()  # the trainer reads these tensors on its own stream
            fault_point("rollout", slot)
            # partial rollouts: tokens of newer versions too; the batch is as old as its oldest token
            version = oldest_version(samples, self.trainer.stage, version)
            self.buffer.put(Batch(slot, version, samples, extra, time.time() - t0, wait_s))

    # ---- the trainer's side ---------------------------------------------------------------
    def next(self, step: int) -> tuple[list[Sample], dict[str, float]]:
        """The batch to train RL step ``step`` on (policy version ``step``), with its metrics."""
        t0 = time.time()
        batch, lag = self.buffer.take(step)
        extra = dict(batch.extra) | {
            "async/staleness": float(lag),
            "async/slot": float(batch.slot),
            "async/train_wait_s": time.time() - t0,
            "async/rollout_s": batch.rollout_s,
            "async/rollout_wait_s": batch.wait_s,
        }
        extra |= version_metrics(batch.samples, self.trainer.stage, step)
        return batch.samples, extra | self.buffer.metrics()

    def publish(self, version: int) -> None:
        """Hand policy ``version`` (the trainer's weights now) to the rollout side."""
        self.side.publish(version)
        self.buffer.advance(version)

    @contextmanager
    def borrowed(self) -> Iterator[None]:
        """For the trainer to use the rollout side itself (an evaluation), where the side is shared
        (``side.shared``: the Ray layout's rollout workers): after the batch in progress, at the
        newest version. A side of its own (one process) is not borrowed."""
        if not self.side.shared:
            yield
            return
        with self.exclusive:
            self.side.refresh(self.buffer.version)
            yield

    def checkpoint_state(self) -> tuple[BufferState, bytes]:
        """The buffer now (the batch in flight re-queued): call between RL steps, so it matches
        the weights saved with it."""
        return self.buffer.state()

    def close(self) -> None:
        self.buffer.close()
        self._thread.join()
        self.side.close()

    def staleness_histogram(self) -> dict[int, int]:
        return dict(sorted(self.buffer.staleness.items()))
