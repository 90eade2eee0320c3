"""`Remote`: a logical worker group with typed method calls and dispatch modes.

A Remote holds ``world_size`` workers built by ``factory(rank_info)``. The driver calls a worker
method by passing the unbound method itself, so the call is type-checked against the worker class::

    outs: list[float] = remote.call_all(Trainer.step, lr=1e-3)      # one-to-all
    ys: list[Out] = remote.call_dp(Trainer.score, xs)                # scatter by dp rank, gather
    state = remote.call_rank0(Trainer.state_dict)                    # rank 0 only
    fut = remote.call_all_async(Trainer.step, lr=1e-3); fut.result(timeout=60)

Implementations: :class:`unirl.distributed.local.LocalRemote` (in-process, same interface, for
single-process runs and tests) and :class:`unirl.distributed.ray_remote.RayRemote` (Ray actors).
Both pass the same contract tests.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

from unirl.distributed.dispatch import DispatchMode, check_dp_lengths, gather_dp, scatter_dp
from unirl.distributed.rank import RankInfo

W = TypeVar("W")
P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
A = TypeVar("A")
T = TypeVar("T")
U = TypeVar("U")

Call = tuple[tuple[Any, ...], dict[str, Any]]


class RemoteFuture(Protocol[R_co]):
    """The pending result of an async Remote call."""

    def result(self, timeout: float | None = None) -> R_co:
        """Block until the call finished (or ``timeout`` seconds passed) and return its value.

        Raises RemoteCallError (the method raised), WorkerDiedError (a worker died) or
        RemoteTimeoutError.
        """
        ...

    def done(self) -> bool:
        """True when :meth:`result` would return (or raise) without blocking."""
        ...


class MappedFuture(Generic[A, R]):
    """A future whose value is ``fn(inner.result())`` (how gathers are applied lazily)."""

    def __init__(self, inner: RemoteFuture[A], fn: Callable[[A], R]) -> None:
        self.inner = inner
        self._fn = fn

    def result(self, timeout: float | None = None) -> R:
        """The mapped value of the inner future."""
        return self._fn(self.inner.result(timeout))

    def done(self) -> bool:
        """Whether the inner future is done."""
        return self.inner.done()


def method_name(fn: Callable[..., Any], worker_cls_hint: str) -> str:
    """The attribute name a worker method is called by; lambdas and nested functions are refused."""
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or name.startswith("<"):
        raise TypeError(
            f"{worker_cls_hint}: pass an unbound worker method such as `MyWorker.step`, got {fn!r}"
        )
    return name


class RemoteBase(abc.ABC, Generic[W]):
    """Dispatch logic shared by every Remote; subclasses implement :meth:`_submit`."""

    name: str
    call_timeout_s: float | None

    @property
    @abc.abstractmethod
    def ranks(self) -> list[RankInfo]:
        """RankInfo of every worker, in global-rank order."""

    @property
    def world_size(self) -> int:
        """Number of workers."""
        return len(self.ranks)

    @abc.abstractmethod
    def _submit(self, method: str, targets: Sequence[int], calls: Sequence[Call]) -> RemoteFuture[list[Any]]:
        """Start ``method(*args, **kwargs)`` on each worker of ``targets`` (calls[i] for targets[i])."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop every worker and free its resources (idempotent)."""

    # ---- one-to-all -------------------------------------------------------------------------
    def call_all_async(
        self, fn: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> RemoteFuture[list[R]]:
        """Broadcast the arguments to every worker; the future yields the per-rank results."""
        name = method_name(fn, self.name)
        fut: RemoteFuture[list[R]] = self._submit(
            name, list(range(self.world_size)), [(args, kwargs)] * self.world_size
        )
        return fut

    def call_all(self, fn: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Synchronous :meth:`call_all_async` (waits at most ``call_timeout_s``)."""
        return self.call_all_async(fn, *args, **kwargs).result(self.call_timeout_s)

    # ---- rank 0 only ------------------------------------------------------------------------
    def call_rank0_async(
        self, fn: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> RemoteFuture[R]:
        """Run the method on global rank 0 only."""
        inner: RemoteFuture[list[R]] = self._submit(method_name(fn, self.name), [0], [(args, kwargs)])
        return MappedFuture(inner, _first)

    def call_rank0(self, fn: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Synchronous :meth:`call_rank0_async`."""
        return self.call_rank0_async(fn, *args, **kwargs).result(self.call_timeout_s)

    # ---- data-parallel scatter / gather -----------------------------------------------------
    def call_dp_async(self, fn: Callable[[W, list[T]], list[U]], items: Sequence[T]) -> RemoteFuture[list[U]]:
        """Split ``items`` by dp rank, run ``fn(chunk)`` everywhere, concatenate the dp outputs."""
        name = method_name(fn, self.name)
        ranks = self.ranks
        chunks = scatter_dp(items, ranks)
        inner: RemoteFuture[list[list[U]]] = self._submit(
            name, list(range(len(ranks))), [((chunk,), {}) for chunk in chunks]
        )
        where = f"{self.name}.{name}"

        def gather(outs: list[list[U]]) -> list[U]:
            check_dp_lengths(chunks, outs, where)
            return gather_dp(outs, ranks, where)

        return MappedFuture(inner, gather)

    def call_dp(self, fn: Callable[[W, list[T]], list[U]], items: Sequence[T]) -> list[U]:
        """Synchronous :meth:`call_dp_async`."""
        return self.call_dp_async(fn, items).result(self.call_timeout_s)

    def call(self, mode: DispatchMode, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Untyped entry point choosing the dispatch by ``mode`` (for config-driven callers)."""
        if mode is DispatchMode.ALL:
            return self.call_all(fn, *args, **kwargs)
        if mode is DispatchMode.RANK0:
            return self.call_rank0(fn, *args, **kwargs)
        if kwargs or len(args) != 1:
            raise TypeError(f"{self.name}: DispatchMode.DP takes exactly one positional list argument")
        return self.call_dp(fn, args[0])


Remote = RemoteBase
"""The name the design uses: ``Remote[W]`` is any worker group of ``W`` workers."""


def _first(values: list[R]) -> R:
    return values[0]
