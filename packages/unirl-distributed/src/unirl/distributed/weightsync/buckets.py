"""Serialized tensor buckets: each bucket is safetensors bytes put into a blob store.

safetensors is a data-only format (a JSON header + raw bytes; no code, no pickle), so a
receiver can parse bytes from anywhere safely. The blob store is the Ray object store between
processes (:class:`RayBlobStore`) or a dict in one process (:class:`InProcessBlobStore`). Memory
bound: the sender materialises one bucket at a time; the store holds the serialized buckets
until :meth:`confirm` drops them (Ray spills to disk past its object-store limit).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from unirl.distributed.codec import TensorMeta
from unirl.distributed.errors import WeightSyncError
from unirl.distributed.weightsync.base import BucketedWeightSync
from unirl.distributed.weightsync.protocol import DEFAULT_BUCKET_BYTES


class BlobStore(Protocol):
    """Where serialized buckets wait between sender and receivers."""

    def put(self, data: bytes) -> Any:
        """Store ``data``; returns a reference."""
        ...

    def get(self, ref: Any) -> bytes:
        """The bytes behind ``ref``."""
        ...

    def free(self, refs: Sequence[Any]) -> None:
        """Drop ``refs``."""
        ...


class InProcessBlobStore:
    """A dict (one process; tests and single-process runs)."""

    def __init__(self) -> None:
        self.blobs: dict[int, bytes] = {}
        self._ids = itertools.count()

    def put(self, data: bytes) -> int:
        """Store a copy."""
        key = next(self._ids)
        self.blobs[key] = bytes(data)
        return key

    def get(self, ref: Any) -> bytes:
        """Look up ``ref``."""
        if ref not in self.blobs:
            raise WeightSyncError(
                f"bucket {ref!r} is not in the blob store (freed by confirm, dropped, or never put); "
                "resync this version from the trainer"
            )
        return self.blobs[ref]

    def free(self, refs: Sequence[Any]) -> None:
        """Delete ``refs``."""
        for r in refs:
            self.blobs.pop(r, None)


class RayBlobStore:
    """The Ray object store; refs are ObjectRefs (freed when no process holds them)."""

    def put(self, data: bytes) -> Any:
        """ray.put."""
        import ray

        return ray.put(data)

    def get(self, ref: Any) -> bytes:
        """ray.get, type-checked."""
        import ray

        data = ray.get(ref)
        if not isinstance(data, bytes):
            raise WeightSyncError(f"bucket payload must be bytes, got {type(data).__name__}")
        return data

    def free(self, refs: Sequence[Any]) -> None:
        """Nothing to do: dropping the ticket drops the refs (Ray counts references)."""


class TensorBucketSync(BucketedWeightSync):
    """Weight sync through serialized safetensors buckets."""

    kind = "tensor_buckets"
    needs_ticket = True

    def __init__(self, store: BlobStore, *, max_bucket_bytes: int = DEFAULT_BUCKET_BYTES, **kw: Any) -> None:
        super().__init__(max_bucket_bytes=max_bucket_bytes, **kw)
        self.store = store

    def _ship(self, metas: tuple[TensorMeta, ...], tensors: list[torch.Tensor], checksum: str) -> Any:
        # safetensors refuses tensors that share storage (tied weights, views of a fused tensor):
        # give every tensor whose storage was already seen in this bucket its own copy
        seen: set[int] = set()
        owned: dict[str, torch.Tensor] = {}
        for m, t in zip(metas, tensors):
            c = t.detach().cpu().contiguous()
            ptr = c.untyped_storage().data_ptr()
            owned[m.name] = c.clone() if ptr in seen else c
            seen.add(ptr)
        data = st_save(owned)
        return self.store.put(data)

    def _fetch(self, metas: tuple[TensorMeta, ...], payload: Any) -> list[torch.Tensor]:
        data = self.store.get(payload)
        try:
            loaded = st_load(data)
        except Exception as exc:  # safetensors raises its own error types on malformed bytes
            raise WeightSyncError(f"{self.name}: bucket bytes are not valid safetensors ({exc})") from exc
        if set(loaded) != {m.name for m in metas}:
            raise WeightSyncError(
                f"{self.name}: bucket holds {sorted(loaded)[:4]}..., ticket lists {[m.name for m in metas][:4]}..."
            )
        return [loaded[m.name] for m in metas]

    def _release(self, payload: Sequence[Any]) -> None:
        self.store.free(payload)
