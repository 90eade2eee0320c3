"""Partial rollouts in the async lifecycle (``rl.buffer.partial_rollouts``, AR only).

The rollout copy's decode loop asks ``MailboxSwap`` between chunks whether the trainer published a
newer policy; if so the copy swaps to it (verified, as between batches) and the generation goes on
from its tokens (``unirl.rollout.ar.partial``). Every token then carries the version that sampled
it (``TextSegment.versions``), and a Sample's staleness counts from its OLDEST token: the batch's
``version`` in the buffer is the oldest token version of its samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unirl.apps.asynchronous.mailbox import RolloutCopy, WeightMailbox
from unirl.types import Sample, TextSegment


class MailboxSwap:
    """``unirl.rollout.ar.WeightSwap`` over the rollout copy and the trainer's mailbox."""

    def __init__(self, copy: RolloutCopy, mailbox: WeightMailbox) -> None:
        self.copy, self.mailbox = copy, mailbox
        self.swaps = 0  # weight swaps inside a generation (not the refreshes between batches)

    def held(self) -> tuple[int, int]:
        return self.copy.version, self.copy.weight_version

    def newer(self) -> bool:
        snap = self.mailbox.latest()
        return snap is not None and snap.version > self.copy.version

    def swap(self) -> None:
        self.copy.refresh(self.mailbox, self.copy.version)
        self.swaps += 1


def _versioned(samples: Sequence[Sample], stage: str) -> list[TextSegment]:
    segs = [p.segment for s in samples for p in s.parts if p.name == stage]
    return [g for g in segs if isinstance(g, TextSegment) and g.versions]


def oldest_version(samples: Sequence[Sample], stage: str, default: int) -> int:
    """The oldest policy version any token of ``samples`` was sampled with (``default``, the
    version the batch started with, when no sample records versions)."""
    olds = [g.versions[0].version for g in _versioned(samples, stage)]  # type: ignore[index]
    return min(olds) if olds else default


def version_metrics(samples: Sequence[Sample], stage: str, trained_version: int) -> dict[str, float]:
    """Versions per sample (mean, max), the fraction of samples interrupted (sampled by more than
    one version), the mean staleness from each sample's oldest token (what the bound applies to)
    and the mean staleness of the tokens themselves (lower: the freshness partial rollouts buy);
    {} without versions."""
    segs = _versioned(samples, stage)
    if not segs:
        return {}
    counts = np.array([len(g.versions or ()) for g in segs])  # _versioned: every one has versions
    oldest = np.array([g.versions[0].version for g in segs])  # type: ignore[index]
    tokens = np.array([v for g in segs for v in g.token_versions() or []])
    return {
        "async/versions_per_sample_mean": float(counts.mean()),
        "async/versions_per_sample_max": float(counts.max()),
        "async/interrupted_frac": float((counts > 1).mean()),
        "async/sample_staleness_mean": float((trained_version - oldest).mean()),
        "async/token_staleness_mean": float((trained_version - tokens).mean()),
    }
