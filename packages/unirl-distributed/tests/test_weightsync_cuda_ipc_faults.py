"""CUDA IPC weight-sync fault sweep (GPU): every seeded fault is detected, nothing bad is loaded.

The sweep of test_weightsync_corruption.py (buckets, shared memory) and of
test_weightsync_broadcast_faults.py (gloo), for the colocated CUDA IPC transport: the sender keeps
one flat CUDA buffer per bucket and ships its IPC handle; a receiver in another process (spawned,
as a colocated engine is) maps it and copies out. Faults, applied to the sender's buffer after
``push`` and before the receiver maps it:

- one flipped bit at a seeded position of a seeded bucket, 50 seeds;
- a bucket dropped from the ticket, 10 seeds: refused before anything loads;
- a bucket's buffer reused after release (zeroed under the receiver), 10 seeds;
- a stale or repeated version after a random accepted one, 20 seeds.

Each must raise a ``WeightSyncError`` (stale: ``StaleWeightVersionError``) in the receiver, and
the sink must hold exactly the buckets before the faulty one, bit-exact. docs/reliability.md §2.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BUCKET_BYTES = 4096
TIMEOUT_S = 120


def params() -> list[tuple[str, torch.Tensor]]:
    """Mixed dtypes and sizes on the GPU: several buckets, one oversized, one non-contiguous."""
    g = torch.Generator(device="cuda").manual_seed(0)
    return [
        ("embed.weight", torch.randn(32, 32, device="cuda", generator=g)),  # 4 KiB: alone
        ("blocks.0.qkv", torch.randn(48, 16, device="cuda", generator=g).to(torch.bfloat16)),
        ("blocks.0.bias", torch.randn(48, device="cuda", generator=g)),
        ("blocks.0.norm", torch.ones(16, device="cuda", dtype=torch.float16)),
        ("blocks.1.mlp", torch.randn(40, 40, device="cuda", generator=g, dtype=torch.float64)),
        ("blocks.1.mask", torch.tensor([True, False, True], device="cuda")),
        ("head.weight", torch.randn(16, 24, device="cuda", generator=g).t()),
        ("lora_A.weight", torch.randn(8, 32, device="cuda", generator=g).to(torch.float16)),
    ]


class Receiver:
    """A spawned receiver process; ``ask`` sends one ticket and returns its answer."""

    def __init__(self) -> None:
        sys.path.insert(0, str(Path(__file__).parent))  # spawned children inherit sys.path
        import _cuda_ipc_child

        ctx = mp.get_context("spawn")
        self.requests, self.answers = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_cuda_ipc_child.serve, args=(self.requests, self.answers))
        self.proc.start()

    def ask(self, key: str, ticket: Any) -> tuple[str, Any, list[tuple[str, torch.Tensor]]]:
        self.requests.put((key, ticket))
        return self.answers.get(timeout=TIMEOUT_S)  # type: ignore[no-any-return]  # untyped queue

    def close(self) -> None:
        self.requests.put(None)
        self.proc.join(timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()
    assert r.proc.exitcode == 0


def sender() -> Any:
    from unirl.distributed.weightsync import CudaIpcWeightSync

    return CudaIpcWeightSync(max_bucket_bytes=BUCKET_BYTES)


def buffer_of(s: Any, ticket: Any, i: int) -> torch.Tensor:
    key, _handle = ticket.payload[i]
    return s._buffers[key]  # type: ignore[no-any-return]  # the sender's CUDA buffer of bucket i


def assert_loaded_exactly(loaded: list[tuple[str, torch.Tensor]], ticket: Any, first_n: int) -> None:
    """The sink saw exactly buckets ``0..first_n-1``, bit-exact."""
    want = [m.name for b in ticket.buckets[:first_n] for m in b]
    assert [n for n, _ in loaded] == want
    ref = {n: t.cpu() for n, t in params()}
    for name, got in loaded:
        a, b = (x.contiguous().reshape(-1).view(torch.uint8) for x in (got, ref[name]))
        assert got.dtype == ref[name].dtype and got.shape == ref[name].shape, name
        assert torch.equal(a, b), name


def finish(s: Any, ticket: Any) -> None:
    """Free the sender's buffers (the failed receiver sent no ack)."""
    s._release(ticket.payload)
    assert s._buffers == {}


def test_control_untouched_sync_loads_everything(receiver: Receiver) -> None:
    s = sender()
    ticket = s.push(params(), 1)
    assert len(ticket.buckets) >= 4
    status, version, loaded = receiver.ask("control", ticket)
    assert (status, version) == ("ok", 1), version
    assert_loaded_exactly(loaded, ticket, len(ticket.buckets))
    finish(s, ticket)


@pytest.mark.parametrize("seed", range(50))
def test_one_flipped_bit_is_detected(receiver: Receiver, seed: int) -> None:
    s = sender()
    ticket = s.push(params(), 1)
    rng = random.Random(seed)
    i = rng.randrange(len(ticket.buckets))
    buf = buffer_of(s, ticket, i)
    bit = rng.randrange(sum(m.nbytes for m in ticket.buckets[i]) * 8)
    buf[bit // 8] ^= 1 << (bit % 8)
    torch.cuda.synchronize()
    status, err, loaded = receiver.ask(f"flip{seed}", ticket)
    assert status == "error" and err.startswith("WeightSyncError") and f"bucket {i}" in err, err
    assert_loaded_exactly(loaded, ticket, i)
    finish(s, ticket)


@pytest.mark.parametrize("seed", range(10))
def test_bucket_dropped_from_ticket_is_refused_before_loading(receiver: Receiver, seed: int) -> None:
    s = sender()
    ticket = s.push(params(), 1)
    i = random.Random(seed).randrange(len(ticket.buckets))

    def without(xs: tuple[Any, ...]) -> tuple[Any, ...]:
        return xs[:i] + xs[i + 1 :]

    bad = dataclasses.replace(
        ticket,
        buckets=without(ticket.buckets),
        bucket_checksums=without(ticket.bucket_checksums),
        payload=without(ticket.payload),
    )
    status, err, loaded = receiver.ask(f"drop{seed}", bad)
    assert status == "error" and "a bucket was dropped or the ticket altered" in err, err
    assert loaded == []
    finish(s, ticket)


@pytest.mark.parametrize("seed", range(10))
def test_bucket_reused_after_release_is_detected(receiver: Receiver, seed: int) -> None:
    s = sender()
    ticket = s.push(params(), 1)
    i = random.Random(seed).randrange(len(ticket.buckets))
    buffer_of(s, ticket, i).zero_()  # the memory handed to another tensor and overwritten
    torch.cuda.synchronize()
    status, err, loaded = receiver.ask(f"reuse{seed}", ticket)
    assert status == "error" and err.startswith("WeightSyncError") and f"bucket {i}" in err, err
    assert_loaded_exactly(loaded, ticket, i)
    finish(s, ticket)


@pytest.mark.parametrize("seed", range(20))
def test_stale_or_repeated_version_is_refused(receiver: Receiver, seed: int) -> None:
    rng = random.Random(seed)
    accepted = rng.randrange(1, 100)
    s = sender()
    first = s.push(params(), accepted)
    status, version, _ = receiver.ask(f"stale{seed}", first)
    assert (status, version) == ("ok", accepted)
    finish(s, first)
    old = rng.randrange(0, accepted + 1)
    s.sent.last = None  # a sender restarted without its version state
    ticket = s.push(params(), old)
    kind = "repeated" if old == accepted else "stale"
    status, err, loaded = receiver.ask(f"stale{seed}", ticket)
    assert status == "error" and f"{kind} weight version {old} (last accepted {accepted})" in err, err
    assert loaded == []
    finish(s, ticket)
