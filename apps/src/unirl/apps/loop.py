"""Pieces every domain trainer's loop shares: prompt records -> Samples, checkpoints, Ctrl-C."""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Literal

import numpy as np
import torch

from unirl.types import ImagePrimitive, Sample, SampleMetadata, TextPrimitive
from unirl.types.sample import Scalar


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a dataset or world, with what a checker needs to score it."""

    id: str
    prompt: str
    answer: str | None = None
    spec: dict[str, Scalar | list[Scalar]] = field(default_factory=dict)
    images: tuple[np.ndarray, ...] = ()
    """uint8 ``[H, W, C]`` arrays the prompt refers to (a visual question); inputs after the text."""


def by_group(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    """group id -> its samples, in order of first appearance."""
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    return groups


def has_signal(group: Sequence[Sample], stage: str) -> bool:
    """A group whose ``stage`` rewards are not all equal: its group-normalised advantages (and so
    its gradient) are not all zero."""
    return len({s.part(stage).reward.total for s in group}) > 1  # type: ignore[union-attr]


def signal_fraction(samples: Sequence[Sample], stage: str) -> float:
    """The fraction of groups that carry a gradient (``groups_with_signal`` in the metrics)."""
    groups = by_group(samples).values()
    return sum(has_signal(g, stage) for g in groups) / max(len(groups), 1)


def make_samples(
    records: Sequence[PromptRecord],
    *,
    step: int,
    samples_per_prompt: int,
    split: Literal["train", "eval"],
    dataset: str,
    tag: str = "",
) -> list[Sample]:
    """``samples_per_prompt`` siblings per record; siblings share the group id ``<split><step><tag>/<record id>``.

    A record listed twice (``draw`` crosses an epoch boundary) gets a second group, ``.../<id>~1``:
    its own sample ids, so its own noise, and a group of ``samples_per_prompt`` like every other."""
    out = []
    seen: dict[str, int] = {}
    for r in records:
        n = seen[r.id] = seen.get(r.id, -1) + 1
        gid = f"{split}{step}{tag}/{r.id}" + (f"~{n}" if n else "")
        for k in range(samples_per_prompt):
            out.append(
                Sample(
                    id=f"{gid}/{k}",
                    group_id=gid,
                    inputs=[TextPrimitive(text=r.prompt), *(ImagePrimitive(pixels=i) for i in r.images)],
                    metadata=SampleMetadata(dataset=dataset, split=split, answer=r.answer, spec=r.spec),
                )
            )
    return out


class StopFlag:
    """Set by the first Ctrl-C (SIGINT) or SIGTERM: the loop finishes its step, saves, and stops.

    A second Ctrl-C interrupts at once (KeyboardInterrupt)."""

    def __init__(self) -> None:
        self.stop = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.stop:
            raise KeyboardInterrupt
        self.stop = True
        print("\nstopping after this step (saving a checkpoint); Ctrl-C again to abort now", flush=True)

    @contextmanager
    def installed(self) -> Iterator[StopFlag]:
        try:
            old_int = signal.signal(signal.SIGINT, self._handler)
            old_term = signal.signal(signal.SIGTERM, self._handler)
        except ValueError:  # not the main thread: no handlers, nothing to restore
            yield self
            return
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint to resume from (a partial or truncated one never counts)."""
    from unirl.train.checkpoint import latest_complete

    return latest_complete(run_dir / "checkpoints" / "latest")


def pick_device(name: str) -> torch.device:
    """The recipe's ``device``: ``auto`` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
