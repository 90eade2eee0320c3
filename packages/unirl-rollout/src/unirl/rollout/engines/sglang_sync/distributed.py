"""``DistributedRoute``: weights broadcast over a process group shared with the SGLang server."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from unirl.distributed.errors import WeightSyncError
from unirl.rollout.engines.http import EngineHTTPClient
from unirl.rollout.engines.sglang_sync.common import Stamper, buckets, check_ok, lookahead
from unirl.types import WeightStamp


def new_weight_update_group(
    backend: str,
    addr: str,
    port: int,
    rank: int,
    world_size: int,
    group_name: str,
    timeout_s: float,
    register_as: str | None = None,
) -> Any:
    """A process group built the way SGLang builds its side of ``/init_weights_update_group``.

    The SGLang server creates its group with a TCP rendezvous at ``addr:port``, a store prefixed
    by ``group_name`` and torch's process-group constructor; rank 0 (this process) must build the
    same thing or the NCCL id exchange never meets. ``register_as`` names the group in this
    process's torch registry (default ``group_name``; two ends in one process need two). Uses torch-private helpers (as every RL
    framework that talks to SGLang does); a torch upgrade that renames them fails here loudly.
    """
    from torch.distributed import PrefixStore, rendezvous
    from torch.distributed import distributed_c10d as c10d

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{addr}:{port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    try:
        pg, _ = c10d._new_process_group_helper(
            world_size,
            rank,
            [],
            backend,
            PrefixStore(group_name, store),
            group_name=register_as or group_name,
            timeout=timeout,
        )
    except TypeError as e:  # signature changed across torch versions
        raise RuntimeError(
            f"cannot build the SGLang weight-update group with torch {torch.__version__}: {e}"
        ) from e
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


class _Thread(threading.Thread):
    """A daemon thread that keeps its target's result or exception."""

    def __init__(self, fn: Any, *args: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.args = fn, args
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as e:
            self.error = e

    def outcome(self, timeout_s: float, what: str) -> Any:
        self.join(timeout_s)
        if self.is_alive():
            raise WeightSyncError(f"{what} did not finish within {timeout_s:g} s")
        if self.error is not None:
            raise self.error
        return self.result


class DistributedRoute:
    """``update_weights_from_distributed``: HTTP for the metadata, a collective for the bytes.

    Args:
        client: the server's client.
        engine_world_size: processes on the server side of the group (SGLang tp_size * dp_size).
        master_address / master_port: the rendezvous this process hosts (None: this node's IP,
            a free port).
        group_name: name of the group on both sides.
        backend: "nccl" (GPU) or "gloo" (CPU tests).
        bucket_bytes: tensors per ``/update_weights_from_distributed`` call, in bytes.
        timeout_s: bound on group formation and on each bucket.
    """

    def __init__(
        self,
        client: EngineHTTPClient,
        *,
        engine_world_size: int,
        master_address: str | None = None,
        master_port: int | None = None,
        group_name: str = "unirl_weight_sync",
        backend: str = "nccl",
        bucket_bytes: int = 512 * 1024 * 1024,
        timeout_s: float = 600.0,
    ) -> None:
        if engine_world_size < 1:
            raise ValueError(f"engine_world_size={engine_world_size} must be >= 1 (SGLang tp_size * dp_size)")
        self.client = client
        self.engine_world_size = engine_world_size
        self.master_address, self.master_port = master_address, master_port
        self.group_name, self.backend = group_name, backend
        self.bucket_bytes, self.timeout_s = bucket_bytes, timeout_s
        self.device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")
        self.group: Any = None
        self.broken: str | None = None

    def _init_group(self) -> None:
        from unirl.distributed.collective import free_port, node_ip

        addr = self.master_address or node_ip()
        port = self.master_port or free_port()
        world = 1 + self.engine_world_size
        body = {
            "master_address": addr,
            "master_port": port,
            "rank_offset": 1,
            "world_size": world,
            "group_name": self.group_name,
            "backend": self.backend,
        }
        # The server joins the group inside this request, so the request waits in a thread while
        # this thread hosts the rendezvous. Not the other way round: a rendezvous left waiting in
        # a thread after a refusal keeps a C++ store thread alive past interpreter exit (abort).
        poster = _Thread(
            lambda: self.client.post_json(
                "/init_weights_update_group", body, idempotent=False, timeout_s=self.timeout_s
            )
        )
        poster.start()
        try:
            group = new_weight_update_group(
                self.backend, addr, port, 0, world, self.group_name, self.timeout_s
            )
        except Exception as e:
            poster.join(self.timeout_s)
            if poster.error is None and poster.result is not None:
                check_ok(poster.result, "/init_weights_update_group", self.client.url)
            if poster.error is not None:
                raise poster.error from e
            raise WeightSyncError(f"joining the weight-update group at {addr}:{port} failed: {e}") from e
        try:
            resp = poster.outcome(self.timeout_s, "/init_weights_update_group")
            check_ok(resp, "/init_weights_update_group", self.client.url)
        except BaseException:
            group.shutdown()
            raise
        self.group = group

    def close(self) -> None:
        """Tear the weight-update group down (its communicator threads must not outlive the process)."""
        if self.group is not None:
            from torch.distributed import distributed_c10d as c10d

            c10d._world.pg_group_ranks.pop(self.group, None)
            self.group.shutdown()
            self.group = None

    def _broadcast(self, tensors: list[Tensor]) -> None:
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = 0
        for t in tensors:
            self.group.broadcast([t], opts).wait()

    def ship(self, named: Iterable[tuple[str, Tensor]], version: int) -> WeightStamp:
        if self.broken:
            raise WeightSyncError(
                f"SGLang {self.client.url}: the weight-update group is out of step after an earlier failure "
                f"({self.broken}); restart the server and the engine"
            )
        if self.group is None:
            self._init_group()
        stamper = Stamper()
        for bucket, last in lookahead(buckets(named, self.bucket_bytes)):
            tensors = [t.detach().to(self.device).contiguous() for _, t in bucket]
            for (name, _), t in zip(bucket, tensors):
                stamper.add(name, t)
            body = {
                "names": [n for n, _ in bucket],
                "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors],
                "shapes": [list(t.shape) for t in tensors],
                "group_name": self.group_name,
                "flush_cache": last,
                "weight_version": str(version) if last else None,
            }
            sender = _Thread(self._broadcast, tensors)
            sender.start()
            try:
                resp = self.client.post_json(
                    "/update_weights_from_distributed", body, idempotent=False, timeout_s=self.timeout_s
                )
                check_ok(resp, "/update_weights_from_distributed", self.client.url)
                sender.outcome(self.timeout_s, "broadcasting a weight bucket")
            except Exception as e:
                self.broken = f"{type(e).__name__}: {e}"
                raise
        return stamper.stamp(version, f"SGLang {self.client.url}")
