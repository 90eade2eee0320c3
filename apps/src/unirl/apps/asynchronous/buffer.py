"""``SampleBuffer``: the bounded, staleness-aware queue between the rollout thread and the trainer.

Entries are whole rollout batches (every group complete: advantages were computed over them), so
the trainer never sees half a group. The producer reserves a *slot* (the data cursor: slot ``j``
draws the prompts of RL step ``j`` in the synchronous run) before it samples; a reservation waits
while

- the buffer holds ``capacity`` batches,
- the batch would be trained at a version more than ``max_staleness`` ahead of the newest
  published policy (it would be too stale before it is used), or
- enough batches exist for the phase.

A checkpoint never waits for the producer: ``state`` holds the finished batches, and a batch in
flight is re-queued (its slot is produced again on resume, with the checkpoint's weights).

Accounting, checked by the tests: ``produced == trained + dropped + buffered`` at every barrier.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TypedDict

from unirl.types import Sample, list_from_bytes, to_bytes


class BatchIndex(TypedDict):
    """One buffered batch in ``BufferState`` (its ``n`` Samples are in the binary part)."""

    slot: int
    version: int
    extra: dict[str, float]
    n: int


class BufferState(TypedDict):
    """The JSON half of ``SampleBuffer.state``: counters, cursor and the buffered batches' index."""

    next_slot: int
    produced: int
    trained: int
    dropped: int
    staleness: dict[str, int]
    batches: list[BatchIndex]


@dataclass
class Batch:
    """One RL step's rollout: ``samples`` (scored, advantages set) generated with policy ``version``
    (with partial rollouts: the oldest version of any of its tokens; newer ones sampled the rest).
    ``wait_s``: how long the producer was held back before it could start the batch."""

    slot: int
    version: int
    samples: list[Sample]
    extra: dict[str, float] = field(default_factory=dict)
    rollout_s: float = 0.0
    wait_s: float = 0.0


class ProducerFailed(RuntimeError):
    """The rollout thread raised; the trainer re-raises its error."""


class SampleBuffer:
    """Thread-safe; one producer (the rollout thread) and one consumer (the trainer)."""

    def __init__(self, *, capacity: int, max_staleness: int, total_steps: int) -> None:
        self.capacity, self.max_staleness, self.total_steps = capacity, max_staleness, total_steps
        self._cv = threading.Condition()
        self._queue: deque[Batch] = deque()
        self.version = 0  # newest published policy version
        self.next_slot = 0
        self.produced = self.trained = self.dropped = 0
        self.staleness: Counter[int] = Counter()
        self._in_flight = self._closed = False
        self._error: BaseException | None = None

    # ---- producer side --------------------------------------------------------------------
    def _may_start(self) -> bool:
        ahead = self.trained + len(self._queue)  # the version the new batch would be trained at
        return (
            len(self._queue) < self.capacity
            and ahead - self.version <= self.max_staleness
            and ahead < self.total_steps
        )

    def reserve(self) -> tuple[int, int] | None:
        """Block until a batch may start; ``(slot, min_version)`` of it, or None once closed.

        ``min_version``: the oldest policy the batch may be sampled with (the bound above)."""
        with self._cv:
            self._cv.wait_for(lambda: self._closed or self._may_start())
            if self._closed:
                return None
            self._in_flight = True
            slot, self.next_slot = self.next_slot, self.next_slot + 1
            return slot, self.trained + len(self._queue) - self.max_staleness

    def put(self, batch: Batch) -> None:
        with self._cv:
            self._queue.append(batch)
            self.produced += 1
            self._in_flight = False
            self._cv.notify_all()

    def fail(self, error: BaseException) -> None:
        """The producer died: wake the trainer with its error."""
        with self._cv:
            self._error, self._in_flight = error, False
            self._cv.notify_all()

    # ---- trainer side ---------------------------------------------------------------------
    def take(self, version: int) -> tuple[Batch, int]:
        """The next batch fresh enough to train at ``version``, and its staleness; older ones are
        dropped (counted in ``dropped``). Blocks until one is there."""
        with self._cv:
            while True:
                self._cv.wait_for(lambda: bool(self._queue) or self._error is not None or self._closed)
                if self._error is not None:
                    raise ProducerFailed(f"the rollout thread failed: {self._error!r}") from self._error
                if not self._queue:
                    raise RuntimeError("SampleBuffer.take on a closed, empty buffer")
                batch = self._queue.popleft()
                lag = version - batch.version
                if lag > self.max_staleness:
                    self.dropped += 1
                    self._cv.notify_all()
                    continue
                self.trained += 1
                self.staleness[lag] += 1
                self._cv.notify_all()
                return batch, lag

    def advance(self, version: int) -> None:
        """The trainer published policy ``version`` (the weights are already in the mailbox)."""
        with self._cv:
            if version < self.version:
                raise ValueError(f"policy version {version} is older than the published {self.version}")
            self.version = version
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def metrics(self) -> dict[str, float]:
        with self._cv:
            return {
                "async/produced": float(self.produced),
                "async/trained": float(self.trained),
                "async/dropped": float(self.dropped),
                "async/buffered": float(len(self._queue)),
            }

    def state(self) -> tuple[BufferState, bytes]:
        """JSON-safe counters and cursor, and the buffered Samples in unirl's pickle-free binary
        form; the slot in flight, if any, is left to be produced again."""
        with self._cv:
            meta: BufferState = {
                "next_slot": self.next_slot - int(self._in_flight),
                "produced": self.produced,
                "trained": self.trained,
                "dropped": self.dropped,
                "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
                "batches": [
                    {"slot": b.slot, "version": b.version, "extra": b.extra, "n": len(b.samples)}
                    for b in self._queue
                ],
            }
            return meta, to_bytes([s for b in self._queue for s in b.samples])

    def restore(self, meta: BufferState, samples_bytes: bytes) -> None:
        """Inverse of ``state`` (before the producer starts)."""
        samples = list_from_bytes(Sample, samples_bytes) if samples_bytes else []
        expected = sum(int(b["n"]) for b in meta["batches"])
        if len(samples) != expected:
            raise ValueError(f"buffer checkpoint holds {len(samples)} samples, its index says {expected}")
        with self._cv:
            self.next_slot = int(meta["next_slot"])
            self.produced, self.trained = int(meta["produced"]), int(meta["trained"])
            self.dropped = int(meta["dropped"])
            self.staleness = Counter({int(k): int(v) for k, v in meta["staleness"].items()})
            self._queue.clear()
            at = 0
            for b in meta["batches"]:
                n = int(b["n"])
                extra = {str(k): float(v) for k, v in b["extra"].items()}
                self._queue.append(Batch(int(b["slot"]), int(b["version"]), samples[at : at + n], extra))
                at += n
