"""Reproducible noise: the initial latent x_T and the per-step SDE noise, from (seed, id).

Every engine and replay can regenerate x_T: it is drawn on CPU in fp32 from a torch Generator
seeded by a stable hash (sha256, never Python's salted ``hash()``) of the seed and a key. The key
is the sample id, or the group id when all samples of a group should start from the same noise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["initial_noise", "noise_generator", "noise_key", "stable_seed"]


def stable_seed(seed: int, key: str, stream: str = "init") -> int:
    """A 63-bit seed derived from (seed, key, stream) with sha256; identical across processes."""
    digest = hashlib.sha256(f"{int(seed)}\x1f{stream}\x1f{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def noise_key(sample_id: str, group_id: str, *, same_noise_per_group: bool) -> str:
    """The key x_T is drawn from: the group id (shared noise within a group) or the sample id."""
    return f"group:{group_id}" if same_noise_per_group else f"sample:{sample_id}"


def noise_generator(seed: int, key: str, stream: str = "init") -> torch.Generator:
    """A CPU generator seeded by ``stable_seed(seed, key, stream)``."""
    return torch.Generator(device="cpu").manual_seed(stable_seed(seed, key, stream))


def initial_noise(shape: Sequence[int], *, seed: int, keys: Sequence[str]) -> Tensor:
    """x_T for a batch: one CPU fp32 standard-normal tensor of ``shape`` per key, stacked -> [B, *shape]."""
    return torch.stack(
        [torch.randn(tuple(shape), generator=noise_generator(seed, k), dtype=torch.float32) for k in keys]
    )
