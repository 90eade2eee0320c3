"""CUDA IPC: the sender packs each bucket into one CUDA buffer and ships its IPC handle.

``torch.multiprocessing.reductions.reduce_tensor`` yields ``(rebuild_fn, args)`` for a CUDA
tensor; the receiver (same GPU node) rebuilds a view of the sender's memory, copies it into its
own tensors and drops the view. The handle tuple holds a function reference, so it travels through
Ray's / multiprocessing's pickling between our own processes only, never from outside. Buffers
stay alive on the sender until :meth:`confirm`. GPU only; tested under the ``gpu`` marker.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from unirl.distributed.codec import TensorMeta, from_bytes
from unirl.distributed.errors import WeightSyncError
from unirl.distributed.weightsync.base import BucketedWeightSync


class CudaIpcWeightSync(BucketedWeightSync):
    """Weight sync by CUDA IPC handles, one flat uint8 CUDA buffer per bucket."""

    kind = "cuda_ipc"
    needs_ticket = True

    def __init__(self, *, device: str | torch.device = "cuda", **kw: Any) -> None:
        super().__init__(**kw)
        self.device = torch.device(device)
        self._buffers: dict[int, torch.Tensor] = {}
        self._ids = itertools.count()

    def _ship(self, metas: tuple[TensorMeta, ...], tensors: list[torch.Tensor], checksum: str) -> Any:
        from torch.multiprocessing.reductions import reduce_tensor

        size = sum(m.nbytes for m in metas)
        buf = torch.empty(max(1, size), dtype=torch.uint8, device=self.device)
        offset = 0
        for m, t in zip(metas, tensors):
            flat = t.detach().to(self.device).contiguous().reshape(-1).view(torch.uint8)
            buf[offset : offset + m.nbytes].copy_(flat)
            offset += m.nbytes
        torch.cuda.synchronize(self.device)
        handle = reduce_tensor(buf)  # type: ignore[no-untyped-call]  # torch ships it unannotated
        key = next(self._ids)
        self._buffers[key] = buf  # kept alive until confirm(): the receivers map this memory
        return (key, handle)

    def _fetch(self, metas: tuple[TensorMeta, ...], payload: Any) -> list[torch.Tensor]:
        if not (isinstance(payload, tuple) and len(payload) == 2):
            raise WeightSyncError(f"{self.name}: malformed CUDA IPC payload {type(payload).__name__}")
        rebuild, args = payload[1]
        shared: torch.Tensor = rebuild(*args)
        out, offset = [], 0
        for m in metas:
            out.append(from_bytes(shared[offset : offset + m.nbytes].clone(), m))
            offset += m.nbytes
        torch.cuda.synchronize()
        del shared
        return out

    def _release(self, payload: Sequence[Any]) -> None:
        for key, _ in payload:
            self._buffers.pop(key, None)
