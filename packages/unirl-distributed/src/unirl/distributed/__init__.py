"""Single-controller runtime on Ray: Remote workers, placement, tensor transport (data plane) and weight sync (weight plane).

Imports are lazy (PEP 562): ``import unirl.distributed`` loads neither Ray nor torch, so a Ray
worker that only hosts a torch-free worker starts in a fraction of a second, and
:class:`LocalRemote` works without starting Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from unirl.distributed.remote import Remote, RemoteBase, RemoteFuture
    from unirl.distributed.transport import (
        InProcessTransport,
        ObjectStoreTransport,
        P2PTransport,
        SampleHandle,
        SampleTransport,
        TensorHandle,
        TensorTransport,
    )

__version__ = "0.1.0"

_HOME = {
    "StandaloneGroup": "collective",
    "pick_master": "collective",
    "DispatchMode": "dispatch",
    "split_dp": "dispatch",
    "DistributedError": "errors",
    "EmptyWeightSyncError": "errors",
    "InsufficientDevicesError": "errors",
    "RemoteCallError": "errors",
    "RemoteTimeoutError": "errors",
    "StaleWeightVersionError": "errors",
    "WeightSyncError": "errors",
    "WorkerDiedError": "errors",
    "LocalRemote": "local",
    "PlacementPlan": "placement",
    "Slab": "placement",
    "allocate_slabs": "placement",
    "place": "placement",
    "plan_placement": "placement",
    "MeshShape": "rank",
    "RankInfo": "rank",
    "all_rank_infos": "rank",
    "rank_info": "rank",
    "RayRemote": "ray_remote",
    "Remote": "remote",
    "RemoteBase": "remote",
    "RemoteFuture": "remote",
    "InProcessTransport": "transport",
    "ObjectStoreTransport": "transport",
    "P2PTransport": "transport",
    "SampleHandle": "transport",
    "SampleTransport": "transport",
    "TensorHandle": "transport",
    "TensorTransport": "transport",
}

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
    "Remote",
    "RemoteBase",
    "RemoteCallError",
    "RemoteFuture",
    "RemoteTimeoutError",
    "SampleHandle",
    "SampleTransport",
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


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'unirl.distributed' has no attribute {name!r}")
    return getattr(importlib.import_module(f"unirl.distributed.{home}"), name)
