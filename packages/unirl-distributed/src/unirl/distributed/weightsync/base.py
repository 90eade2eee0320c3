"""`BucketedWeightSync`: the push / receive loops every weight-sync implementation shares.

Subclasses move one bucket at a time (``_ship`` on the source, ``_fetch`` on a receiver) and free
their payload in ``_release``; gathering, checksums, version gates and acks live here.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from unirl.distributed.codec import TensorMeta
from unirl.distributed.errors import EmptyWeightSyncError, WeightSyncError
from unirl.distributed.weightsync.protocol import (
    DEFAULT_BUCKET_BYTES,
    NamedTensors,
    Sink,
    SyncAck,
    SyncTicket,
    VersionGate,
    bucket_checksum,
    check_acks,
    full_tensor,
    global_meta,
    overall_checksum,
    plan_buckets,
)

__all__ = ["BucketedWeightSync"]


class BucketedWeightSync(abc.ABC):
    """Push/receive loops shared by every implementation; subclasses move one bucket at a time."""

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

    def push(self, params: NamedTensors, version: int) -> SyncTicket:
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
        n = len(ticket.buckets)
        if len(ticket.bucket_checksums) != n or (self.needs_ticket and len(ticket.payload) != n):
            raise WeightSyncError(
                f"{self.name}: malformed ticket v{ticket.version}: {n} buckets, "
                f"{len(ticket.bucket_checksums)} checksums, {len(ticket.payload)} payload refs"
            )
        if overall_checksum(ticket.version, ticket.bucket_checksums) != ticket.checksum:
            # a bucket dropped from (or a checksum altered in) the ticket: caught before any bucket
            # is loaded, not by the overall check after the others were sunk
            raise WeightSyncError(
                f"{self.name}: ticket v{ticket.version}'s {n} bucket checksums do not hash to its overall "
                f"checksum {ticket.checksum}: a bucket was dropped or the ticket altered; nothing was "
                "loaded, resync this version from the trainer"
            )
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
