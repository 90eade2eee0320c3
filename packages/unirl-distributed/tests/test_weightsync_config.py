"""``sync:``: the weight-plane union (selection, the plain-string form, layout checks) and the
``engine`` plane's contract (stamp echo, no silent mismatch)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from unirl.distributed.errors import EmptyWeightSyncError
from unirl.distributed.weightsync import (
    BroadcastWeightSync,
    BucketsSync,
    CudaIpcSync,
    CudaIpcWeightSync,
    Endpoint,
    EngineSync,
    EngineWeightPlane,
    SharedMemoryWeightSync,
    StampMismatchError,
    SyncConfig,
    TensorBucketSync,
    weight_stamp,
)
from unirl.types import WeightStamp

SYNC: TypeAdapter[SyncConfig] = TypeAdapter(SyncConfig)


class Holder(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sync: SyncConfig = BucketsSync()


@pytest.mark.parametrize(
    ("value", "built"),
    [
        ("buckets", TensorBucketSync),
        ("shm", SharedMemoryWeightSync),
        ("broadcast", BroadcastWeightSync),
        ("cuda_ipc", CudaIpcWeightSync),
        ({"kind": "buckets", "max_bucket_bytes": 128}, TensorBucketSync),
        ({"kind": "cuda_ipc", "max_bucket_bytes": 128}, CudaIpcWeightSync),
    ],
)
def test_each_kind_is_selected_by_name_or_mapping_and_builds_its_transport(
    value: object, built: type
) -> None:
    cfg = SYNC.validate_python(value)
    # broadcast with group=None: a gather-only participant (constructible without a group)
    endpoint = cfg.build(Endpoint("train0", is_source=True))
    assert type(endpoint) is built and endpoint.kind == type(endpoint).kind
    want = value["max_bucket_bytes"] if isinstance(value, dict) else 256 * 1024 * 1024
    assert endpoint.max_bucket_bytes == want  # type: ignore[union-attr]  # every transport buckets


def test_the_plain_string_form_equals_the_mapping_and_the_default_is_buckets() -> None:
    assert Holder(sync="shm").sync == Holder(sync={"kind": "shm"}).sync  # type: ignore[arg-type]  # coerced
    assert Holder().sync.kind == "buckets"
    assert SYNC.validate_python("broadcast").streaming and not SYNC.validate_python("buckets").streaming


def test_a_wrong_kind_or_option_fails_at_load_naming_it() -> None:
    with pytest.raises(ValidationError, match=r"sync='nccl' is not a weight plane; use one of broadcast, "):
        Holder(sync="nccl")  # type: ignore[arg-type]  # the point
    with pytest.raises(
        ValidationError, match=r"'x' .*expected tags: 'broadcast', 'buckets', 'shm', 'cuda_ipc'"
    ):
        Holder(sync={"kind": "x"})  # type: ignore[arg-type]  # the point
    with pytest.raises(ValidationError, match=r"sync\.shm\.bucket_bytes"):
        Holder(sync={"kind": "shm", "bucket_bytes": 1})  # type: ignore[arg-type]  # the point
    with pytest.raises(ValidationError, match=r"max_bucket_bytes"):
        Holder(sync={"kind": "buckets", "max_bucket_bytes": 0})  # type: ignore[arg-type]  # the point


def test_cuda_ipc_needs_gpu_and_colocate_in_the_ray_layout() -> None:
    ipc = CudaIpcSync()
    ipc.check_layout(kind="ray", device="gpu", placement="colocate")
    ipc.check_layout(kind="single", device="cpu", placement="colocate")  # no worker-to-worker sync
    with pytest.raises(ValueError, match=r"layout.device='cpu'.*needs device='gpu' and placement='colocate'"):
        ipc.check_layout(kind="ray", device="cpu", placement="colocate")
    with pytest.raises(ValueError, match=r"layout.placement='separate'"):
        ipc.check_layout(kind="ray", device="gpu", placement="separate")


def test_broadcast_refuses_a_shared_gpu_and_engine_refuses_the_ray_layout() -> None:
    with pytest.raises(ValueError, match="NCCL refuses"):
        SYNC.validate_python("broadcast").check_layout(kind="ray", device="gpu", placement="colocate")
    SYNC.validate_python("broadcast").check_layout(kind="ray", device="gpu", placement="separate")
    with pytest.raises(ValueError, match=r"layout.sync='engine' with layout.kind='ray'"):
        EngineSync().check_layout(kind="ray", device="cpu", placement="colocate")
    with pytest.raises(TypeError, match=r"needs Endpoint\(engine=...\)"):
        EngineSync().build(Endpoint("trainer", is_source=True))


class FakeEngine:
    """Echoes the stamp of what it loaded (``lie``: of other bytes)."""

    def __init__(self, lie: bool = False) -> None:
        self.lie = lie
        self.loaded: list[tuple[str, torch.Tensor]] = []

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], stamp: WeightStamp
    ) -> WeightStamp:
        self.loaded = [(n, t.clone()) for n, t in named_tensors]
        if self.lie:
            self.loaded[0][1].add_(1)
        return weight_stamp(self.loaded, stamp.version)


def policy() -> list[tuple[str, torch.Tensor]]:
    emb = torch.arange(6.0).reshape(3, 2)
    return [("embed.weight", emb), ("head.weight", emb), ("norm.weight", torch.ones(2))]  # head tied


def test_engine_plane_pushes_stamped_tensors_once_per_storage() -> None:
    engine = FakeEngine()
    plane = EngineSync().build(Endpoint("rollout engine", is_source=True, engine=engine))
    assert isinstance(plane, EngineWeightPlane)
    ticket = plane.push(policy(), 3)
    assert [n for n, _ in engine.loaded] == ["embed.weight", "norm.weight"]  # the tied head once
    assert (ticket.kind, ticket.version, ticket.num_tensors) == ("engine", 3, 2)
    assert ticket.checksum == weight_stamp(engine.loaded, 3).checksum == plane.last_stamp.checksum  # type: ignore[union-attr]  # set by push


def test_engine_plane_rejects_a_mismatched_echo_and_an_empty_policy() -> None:
    plane = EngineSync().build(Endpoint("rollout engine", is_source=True, engine=FakeEngine(lie=True)))
    with pytest.raises(StampMismatchError, match="rollout engine: weight sync v1 stamp mismatch"):
        plane.push(policy(), 1)
    with pytest.raises(EmptyWeightSyncError):
        EngineSync().build(Endpoint("e", is_source=True, engine=FakeEngine())).push([], 1)
