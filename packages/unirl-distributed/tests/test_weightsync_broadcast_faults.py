"""Weight-sync faults on the broadcast transport (a real gloo group of two ranks, here as two threads).

test_weightsync.py holds the contract (one flipped byte of the first bucket). Here the faults are
swept over seeded places, as test_weightsync_corruption.py does for the ticket transports:
- one flipped bit anywhere in any message the receiver gets (the JSON header or any bucket),
  50 seeds: the sync fails (in ``receive``, or in the sender's ``confirm`` when the flip turned the
  header's version into another number), nothing corrupted reaches the sink, and the receiver
  does not accept the version it was sent;
- a stale or repeated version from a restarted sender: refused by the receiver, nothing loaded.
docs/reliability.md records the rates.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch

from unirl.distributed.collective import StandaloneGroup, free_port
from unirl.distributed.errors import StaleWeightVersionError, WeightSyncError
from unirl.distributed.weightsync import BroadcastWeightSync

BUCKET_BYTES = 512
TIMEOUT_S = 10.0  # also the rendezvous (2 s failed it under CI load); a receiver that cannot read the header leaves the sender to the group's timeout


def params() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(16, 8, generator=g)),
        ("blocks.0.attn.qkv", torch.randn(24, 4, generator=g).to(torch.bfloat16)),
        ("blocks.0.norm", torch.ones(8, dtype=torch.float16)),
        ("blocks.1.mlp", torch.randn(10, 10, generator=g, dtype=torch.float64)),
        ("head.weight", torch.randn(8, 8, generator=g).t()),
        ("step", torch.tensor(3, dtype=torch.int64)),
    ]


class FaultGroup(StandaloneGroup):
    """A real gloo group whose receiving side flips one bit of its ``target``-th uint8 message
    (0: the JSON header, 1..: the buckets) after it arrived."""

    target: int | None = None
    bit = 0
    seen = 0

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        super().broadcast(tensor, src)
        if tensor.dtype != torch.uint8 or self.target is None:
            return
        if self.seen == self.target:
            b = self.bit % (tensor.numel() * 8)
            tensor.view(-1)[b // 8] ^= 1 << (b % 8)
            self.target = None
        self.seen += 1


@dataclass
class Link:
    send: StandaloneGroup
    recv: FaultGroup
    pool: ThreadPoolExecutor


@pytest.fixture
def link() -> Iterator[Link]:
    port = free_port()
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(StandaloneGroup, "gloo", "127.0.0.1", port, 0, 2, TIMEOUT_S)
        recv = FaultGroup("gloo", "127.0.0.1", port, 1, 2, TIMEOUT_S)
        send = fut.result(timeout=30)
    pool = ThreadPoolExecutor(1)
    yield Link(send, recv, pool)
    pool.shutdown(wait=True)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    flat = [x.contiguous().reshape(-1).view(torch.uint8) for x in (a, b)]
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(*flat))


def _sync(link: Link, sender: BroadcastWeightSync, receiver: BroadcastWeightSync, version: int) -> dict:
    """Push and receive concurrently, then confirm; each outcome recorded (not raised)."""
    got: dict[str, torch.Tensor] = {}
    fut = link.pool.submit(sender.push, params(), version)
    out: dict = {"got": got, "recv_error": None, "push_error": None, "confirm_error": None}
    try:
        ack = receiver.receive(None, got.update)
    except (WeightSyncError, StaleWeightVersionError) as e:
        out["recv_error"], ack = e, None
    try:
        ticket = fut.result(timeout=60)
    except Exception as e:  # the sender left to the group's timeout (an unreadable header)
        out["push_error"], ticket = e, None
    if ticket is not None and ack is not None:
        try:
            sender.confirm(ticket, [ack], 1)
        except WeightSyncError as e:
            out["confirm_error"] = e
    out["ticket"] = ticket
    return out


@pytest.mark.parametrize("seed", range(50))
def test_one_flipped_bit_anywhere_in_the_stream_is_detected(link: Link, seed: int) -> None:
    rng = random.Random(seed)
    sender = BroadcastWeightSync(link.send, max_bucket_bytes=BUCKET_BYTES)
    receiver = BroadcastWeightSync(link.recv, max_bucket_bytes=BUCKET_BYTES, name="engine")
    n_buckets = 4  # plan_buckets of params() at 512 bytes (asserted below)
    link.recv.target, link.recv.bit = rng.randrange(n_buckets + 1), rng.randrange(1 << 20)
    out = _sync(link, sender, receiver, version=7)
    failed = [k for k in ("recv_error", "push_error", "confirm_error") if out[k] is not None]
    assert failed, f"seed {seed}: a flipped bit in message {link.recv.target} went unnoticed"
    assert receiver.received.last != 7 or out["confirm_error"] is not None
    ref = dict(params())
    for name, t in out["got"].items():  # whatever reached the sink is bit-exact
        assert _bits_equal(t, ref[name]), f"seed {seed}: corrupted {name} reached the sink"
    if out["ticket"] is not None:
        assert len(out["ticket"].buckets) == n_buckets


def test_control_untouched_stream_loads_everything(link: Link) -> None:
    sender = BroadcastWeightSync(link.send, max_bucket_bytes=BUCKET_BYTES)
    receiver = BroadcastWeightSync(link.recv, max_bucket_bytes=BUCKET_BYTES, name="engine")
    out = _sync(link, sender, receiver, version=1)
    assert not any(out[k] for k in ("recv_error", "push_error", "confirm_error"))
    assert len(out["ticket"].buckets) == 4 and receiver.received.last == 1
    assert all(_bits_equal(out["got"][n], t) for n, t in params())


@pytest.mark.parametrize("seed", range(10))
def test_stale_or_repeated_version_from_a_restarted_sender_is_refused(link: Link, seed: int) -> None:
    rng = random.Random(seed)
    receiver = BroadcastWeightSync(link.recv, max_bucket_bytes=BUCKET_BYTES, name="engine")
    accepted = rng.randrange(1, 100)
    first = _sync(link, BroadcastWeightSync(link.send, max_bucket_bytes=BUCKET_BYTES), receiver, accepted)
    assert first["recv_error"] is None and receiver.received.last == accepted
    old = rng.randrange(0, accepted + 1)
    out = _sync(link, BroadcastWeightSync(link.send, max_bucket_bytes=BUCKET_BYTES), receiver, old)
    kind = "repeated" if old == accepted else "stale"
    assert isinstance(out["recv_error"], StaleWeightVersionError), out
    assert f"{kind} weight version {old}" in str(out["recv_error"])
    assert out["got"] == {} and receiver.received.last == accepted
    assert out["push_error"] is None  # the receiver drained the stream: the sender was not left hanging
