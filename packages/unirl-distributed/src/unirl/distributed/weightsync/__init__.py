"""The weight plane: versioned, verified trainer -> engine weight sync."""

from unirl.distributed.weightsync.base import BucketedWeightSync
from unirl.distributed.weightsync.broadcast import BroadcastWeightSync
from unirl.distributed.weightsync.buckets import InProcessBlobStore, RayBlobStore, TensorBucketSync
from unirl.distributed.weightsync.cuda_ipc import CudaIpcWeightSync
from unirl.distributed.weightsync.driver import drive_weight_sync
from unirl.distributed.weightsync.lora import LoraOnlySync, is_adapter
from unirl.distributed.weightsync.protocol import (
    DEFAULT_BUCKET_BYTES,
    SyncAck,
    SyncTicket,
    VersionGate,
    WeightSync,
    plan_buckets,
)
from unirl.distributed.weightsync.shm import SharedMemoryWeightSync

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "BroadcastWeightSync",
    "BucketedWeightSync",
    "CudaIpcWeightSync",
    "InProcessBlobStore",
    "LoraOnlySync",
    "RayBlobStore",
    "SharedMemoryWeightSync",
    "SyncAck",
    "SyncTicket",
    "TensorBucketSync",
    "VersionGate",
    "WeightSync",
    "drive_weight_sync",
    "is_adapter",
    "plan_buckets",
]
