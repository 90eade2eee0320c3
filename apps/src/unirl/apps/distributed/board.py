"""The weight board of the Ray layout's async lifecycle: the newest staged policy and who read what.

The trainer's thread ``post``s each pushed version; rollout workers ``claim`` the newest one,
pull it through the weight plane and report ``done`` with their ack: between batches (the
controller's ``refresh``) and, with ``rl.buffer.partial_rollouts``, in the middle of a generation
(``BoardSwap``, asked between decode chunks). It runs as a Ray actor, so each call is atomic and
both sides reach it from their own processes. A staged version's payload (object-store buckets,
shared memory) is freed on the trainer's thread once nobody will read it: superseded and no pull
in progress, or the newest and acked by every worker (``collect``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from unirl.distributed.errors import StaleWeightVersionError
from unirl.distributed.rank import RankInfo
from unirl.distributed.weightsync import SyncAck, SyncTicket

if TYPE_CHECKING:  # the board actor's process imports no model code
    from unirl.rollout.ar import ARPipeline
    from unirl.rollout.pipelines import Pipeline

__all__ = ["BoardSwap", "WeightBoard", "attach_board", "catch_up", "detach_board"]


class BoardReader(Protocol):
    """What the board's worker side uses of ``workers.RolloutWorker``."""

    info: RankInfo
    board: Any  # the WeightBoard actor handle (ray's stubs do not type its `.remote` methods)
    policy_version: int

    @property
    def pipeline(self) -> Pipeline: ...

    def pull(self, ticket: SyncTicket | None) -> SyncAck: ...

    def weight_version(self) -> int: ...


Staged = tuple[int, SyncTicket | None]
"""A policy version and its ticket (None: the workers already hold these weights)."""


class WeightBoard:
    """Policy versions staged for ``readers`` rollout workers (plain class; a Ray actor in a run)."""

    def __init__(self, readers: int) -> None:
        self.readers = readers
        self.staged: Staged | None = None
        self.held: dict[int, int] = {}  # worker rank -> the policy version it holds
        self.reading: dict[int, int] = {}  # worker rank -> the version it is pulling (claimed)
        self.unfreed: dict[int, tuple[SyncTicket, list[SyncAck]]] = {}  # version -> ticket, acks so far

    def post(self, version: int, ticket: SyncTicket | None) -> None:
        """The trainer staged ``version`` (the newest replaces older ones)."""
        if self.staged is not None and version <= self.staged[0]:
            raise StaleWeightVersionError(
                f"weight board: policy v{version} posted after v{self.staged[0]}; versions must increase"
            )
        self.staged = (version, ticket)
        if ticket is not None:
            self.unfreed[version] = (ticket, [])

    def newest(self) -> int:
        """The newest staged policy version (-1: none)."""
        return -1 if self.staged is None else self.staged[0]

    def claim(self, rank: int) -> Staged | None:
        """The newest version for worker ``rank`` to pull, if it is newer than what the worker holds."""
        if self.staged is None or self.staged[0] <= self.held.get(rank, -1):
            return None
        self.reading[rank] = self.staged[0]
        return self.staged

    def done(self, rank: int, version: int, ack: SyncAck | None) -> None:
        """Worker ``rank`` loaded (and verified) ``version``."""
        if self.reading.pop(rank, None) != version:
            raise RuntimeError(f"weight board: rollout{rank} reports v{version}, which it did not claim")
        self.held[rank] = version
        if ack is not None:
            self.unfreed[version][1].append(ack)

    def held_versions(self) -> list[int]:
        return [self.held.get(r, -1) for r in range(self.readers)]

    def collect(self) -> list[tuple[SyncTicket, list[SyncAck], int]]:
        """Tickets nobody will read any more, removed: ``(ticket, acks, receivers expected)``."""
        out = []
        newest = self.newest()
        for version, (ticket, acks) in list(self.unfreed.items()):
            if version in self.reading.values() or (version == newest and len(acks) < self.readers):
                continue  # a pull in progress, or a worker that will still pull it
            out.append((ticket, acks, len(acks)))
            del self.unfreed[version]
        return out


def attach_board(worker: BoardReader, board: Any, chunk_tokens: int | None) -> None:
    """Give ``worker`` the run's board (a Ray actor handle); ``chunk_tokens``: partial rollouts,
    a check for a newer policy every ``chunk_tokens`` decode steps (None: between batches only)."""
    from unirl.rollout.ar import PartialRollouts

    worker.board, worker.policy_version = board, -1
    if chunk_tokens is not None:  # AR pipelines only (the recipe checks it)
        _ar(worker).enable_partial(PartialRollouts(BoardSwap(worker), chunk_tokens))


def detach_board(worker: BoardReader) -> None:
    """The async phase is over: decode whole generations again, the board is gone."""
    worker.board = None
    _ar(worker).enable_partial(None)


def _ar(worker: BoardReader) -> ARPipeline:
    """The worker's pipeline, which partial rollouts (an AR decode loop) need to be an ARPipeline."""
    from unirl.rollout.ar import ARPipeline

    if not isinstance(worker.pipeline, ARPipeline):
        raise TypeError(f"rollout{worker.info.rank}: partial rollouts need an AR pipeline")
    return worker.pipeline


def catch_up(worker: BoardReader) -> tuple[int, int]:
    """Pull the newest staged version if newer than held; ``(policy version, weight version)``."""
    import ray

    rank = worker.info.rank
    claim = ray.get(worker.board.claim.remote(rank))
    if claim is not None:
        version, ticket = claim
        ack = None if ticket is None else worker.pull(ticket)
        ray.get(worker.board.done.remote(rank, version, ack))
        worker.policy_version = version
    return worker.policy_version, worker.weight_version()


class BoardSwap:
    """``unirl.rollout.ar.WeightSwap`` of a Ray rollout worker: a generation in progress asks the
    board between chunks and pulls a newer policy through the weight plane (verified, as between
    batches)."""

    def __init__(self, worker: BoardReader) -> None:
        self.worker = worker

    def held(self) -> tuple[int, int]:
        return self.worker.policy_version, self.worker.weight_version()

    def newer(self) -> bool:
        import ray

        return int(ray.get(self.worker.board.newest.remote())) > self.worker.policy_version

    def swap(self) -> None:
        catch_up(self.worker)
