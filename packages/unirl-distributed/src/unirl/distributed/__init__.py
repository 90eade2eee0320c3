"""Single-controller runtime on Ray: Remote workers, placement, and the weight plane (weight sync).

The weight plane a recipe uses is its ``sync:`` section (:data:`SyncConfig`, from
``unirl.distributed.weightsync``). Samples travel between the driver and the workers as the
results and arguments of ``Remote`` calls (Ray's own serialisation between our processes).

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
    from unirl.distributed.weightsync.config import SyncConfig
    from unirl.distributed.weightsync.protocol import WeightPlane

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
    "SyncConfig": "weightsync.config",
    "WeightPlane": "weightsync.protocol",
}

__all__ = [
    "DispatchMode",
    "DistributedError",
    "EmptyWeightSyncError",
    "InsufficientDevicesError",
    "LocalRemote",
    "MeshShape",
    "PlacementPlan",
    "RankInfo",
    "RayRemote",
    "Remote",
    "RemoteBase",
    "RemoteCallError",
    "RemoteFuture",
    "RemoteTimeoutError",
    "Slab",
    "StaleWeightVersionError",
    "StandaloneGroup",
    "SyncConfig",
    "WeightPlane",
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
