"""The `WeightSync` protocol (weight plane: trainer -> rollout engine) and its shared machinery.

A sync ships named tensors in *buckets* (at most ``max_bucket_bytes`` each, a larger tensor gets
a bucket of its own), so neither side holds more than one bucket of gathered/decoded tensors at a
time. FSDP2 parameters may be DTensors: ``full_tensor()`` is called per parameter inside the
bucket loop (a collective: every trainer rank must call ``send``; only the source ships).

Every sync is versioned and verified:
- the sender stamps a version that must increase (:class:`VersionGate`); the receiver rejects a
  stale or repeated version with StaleWeightVersionError (and a skipped one when
  ``require_consecutive``);
- each bucket carries a BLAKE2b checksum of its tensors computed by the sender; the receiver
  recomputes it *before* handing the bucket to its sink, so corrupted bytes are never loaded;
- the receiver's :class:`SyncAck` carries the version and overall checksum; the sender's
  :meth:`WeightSync.confirm` checks every ack (a missing, skipped or mismatched ack is an error);
- a sync with zero tensors fails loudly (EmptyWeightSyncError).
"""

from __future__ import annotations

import abc
import hashlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from unirl.distributed.codec import Checksum, TensorMeta
from unirl.distributed.errors import EmptyWeightSyncError, StaleWeightVersionError, WeightSyncError

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


class WeightSync(Protocol):
    """Trainer -> engine weight transfer; one object per process, on the sending or receiving side."""

    kind: str
    needs_ticket: bool
    """True when ``receive`` needs the sender's ticket (so the driver runs send, then receive);
    False for streaming transports, where send and receive run concurrently."""

    def send(self, params: NamedTensors, version: int) -> SyncTicket:
        """Ship ``params`` as weight ``version``; every trainer rank calls it (DTensor gathers)."""
        ...

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


class BucketedWeightSync(abc.ABC):
    """Send/receive loops shared by every implementation; subclasses move one bucket at a time."""

    kind: str = "abstract"
    needs_ticket: bool = True

    def __init__(
        self,
        *,
        name: str = "weights",
        is_source: bool = True,
        max_bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        verify: bool = True,
        require_consecutive: bool = False,
    ) -> None:
        self.name = name
        self.is_source = is_source
        self.max_bucket_bytes = max_bucket_bytes
        self.verify = verify
        self.sent = VersionGate(f"{name} sender")
        self.received = VersionGate(f"{name} receiver", require_consecutive)

    # -- transport hooks ------------------------------------------------------------------------
    @abc.abstractmethod
    def _ship(self, metas: tuple[TensorMeta, ...], tensors: list[torch.Tensor], checksum: str) -> Any:
        """Move one bucket out of the source; returns its payload reference."""

    @abc.abstractmethod
    def _fetch(self, metas: tuple[TensorMeta, ...], payload: Any) -> list[torch.Tensor]:
        """Materialise one bucket on the receiver (fresh tensors the sink may keep)."""

    def _release(self, payload: Sequence[Any]) -> None:
        """Free the ticket's payload once every receiver acked (default: nothing to free)."""
        return None

    def _drain(self, ticket: SyncTicket, start: int) -> None:
        """Consume buckets ``start..`` without loading them (streaming transports must, or the
        sender blocks); default: nothing to do."""
        return None

    # -- sender ---------------------------------------------------------------------------------
    def _iter_buckets(
        self, params: NamedTensors
    ) -> Iterator[tuple[tuple[TensorMeta, ...], list[torch.Tensor]]]:
        items = list(params)
        metas = [global_meta(n, t) for n, t in items]
        if not items:
            raise EmptyWeightSyncError(
                f"{self.name}: weight sync with zero tensors (e.g. LoRA bound to zero modules, or a filter "
                "that matched nothing); check the target modules / parameter names"
            )
        for idx in plan_buckets(metas, self.max_bucket_bytes):
            # full_tensor() per parameter, inside the loop: one bucket of full tensors alive at a time
            yield tuple(metas[i] for i in idx), [full_tensor(items[i][1]).detach() for i in idx]

    def send(self, params: NamedTensors, version: int) -> SyncTicket:
        """Gather (DTensors), checksum and ship bucket by bucket; the source returns the ticket."""
        self.sent.check(version)
        buckets: list[tuple[TensorMeta, ...]] = []
        sums: list[str] = []
        payload: list[Any] = []
        for metas, tensors in self._iter_buckets(params):
            if not self.is_source:
                continue  # non-source ranks only took part in the gathers
            s = bucket_checksum(zip((m.name for m in metas), tensors)) if self.verify else ""
            payload.append(self._ship(metas, tensors, s))
            buckets.append(metas)
            sums.append(s)
            del tensors
        self.sent.commit(version)
        return SyncTicket(
            self.kind, version, overall_checksum(version, sums), tuple(buckets), tuple(sums), tuple(payload)
        )

    def confirm(self, ticket: SyncTicket, acks: Sequence[SyncAck], expected_receivers: int) -> None:
        """Check the acks, then free the payload (also when the check fails)."""
        try:
            check_acks(ticket, acks, expected_receivers)
        finally:
            self._release(ticket.payload)

    # -- receiver -------------------------------------------------------------------------------
    def _check_ticket(self, ticket: SyncTicket | None) -> SyncTicket:
        if ticket is None:
            raise TypeError(f"{self.name}: {self.kind} sync needs the sender's ticket to receive")
        if ticket.kind != self.kind:
            raise TypeError(f"{self.name}: a {ticket.kind!r} ticket was given to a {self.kind!r} receiver")
        if ticket.num_tensors == 0:
            raise EmptyWeightSyncError(f"{self.name}: weight sync v{ticket.version} carries zero tensors")
        self.received.check(ticket.version)
        return ticket

    def _verify_bucket(
        self, version: int, i: int, metas: tuple[TensorMeta, ...], tensors: list[torch.Tensor], expected: str
    ) -> str:
        for m, t in zip(metas, tensors):
            if TensorMeta.of(m.name, t) != m:
                raise WeightSyncError(
                    f"{self.name} v{version}: tensor {m.name!r} arrived as {TensorMeta.of(m.name, t)}, expected {m}"
                )
        if not self.verify:
            return expected
        got = bucket_checksum(zip((m.name for m in metas), tensors))
        if got != expected:
            raise WeightSyncError(
                f"{self.name} v{version}: bucket {i} ({[m.name for m in metas][:4]}...) checksum {got} != "
                f"trainer's {expected}; the bytes were corrupted in transit. The bucket was NOT loaded; "
                "weights up to the previous bucket are from this version, resync before sampling"
            )
        return got

    def receive(self, ticket: SyncTicket | None, sink: Sink) -> SyncAck:
        """Fetch, verify and sink each bucket, then accept the version and ack."""
        t = self._check_ticket(ticket)
        sums = []
        for i, (metas, payload) in enumerate(zip(t.buckets, t.payload)):
            tensors = self._fetch(metas, payload)
            try:
                sums.append(self._verify_bucket(t.version, i, metas, tensors, t.bucket_checksums[i]))
            except WeightSyncError:
                self._drain(t, i + 1)
                raise
            sink({m.name: x for m, x in zip(metas, tensors)})
        checksum = overall_checksum(t.version, sums)
        if checksum != t.checksum:
            raise WeightSyncError(
                f"{self.name} v{t.version}: overall checksum {checksum} != ticket's {t.checksum}"
            )
        self.received.commit(t.version)
        return SyncAck(self.name, t.version, checksum, t.num_tensors)
