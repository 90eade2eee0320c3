"""Reproducible noise: the initial latent x_T and the per-step SDE noise, from (seed, id).

Every engine and replay can regenerate x_T: it is drawn on CPU in fp32 from a torch Generator
seeded by a stable hash (sha256, never Python's salted ``hash()``) of the seed and a key. The key
is the sample id, or the group id when all samples of a group should start from the same noise.

Video latents ``[C, F, h, w]`` are drawn frame-aware (``frame_axis``): frame f comes from its own
stream ``(seed, key, stream, f)``, so a frame's noise does not depend on how many frames the video
has (a 9-frame video starts from the first frames of the 17-frame one: length curricula and
prefix-consistent evaluation), and a worker holding frames [a, b) of a sequence-parallel split can
draw exactly its slice without drawing the others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "FrameNoise",
    "initial_noise",
    "noise_generator",
    "noise_key",
    "sde_noise_key",
    "stable_seed",
]


def stable_seed(seed: int, key: str, stream: str = "init") -> int:
    """A 63-bit seed derived from (seed, key, stream) with sha256; identical across processes."""
    digest = hashlib.sha256(f"{int(seed)}\x1f{stream}\x1f{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def noise_key(sample_id: str, group_id: str, scope: str = "sample") -> str:
    """The key x_T is drawn from (``NoiseRecipe.scope``): the sample id, the group id (shared noise
    within a group) or, for ``"cousins"``, the parents' group and the child's index: child
    ``<g>/<k>/c<j>`` of group ``<g>/<k>`` draws from ``cousins:<g>/c<j>`` for every ``k``."""
    if scope == "sample":
        return f"sample:{sample_id}"
    if scope == "group":
        return f"group:{group_id}"
    if scope == "cousins":
        parents_group, sep, _ = group_id.rpartition("/")
        child = sample_id.removeprefix(group_id + "/")
        if not sep or child == sample_id:
            raise ValueError(
                f"noise.scope='cousins' needs child ids '<group>/<k>/c<j>' in group '<group>/<k>' "
                f"(expand_children's); got sample {sample_id!r} in group {group_id!r}: use scope 'sample'"
            )
        return f"cousins:{parents_group}/{child}"
    raise ValueError(f"noise.scope={scope!r} is not one of 'sample', 'group', 'cousins'")


def sde_noise_key(sample_id: str, group_id: str, scope: str = "sample") -> str:
    """The key of the per-step SDE noise: the sample's own, but shared by cousins (``noise_key``)."""
    return noise_key(sample_id, group_id, scope) if scope == "cousins" else f"sample:{sample_id}"


def noise_generator(seed: int, key: str, stream: str = "init") -> torch.Generator:
    """A CPU generator seeded by ``stable_seed(seed, key, stream)``."""
    return torch.Generator(device="cpu").manual_seed(stable_seed(seed, key, stream))


def frame_stream(stream: str, frame: int) -> str:
    """The stream name of frame ``frame`` (frame-aware noise)."""
    return f"{stream}/frame{int(frame)}"


def initial_noise(
    shape: Sequence[int], *, seed: int, keys: Sequence[str], frame_axis: int | None = None
) -> Tensor:
    """x_T for a batch: one CPU fp32 standard-normal tensor of ``shape`` per key, stacked -> [B, *shape].

    ``frame_axis`` (an axis of ``shape``, e.g. 1 for video ``[C, F, h, w]``): draw each frame from its
    own stream (module docstring); None draws the whole tensor from one stream (images)."""
    if frame_axis is None:
        return torch.stack(
            [torch.randn(tuple(shape), generator=noise_generator(seed, k), dtype=torch.float32) for k in keys]
        )
    return torch.stack([FrameNoise(seed, k, shape, frame_axis, stream="init").draw() for k in keys])


class FrameNoise:
    """Standard-normal draws of ``shape`` whose slices along ``frame_axis`` come from per-frame streams.

    Each call of ``draw`` advances every frame's generator once, so the k-th draw of frame f is the
    same whatever the number of frames (the per-step SDE noise of a video uses one of these per sample).
    """

    def __init__(self, seed: int, key: str, shape: Sequence[int], frame_axis: int, stream: str) -> None:
        shape = tuple(int(d) for d in shape)
        if not 0 <= frame_axis < len(shape):
            raise ValueError(f"frame_axis={frame_axis} is not an axis of shape {list(shape)}")
        self.shape, self.frame_axis = shape, frame_axis
        self._frame_shape = shape[:frame_axis] + shape[frame_axis + 1 :]
        self._gens = [noise_generator(seed, key, frame_stream(stream, f)) for f in range(shape[frame_axis])]

    def draw(self) -> Tensor:
        """One fp32 CPU tensor of ``shape``."""
        frames = [torch.randn(self._frame_shape, generator=g, dtype=torch.float32) for g in self._gens]
        return torch.stack(frames, dim=self.frame_axis)
