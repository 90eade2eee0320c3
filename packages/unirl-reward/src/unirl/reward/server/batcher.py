"""Dynamic batching across concurrent requests, with a bounded queue.

Requests enqueue their items; one loop takes items from the head of the queue until the batch
holds `max_batch` items or `max_wait_s` has passed since the oldest waiting item arrived, then
scores the batch in a single worker thread (scorers are never called concurrently) and hands
each request its slice. A request larger than `max_batch` is split across batches. The queue
holds at most `max_queue` items; `submit` raises `QueueFull` beyond that (the server's 429).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from unirl.reward.protocol import ScoreItem, ScoreResult

ScoreFn = Callable[[Sequence[ScoreItem]], list[ScoreResult]]


class QueueFull(Exception):
    """The queue cannot take the request now; retry after `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"reward queue full; retry after {retry_after_s:.1f}s")
        self.retry_after_s = retry_after_s


@dataclass
class _Job:
    items: Sequence[ScoreItem]
    future: asyncio.Future[list[ScoreResult]]
    arrived: float
    results: list[ScoreResult | None] = field(default_factory=list)
    next_index: int = 0  # first item not yet taken into a batch
    done_count: int = 0

    def __post_init__(self) -> None:
        self.results = [None] * len(self.items)


@dataclass
class BatchStats:
    batches: int = 0
    items: int = 0
    batch_size_max: int = 0
    busy_s: float = 0.0


class DynamicBatcher:
    """See module docstring. Start with `start()` inside the event loop; `stop()` on shutdown."""

    def __init__(
        self,
        fn: ScoreFn,
        max_batch: int = 32,
        max_wait_s: float = 0.01,
        max_queue: int = 4096,
        thread_initializer: Callable[[], None] | None = None,
    ) -> None:
        if max_batch < 1 or max_queue < max_batch or max_wait_s < 0:
            raise ValueError(
                f"need max_batch >= 1, max_queue >= max_batch, max_wait_s >= 0; got {max_batch}, {max_queue}, {max_wait_s}"
            )
        self.fn = fn
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
        self._jobs: deque[_Job] = deque()
        self._queued_items = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="scorer", initializer=thread_initializer
        )
        self.stats = BatchStats()
        self._item_s = 0.01  # running estimate of seconds per item, for Retry-After

    @property
    def queued_items(self) -> int:
        return self._queued_items

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for job in self._jobs:
            if not job.future.done():
                job.future.set_exception(RuntimeError("reward server shutting down"))
        self._pool.shutdown(wait=False, cancel_futures=True)

    def submit(self, items: Sequence[ScoreItem]) -> asyncio.Future[list[ScoreResult]]:
        """Enqueue `items`; the future resolves to their results in order. Raises QueueFull."""
        if self._wake is None:
            raise RuntimeError("DynamicBatcher.start() was not called")
        if self._queued_items + len(items) > self.max_queue:
            raise QueueFull(max(0.1, self._queued_items * self._item_s))
        job = _Job(items, asyncio.get_running_loop().create_future(), time.monotonic())
        self._jobs.append(job)
        self._queued_items += len(items)
        self._wake.set()
        return job.future

    def _take_batch(self) -> list[tuple[_Job, int, int]]:
        """Slices (job, start, stop) from the queue head, up to max_batch items; drops cancelled jobs."""
        batch: list[tuple[_Job, int, int]] = []
        room = self.max_batch
        while self._jobs and room > 0:
            job = self._jobs[0]
            if job.future.done():  # timed out or cancelled by the caller: never score it
                self._jobs.popleft()
                self._queued_items -= len(job.items) - job.next_index
                continue
            n = min(room, len(job.items) - job.next_index)
            batch.append((job, job.next_index, job.next_index + n))
            job.next_index += n
            self._queued_items -= n
            room -= n
            if job.next_index == len(job.items):
                self._jobs.popleft()
        return batch

    async def _loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._jobs:
                self._wake.clear()
                await self._wake.wait()
                continue
            deadline = self._jobs[0].arrived + self.max_wait_s
            while self._queued_items < self.max_batch and (delay := deadline - time.monotonic()) > 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except TimeoutError:
                    break
            batch = self._take_batch()
            if not batch:
                continue
            items = [it for job, a, b in batch for it in job.items[a:b]]
            t0 = time.monotonic()
            try:
                results = await loop.run_in_executor(self._pool, self.fn, items)
            except Exception:
                # One bad request must not fail its batch-mates: score each slice on its own.
                await self._isolate(batch, loop)
                continue
            self._record(len(items), time.monotonic() - t0)
            self._deliver(batch, results)

    async def _isolate(self, batch: list[tuple[_Job, int, int]], loop: asyncio.AbstractEventLoop) -> None:
        for job, a, b in batch:
            if job.future.done():
                continue
            try:
                res = await loop.run_in_executor(self._pool, self.fn, job.items[a:b])
            except Exception as e:
                if not job.future.done():
                    job.future.set_exception(e)
                continue
            self._deliver([(job, a, b)], res)

    def _deliver(self, batch: list[tuple[_Job, int, int]], results: list[ScoreResult]) -> None:
        k = 0
        for job, a, b in batch:
            job.results[a:b] = results[k : k + (b - a)]
            k += b - a
            job.done_count += b - a
            if job.done_count == len(job.items) and not job.future.done():
                job.future.set_result([r for r in job.results if r is not None])

    def _record(self, n: int, seconds: float) -> None:
        s = self.stats
        s.batches += 1
        s.items += n
        s.batch_size_max = max(s.batch_size_max, n)
        s.busy_s += seconds
        self._item_s = 0.8 * self._item_s + 0.2 * (seconds / max(n, 1))
