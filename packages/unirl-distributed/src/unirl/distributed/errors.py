"""Errors raised by the single-controller layer; each names what failed, where, and how to fix it."""

from __future__ import annotations


class DistributedError(RuntimeError):
    """Base class of every runtime error raised by unirl.distributed."""


class InsufficientDevicesError(DistributedError):
    """A placement asked for more devices (or CPUs) than the cluster has; raised before any worker starts."""


class WorkerDiedError(DistributedError):
    """A worker process of a Remote died (or was killed) while a call was in flight."""


class RemoteCallError(DistributedError):
    """A method raised inside a worker; the message carries the remote name, rank and the worker's error."""


class RemoteTimeoutError(DistributedError):
    """A call did not finish within its timeout (the worker may be hung or overloaded)."""


class WeightSyncError(DistributedError):
    """A weight sync failed verification: checksum mismatch, wrong tensor set, or a transport error."""


class StaleWeightVersionError(WeightSyncError):
    """A weight sync carried a version that is not newer than the last one the receiver accepted."""


class EmptyWeightSyncError(WeightSyncError):
    """A weight sync carried zero tensors (e.g. LoRA bound to zero modules): always a configuration bug."""
