"""Child-process side of the CUDA IPC test (imported by name in a spawned process)."""

from __future__ import annotations

from typing import Any


def receive(ticket: Any, out: Any) -> None:
    """Receive one CUDA IPC sync and report (ack, checksum of what arrived) or the error text."""
    import torch

    from unirl.distributed.codec import checksum
    from unirl.distributed.weightsync import CudaIpcWeightSync

    got: dict[str, torch.Tensor] = {}
    try:
        ack = CudaIpcWeightSync(name="engine").receive(ticket, got.update)
        out.put(("ok", ack, checksum((k, v.cpu()) for k, v in got.items())))
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}", ""))
