"""The async weight plane in one process: versioned, verified, double-buffered.

The trainer ``publish``es a snapshot of the policy after each RL step (CPU copies, so it trains on
at once); the rollout side keeps sampling with the weights it holds and swaps the newest snapshot
in between batches (``RolloutCopy.refresh``). Every swap is verified before anything is loaded:
the snapshot's stamp (checksum over its tensors, in order), recomputed on the rollout side, must
equal the one the trainer took at publish, each tensor's dtype and shape must match the copy's,
and the version must not go back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from unirl.distributed.errors import StaleWeightVersionError
from unirl.distributed.weightsync.protocol import full_tensor
from unirl.rollout.engines.guards import check_weight_stamp, weight_stamp
from unirl.types import WeightStamp


@dataclass(frozen=True)
class Snapshot:
    """``version``: the policy version (RL steps trained); ``stamp.version``: the backend's
    optimizer step, the ``weight_version`` its Parts carry (as in the synchronous run)."""

    version: int
    tensors: list[tuple[str, Tensor]]
    stamp: WeightStamp


class WeightMailbox:
    """Holds the newest published policy (older ones are dropped: rollout only ever wants the newest)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: Snapshot | None = None

    def publish(self, version: int, weight_version: int, named: Iterable[tuple[str, Tensor]]) -> WeightStamp:
        """Snapshot ``named`` (full CPU copies) as policy ``version``; the trainer may train on at once."""
        tensors = [(n, full_tensor(t.detach()).to("cpu", copy=True)) for n, t in named]
        stamp = weight_stamp(tensors, weight_version)
        with self._lock:
            if self._latest is not None and version <= self._latest.version:
                raise ValueError(
                    f"policy version {version} is not newer than the published {self._latest.version}"
                )
            self._latest = Snapshot(version, tensors, stamp)
        return stamp

    def latest(self) -> Snapshot | None:
        with self._lock:
            return self._latest


class RolloutCopy:
    """The rollout side's module: loads mailbox snapshots into its own parameters, verified."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module.requires_grad_(False)
        self.params = dict(module.named_parameters())
        self.version = -1  # the policy version held (-1: none loaded yet)
        self.weight_version = 0  # its optimizer step, stamped on the Parts it generates
        self.stamp: WeightStamp | None = None  # the stamp of the snapshot held

    def refresh(self, mailbox: WeightMailbox, min_version: int) -> int:
        """Load the newest snapshot if it is newer than what is held; the version now held.

        Raises if even the newest is older than ``min_version`` (the staleness bound)."""
        snap = mailbox.latest()
        if snap is None or snap.version < min_version:
            have = None if snap is None else snap.version
            raise RuntimeError(f"async rollout needs policy version >= {min_version}; the mailbox has {have}")
        if snap.version < self.version or (snap.version == self.version and snap.stamp != self.stamp):
            # a mailbox rebuilt (or restored) behind the copy: loading it would move the policy back
            kind = "stale" if snap.version < self.version else "repeated (with other weights)"
            raise StaleWeightVersionError(
                f"async rollout copy holds policy v{self.version}; the mailbox offers {kind} v{snap.version}. "
                "Versions must increase with every publish: publish the trainer's current policy as "
                f"v{self.version + 1} or later"
            )
        if snap.version == self.version:
            return self.version
        names = [n for n, _ in snap.tensors]
        unknown = sorted(set(names) - set(self.params))
        missing = sorted(set(self.params) - set(names))
        if unknown or missing:
            raise RuntimeError(
                f"async weight snapshot v{snap.version} does not match the rollout copy: unknown "
                f"{unknown[:3]}, missing {missing[:3]} (is the copy built like the trained module?)"
            )
        # verified before loading, so a snapshot corrupted after publish never reaches the copy.
        # Loading is then a same-dtype, same-shape copy_ (checked first: no silent cast or
        # broadcast), so the loaded bytes are the verified ones without hashing them again.
        check_weight_stamp(
            weight_stamp(snap.tensors, snap.stamp.version), snap.stamp, "async weight snapshot"
        )
        for n, t in snap.tensors:
            p = self.params[n]
            if (p.dtype, p.shape) != (t.dtype, t.shape):
                raise RuntimeError(
                    f"async weight snapshot v{snap.version}: {n!r} is {t.dtype} {tuple(t.shape)}, the rollout "
                    f"copy's is {p.dtype} {tuple(p.shape)} (is the copy built like the trained module?)"
                )
        with torch.no_grad():
            for n, t in snap.tensors:
                self.params[n].copy_(t)
        self.version, self.weight_version, self.stamp = snap.version, snap.stamp.version, snap.stamp
        return self.version
