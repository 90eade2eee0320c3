"""The weight plane: versioned, verified trainer -> rollout weight sync.

A recipe picks one plane with ``sync:`` (:data:`SyncConfig`); ``build()`` gives the endpoint, and
the trainer calls ``push(policy, version)`` once after each train step.
"""

from unirl.distributed.weightsync.base import BucketedWeightSync
from unirl.distributed.weightsync.broadcast import BroadcastWeightSync
from unirl.distributed.weightsync.buckets import InProcessBlobStore, RayBlobStore, TensorBucketSync
from unirl.distributed.weightsync.config import (
    SYNC_KINDS,
    BroadcastSync,
    BucketsSync,
    CudaIpcSync,
    Endpoint,
    EngineSync,
    ShmSync,
    SyncConfig,
)
from unirl.distributed.weightsync.cuda_ipc import CudaIpcWeightSync
from unirl.distributed.weightsync.driver import drive_weight_sync
from unirl.distributed.weightsync.engine import (
    EngineWeightPlane,
    StampMismatchError,
    WeightEngine,
    check_weight_stamp,
    materialize,
    module_weights,
    stamp_of,
    weight_stamp,
)
from unirl.distributed.weightsync.lora import LoraOnlySync, is_adapter
from unirl.distributed.weightsync.protocol import (
    DEFAULT_BUCKET_BYTES,
    SyncAck,
    SyncTicket,
    VersionGate,
    WeightPlane,
    WeightSync,
    plan_buckets,
)
from unirl.distributed.weightsync.shm import SharedMemoryWeightSync

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "SYNC_KINDS",
    "BroadcastSync",
    "BroadcastWeightSync",
    "BucketedWeightSync",
    "BucketsSync",
    "CudaIpcSync",
    "CudaIpcWeightSync",
    "Endpoint",
    "EngineSync",
    "EngineWeightPlane",
    "InProcessBlobStore",
    "LoraOnlySync",
    "RayBlobStore",
    "SharedMemoryWeightSync",
    "ShmSync",
    "StampMismatchError",
    "SyncAck",
    "SyncConfig",
    "SyncTicket",
    "TensorBucketSync",
    "VersionGate",
    "WeightEngine",
    "WeightPlane",
    "WeightSync",
    "check_weight_stamp",
    "drive_weight_sync",
    "is_adapter",
    "materialize",
    "module_weights",
    "plan_buckets",
    "stamp_of",
    "weight_stamp",
]
