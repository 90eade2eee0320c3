"""``RayRolloutSide``: the async lifecycle on the Ray layout: rollout workers sample while train
workers train, in their own processes (on their own devices with ``placement: separate``).

The weight plane's two halves run apart: after each RL step the trainer's thread ``push``es the
policy into the transport (safetensors buckets in the object store, or shared memory), posts the
ticket on the run's ``WeightBoard`` (board.py, a Ray actor) and goes on. The rollout workers pull
the newest posted version from the board, every bucket checked against the trainer's checksums as
in the synchronous run: between batches, and with ``rl.buffer.partial_rollouts`` also between the
decode chunks of a generation in progress. A version superseded before a worker read it is freed
unread. The acks are confirmed on the trainer's thread, the only one that calls the train workers.
"""

from __future__ import annotations

from typing import Protocol

from unirl.apps.asynchronous.source import RLRecipe
from unirl.apps.distributed.board import WeightBoard
from unirl.apps.distributed.layout import LayoutConfig
from unirl.apps.distributed.workers import RolloutWorker, TrainWorker
from unirl.distributed import RayRemote
from unirl.types import Sample


class RayDriver(Protocol):
    """What ``RayRolloutSide`` uses of the ``DistributedRL`` controller."""

    synced_version: int | None

    @property
    def cfg(self) -> RLRecipe: ...

    @property
    def layout(self) -> LayoutConfig: ...

    @property
    def train(self) -> RayRemote[TrainWorker]: ...

    @property
    def rollout_remote(self) -> RayRemote[RolloutWorker]: ...

    def engine_checks(self) -> dict[str, float]: ...


class RayRolloutSide:
    """Implements ``unirl.apps.asynchronous.source.RolloutSide`` over a ``DistributedRL`` controller."""

    shared = True
    """The rollout workers also run the controller's evaluations: the trainer borrows them."""

    def __init__(self, controller: RayDriver) -> None:
        import ray

        self.d = d = controller
        n = d.rollout_remote.world_size
        self.board = ray.remote(num_cpus=0)(WeightBoard).remote(n)
        if d.cfg.rl is None:
            raise ValueError("the async lifecycle needs an `rl` phase (rl.buffer)")
        buffer = d.cfg.rl.buffer
        self.partial = bool(buffer.partial_rollouts)
        chunk = buffer.partial_chunk_tokens if self.partial else None
        d.rollout_remote.call_all(RolloutWorker.attach_board, self.board, chunk)
        self.version = -1

    # ---- the trainer's thread ---------------------------------------------------------------
    def publish(self, version: int) -> None:
        import ray

        self._confirm()
        d = self.d
        step = d.train.call_rank0(TrainWorker.global_step)
        held = d.synced_version is not None and step <= d.synced_version
        ticket = None if held else d.train.call_all(TrainWorker.push, step)[0]
        ray.get(self.board.post.remote(version, ticket))

    def _confirm(self) -> None:
        """Free what nobody will read any more (a superseded version unread: just freed)."""
        import ray

        for ticket, acks, receivers in ray.get(self.board.collect.remote()):
            self.d.train.call_rank0(TrainWorker.confirm, ticket, acks, receivers)

    # ---- the rollout thread -----------------------------------------------------------------
    def refresh(self, min_version: int) -> int:
        import ray

        d = self.d
        # every worker holds at least self.version (the oldest last seen): nothing newer posted, nothing to pull
        if ray.get(self.board.newest.remote()) > self.version:
            held = d.rollout_remote.call_all_async(RolloutWorker.catch_up).result(d.layout.call_timeout_s)
            self.version = min(v for v, _ in held)
            weights = min(w for _, w in held)
            if d.synced_version is None or weights > d.synced_version:
                d.synced_version = weights  # the controller's own sync (evaluations) is then a no-op
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
        import ray

        self.refresh(self.version)
        self._confirm()
        if self.partial:  # the evaluations after the phase decode whole generations
            self.d.rollout_remote.call_all(RolloutWorker.detach_board)
        ray.kill(self.board)
