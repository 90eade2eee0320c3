"""torch.distributed process groups: the Remote's default group and standalone groups across Remotes.

The default group of a Remote's workers is created with ``init_process_group`` (one per process).
A weight-sync group (``sync: broadcast``) spans *different* Remotes (e.g. trainer rank 0 + every rollout
worker), so it cannot be the default group: :class:`StandaloneGroup` builds a ProcessGroupGloo /
ProcessGroupNCCL directly on a TCPStore, the way RL frameworks build their weight-update groups.
Rank 0 picks the address and port (:func:`pick_master`), the driver passes them to the others.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any, Literal

import torch
import torch.distributed as dist

Backend = Literal["gloo", "nccl"]


def node_ip() -> str:
    """This node's IP as Ray sees it (falls back to loopback outside Ray)."""
    try:
        import ray.util

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]  # ray: unannotated
    except Exception:  # not inside a Ray worker: single-node use
        return "127.0.0.1"


def free_port() -> int:
    """A TCP port that was free a moment ago (bound to 0 and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def pick_master() -> tuple[str, int]:
    """(address, port) for a rendezvous hosted by the calling process (call it on rank 0)."""
    return node_ip(), free_port()


def default_backend(device: str) -> Backend:
    """NCCL on GPU, gloo on CPU."""
    return "nccl" if device == "gpu" else "gloo"


def init_default_group(
    backend: Backend, addr: str, port: int, rank: int, world_size: int, timeout_s: float
) -> None:
    """Initialise this process's default torch.distributed group and the usual env variables."""
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    if backend == "nccl":
        torch.cuda.set_device(0)  # Ray narrows CUDA_VISIBLE_DEVICES to this worker's GPU
    dist.init_process_group(
        backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


class StandaloneGroup:
    """A process group that is not the default one (spans processes of different Remotes)."""

    def __init__(
        self, backend: Backend, addr: str, port: int, rank: int, world_size: int, timeout_s: float = 120.0
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"StandaloneGroup: rank={rank} outside [0, world_size={world_size})")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.backend: Backend = backend
        self.rank = rank
        self.world_size = world_size
        self.store = dist.TCPStore(  # type: ignore[attr-defined]  # public API, not in torch's __all__ stubs
            addr, port, world_size, rank == 0, timeout=timeout
        )
        # Any: torch's stubs declare the backends without the collectives used below, which exist at runtime
        self.pg: Any
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
        elif backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(self.store, rank, world_size, opts)
        else:
            raise ValueError(f"backend={backend!r} is not one of 'gloo', 'nccl'")

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """In-place broadcast of ``tensor`` from ``src``."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self.pg.broadcast([tensor], opts).wait()

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        """In-place sum all-reduce."""
        self.pg.allreduce([tensor]).wait()
