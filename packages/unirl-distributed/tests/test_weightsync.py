"""WeightSync contract tests, in one process (broadcast runs its two gloo ranks in two threads).

Every implementation must: round-trip bit-exactly (mixed dtypes, 0-dim, non-contiguous), bucket
by size, reject stale / repeated / skipped versions, detect a flipped byte before loading the
bucket, refuse an empty sync, and check acks on the sender side.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from unirl.distributed.codec import TensorMeta
from unirl.distributed.collective import StandaloneGroup, free_port
from unirl.distributed.errors import EmptyWeightSyncError, StaleWeightVersionError, WeightSyncError
from unirl.distributed.weightsync import (
    BroadcastWeightSync,
    BucketedWeightSync,
    InProcessBlobStore,
    LoraOnlySync,
    SharedMemoryWeightSync,
    SyncAck,
    SyncTicket,
    TensorBucketSync,
    plan_buckets,
)


def model_params() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 5, generator=g)
    return [
        ("layer.weight", w.t()),  # non-contiguous
        ("layer.bias", torch.randn(6, generator=g).to(torch.bfloat16)),
        ("step", torch.tensor(7, dtype=torch.int64)),  # 0-dim
        ("mask", torch.tensor([True, False, True])),
        ("emb", torch.randn(40, 8, generator=g, dtype=torch.float64)),  # 2560 bytes: its own bucket
        ("nan", torch.tensor([float("nan"), -0.0, float("inf")])),
    ]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and bool(
            torch.equal(
                a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
            )
        )
    )


class FlipGroup(StandaloneGroup):
    """A real gloo group whose receiving side flips one byte of the next large broadcast."""

    flip_next = False
    seen = 0

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        super().broadcast(tensor, src)
        if self.flip_next and tensor.dtype == torch.uint8 and tensor.numel() >= 64:
            self.seen += 1
            if self.seen == 2:  # the first large uint8 broadcast is the header; flip bucket 0
                tensor[-1] ^= 0xFF
                self.flip_next = False


@dataclass
class Harness:
    """A sender/receiver pair of one implementation plus how to run and corrupt a sync."""

    kind: str
    make_sender: Callable[[], Any]
    receiver: Any
    corrupt: Callable[[Any, SyncTicket], None]
    streaming: bool = False
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1))
    sender: Any = None

    def __post_init__(self) -> None:
        self.sender = self.make_sender()

    def sync(
        self,
        params: list[tuple[str, torch.Tensor]],
        version: int,
        sender: Any = None,
        before_receive: Callable[[SyncTicket], None] | None = None,
    ) -> tuple[SyncTicket, SyncAck, dict[str, torch.Tensor]]:
        sender = sender or self.sender
        got: dict[str, torch.Tensor] = {}
        if self.streaming:
            fut = self.pool.submit(sender.push, params, version)
            try:
                ack = self.receiver.receive(None, got.update)
            finally:
                ticket = fut.result(timeout=30)
        else:
            ticket = sender.push(params, version)
            if before_receive is not None:
                before_receive(ticket)
            ack = self.receiver.receive(ticket, got.update)
        return ticket, ack, got


def _buckets() -> Harness:
    store = InProcessBlobStore()

    def corrupt(sender: Any, ticket: SyncTicket) -> None:
        ref = ticket.payload[-1]
        data = bytearray(store.blobs[ref])
        data[-1] ^= 0xFF  # last byte of tensor data (the header is at the front)
        store.blobs[ref] = bytes(data)

    return Harness(
        "tensor_buckets",
        lambda: TensorBucketSync(store, max_bucket_bytes=256),
        TensorBucketSync(store, max_bucket_bytes=256, name="engine"),
        corrupt,
    )


def _shm() -> Harness:
    def corrupt(sender: Any, ticket: SyncTicket) -> None:
        seg = sender.segment(ticket.payload[-1])
        seg.buf[0] ^= 0xFF

    return Harness(
        "shared_memory",
        lambda: SharedMemoryWeightSync(max_bucket_bytes=256),
        SharedMemoryWeightSync(max_bucket_bytes=256, name="engine"),
        corrupt,
    )


def _lora() -> Harness:
    h = _buckets()
    return Harness("lora", lambda: LoraOnlySync(h.make_sender()), LoraOnlySync(h.receiver), h.corrupt)


def _broadcast() -> Harness:
    port = free_port()
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(StandaloneGroup, "gloo", "127.0.0.1", port, 0, 2, 30.0)
        recv_group = FlipGroup("gloo", "127.0.0.1", port, 1, 2, 30.0)
        send_group = fut.result(timeout=30)

    def corrupt(sender: Any, ticket: SyncTicket) -> None:
        recv_group.flip_next = True

    return Harness(
        "broadcast",
        lambda: BroadcastWeightSync(send_group, max_bucket_bytes=256),
        BroadcastWeightSync(recv_group, max_bucket_bytes=256, name="engine"),
        corrupt,
        streaming=True,
    )


FACTORIES = {"tensor_buckets": _buckets, "shared_memory": _shm, "broadcast": _broadcast}


@pytest.fixture(params=list(FACTORIES))
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    h = FACTORIES[request.param]()
    yield h
    h.pool.shutdown(wait=False)


class TestWeightSyncContract:
    def test_round_trip_is_bit_exact_and_bucketed(self, harness: Harness) -> None:
        params = model_params()
        ticket, ack, got = harness.sync(params, version=1)
        assert list(got) == [n for n, _ in params]
        for name, t in params:
            assert same_bits(got[name], t), name
        # sizes 120, 12, 8, 3, 2560, 12 with max 256 -> [[0..3], [4], [5]]
        assert [len(b) for b in ticket.buckets] == [4, 1, 1]
        assert (ack.version, ack.checksum, ack.num_tensors) == (1, ticket.checksum, 6)
        harness.sender.confirm(ticket, [ack], expected_receivers=1)

    def test_versions_must_increase(self, harness: Harness) -> None:
        params = model_params()
        harness.sync(params, version=2)
        with pytest.raises(StaleWeightVersionError, match="repeated weight version 2"):
            harness.sender.sent.last = None  # a sender restarted without its version state
            harness.sync(params, version=2)
        if harness.streaming:
            return  # the stream was drained; a broadcast receiver sees the same check either way
        with pytest.raises(StaleWeightVersionError, match="stale weight version 1 \\(last accepted 2\\)"):
            harness.sync(params, version=1, sender=harness.make_sender())

    def test_sender_rejects_non_increasing_versions_before_sending(self, harness: Harness) -> None:
        harness.sync(model_params(), version=5)
        if harness.streaming:
            fut = harness.pool.submit(harness.sender.push, model_params(), 5)
            with pytest.raises(WeightSyncError, match="sender aborted this sync: StaleWeightVersionError"):
                harness.receiver.receive(None, lambda b: None)
            with pytest.raises(StaleWeightVersionError, match="weights sender"):
                fut.result(timeout=30)
            return
        with pytest.raises(StaleWeightVersionError, match="weights sender"):
            harness.sender.push(model_params(), 5)

    def test_flipped_byte_is_detected_and_bucket_not_loaded(self, harness: Harness) -> None:
        params = model_params()
        loaded: list[str] = []
        if harness.streaming:
            harness.corrupt(harness.sender, None)  # type: ignore[arg-type]  # broadcast flips in flight
            fut = harness.pool.submit(harness.sender.push, params, 1)
            with pytest.raises(WeightSyncError, match="checksum .* != trainer's"):
                harness.receiver.receive(None, lambda b: loaded.extend(b))
            fut.result(timeout=30)
        else:
            with pytest.raises(WeightSyncError, match="checksum|not valid safetensors"):
                harness.sync(params, 1, before_receive=lambda t: harness.corrupt(harness.sender, t))
        assert "nan" not in loaded  # the corrupted bucket (and the ones after it) never reached the sink
        assert harness.receiver.received.last is None  # the version was not accepted

    def test_empty_sync_fails_loudly(self, harness: Harness) -> None:
        if harness.streaming:  # the receivers learn it from the stream and fail too, no timeout
            fut = harness.pool.submit(harness.sender.push, [], 1)
            with pytest.raises(WeightSyncError, match="sender aborted this sync: EmptyWeightSyncError"):
                harness.receiver.receive(None, lambda b: None)
            with pytest.raises(EmptyWeightSyncError, match="zero tensors"):
                fut.result(timeout=30)
            return
        with pytest.raises(EmptyWeightSyncError, match="zero tensors"):
            harness.sender.push([], 1)

    def test_confirm_detects_missing_and_mismatched_acks(self, harness: Harness) -> None:
        ticket, ack, _ = harness.sync(model_params(), version=1)
        with pytest.raises(WeightSyncError, match="1 acks for 2 receivers"):
            harness.sender.confirm(ticket, [ack], expected_receivers=2)
        bad = SyncAck("engine", 1, "0" * 32, ack.num_tensors)
        with pytest.raises(WeightSyncError, match="acked v1 checksum 0+ but the trainer sent"):
            harness.sender.confirm(ticket, [bad], expected_receivers=1)


def test_skipped_version_rejected_when_consecutive_required() -> None:
    store = InProcessBlobStore()
    sender = TensorBucketSync(store)
    receiver = TensorBucketSync(store, require_consecutive=True)
    receiver.receive(sender.push(model_params(), 1), lambda b: None)
    with pytest.raises(WeightSyncError, match="skips 2..2"):
        receiver.receive(sender.push(model_params(), 3), lambda b: None)


def test_lora_only_ships_adapters_and_refuses_zero_adapters() -> None:
    store = InProcessBlobStore()
    sender, receiver = LoraOnlySync(TensorBucketSync(store)), LoraOnlySync(TensorBucketSync(store))
    params = [
        ("q.base_layer.weight", torch.ones(4, 4)),
        ("q.lora_A.default.weight", torch.ones(2, 4)),
        ("q.lora_B.default.weight", torch.zeros(4, 2)),
    ]
    got: dict[str, torch.Tensor] = {}
    ack = receiver.receive(sender.push(params, 1), got.update)
    assert sorted(got) == ["q.lora_A.default.weight", "q.lora_B.default.weight"] and ack.num_tensors == 2
    with pytest.raises(EmptyWeightSyncError, match="LoRA is bound to zero modules"):
        sender.push(params[:1], 2)


def test_plan_buckets_worked_example() -> None:
    metas = [TensorMeta(str(i), "uint8", (n,)) for i, n in enumerate([40, 40, 40, 100, 300])]
    assert plan_buckets(metas, 100) == [[0, 1], [2], [3], [4]]


def test_receiver_refuses_wrong_kind_and_missing_ticket() -> None:
    store = InProcessBlobStore()
    ticket = TensorBucketSync(store).push(model_params(), 1)
    with pytest.raises(TypeError, match="'tensor_buckets' ticket was given to a 'shared_memory'"):
        SharedMemoryWeightSync().receive(ticket, lambda b: None)
    with pytest.raises(TypeError, match="needs the sender's ticket"):
        TensorBucketSync(store).receive(None, lambda b: None)


def test_verify_off_skips_checksums() -> None:
    store = InProcessBlobStore()
    sender, receiver = TensorBucketSync(store, verify=False), TensorBucketSync(store, verify=False)
    ticket = sender.push(model_params(), 1)
    assert ticket.bucket_checksums == ("",)
    assert receiver.receive(ticket, lambda b: None).version == 1


def test_bucketed_base_is_abstract() -> None:
    with pytest.raises(TypeError):
        BucketedWeightSync()  # type: ignore[abstract]  # the point of the test
    assert threading.active_count() >= 1


def test_tied_and_view_sharing_params_round_trip_through_buckets() -> None:
    store = InProcessBlobStore()
    sender, receiver = TensorBucketSync(store), TensorBucketSync(store)
    emb = torch.randn(5, 3)
    fused = torch.randn(6, 3)
    params = [("embed.weight", emb), ("lm_head.weight", emb), ("q", fused[:3]), ("k", fused[3:])]
    got: dict[str, torch.Tensor] = {}
    receiver.receive(sender.push(params, 1), got.update)
    for name, t in params:
        assert torch.equal(got[name], t), name


def test_malformed_ticket_is_rejected() -> None:
    import dataclasses

    store = InProcessBlobStore()
    ticket = TensorBucketSync(store, max_bucket_bytes=256).push(model_params(), 1)
    bad = dataclasses.replace(ticket, payload=ticket.payload[:1])
    with pytest.raises(WeightSyncError, match="malformed ticket v1: 3 buckets, 3 checksums, 1 payload refs"):
        TensorBucketSync(store).receive(bad, lambda b: None)


class _Trainer:
    def __init__(self, info: Any, store: InProcessBlobStore) -> None:
        self.sync = TensorBucketSync(store, is_source=info.rank == 0, max_bucket_bytes=256)

    def push(self, version: int) -> SyncTicket:
        return self.sync.push(model_params(), version)

    def confirm(self, ticket: SyncTicket, acks: list[SyncAck], n: int) -> None:
        self.sync.confirm(ticket, acks, n)


class _Engine:
    def __init__(self, info: Any, store: InProcessBlobStore) -> None:
        self.sync = TensorBucketSync(store, name=f"engine{info.rank}")
        self.weights: dict[str, torch.Tensor] = {}

    def pull(self, ticket: SyncTicket | None) -> SyncAck:
        return self.sync.receive(ticket, self.weights.update)


def test_drive_weight_sync_over_local_remotes() -> None:
    from functools import partial

    from unirl.distributed import LocalRemote, MeshShape
    from unirl.distributed.weightsync import drive_weight_sync

    store = InProcessBlobStore()
    trainer = LocalRemote(partial(_Trainer, store=store), name="trainer", mesh=MeshShape(dp=2))
    engine = LocalRemote(partial(_Engine, store=store), name="engine", mesh=MeshShape(dp=2))
    for version in (1, 2):
        ticket = drive_weight_sync(
            trainer,
            engine,
            push=_Trainer.push,
            pull=_Engine.pull,
            confirm=_Trainer.confirm,
            version=version,
            streaming=False,
        )
        assert ticket.version == version
    assert store.blobs == {}  # confirm freed every bucket
    for w in engine.workers:
        assert all(same_bits(w.weights[n], t) for n, t in model_params())
