"""Collective broadcast over a torch.distributed group (NCCL on GPU, gloo on CPU).

The group (a :class:`StandaloneGroup`) spans the trainer's source rank (group rank 0) and every
receiver. It is a *streaming* transport: the sender and receivers run concurrently (the driver
starts ``push`` async, then ``receive``). The stream is: a JSON header (version, bucket metadata,
bucket checksums), then one flat uint8 buffer per bucket. Receivers verify each bucket against the
header's checksum before sinking it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from unirl.distributed.codec import TensorMeta, from_bytes
from unirl.distributed.collective import StandaloneGroup
from unirl.distributed.errors import WeightSyncError
from unirl.distributed.weightsync.base import BucketedWeightSync
from unirl.distributed.weightsync.protocol import (
    NamedTensors,
    Sink,
    SyncAck,
    SyncTicket,
    bucket_checksum,
    overall_checksum,
)


class BroadcastWeightSync(BucketedWeightSync):
    """Weight sync by collective broadcast from group rank 0."""

    kind = "broadcast"
    needs_ticket = False

    def __init__(self, group: StandaloneGroup | None, **kw: Any) -> None:
        """``group=None`` makes a gather-only participant: a trainer rank that is not the source
        but must take part in the DTensor gathers."""
        super().__init__(is_source=group is not None and group.rank == 0, **kw)
        self._group = group
        nccl = group is not None and group.backend == "nccl"
        self.device = torch.device("cuda") if nccl else torch.device("cpu")

    @property
    def group(self) -> StandaloneGroup:
        """The broadcast group (receivers and the source have one)."""
        if self._group is None:
            raise TypeError(
                f"{self.name}: a gather-only participant (group=None) cannot send or receive data"
            )
        return self._group

    def _bcast_bytes(self, data: bytes | None) -> bytes:
        n = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=self.device)
        self.group.broadcast(n, 0)
        if data is not None:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        else:
            buf = torch.empty(int(n.item()), dtype=torch.uint8, device=self.device)
        self.group.broadcast(buf, 0)
        return bytes(buf.cpu().numpy().tobytes())

    def _flat(self, metas: tuple[TensorMeta, ...], tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(
            [t.detach().to(self.device).contiguous().reshape(-1).view(torch.uint8) for t in tensors]
        )

    def push(self, params: NamedTensors, version: int) -> SyncTicket:
        """Gather everything on every rank; the source checksums and broadcasts bucket by bucket.

        The header must name every bucket's checksum before the data, so the source computes the
        bucket checksums in a first pass (gathering DTensors per bucket) and broadcasts in a second.
        A failure before the header (stale version, zero tensors) is broadcast as an abort header,
        so the receivers raise too instead of waiting for the group's timeout.
        """
        items = list(params)
        buckets, sums = [], []
        try:
            self.sent.check(version)
            for metas, tensors in self._iter_buckets(items):
                buckets.append(metas)
                sums.append(bucket_checksum(zip((m.name for m in metas), tensors)) if self.verify else "")
        except Exception as exc:
            if self.is_source:
                self._bcast_bytes(json.dumps({"abort": f"{type(exc).__name__}: {exc}"}).encode())
            raise
        ticket = SyncTicket(self.kind, version, overall_checksum(version, sums), tuple(buckets), tuple(sums))
        if self.is_source:
            header = {
                "version": version,
                "checksums": sums,
                "buckets": [[m.to_json() for m in b] for b in buckets],
            }
            self._bcast_bytes(json.dumps(header).encode())
        for metas, tensors in self._iter_buckets(items):
            if self.is_source:
                self.group.broadcast(self._flat(metas, tensors), 0)
        self.sent.commit(version)
        return ticket

    def _ship(self, metas: tuple[TensorMeta, ...], tensors: list[torch.Tensor], checksum: str) -> Any:
        raise NotImplementedError("broadcast streams in push()")

    def _fetch(self, metas: tuple[TensorMeta, ...], payload: Any) -> list[torch.Tensor]:
        buf = torch.empty(sum(m.nbytes for m in metas), dtype=torch.uint8, device=self.device)
        self.group.broadcast(buf, 0)
        out, offset = [], 0
        for m in metas:
            out.append(from_bytes(buf[offset : offset + m.nbytes].clone(), m))
            offset += m.nbytes
        return out

    def receive(self, ticket: SyncTicket | None, sink: Sink) -> SyncAck:
        """Read the header from the stream, then each bucket; ``ticket`` is ignored (may be None)."""
        raw = self._bcast_bytes(None)
        try:
            header = json.loads(raw.decode())
            if isinstance(header, dict) and "abort" in header:
                raise WeightSyncError(f"{self.name}: the sender aborted this sync: {header['abort']}")
            version = header["version"]
            buckets = tuple(tuple(TensorMeta.from_json(m) for m in b) for b in header["buckets"])
            sums = tuple(str(c) for c in header["checksums"])
            if not isinstance(version, int) or len(sums) != len(buckets):
                raise ValueError("version/checksums malformed")
        except (ValueError, KeyError, TypeError) as exc:  # incl. UnicodeDecodeError, JSONDecodeError
            raise WeightSyncError(
                f"{self.name}: malformed broadcast header ({exc}); the group's stream is out of step: "
                "rebuild the weight-sync group before the next sync"
            ) from exc
        payload = tuple(None for _ in buckets)
        if not all(_is_digest(c) for c in sums):
            # the stream's layout is known (the buckets parsed): read it out so the sender finishes
            self._drain(SyncTicket(self.kind, version, "", buckets, sums, payload), 0)
            raise WeightSyncError(
                f"{self.name}: broadcast header v{version} carries a garbled bucket checksum; the sync "
                "was corrupted in transit and nothing was loaded"
            )
        streamed = SyncTicket(self.kind, version, overall_checksum(version, sums), buckets, sums, payload)
        try:
            self._check_ticket(streamed)
        except Exception:
            self._drain(streamed, 0)
            raise
        return super().receive(streamed, sink)

    def _drain(self, ticket: SyncTicket, start: int) -> None:
        """Take part in the remaining broadcasts so the sender is not left blocked."""
        for metas in ticket.buckets[start:]:
            self._fetch(metas, None)

    def confirm(self, ticket: SyncTicket, acks: Sequence[SyncAck], expected_receivers: int) -> None:
        """Check the acks (nothing to free)."""
        super().confirm(ticket, acks, expected_receivers)


def _is_digest(c: str) -> bool:
    """A hex digest as the sender writes them (empty when it does not verify)."""
    try:
        bytes.fromhex(c)
    except ValueError:
        return False
    return True
