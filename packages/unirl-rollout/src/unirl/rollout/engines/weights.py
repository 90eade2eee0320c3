"""Trainer-side helpers for dedicated engines: materialise named tensors and stamp them.

A ``WeightStamp`` is what a dedicated engine's ``update_weights`` must echo back: the version
plus the checksum (``unirl.distributed.codec.checksum``: name, dtype, shape and bytes, in order)
of exactly the tensors sent.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from unirl.distributed.errors import EmptyWeightSyncError
from unirl.distributed.weightsync.protocol import full_tensor
from unirl.rollout.engines.guards import weight_stamp
from unirl.types import WeightStamp

__all__ = ["materialize", "module_weights", "stamp_of"]


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
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
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
