"""`RayRemote`: a Remote whose workers are Ray actors placed on a device slab.

Start-up: (1) one :class:`WorkerHost` actor per rank, pinned to its slab bundle; (2) rank 0 picks
the rendezvous address/port and the driver hands them to every host, which joins the default
torch.distributed group (NCCL on GPU, gloo on CPU); (3) each host builds its worker with
``factory(rank_info)``, so worker constructors may already use collectives.

Calls return Ray ObjectRefs wrapped in :class:`RayFuture`; the driver waits on them with a
deadline and turns Ray's errors into ours (WorkerDiedError, RemoteCallError, RemoteTimeoutError),
naming the Remote, the rank and the method. Arguments and results cross process boundaries via
Ray's own (cloud)pickle between our own processes only; no bytes from outside are unpickled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from unirl.distributed.errors import RemoteCallError, RemoteTimeoutError, WorkerDiedError
from unirl.distributed.placement import Slab, allocate_slabs, plan_placement
from unirl.distributed.rank import MeshShape, RankInfo, all_rank_infos
from unirl.distributed.remote import Call, RemoteBase

if TYPE_CHECKING:
    from unirl.distributed.collective import Backend

W = TypeVar("W")
R = TypeVar("R")


class WorkerHost:
    """The Ray actor body that owns one worker object (constructed after the process group)."""

    def __init__(self, info: RankInfo, remote_name: str) -> None:
        self.info = info
        self.remote_name = remote_name
        self.worker: Any = None

    def pick_master(self) -> tuple[str, int]:
        """Rendezvous address chosen on this host (called on rank 0)."""
        from unirl.distributed.collective import pick_master  # torch: only for workers that use it

        return pick_master()

    def init_process_group(self, backend: Backend, addr: str, port: int, timeout_s: float) -> None:
        """Join the Remote's default torch.distributed group."""
        from unirl.distributed.collective import init_default_group

        init_default_group(backend, addr, port, self.info.rank, self.info.world_size, timeout_s)

    def construct(self, factory: Callable[[RankInfo], Any]) -> None:
        """Build the worker object."""
        self.worker = factory(self.info)

    def invoke(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``worker.method(*args, **kwargs)``."""
        bound = getattr(self.worker, method, None)
        if bound is None or not callable(bound):
            raise TypeError(
                f"{self.remote_name}: worker {type(self.worker).__name__} has no method {method!r}"
            )
        return bound(*args, **kwargs)

    def invoke_packed(self, method: str, call: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
        """:meth:`invoke` with ``(args, kwargs)`` packed in one (object-store) value."""
        args, kwargs = call
        return self.invoke(method, args, kwargs)

    def pid(self) -> int:
        """OS process id (tests kill workers by it)."""
        return os.getpid()


class RayFuture:
    """ObjectRefs of one call, one per targeted rank; :meth:`result` waits with a deadline."""

    def __init__(self, refs: list[Any], targets: Sequence[int], where: str) -> None:
        self.refs = refs
        self.targets = list(targets)
        self.where = where

    def done(self) -> bool:
        """True when every ref is ready (value or error)."""
        import ray

        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0, fetch_local=False)
        return len(ready) == len(self.refs)

    def result(self, timeout: float | None = None) -> list[Any]:
        """Per-rank values; the first failing rank is reported as soon as it fails (a raising rank
        after up to ``PEER_DEATH_GRACE_S`` for its peers: a dead peer is reported as the cause)."""
        import ray
        import ray.exceptions as rex

        deadline = None if timeout is None else time.monotonic() + timeout
        index = {ref: i for i, ref in enumerate(self.refs)}
        values: list[Any] = [None] * len(self.refs)
        pending = list(self.refs)
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left, fetch_local=True)
            if not ready:
                ranks = [self.targets[index[r]] for r in pending]
                raise RemoteTimeoutError(
                    f"{self.where}: ranks {ranks} did not finish within {timeout}s; the worker may be hung "
                    "or overloaded (raise call_timeout_s if the work is legitimately slow)"
                )
            for ref in ready:
                rank = self.targets[index[ref]]
                try:
                    values[index[ref]] = ray.get(ref)
                except _death_errors() as exc:
                    raise self._died(rank, exc) from exc
                except rex.RayTaskError as exc:
                    cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                    self._raise_if_a_peer_died(pending, index, rank, cause)
                    raise RemoteCallError(
                        f"{self.where}: rank {rank} raised {type(cause).__name__}: {cause}"
                    ) from cause
                except rex.RayError as exc:  # object lost, out of memory, ...: Ray's own failures
                    raise RemoteCallError(f"{self.where}: rank {rank}: Ray failed the call: {exc}") from exc
        return values

    def _raise_if_a_peer_died(
        self, pending: list[Any], index: dict[Any, int], rank: int, cause: BaseException
    ) -> None:
        """Rank ``rank`` raised; if a peer of the same call died, that death is the cause (a rank
        left waiting in a collective fails with a connection error before Ray reports its dead peer):
        wait up to ``PEER_DEATH_GRACE_S`` for the other ranks and raise WorkerDiedError naming it."""
        import ray

        if not pending:
            return
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=PEER_DEATH_GRACE_S, fetch_local=False)
        for ref in ready:
            try:
                ray.get(ref, timeout=0)
            except _death_errors() as exc:
                then = f" (rank {rank} then raised {type(cause).__name__}: {cause})"
                raise self._died(self.targets[index[ref]], exc, then) from exc
            except Exception:  # another rank's own error: the first one is reported
                continue

    def _died(self, rank: int, exc: BaseException, then: str = "") -> WorkerDiedError:
        return WorkerDiedError(
            f"{self.where}: worker rank {rank} died during the call ({type(exc).__name__}); "
            f"its state is lost, restart the Remote{then}"
        )


def _death_errors() -> tuple[type[BaseException], ...]:
    """Ray's errors for a call whose actor died (ray is imported lazily)."""
    import ray.exceptions as rex

    return (rex.ActorDiedError, rex.ActorUnavailableError, rex.RayActorError)


PEER_DEATH_GRACE_S = 5.0
"""How long a call whose rank raised waits for its other ranks to tell whether one of them died."""


class RayRemote(RemoteBase[W]):
    """A Remote of Ray actors; build it with :meth:`spawn`."""

    def __init__(
        self,
        name: str,
        ranks: list[RankInfo],
        hosts: list[Any],
        slab: Slab,
        share: float,
        owns_slab: bool,
        call_timeout_s: float | None,
    ) -> None:
        self.name = name
        self.share = share
        self.call_timeout_s = call_timeout_s
        self._ranks = ranks
        self.hosts = hosts
        self.bundles: list[int] = []
        """Slab bundle (device index) of each worker."""
        self.pids: list[int] = []
        """OS process id of each worker (e.g. to kill one in a fault-injection test)."""
        self.slab = slab
        self._owns_slab = owns_slab

    @classmethod
    def spawn(
        cls,
        factory: Callable[[RankInfo], W],
        *,
        name: str,
        mesh: MeshShape | None = None,
        slab: Slab | None = None,
        share: float = 1.0,
        process_group: bool = True,
        call_timeout_s: float | None = 300.0,
        startup_timeout_s: float = 60.0,
        collective_timeout_s: float = 1800.0,
        cpus_per_worker: float = 1.0,
    ) -> RayRemote[W]:
        """Start ``mesh.world_size`` actors on ``slab`` (a fresh CPU slab when None) and build workers.

        ``share`` is the fraction of each device this Remote takes (colocated siblings use < 1);
        ``cpus_per_worker`` sizes the fresh slab (ignored when ``slab`` is given).
        ``startup_timeout_s`` bounds each start-up phase; ``collective_timeout_s`` is the default
        group's per-collective timeout (how long a rank waits for a dead or slow peer).
        """
        import ray

        ranks = all_rank_infos(mesh or MeshShape())
        owns = slab is None
        if slab is None:
            plan = plan_placement({name: len(ranks)}, "separate")
            slab = allocate_slabs(plan, cpus_per_device=cpus_per_worker, timeout_s=startup_timeout_s)[name]
        try:
            bundles = slab.claim(len(ranks), share, name)
        except BaseException:
            if owns:
                slab.release()
            raise
        actor_cls = ray.remote(WorkerHost)
        hosts: list[Any] = [
            actor_cls.options(**slab.actor_options(b, share), max_restarts=0, max_concurrency=1).remote(
                info, name
            )
            for b, info in zip(bundles, ranks)
        ]
        remote: RayRemote[W] = cls(name, ranks, hosts, slab, share, owns, call_timeout_s)
        remote.bundles = bundles
        try:
            if process_group:
                addr, port = RayFuture([hosts[0].pick_master.remote()], [0], f"{name}.pick_master").result(
                    startup_timeout_s
                )[0]
                backend: Backend = "nccl" if slab.device == "gpu" else "gloo"
                refs = [h.init_process_group.remote(backend, addr, port, collective_timeout_s) for h in hosts]
                RayFuture(refs, range(len(hosts)), f"{name}.init_process_group").result(startup_timeout_s)
            refs = [h.construct.remote(factory) for h in hosts]
            RayFuture(refs, range(len(hosts)), f"{name}.construct").result(startup_timeout_s)
            refs = [h.pid.remote() for h in hosts]
            remote.pids = RayFuture(refs, range(len(hosts)), f"{name}.pid").result(startup_timeout_s)
        except BaseException:
            remote.shutdown()
            raise
        return remote

    @property
    def ranks(self) -> list[RankInfo]:
        """RankInfo of every worker."""
        return list(self._ranks)

    def _submit(self, method: str, targets: Sequence[int], calls: Sequence[Call]) -> RayFuture:
        if not self.hosts:
            raise RemoteCallError(f"{self.name}.{method}: the Remote was shut down")
        import ray

        if len(calls) > 1 and all(c is calls[0] for c in calls):
            # one-to-all: serialise the arguments once into the object store; every worker reads
            # the same copy (Ray resolves a top-level ObjectRef argument before the call runs)
            shared = ray.put(calls[0])
            refs = [self.hosts[r].invoke_packed.remote(method, shared) for r in targets]
        else:
            refs = [self.hosts[r].invoke.remote(method, a, k) for r, (a, k) in zip(targets, calls)]
        return RayFuture(refs, targets, f"{self.name}.{method}")

    def shutdown(self) -> None:
        """Kill the actors and give back this Remote's share of the slab."""
        import ray

        for h in self.hosts:
            ray.kill(h, no_restart=True)
        if self.hosts:
            for i in range(len(self._ranks)):
                self.slab.used[i] = max(0.0, self.slab.used[i] - self.share)
        self.hosts = []
        if self._owns_slab:
            self.slab.release()
            self._owns_slab = False
