"""``RayRolloutSide``: the async lifecycle on the Ray layout: rollout workers sample while train
workers train, in their own processes (on their own devices with ``placement: separate``).

The weight plane's two halves run apart: after each RL step the trainer's thread ``push``es the
policy into the transport (safetensors buckets in the object store, or shared memory) and goes
on; the rollout thread ``pull``s the newest staged version between batches (every bucket checked
against the trainer's checksums, as in the synchronous run). A version superseded before any
worker pulled it is freed unread. The acks are confirmed on the trainer's thread, the only one
that calls the train workers.
"""

from __future__ import annotations

import threading
from typing import Any

from unirl.apps.distributed.workers import RolloutWorker, TrainWorker
from unirl.distributed.weightsync import SyncAck, SyncTicket
from unirl.types import Sample


class RayRolloutSide:
    """Implements ``unirl.apps.asynchronous.source.RolloutSide`` over a ``DistributedRL`` controller."""

    shared = True
    """The rollout workers also run the controller's evaluations: the trainer borrows them."""

    def __init__(self, controller: Any) -> None:
        self.d = controller
        self._lock = threading.Lock()
        self._staged: tuple[int, SyncTicket | None] | None = None  # newest pushed, not pulled yet
        # (a None ticket: the workers already hold these weights, e.g. the SFT result at RL's start)
        self._pulled: list[tuple[SyncTicket, list[SyncAck]]] = []  # acks the trainer confirms
        self._unread: list[SyncTicket] = []  # superseded before any pull: freed by the trainer
        self.version = -1

    # ---- the trainer's thread ---------------------------------------------------------------
    def publish(self, version: int) -> None:
        self._confirm()
        d = self.d
        step = d.train.call_rank0(TrainWorker.global_step)
        held = d.synced_version is not None and step <= d.synced_version
        ticket = None if held else d.train.call_all(TrainWorker.push, step)[0]
        with self._lock:
            if self._staged is not None and self._staged[1] is not None:
                self._unread.append(self._staged[1])
            self._staged = (version, ticket)

    def _confirm(self) -> None:
        d = self.d
        with self._lock:
            pulled, unread = self._pulled, self._unread
            self._pulled, self._unread = [], []
        for ticket, acks in pulled:
            d.train.call_rank0(TrainWorker.confirm, ticket, acks, d.rollout_remote.world_size)
        for ticket in unread:
            d.train.call_rank0(TrainWorker.confirm, ticket, [], 0)  # nobody read it: just free it

    # ---- the rollout thread -----------------------------------------------------------------
    def refresh(self, min_version: int) -> int:
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is not None and staged[1] is None:
            self.version = staged[0]
        elif staged is not None:
            version, ticket = staged
            d = self.d
            acks = d.rollout_remote.call_all_async(RolloutWorker.pull, ticket).result(d.layout.call_timeout_s)
            with self._lock:
                self._pulled.append((ticket, acks))
            self.version = version
            d.synced_version = ticket.version  # the controller's own sync (evaluations) is then a no-op
        if self.version < min_version:
            raise RuntimeError(
                f"async rollout needs policy version >= {min_version}; the workers hold {self.version}"
            )
        return self.version

    def generate(self, samples: list[Sample], step: int) -> list[Sample]:
        r = self.d.rollout_remote
        r.call_all(RolloutWorker.set_step, step)
        out: list[Sample] = r.call_dp(RolloutWorker.generate, samples)
        return out

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = self.d.engine_checks()
        return m

    def close(self) -> None:
        """The rollout workers take the last version (the final evaluation samples with it)."""
        self.refresh(self.version)
        self._confirm()
