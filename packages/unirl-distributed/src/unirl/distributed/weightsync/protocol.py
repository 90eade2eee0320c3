"""The `WeightSync` protocol (weight plane: trainer -> rollout engine), tickets, acks and checks.

A sync ships named tensors in *buckets* (at most ``max_bucket_bytes`` each, a larger tensor gets
a bucket of its own), so neither side holds more than one bucket of gathered/decoded tensors at a
time. FSDP2 parameters may be DTensors: ``full_tensor()`` is called per parameter inside the
bucket loop (a collective: every trainer rank must call ``push``; only the source ships).

Every sync is versioned and verified:
- the sender stamps a version that must increase (:class:`VersionGate`); the receiver rejects a
  stale or repeated version with StaleWeightVersionError (and a skipped one when
  ``require_consecutive``);
- each bucket carries an XXH3-128 checksum of its tensors computed by the sender; the receiver
  recomputes it *before* handing the bucket to its sink, so corrupted bytes are never loaded;
- the receiver's :class:`SyncAck` carries the version and overall checksum; the sender's
  :meth:`WeightSync.confirm` checks every ack (a missing, skipped or mismatched ack is an error);
- a sync with zero tensors fails loudly (EmptyWeightSyncError).

:class:`WeightPlane` is the trainer's side of every kind (``push(policy, version)``, once after each
train step); :class:`WeightSync` adds the rollout side of the transports (``receive``, ``confirm``).
Which kind a run uses is the recipe's ``sync:`` (``unirl.distributed.weightsync.config``).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from unirl.distributed.codec import Checksum, TensorMeta
from unirl.distributed.errors import StaleWeightVersionError, WeightSyncError

NamedTensors = Iterable[tuple[str, torch.Tensor]]
Sink = Callable[[dict[str, torch.Tensor]], None]
DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class SyncTicket:
    """What the sender returns and the driver hands to the receivers (small: no tensor data).

    ``payload`` holds one transport reference per bucket (a store ref, a shared-memory name, an
    IPC handle) or is empty for transports that stream the data themselves (broadcast).
    """

    kind: str
    version: int
    checksum: str
    buckets: tuple[tuple[TensorMeta, ...], ...]
    bucket_checksums: tuple[str, ...]
    payload: tuple[Any, ...] = ()

    @property
    def num_tensors(self) -> int:
        """Tensors in the sync."""
        return sum(len(b) for b in self.buckets)

    @property
    def nbytes(self) -> int:
        """Bytes in the sync."""
        return sum(m.nbytes for b in self.buckets for m in b)


@dataclass(frozen=True)
class SyncAck:
    """A receiver's acknowledgement: the version it now serves and the checksum it verified."""

    receiver: str
    version: int
    checksum: str
    num_tensors: int


class WeightPlane(Protocol):
    """The trainer's side of the weight plane: ``push`` the policy as a new weight version."""

    kind: str

    def push(self, policy: NamedTensors, version: int) -> SyncTicket:
        """Ship ``policy`` as weight ``version``; every trainer rank calls it (DTensor gathers)."""
        ...


class WeightSync(WeightPlane, Protocol):
    """Trainer -> rollout weight transport; one object per process, on the sending or receiving side."""

    needs_ticket: bool
    """True when ``receive`` needs the sender's ticket (so the driver runs send, then receive);
    False for streaming transports, where push and receive run concurrently."""

    def receive(self, ticket: SyncTicket | None, sink: Sink) -> SyncAck:
        """Receive, verify each bucket, pass it to ``sink`` (e.g. ``model.load_weights``), ack."""
        ...

    def confirm(self, ticket: SyncTicket, acks: Sequence[SyncAck], expected_receivers: int) -> None:
        """Sender side: check every receiver acked this version and checksum; free the payload."""
        ...


class VersionGate:
    """Monotonic weight versions: each accepted version must exceed the last."""

    def __init__(self, where: str, require_consecutive: bool = False) -> None:
        self.where = where
        self.require_consecutive = require_consecutive
        self.last: int | None = None

    def check(self, version: int) -> None:
        """Raise unless ``version`` may follow the last accepted one."""
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ValueError(f"{self.where}: weight version must be an int >= 0, got {version!r}")
        if self.last is not None and version <= self.last:
            kind = "repeated" if version == self.last else "stale"
            raise StaleWeightVersionError(
                f"{self.where}: {kind} weight version {version} (last accepted {self.last}); versions "
                "must increase with every sync"
            )
        if self.require_consecutive and self.last is not None and version != self.last + 1:
            raise WeightSyncError(
                f"{self.where}: weight version {version} skips {self.last + 1}..{version - 1}; this "
                "receiver requires consecutive versions (require_consecutive=True)"
            )

    def commit(self, version: int) -> None:
        """Record ``version`` as accepted."""
        self.last = version


def plan_buckets(metas: Sequence[TensorMeta], max_bucket_bytes: int) -> list[list[int]]:
    """Greedy, order-preserving buckets of at most ``max_bucket_bytes`` (an oversized tensor alone).

    E.g. sizes [40, 40, 40, 100] with max 100 -> [[0, 1], [2], [3]].
    """
    if max_bucket_bytes < 1:
        raise ValueError(f"max_bucket_bytes={max_bucket_bytes} must be >= 1")
    buckets: list[list[int]] = []
    size = 0
    for i, m in enumerate(metas):
        if buckets and size + m.nbytes <= max_bucket_bytes:
            buckets[-1].append(i)
            size += m.nbytes
        else:
            buckets.append([i])
            size = m.nbytes
    return buckets


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The full (unsharded) value of ``t``: DTensor.full_tensor() for DTensors, else ``t``."""
    dtensor_mod = sys.modules.get("torch.distributed.tensor")
    if dtensor_mod is None:  # nobody imported DTensor (a ~5 s import), so ``t`` cannot be one
        return t
    if isinstance(t, dtensor_mod.DTensor):
        full: torch.Tensor = t.full_tensor()
        return full
    return t


def global_meta(name: str, t: torch.Tensor) -> TensorMeta:
    """Metadata of the full tensor (DTensor.shape is already the global shape)."""
    return TensorMeta.of(name, t)


def bucket_checksum(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Checksum of one bucket."""
    c = Checksum()
    for name, t in named:
        c.update(name, t)
    return c.hexdigest()


def overall_checksum(version: int, bucket_checksums: Iterable[str]) -> str:
    """The sync's checksum: a hash of the version and the bucket checksums, in order."""
    h = hashlib.blake2b(digest_size=16)
    h.update(str(version).encode())
    for c in bucket_checksums:
        h.update(bytes.fromhex(c))
    return h.hexdigest()


def check_acks(ticket: SyncTicket, acks: Sequence[SyncAck], expected_receivers: int) -> None:
    """Every expected receiver acked ``ticket``'s version with its checksum."""
    if len(acks) != expected_receivers:
        raise WeightSyncError(
            f"weight sync v{ticket.version}: {len(acks)} acks for {expected_receivers} receivers; a receiver "
            "skipped the sync"
        )
    for ack in acks:
        if ack.version != ticket.version or ack.checksum != ticket.checksum:
            raise WeightSyncError(
                f"weight sync v{ticket.version}: receiver {ack.receiver!r} acked v{ack.version} checksum "
                f"{ack.checksum} but the trainer sent checksum {ticket.checksum}"
            )
