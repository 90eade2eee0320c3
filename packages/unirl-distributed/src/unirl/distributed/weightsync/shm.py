"""CPU shared memory: the CPU equivalent of CUDA IPC (same node, no copy through a socket).

The sender copies each bucket once into a ``multiprocessing.shared_memory`` segment and ships
only its name plus the (allow-listed) metadata; the receiver maps the segment, copies the bucket
out into its own tensors, verifies, and unmaps. Segments live until :meth:`confirm` unlinks them,
so the sender holds one model copy in shared memory while receivers load.
"""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import torch

from unirl.distributed.codec import TensorMeta, byte_view, from_bytes
from unirl.distributed.errors import WeightSyncError
from unirl.distributed.weightsync.base import BucketedWeightSync


def _attach(name: str) -> shared_memory.SharedMemory:
    shm = shared_memory.SharedMemory(name=name, create=False)
    # Python < 3.13 registers attached segments with this process's resource tracker, which would
    # unlink the sender's segment when this process exits; the sender owns it, so unregister.
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]  # private but stable
    return shm


class SharedMemoryWeightSync(BucketedWeightSync):
    """Weight sync through POSIX shared-memory segments, one per bucket."""

    kind = "shared_memory"
    needs_ticket = True

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._segments: dict[str, shared_memory.SharedMemory] = {}

    def _ship(self, metas: tuple[TensorMeta, ...], tensors: list[torch.Tensor], checksum: str) -> str:
        size = max(1, sum(m.nbytes for m in metas))
        shm = shared_memory.SharedMemory(create=True, size=size)
        dst = torch.frombuffer(shm.buf, dtype=torch.uint8, count=size)
        offset = 0
        for m, t in zip(metas, tensors):
            dst[offset : offset + m.nbytes].copy_(byte_view(t))
            offset += m.nbytes
        del dst
        self._segments[shm.name] = shm
        return shm.name

    def _fetch(self, metas: tuple[TensorMeta, ...], payload: Any) -> list[torch.Tensor]:
        if not isinstance(payload, str):
            raise WeightSyncError(
                f"{self.name}: shared-memory payload must be a segment name, got {payload!r}"
            )
        try:
            shm = _attach(payload)
        except FileNotFoundError as exc:
            raise WeightSyncError(
                f"{self.name}: shared-memory segment {payload!r} is gone (already confirmed, or the sender "
                "is on another node: shared_memory sync needs sender and receiver on one node)"
            ) from exc
        try:
            src = torch.frombuffer(shm.buf, dtype=torch.uint8, count=shm.size)
            out, offset = [], 0
            for m in metas:
                out.append(from_bytes(src[offset : offset + m.nbytes].clone(), m))
                offset += m.nbytes
            del src
        finally:
            shm.close()
        return out

    def _release(self, payload: Sequence[Any]) -> None:
        for name in payload:
            shm = self._segments.pop(name, None)
            if shm is not None:
                shm.close()
                shm.unlink()

    def segment(self, name: str) -> shared_memory.SharedMemory:
        """The sender's live segment ``name`` (for inspection and fault-injection tests)."""
        return self._segments[name]
