"""Tensor transport (the data plane): move large rollout outputs between workers.

- :class:`ObjectStoreTransport`: the producer ``put``\\ s tensors into the Ray object store and
  returns a small :class:`TensorHandle` (an ObjectRef + metadata); the driver passes handles only
  and the consumer ``get``\\ s the tensors (zero-copy from shared memory on the same node).
  Payloads are raw byte arrays (numpy uint8) plus allow-listed metadata; Ray's own pickling moves
  the numpy buffers between our processes, never anything from outside.
- :class:`InProcessTransport`: same interface, for LocalRemote runs and tests.
- :class:`P2PTransport`: torch.distributed send/recv between two ranks of a group: a JSON header
  (length, then bytes) followed by one message per tensor; the receiver allocates from the header.
- :class:`SampleTransport`: batches of ``unirl.types.Sample`` through the object store, encoded
  with the schema's own pickle-free binary codec and validated on arrival.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from unirl.distributed.codec import TensorMeta, byte_view, from_bytes, metas_from_bytes, metas_to_bytes
from unirl.distributed.collective import StandaloneGroup

if TYPE_CHECKING:
    from unirl.types import Sample


@dataclass(frozen=True)
class TensorHandle:
    """What the driver holds for a tensor payload: a store reference and the payload's metadata."""

    ref: Any
    metas: tuple[TensorMeta, ...]

    @property
    def nbytes(self) -> int:
        """Payload size."""
        return sum(m.nbytes for m in self.metas)


class TensorTransport(Protocol):
    """Handle-based data plane: ``put`` where the tensors are, ``get`` where they are needed."""

    def put(self, tensors: Mapping[str, torch.Tensor]) -> TensorHandle:
        """Publish ``tensors`` and return a handle (cheap to pass around)."""
        ...

    def get(self, handle: TensorHandle) -> dict[str, torch.Tensor]:
        """Fetch the tensors behind ``handle`` (fresh, writable CPU tensors)."""
        ...


def _encode(tensors: Mapping[str, torch.Tensor]) -> tuple[tuple[TensorMeta, ...], list[np.ndarray[Any, Any]]]:
    metas = tuple(TensorMeta.of(k, v) for k, v in tensors.items())
    return metas, [byte_view(v).numpy() for v in tensors.values()]


def _decode(metas: tuple[TensorMeta, ...], buffers: object) -> dict[str, torch.Tensor]:
    if not isinstance(buffers, list) or len(buffers) != len(metas):
        raise TypeError(
            f"tensor payload must be a list of {len(metas)} byte arrays, got {type(buffers).__name__}"
        )
    out: dict[str, torch.Tensor] = {}
    for meta, arr in zip(metas, buffers):
        if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8:
            raise TypeError(
                f"tensor {meta.name!r}: payload must be a uint8 numpy array, got {type(arr).__name__}"
            )
        # the store's arrays are read-only views of shared memory: copy once into our own tensor
        out[meta.name] = from_bytes(torch.from_numpy(arr.copy()), meta)
    return out


class ObjectStoreTransport:
    """Tensors through the Ray object store (call from any Ray worker or the driver)."""

    def put(self, tensors: Mapping[str, torch.Tensor]) -> TensorHandle:
        """ray.put the byte arrays; the calling process owns the object."""
        import ray

        metas, buffers = _encode(tensors)
        return TensorHandle(ray.put(buffers), metas)

    def get(self, handle: TensorHandle) -> dict[str, torch.Tensor]:
        """ray.get and rebuild the tensors, checking the payload against the handle's metadata."""
        import ray

        return _decode(handle.metas, ray.get(handle.ref))


class InProcessTransport:
    """A dict-backed stand-in for the object store (one process)."""

    def __init__(self) -> None:
        self._store: dict[int, list[np.ndarray[Any, Any]]] = {}
        self._ids = itertools.count()

    def put(self, tensors: Mapping[str, torch.Tensor]) -> TensorHandle:
        """Store copies of the byte arrays."""
        metas, buffers = _encode(tensors)
        key = next(self._ids)
        self._store[key] = [b.copy() for b in buffers]
        return TensorHandle(key, metas)

    def get(self, handle: TensorHandle) -> dict[str, torch.Tensor]:
        """Rebuild the tensors of ``handle``."""
        if handle.ref not in self._store:
            raise KeyError(f"no payload for handle {handle.ref!r} in this process")
        return _decode(handle.metas, self._store[handle.ref])


class P2PTransport:
    """torch.distributed send/recv of named tensors between two ranks of a StandaloneGroup."""

    def __init__(self, group: StandaloneGroup) -> None:
        self.group = group
        # NCCL moves CUDA tensors only; gloo moves CPU tensors
        self.device = torch.device("cuda") if group.backend == "nccl" else torch.device("cpu")

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(self.device).contiguous().reshape(-1).view(torch.uint8)

    def send(self, tensors: Mapping[str, torch.Tensor], dst: int) -> None:
        """Send a header then each tensor's bytes to ``dst`` (blocks until received)."""
        raw = metas_to_bytes(TensorMeta.of(k, v) for k, v in tensors.items())
        header = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(self.device)
        self.group.send(torch.tensor([header.numel()], dtype=torch.int64, device=self.device), dst)
        self.group.send(header, dst)
        for t in tensors.values():
            self.group.send(self._wire(t), dst)

    def recv(self, src: int) -> dict[str, torch.Tensor]:
        """Receive what :meth:`send` sent from ``src``."""
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.group.recv(size, src)
        header = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self.group.recv(header, src)
        metas, _ = metas_from_bytes(header.cpu().numpy().tobytes())
        out: dict[str, torch.Tensor] = {}
        for meta in metas:
            buf = torch.empty(meta.nbytes, dtype=torch.uint8, device=self.device)
            self.group.recv(buf, src)
            out[meta.name] = from_bytes(buf, meta)
        return out


@dataclass(frozen=True)
class SampleHandle:
    """A batch of Samples in the object store: a reference to their binary encoding."""

    ref: Any
    count: int
    nbytes: int


class SampleTransport:
    """Sample batches through the Ray object store (or a dict with ``in_process=True``).

    The payload is ``unirl.types.to_bytes`` output (msgpack + raw tensor bytes, no pickle); the
    consumer validates it back into Samples with ``unirl.types.list_from_bytes``.
    """

    def __init__(self, in_process: bool = False) -> None:
        self.in_process = in_process
        self._store: dict[int, bytes] = {}
        self._ids = itertools.count()

    def put(self, samples: list[Sample]) -> SampleHandle:
        """Encode and publish ``samples``."""
        from unirl.types import to_bytes

        data = to_bytes(list(samples))
        if self.in_process:
            key = next(self._ids)
            self._store[key] = data
            return SampleHandle(key, len(samples), len(data))
        import ray

        return SampleHandle(ray.put(data), len(samples), len(data))

    def get(self, handle: SampleHandle) -> list[Sample]:
        """Fetch and validate the Samples behind ``handle``."""
        from unirl.types import Sample, list_from_bytes

        if self.in_process:
            data: object = self._store[handle.ref]
        else:
            import ray

            data = ray.get(handle.ref)
        if not isinstance(data, bytes):
            raise TypeError(f"sample payload must be bytes, got {type(data).__name__}")
        samples = list_from_bytes(Sample, data)
        if len(samples) != handle.count:
            raise ValueError(f"sample payload holds {len(samples)} samples, the handle says {handle.count}")
        return samples
