"""Multi-process tests on a local Ray cluster: placement, gloo inside Remotes, failures, the weight
plane. Workers are reused across the module (starting torch workers is the slow part)."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from unirl.distributed import (
    InsufficientDevicesError,
    MeshShape,
    RankInfo,
    RayRemote,
    RemoteCallError,
    RemoteTimeoutError,
    WorkerDiedError,
    place,
)

pytestmark = pytest.mark.slow

SYNC_KIND = {"tensor_buckets": "buckets", "shared_memory": "shm", "broadcast": "broadcast"}
"""The endpoint's ``kind`` -> the ``sync:`` kind that builds it."""


def full_params(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(16, 8, generator=g),
        "block.lora_A.default.weight": torch.randn(4, 8, generator=g),
        "block.lora_B.default.weight": torch.randn(8, 4, generator=g).to(torch.bfloat16),
        "head.bias": torch.randn(6, generator=g).to(torch.float16),
    }


class Node:
    """A worker exercising each plane; state persists across calls (Ray actors are stateful)."""

    def __init__(self, info: RankInfo) -> None:
        self.info = info
        self.group: Any = None
        self.sync: Any = None
        self.received: dict[str, torch.Tensor] = {}

    # placement / process group
    def where(self) -> tuple[str, float]:
        """(placement group id, CPUs assigned to this actor)."""
        import ray

        ctx = ray.get_runtime_context()
        return ctx.get_placement_group_id() or "", float(ctx.get_assigned_resources().get("CPU", 0.0))

    def allreduce(self) -> tuple[float, int, int]:
        import torch.distributed as dist

        t = torch.tensor([float(self.info.rank + 1)])
        dist.all_reduce(t)
        return float(t.item()), dist.get_rank(), dist.get_world_size()

    # failures
    def block(self, flag: str, seconds: float) -> None:
        Path(flag).touch()
        threading.Event().wait(seconds)  # never set: the call stays in flight until killed

    def pid(self) -> int:
        return os.getpid()

    # standalone groups across Remotes
    def master(self) -> tuple[str, int]:
        from unirl.distributed import pick_master

        return pick_master()

    def join(self, addr: str, port: int, offset: int, world: int) -> None:
        """Join a group spanning Remotes as group rank ``offset + own rank``."""
        from unirl.distributed import StandaloneGroup

        if self.group is None:
            self.group = StandaloneGroup("gloo", addr, port, offset + self.info.rank, world, timeout_s=60)

    # weight plane
    def make_sync(self, kind: str, role: str, lora: bool = False) -> None:
        """A fresh endpoint built from its ``sync:`` config, as a run's workers build theirs; on the
        trainer only rank 0 is the source (the others gather; broadcast: trainer rank 1 has no group)."""
        from pydantic import TypeAdapter

        from unirl.distributed.weightsync import Endpoint, LoraOnlySync, SyncConfig

        cfg = TypeAdapter(SyncConfig).validate_python({"kind": SYNC_KIND[kind], "max_bucket_bytes": 600})
        source = role == "trainer" and self.info.rank == 0
        self.sync = cfg.build(Endpoint(f"{role}{self.info.rank}", is_source=source, group=self.group))
        assert self.sync.kind == kind
        if lora:
            self.sync = LoraOnlySync(self.sync)

    def set_seed(self, seed: int) -> None:
        self.seed = seed

    def push(self, version: int) -> Any:
        """Every trainer rank: shard the params FSDP-style as DTensors, then send (gathers inside)."""
        seed = self.seed
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (self.info.world_size,))
        sharded = [(n, distribute_tensor(t, mesh, [Shard(0)])) for n, t in full_params(seed).items()]
        return self.sync.push(sharded, version)

    def pull(self, ticket: Any) -> Any:
        self.received = {}
        return self.sync.receive(ticket, self.received.update)

    def confirm(self, ticket: Any, acks: list[Any], n: int) -> None:
        self.sync.confirm(ticket, acks, n)

    def state(self) -> dict[str, torch.Tensor]:
        return self.received


def join_group(trainer: RayRemote[Node], engine: RayRemote[Node]) -> None:
    """Trainer rank 0 (group rank 0) + engine ranks 0, 1 (group ranks 1, 2); rank 0 picks the port."""
    addr, port = trainer.call_rank0(Node.master)
    fut = trainer.call_rank0_async(Node.join, addr, port, 0, 3)
    engine.call_all(Node.join, addr, port, 1, 3)
    fut.result(timeout=60)


def assert_bit_exact(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


@pytest.fixture(scope="module")
def remotes(ray_cluster: Any) -> Iterator[dict[str, Any]]:
    # colocated: trainer and engine share a 2-device slab (0.5 CPU "devices"), half each
    plan, slabs = place({"trainer": 2, "engine": 2}, "colocate", cpus_per_device=0.5)
    share = plan.slab_of("trainer").share
    trainer = RayRemote.spawn(
        Node, name="trainer", mesh=MeshShape(dp=2), slab=slabs["trainer"], share=share, call_timeout_s=60
    )
    engine = RayRemote.spawn(
        Node, name="engine", mesh=MeshShape(dp=2), slab=slabs["engine"], share=share, call_timeout_s=60
    )
    yield {"trainer": trainer, "engine": engine, "slab": slabs["trainer"], "share": share}
    trainer.shutdown()
    engine.shutdown()
    slabs["trainer"].release()


def test_colocated_remotes_share_bundles_of_one_slab(remotes: dict[str, Any]) -> None:
    t, e = remotes["trainer"].call_all(Node.where), remotes["engine"].call_all(Node.where)
    assert t[0][0] == e[0][0] == t[1][0] == e[1][0] != ""  # one placement group
    assert [c for _, c in t + e] == [0.25] * 4  # half of each 0.5-CPU "device"
    assert remotes["trainer"].bundles == remotes["engine"].bundles == [0, 1]  # rank i on device i
    assert remotes["slab"].used == [1.0, 1.0]
    with pytest.raises(InsufficientDevicesError, match="device 0 of slab 'colocated' is 1 used"):
        RayRemote.spawn(Node, name="third", slab=remotes["slab"], share=0.5)


def test_separate_remotes_get_disjoint_slabs(ray_cluster: Any) -> None:
    _, slabs = place({"a": 1, "b": 1}, "separate", cpus_per_device=0.25)
    a = RayRemote.spawn(Node, name="a", slab=slabs["a"], process_group=False)
    b = RayRemote.spawn(Node, name="b", slab=slabs["b"], process_group=False)
    try:
        (pa, _), (pb, _) = a.call_rank0(Node.where), b.call_rank0(Node.where)
        assert pa and pb and pa != pb
    finally:
        for r in (a, b):
            r.shutdown()
        for s in slabs.values():
            s.release()


def test_too_few_devices_fails_before_any_worker_starts(ray_cluster: Any) -> None:
    groups_before = len(ray_cluster.util.placement_group_table())
    with pytest.raises(InsufficientDevicesError, match=r"CPU: need 10, free [\d.]+"):
        RayRemote.spawn(Node, name="huge", mesh=MeshShape(dp=10))
    assert len(ray_cluster.util.placement_group_table()) == groups_before


def test_gloo_all_reduce_inside_remote_workers(remotes: dict[str, Any]) -> None:
    # ranks contribute 1 and 2 -> both see 3
    assert remotes["trainer"].call_all(Node.allreduce) == [(3.0, 0, 2), (3.0, 1, 2)]


def test_kill_mid_call_surfaces_worker_died_quickly(ray_cluster: Any, tmp_path: Path) -> None:
    victim = RayRemote.spawn(Node, name="victim", cpus_per_worker=0.25, process_group=False)
    try:
        flag = tmp_path / "in_call"
        fut = victim.call_rank0_async(Node.block, str(flag), 120.0)
        deadline = time.monotonic() + 30
        while not flag.exists():  # wait (bounded) until the call is in flight
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.05)
        with pytest.raises(RemoteTimeoutError, match=r"victim.block: ranks \[0\] did not finish within 0.5s"):
            fut.result(timeout=0.5)
        os.kill(victim.pids[0], signal.SIGKILL)  # a crash, not a polite ray.kill
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="victim.block: worker rank 0 died"):
            fut.result(timeout=30)
        assert time.monotonic() - start < 30
    finally:
        victim.shutdown()


def sync_round(
    trainer: RayRemote[Node], engine: RayRemote[Node], seed: int, version: int, streaming: bool
) -> Any:
    """One weight sync of the params of ``seed`` as ``version``, sequenced by the library's driver."""
    from unirl.distributed.weightsync import drive_weight_sync

    trainer.call_all(Node.set_seed, seed)
    return drive_weight_sync(
        trainer,
        engine,
        push=Node.push,
        pull=Node.pull,
        confirm=Node.confirm,
        version=version,
        streaming=streaming,
        timeout_s=60,
    )


@pytest.mark.parametrize("kind", ["tensor_buckets", "shared_memory", "broadcast"])
def test_weight_sync_from_sharded_dtensors_is_bit_exact(remotes: dict[str, Any], kind: str) -> None:
    trainer, engine = remotes["trainer"], remotes["engine"]
    if kind == "broadcast":
        join_group(trainer, engine)
    trainer.call_all(Node.make_sync, kind, "trainer")
    engine.call_all(Node.make_sync, kind, "engine")
    ticket = sync_round(trainer, engine, seed=7, version=1, streaming=kind == "broadcast")
    # sizes 512, 128, 64, 12 bytes with a 600-byte bucket limit -> [[embed], [lora_A, lora_B, head]]
    assert [len(b) for b in ticket.buckets] == [1, 3]
    for state in engine.call_all(Node.state):
        assert_bit_exact(state, full_params(7))
    sync_round(trainer, engine, seed=8, version=2, streaming=kind == "broadcast")
    for state in engine.call_all(Node.state):
        assert_bit_exact(state, full_params(8))


def test_corrupted_stale_and_repeated_syncs_are_rejected_across_processes(remotes: dict[str, Any]) -> None:
    import ray

    trainer, engine = remotes["trainer"], remotes["engine"]
    trainer.call_all(Node.make_sync, "tensor_buckets", "trainer")
    engine.call_all(Node.make_sync, "tensor_buckets", "engine")
    v1 = sync_round(trainer, engine, seed=1, version=1, streaming=False)
    trainer.call_all(Node.set_seed, 2)
    tickets = trainer.call_all(Node.push, 2)
    assert tickets[1].payload == ()  # the non-source rank only took part in the gathers
    v2 = tickets[0]
    data = bytearray(ray.get(v2.payload[0]))
    data[-1] ^= 0x01  # flip one bit of the last tensor byte of bucket 0
    bad = dataclasses.replace(v2, payload=(ray.put(bytes(data)), *v2.payload[1:]))
    with pytest.raises(
        RemoteCallError, match="engine.pull: rank 0 raised WeightSyncError: .*bucket 0 .*checksum"
    ):
        engine.call_rank0(Node.pull, bad)
    assert_bit_exact(engine.call_rank0(Node.state), {})  # nothing of the corrupted bucket was loaded
    assert engine.call_rank0(Node.pull, v2).version == 2  # the intact ticket still applies
    with pytest.raises(RemoteCallError, match="repeated weight version 2"):
        engine.call_rank0(Node.pull, v2)
    with pytest.raises(RemoteCallError, match=r"stale weight version 1 \(last accepted 2\)"):
        engine.call_rank0(Node.pull, v1)


def test_lora_only_sync_ships_adapters_only(remotes: dict[str, Any]) -> None:
    trainer, engine = remotes["trainer"], remotes["engine"]
    trainer.call_all(Node.make_sync, "shared_memory", "trainer", True)
    engine.call_all(Node.make_sync, "shared_memory", "engine", True)
    sync_round(trainer, engine, seed=4, version=1, streaming=False)
    want = {k: v for k, v in full_params(4).items() if "lora_" in k}
    for state in engine.call_all(Node.state):
        assert_bit_exact(state, want)
