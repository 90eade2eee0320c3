"""`LocalRemote`: the in-process Remote (same interface as RayRemote; for single-process runs and tests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from unirl.distributed.errors import RemoteCallError
from unirl.distributed.rank import MeshShape, RankInfo, all_rank_infos
from unirl.distributed.remote import Call, RemoteBase

W = TypeVar("W")
R = TypeVar("R")


class DoneFuture(Generic[R]):
    """A future computed eagerly at submission (in-process calls run in order, like an actor's)."""

    def __init__(self, value: R | None = None, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error

    def result(self, timeout: float | None = None) -> R:
        """The value, or the worker's error wrapped in RemoteCallError."""
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # value is set whenever error is None

    def done(self) -> bool:
        """Always True."""
        return True


class LocalRemote(RemoteBase[W]):
    """``world_size`` worker objects in this process, called one after the other.

    No torch.distributed group is created (every worker lives in one process), so worker code
    that needs collectives must run under RayRemote; everything else behaves the same.
    """

    def __init__(self, factory: Callable[[RankInfo], W], *, name: str, mesh: MeshShape | None = None) -> None:
        self.name = name
        self.call_timeout_s = None
        self._ranks = all_rank_infos(mesh or MeshShape())
        self.workers: list[W] = [factory(info) for info in self._ranks]
        self._closed = False

    @property
    def ranks(self) -> list[RankInfo]:
        """RankInfo of every worker."""
        return list(self._ranks)

    def _submit(self, method: str, targets: Sequence[int], calls: Sequence[Call]) -> DoneFuture[list[Any]]:
        if self._closed:
            raise RemoteCallError(f"{self.name}.{method}: the Remote was shut down")
        results: list[Any] = []
        for rank, (args, kwargs) in zip(targets, calls):
            worker = self.workers[rank]
            bound = getattr(worker, method, None)
            if bound is None or not callable(bound):
                err = TypeError(f"{self.name}: worker {type(worker).__name__} has no method {method!r}")
                return DoneFuture(error=RemoteCallError(f"{self.name}[rank {rank}].{method}: {err}"))
            try:
                results.append(bound(*args, **kwargs))
            except Exception as exc:  # the worker's own error, surfaced like RayRemote does
                wrapped = RemoteCallError(
                    f"{self.name}[rank {rank}].{method} raised {type(exc).__name__}: {exc}"
                )
                wrapped.__cause__ = exc
                return DoneFuture(error=wrapped)
        return DoneFuture(results)

    def shutdown(self) -> None:
        """Drop the workers."""
        self._closed = True
        self.workers = []
