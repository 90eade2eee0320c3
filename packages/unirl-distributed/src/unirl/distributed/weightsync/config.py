"""``sync:``: which weight plane a run uses, as a discriminated union with one ``build()`` each.

    sync: buckets                                     # the plain-string form: defaults of that kind
    sync: {kind: broadcast, max_bucket_bytes: 67108864}

| kind | moves the weights | where it can run |
|---|---|---|
| ``broadcast`` | collective broadcast from trainer rank 0 (gloo on CPU, NCCL on GPU) | not colocated on GPU |
| ``buckets`` | safetensors buckets through the Ray object store | anywhere |
| ``shm`` | CPU shared-memory segments | one node |
| ``cuda_ipc`` | CUDA IPC handles of one GPU buffer per bucket | GPU, colocated (one node) |
| ``engine`` | a dedicated engine's own ``update_weights`` (vLLM, SGLang), stamp-checked | in the engine's process |

Every member's ``build(at)`` returns a :class:`WeightPlane` (``push(policy, version)`` on the
trainer side; the transports are also :class:`WeightSync` receivers). Verification is not
optional: every kind stamps the version and checksums what it ships.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag

from unirl.distributed.weightsync.protocol import DEFAULT_BUCKET_BYTES
from unirl.types.base import kind_or

if TYPE_CHECKING:
    from unirl.distributed.collective import StandaloneGroup
    from unirl.distributed.weightsync.engine import EngineWeightPlane, WeightEngine
    from unirl.distributed.weightsync.protocol import WeightSync

__all__ = [
    "SYNC_KINDS",
    "BroadcastSync",
    "BucketsSync",
    "CudaIpcSync",
    "Endpoint",
    "EngineSync",
    "ShmSync",
    "SyncConfig",
]

SYNC_KINDS = ("broadcast", "buckets", "shm", "cuda_ipc", "engine")


@dataclass(frozen=True)
class Endpoint:
    """Where one weight-plane endpoint sits.

    ``name`` labels errors and acks; ``is_source``: the trainer rank that ships (rank 0; the other
    trainer ranks take part in the DTensor gathers only; receivers are never sources); ``group``:
    the broadcast group (``broadcast``); ``engine``: the engine pushed into (``engine``)."""

    name: str
    is_source: bool
    group: StandaloneGroup | None = None
    engine: WeightEngine | None = None


class _Sync(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    streaming: ClassVar[bool] = False
    """True when sender and receivers must run at once (the driver starts push, then receive)."""

    def check_layout(self, *, kind: str, device: str, placement: str) -> None:
        """Raise ValueError when this plane cannot run in that layout (default: anywhere)."""

    def join_group(self, addr: str, port: int, rank: int, world: int) -> StandaloneGroup | None:
        """This process's group of a streaming plane (rank 0: the trainer's source); None otherwise."""
        return None


class _Bucketed(_Sync):
    max_bucket_bytes: int = Field(
        default=DEFAULT_BUCKET_BYTES,
        ge=1,
        description="bytes per bucket (a larger tensor gets its own): neither side holds more than one "
        "bucket of gathered / decoded tensors at a time",
    )


class BroadcastSync(_Bucketed):
    """Collective broadcast over a group of trainer rank 0 and every rollout worker."""

    kind: Literal["broadcast"] = "broadcast"
    streaming: ClassVar[bool] = True
    group_timeout_s: float = Field(default=300.0, gt=0, description="deadline of one collective")

    def join_group(self, addr: str, port: int, rank: int, world: int) -> StandaloneGroup:
        """Join the gloo group of trainer rank 0 (group rank 0) and every rollout worker."""
        from unirl.distributed.collective import StandaloneGroup

        return StandaloneGroup("gloo", addr, port, rank, world, timeout_s=self.group_timeout_s)

    def check_layout(self, *, kind: str, device: str, placement: str) -> None:
        if kind == "ray" and placement == "colocate" and device == "gpu":
            # NCCL cannot broadcast between two processes bound to the same GPU
            raise ValueError(
                "layout.sync='broadcast' with placement='colocate' on GPU puts sender and receiver on "
                "one device (NCCL refuses); use sync='buckets' or 'cuda_ipc', or placement='separate'"
            )

    def build(self, at: Endpoint) -> WeightSync:
        from unirl.distributed.weightsync.broadcast import BroadcastWeightSync

        return BroadcastWeightSync(at.group, name=at.name, max_bucket_bytes=self.max_bucket_bytes)


class BucketsSync(_Bucketed):
    """safetensors buckets through the Ray object store (pickle-free bytes)."""

    kind: Literal["buckets"] = "buckets"

    def build(self, at: Endpoint) -> WeightSync:
        from unirl.distributed.weightsync.buckets import RayBlobStore, TensorBucketSync

        return TensorBucketSync(
            RayBlobStore(), is_source=at.is_source, name=at.name, max_bucket_bytes=self.max_bucket_bytes
        )


class ShmSync(_Bucketed):
    """CPU shared memory, one segment per bucket (sender and receivers on one node)."""

    kind: Literal["shm"] = "shm"

    def build(self, at: Endpoint) -> WeightSync:
        from unirl.distributed.weightsync.shm import SharedMemoryWeightSync

        return SharedMemoryWeightSync(
            is_source=at.is_source, name=at.name, max_bucket_bytes=self.max_bucket_bytes
        )


class CudaIpcSync(_Bucketed):
    """CUDA IPC handles: one flat GPU buffer per bucket, mapped by the receivers on the same node."""

    kind: Literal["cuda_ipc"] = "cuda_ipc"

    def check_layout(self, *, kind: str, device: str, placement: str) -> None:
        if kind == "ray" and (device != "gpu" or placement != "colocate"):
            raise ValueError(
                f"layout.sync='cuda_ipc' with layout.device={device!r}, layout.placement={placement!r}: "
                "CUDA IPC maps the trainer's GPU memory, so it needs device='gpu' and "
                "placement='colocate' (trainer and rollout on one node); use sync='buckets' (or 'shm' on "
                "CPU), or set device=gpu placement=colocate"
            )

    def build(self, at: Endpoint) -> WeightSync:
        from unirl.distributed.weightsync.cuda_ipc import CudaIpcWeightSync

        return CudaIpcWeightSync(is_source=at.is_source, name=at.name, max_bucket_bytes=self.max_bucket_bytes)


class EngineSync(_Sync):
    """Push into a dedicated engine (vLLM, SGLang) in this process through its own ``update_weights``."""

    kind: Literal["engine"] = "engine"

    def check_layout(self, *, kind: str, device: str, placement: str) -> None:
        if kind == "ray":
            raise ValueError(
                "layout.sync='engine' with layout.kind='ray': the engine plane pushes into an engine in the "
                "trainer's own process; between Ray workers pick a transport (broadcast, buckets, shm, "
                "cuda_ipc): each rollout worker then pushes into its engine through the engine plane"
            )

    def build(self, at: Endpoint) -> EngineWeightPlane:
        from unirl.distributed.weightsync.engine import EngineWeightPlane

        if at.engine is None:
            raise TypeError(
                f"{at.name}: sync kind 'engine' needs Endpoint(engine=...), the engine to push into"
            )
        return EngineWeightPlane(at.engine, name=at.name)


def _plain_kind(value: Any) -> Any:
    """``sync: buckets`` (the form recipes used before the union) means ``{kind: buckets}``."""
    if isinstance(value, str):
        if value not in SYNC_KINDS:
            raise ValueError(f"sync={value!r} is not a weight plane; use one of {', '.join(SYNC_KINDS)}")
        return {"kind": value}
    return value


SyncConfig = Annotated[
    Annotated[BroadcastSync, Tag("broadcast")]
    | Annotated[BucketsSync, Tag("buckets")]
    | Annotated[ShmSync, Tag("shm")]
    | Annotated[CudaIpcSync, Tag("cuda_ipc")]
    | Annotated[EngineSync, Tag("engine")],
    Discriminator(kind_or("buckets")),
    BeforeValidator(_plain_kind),
]
"""The ``sync:`` field type: a plain kind name or a mapping with ``kind`` and that kind's options."""
