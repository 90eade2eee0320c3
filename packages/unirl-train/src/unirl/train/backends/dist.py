"""Process-group bootstrap for a single process (world size 1) when no launcher made one, and the
device a rank trains on."""

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


def default_device() -> torch.device:
    """cuda:LOCAL_RANK when CUDA is available, else cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def resolve_device(device: torch.device | str | None) -> torch.device:
    """`device`, with None and a bare "cuda" meaning this rank's GPU (or the CPU without one);
    a CUDA device becomes the current one."""
    out = torch.device(device) if device is not None else default_device()
    if out.type == "cuda" and out.index is None:
        out = default_device()
    if out.type == "cuda":
        torch.cuda.set_device(out)
    return out
