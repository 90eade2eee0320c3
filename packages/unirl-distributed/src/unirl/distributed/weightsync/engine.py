"""The ``engine`` weight plane: push into a dedicated inference engine (vLLM, SGLang) through the
engine's own ``update_weights``, with the stamp every such push is verified by.

A ``WeightStamp`` is what ``update_weights`` must echo back: the version plus the checksum
(:class:`unirl.distributed.codec.Checksum`: name, dtype, shape and bytes, in order) of exactly the
tensors sent. The engine itself checks the rest (its own parameters changed: the no-op-sync guard;
a canary sequence scores the same in the engine and its reference copy).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from unirl.distributed.codec import Checksum, TensorMeta
from unirl.distributed.errors import EmptyWeightSyncError
from unirl.distributed.weightsync.protocol import NamedTensors, SyncTicket, full_tensor
from unirl.types import WeightStamp

__all__ = [
    "EngineWeightPlane",
    "StampMismatchError",
    "WeightEngine",
    "check_weight_stamp",
    "materialize",
    "module_weights",
    "stamp_of",
    "weight_stamp",
]


class StampMismatchError(ValueError):
    """A receiver's stamp differs from the one the trainer computed for the tensors it sent."""


def weight_stamp(named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> WeightStamp:
    """The stamp of ``named_tensors`` in iteration order (checksum as ``unirl.distributed.codec``)."""
    c = Checksum()
    n_bytes = 0
    for name, t in named_tensors:
        c.update(name, t)
        n_bytes += t.numel() * t.element_size()
    return WeightStamp(version=version, checksum=c.hexdigest(), num_tensors=c.count, num_bytes=n_bytes)


def check_weight_stamp(got: WeightStamp, expected: WeightStamp, where: str) -> None:
    """Raise StampMismatchError unless ``got`` (computed by a receiver) equals ``expected``."""
    if got != expected:
        raise StampMismatchError(
            f"{where}: weight sync v{expected.version} stamp mismatch: received {got.num_tensors} tensors, "
            f"{got.num_bytes} bytes, checksum {got.checksum}; the trainer stamped {expected.num_tensors} "
            f"tensors, {expected.num_bytes} bytes, checksum {expected.checksum}. The tensors sent are not "
            "the ones stamped (different order, filter, dtype, or a consumed iterator)"
        )


def materialize(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Full (unsharded), detached, contiguous CPU tensors; EmptyWeightSyncError when empty.

    Aliases (tied weights, e.g. ``lm_head.weight`` sharing the embedding in a state dict) are
    kept once, under the first name: the engine's loader re-ties them, and a weight file cannot
    hold two names for one storage.
    """
    items: list[tuple[str, torch.Tensor]] = []
    seen: set[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = set()
    for n, t in named:
        t = full_tensor(t).detach().to("cpu").contiguous()
        key = (t.untyped_storage().data_ptr(), int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))
        if t.numel() and key in seen:
            continue
        seen.add(key)
        items.append((n, t))
    if not items:
        raise EmptyWeightSyncError("weight sync with zero tensors: the trainer sent nothing")
    return items


def module_weights(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A causal LM's parameters under their checkpoint (Hugging Face) names, tied ones once.

    ``named_parameters`` already drops a tied ``lm_head.weight`` (it is the embedding), which
    is what inference engines expect: their loaders re-tie the head themselves.
    """
    return materialize(model.named_parameters())


def stamp_of(items: list[tuple[str, torch.Tensor]], version: int) -> WeightStamp:
    """The stamp of ``items`` (already materialised) at ``version``."""
    return weight_stamp(items, version)


@runtime_checkable
class WeightEngine(Protocol):
    """What the engine plane pushes into: a dedicated engine's own verified weight update
    (``isinstance(engine, WeightEngine)``: the engine has its own weights to push to)."""

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], stamp: WeightStamp
    ) -> WeightStamp:
        """Load ``named_tensors`` as ``stamp.version``; returns the stamp of what it loaded."""
        ...


class EngineWeightPlane:
    """``sync.kind: engine``: materialise the policy, stamp it, ``engine.update_weights``, check the echo.

    ``push`` returns a one-bucket :class:`SyncTicket` whose checksum is the stamp's; there is no
    separate receiver (the engine loads and verifies inside ``update_weights``)."""

    kind = "engine"

    def __init__(self, engine: WeightEngine, *, name: str = "rollout engine") -> None:
        self.engine = engine
        self.name = name
        self.last_stamp: WeightStamp | None = None
        """The stamp the engine echoed at the last push."""

    def push(self, policy: NamedTensors, version: int) -> SyncTicket:
        """Push ``policy`` into the engine as ``version``; raises unless the engine echoes its stamp."""
        items = materialize(policy)
        stamp = stamp_of(items, version)
        got = self.engine.update_weights(items, stamp)
        check_weight_stamp(got, stamp, self.name)
        self.last_stamp = got
        metas = tuple(TensorMeta.of(n, t) for n, t in items)
        return SyncTicket(self.kind, got.version, got.checksum, (metas,), (got.checksum,))
