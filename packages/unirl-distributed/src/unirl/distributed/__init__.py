"""Single-controller runtime on Ray: Remote workers, placement, tensor transport (data plane) and weight sync (weight plane).

Ray is imported lazily: ``import unirl.distributed`` and :class:`LocalRemote` work without
starting Ray.
"""

from unirl.distributed.collective import StandaloneGroup, pick_master
from unirl.distributed.dispatch import DispatchMode, split_dp
from unirl.distributed.errors import (
    DistributedError,
    EmptyWeightSyncError,
    InsufficientDevicesError,
    RemoteCallError,
    RemoteTimeoutError,
    StaleWeightVersionError,
    WeightSyncError,
    WorkerDiedError,
)
from unirl.distributed.local import LocalRemote
from unirl.distributed.placement import PlacementPlan, Slab, allocate_slabs, place, plan_placement
from unirl.distributed.rank import MeshShape, RankInfo, all_rank_infos, rank_info
from unirl.distributed.ray_remote import RayRemote
from unirl.distributed.remote import RemoteBase, RemoteFuture
from unirl.distributed.transport import (
    InProcessTransport,
    ObjectStoreTransport,
    P2PTransport,
    TensorHandle,
    TensorTransport,
)

__version__ = "0.1.0"

__all__ = [
    "DispatchMode",
    "DistributedError",
    "EmptyWeightSyncError",
    "InProcessTransport",
    "InsufficientDevicesError",
    "LocalRemote",
    "MeshShape",
    "ObjectStoreTransport",
    "P2PTransport",
    "PlacementPlan",
    "RankInfo",
    "RayRemote",
    "RemoteBase",
    "RemoteCallError",
    "RemoteFuture",
    "RemoteTimeoutError",
    "Slab",
    "StaleWeightVersionError",
    "StandaloneGroup",
    "TensorHandle",
    "TensorTransport",
    "WeightSyncError",
    "WorkerDiedError",
    "all_rank_infos",
    "allocate_slabs",
    "pick_master",
    "place",
    "plan_placement",
    "rank_info",
    "split_dp",
]
