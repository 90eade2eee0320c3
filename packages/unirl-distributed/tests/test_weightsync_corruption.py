"""Weight-sync corruption sweep: every seeded fault must be detected, and nothing bad loaded.

test_weightsync.py holds the contract (one flipped byte per implementation, stale and repeated
versions once). Here the same faults are swept over seeded positions for the two ticket
transports (safetensors buckets in an InProcessBlobStore, shared memory), so "detected" is a
rate over many draws, not one lucky byte:
- one flipped bit anywhere in one bucket's bytes (the safetensors header included), 50 seeds;
- one bucket dropped: from the ticket (caught before anything loads) or from the store / shm;
- a stale or repeated version after a random accepted one.
docs/reliability.md records the rates and the checksum's cost.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from unirl.distributed.errors import StaleWeightVersionError, WeightSyncError
from unirl.distributed.weightsync import (
    InProcessBlobStore,
    SharedMemoryWeightSync,
    SyncTicket,
    TensorBucketSync,
)

SEEDS = range(50)
BUCKET_BYTES = 512


def params() -> list[tuple[str, torch.Tensor]]:
    """A small model's worth of mixed tensors: several buckets of BUCKET_BYTES."""
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(16, 8, generator=g)),  # 512 B: a bucket alone
        ("blocks.0.attn.qkv", torch.randn(24, 4, generator=g).to(torch.bfloat16)),
        ("blocks.0.attn.bias", torch.randn(24, generator=g)),
        ("blocks.0.norm", torch.ones(8, dtype=torch.float16)),
        ("blocks.1.mlp", torch.randn(10, 10, generator=g, dtype=torch.float64)),  # 800 B: oversized
        ("blocks.1.mask", torch.tensor([True, False, True, True])),
        ("head.weight", torch.randn(8, 8, generator=g).t()),  # non-contiguous
        ("step", torch.tensor(3, dtype=torch.int64)),
    ]


@dataclass
class Pair:
    """A sender and a receiver of one transport, with hooks that reach into its payload."""

    sender: Any
    receiver: Any
    bucket_bytes: Callable[[SyncTicket, int], Any]  # a mutable byte buffer of bucket i
    lose_bucket: Callable[[SyncTicket, int], None]  # the payload of bucket i disappears


def _buckets() -> Pair:
    store = InProcessBlobStore()

    def bucket_bytes(ticket: SyncTicket, i: int) -> Any:
        ref = ticket.payload[i]
        store.blobs[ref] = bytearray(store.blobs[ref])  # type: ignore[assignment]  # mutable in place
        return store.blobs[ref]

    return Pair(
        TensorBucketSync(store, max_bucket_bytes=BUCKET_BYTES),
        TensorBucketSync(store, max_bucket_bytes=BUCKET_BYTES, name="engine"),
        bucket_bytes,
        lambda t, i: store.free([t.payload[i]]),
    )


def _shm() -> Pair:
    sender = SharedMemoryWeightSync(max_bucket_bytes=BUCKET_BYTES)

    def lose(ticket: SyncTicket, i: int) -> None:
        sender._release([ticket.payload[i]])  # the segment unlinked under the receiver

    return Pair(
        sender,
        SharedMemoryWeightSync(max_bucket_bytes=BUCKET_BYTES, name="engine"),
        lambda t, i: sender.segment(t.payload[i]).buf,
        lose,
    )


KINDS = {"tensor_buckets": _buckets, "shared_memory": _shm}


@pytest.fixture(params=list(KINDS))
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    p = KINDS[request.param]()
    yield p
    if isinstance(p.sender, SharedMemoryWeightSync):
        p.sender._release(list(p.sender._segments))


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    flat = [x.contiguous().reshape(-1).view(torch.uint8) for x in (a, b)]
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(*flat))


def _loaded_exactly(got: dict[str, torch.Tensor], ticket: SyncTicket, first_n_buckets: int) -> None:
    """The sink saw exactly buckets ``0..first_n_buckets-1``, bit-exact: nothing corrupted loaded."""
    want = [m.name for b in ticket.buckets[:first_n_buckets] for m in b]
    assert list(got) == want
    ref = dict(params())
    for name in want:
        assert _bits_equal(got[name], ref[name]), name


@pytest.mark.parametrize("seed", SEEDS)
def test_one_flipped_bit_is_detected(pair: Pair, seed: int) -> None:
    ticket = pair.sender.push(params(), 1)
    assert len(ticket.buckets) >= 4
    rng = random.Random(seed)
    i = rng.randrange(len(ticket.buckets))
    buf = pair.bucket_bytes(ticket, i)
    bit = rng.randrange(len(buf) * 8)
    buf[bit // 8] ^= 1 << (bit % 8)
    got: dict[str, torch.Tensor] = {}
    with pytest.raises(WeightSyncError):
        pair.receiver.receive(ticket, got.update)
    _loaded_exactly(got, ticket, i)
    assert pair.receiver.received.last is None  # the version was not accepted


@pytest.mark.parametrize("seed", range(10))
def test_bucket_dropped_from_ticket_is_detected_before_loading(pair: Pair, seed: int) -> None:
    ticket = pair.sender.push(params(), 1)
    i = random.Random(seed).randrange(len(ticket.buckets))

    def without(xs: tuple[Any, ...]) -> tuple[Any, ...]:
        return xs[:i] + xs[i + 1 :]

    bad = dataclasses.replace(
        ticket,
        buckets=without(ticket.buckets),
        bucket_checksums=without(ticket.bucket_checksums),
        payload=without(ticket.payload),
    )
    got: dict[str, torch.Tensor] = {}
    with pytest.raises(
        WeightSyncError, match="a bucket was dropped or the ticket altered; nothing was loaded"
    ):
        pair.receiver.receive(bad, got.update)
    assert got == {} and pair.receiver.received.last is None


@pytest.mark.parametrize("seed", range(10))
def test_bucket_lost_in_transit_is_detected(pair: Pair, seed: int) -> None:
    ticket = pair.sender.push(params(), 1)
    i = random.Random(seed).randrange(len(ticket.buckets))
    pair.lose_bucket(ticket, i)
    got: dict[str, torch.Tensor] = {}
    with pytest.raises(WeightSyncError, match="not in the blob store|is gone"):
        pair.receiver.receive(ticket, got.update)
    _loaded_exactly(got, ticket, i)
    assert pair.receiver.received.last is None


@pytest.mark.parametrize("seed", range(20))
def test_stale_or_repeated_version_is_rejected(pair: Pair, seed: int) -> None:
    rng = random.Random(seed)
    accepted = rng.randrange(1, 100)
    pair.receiver.receive(pair.sender.push(params(), accepted), lambda b: None)
    old = rng.randrange(0, accepted + 1)  # accepted itself: a repeat
    pair.sender.sent.last = None  # a sender restarted without its version state
    ticket = pair.sender.push(params(), old)
    kind = "repeated" if old == accepted else "stale"
    got: dict[str, torch.Tensor] = {}
    with pytest.raises(
        StaleWeightVersionError, match=f"{kind} weight version {old} \\(last accepted {accepted}\\)"
    ):
        pair.receiver.receive(ticket, got.update)
    assert got == {} and pair.receiver.received.last == accepted


def test_control_untouched_sync_loads_everything(pair: Pair) -> None:
    """The sweep's baseline: the same sync without a fault is accepted, every bucket bit-exact."""
    ticket = pair.sender.push(params(), 1)
    got: dict[str, torch.Tensor] = {}
    assert pair.receiver.receive(ticket, got.update).version == 1
    _loaded_exactly(got, ticket, len(ticket.buckets))
