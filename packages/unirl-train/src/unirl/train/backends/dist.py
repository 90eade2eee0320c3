"""Process-group bootstrap for a single process (world size 1) when no launcher made one."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist


def ensure_process_group(device: torch.device) -> None:
    """Initialise torch.distributed if needed.

    With RANK/WORLD_SIZE in the environment (torchrun, Ray workers) the usual env:// init is
    used; otherwise a world of one over a FileStore in a fresh temp dir (no port to collide on).
    gloo serves CPU tensors; NCCL is added for CUDA devices.
    """
    if dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend)
        return
    path = os.path.join(tempfile.mkdtemp(prefix="unirl-pg-"), "store")
    store = dist.FileStore(path, 1)
    dist.init_process_group(backend=backend, store=store, rank=0, world_size=1)
