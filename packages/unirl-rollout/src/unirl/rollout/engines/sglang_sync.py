"""Weight updates of an SGLang server over its HTTP API, one class per route.

- :class:`DistributedRoute`: ``/init_weights_update_group`` once, then per bucket
  ``/update_weights_from_distributed`` (names, dtypes, shapes) while this process, rank 0 of the
  weight-update group, broadcasts each tensor in that order. The HTTP call returns only after the
  server received the bucket, so it runs concurrently with the broadcast.
- :class:`DiskRoute`: safetensors shards in a directory the server can read, then
  ``/update_weights_from_disk``. This is the pickle-free way to ship tensors to SGLang: its
  ``/update_weights_from_tensor`` route unpickles its payload (``MultiprocessingSerializer``),
  which this project never sends.
- :class:`LoraRoute`: the adapter tensors as a PEFT adapter directory, loaded with
  ``/load_lora_adapter`` under a fresh name per version (the previous one is unloaded), so a
  request never mixes two versions of an adapter.

Each route stamps exactly the tensors it shipped (``guards.weight_stamp`` semantics) and returns
the stamp; the engine compares it with the trainer's and verifies the server.
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from unirl.distributed.codec import Checksum
from unirl.distributed.errors import EmptyWeightSyncError, WeightSyncError
from unirl.distributed.weightsync.lora import LORA_MARKERS, is_adapter
from unirl.rollout.engines.http import EngineHTTPClient
from unirl.types import WeightStamp

__all__ = ["DiskRoute", "DistributedRoute", "LoraRoute", "new_weight_update_group"]


class _Stamper:
    """Accumulates the stamp of the tensors a route ships, in shipping order."""

    def __init__(self) -> None:
        self.c = Checksum()
        self.nbytes = 0

    def add(self, name: str, t: Tensor) -> None:
        self.c.update(name, t)
        self.nbytes += t.numel() * t.element_size()

    def stamp(self, version: int, where: str) -> WeightStamp:
        if self.c.count == 0:
            raise EmptyWeightSyncError(f"{where}: weight sync v{version} carried zero tensors")
        return WeightStamp(
            version=version, checksum=self.c.hexdigest(), num_tensors=self.c.count, num_bytes=self.nbytes
        )


def _buckets(named: Iterable[tuple[str, Tensor]], max_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
    """Order-preserving buckets of at most ``max_bytes`` (an oversized tensor alone)."""
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if bucket and size + n > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def _lookahead(it: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    """``(item, is_last)`` pairs, holding one item back."""
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True


def _check_ok(resp: Any, route: str, url: str) -> None:
    ok = resp.get("success") if isinstance(resp, dict) else None
    if ok is not True:
        msg = resp.get("message", resp.get("error_message", resp)) if isinstance(resp, dict) else resp
        raise WeightSyncError(f"SGLang {url}{route} refused the update: {msg}")


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
                _check_ok(poster.result, "/init_weights_update_group", self.client.url)
            if poster.error is not None:
                raise poster.error from e
            raise WeightSyncError(f"joining the weight-update group at {addr}:{port} failed: {e}") from e
        try:
            resp = poster.outcome(self.timeout_s, "/init_weights_update_group")
            _check_ok(resp, "/init_weights_update_group", self.client.url)
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
        stamper = _Stamper()
        for bucket, last in _lookahead(_buckets(named, self.bucket_bytes)):
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
                _check_ok(resp, "/update_weights_from_distributed", self.client.url)
                sender.outcome(self.timeout_s, "broadcasting a weight bucket")
            except Exception as e:
                self.broken = f"{type(e).__name__}: {e}"
                raise
        return stamper.stamp(version, f"SGLang {self.client.url}")


class DiskRoute:
    """``update_weights_from_disk`` with safetensors shards written to ``directory/<prefix>-v<version>``.

    ``directory`` must be readable by the server under the same path (shared filesystem). Only the
    last ``keep_last`` version directories this route wrote are kept.
    """

    def __init__(
        self,
        client: EngineHTTPClient,
        *,
        directory: str | Path,
        load_format: str | None = None,
        shard_bytes: int = 2 * 1024**3,
        keep_last: int = 1,
        prefix: str = "unirl",
        timeout_s: float = 600.0,
    ) -> None:
        self.client, self.directory = client, Path(directory)
        self.load_format, self.shard_bytes = load_format, shard_bytes
        self.keep_last, self.prefix, self.timeout_s = max(1, keep_last), prefix, timeout_s
        self.written: list[Path] = []

    def ship(self, named: Iterable[tuple[str, Tensor]], version: int) -> WeightStamp:
        from safetensors.torch import save_file

        out = self.directory / f"{self.prefix}-v{version}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        stamper = _Stamper()
        for i, bucket in enumerate(_buckets(named, self.shard_bytes)):
            shard = {}
            for name, t in bucket:
                shard[name] = t.detach().cpu().contiguous()
                stamper.add(name, shard[name])
            save_file(shard, str(out / f"model-{i:05d}.safetensors"))
        stamp = stamper.stamp(version, f"SGLang {self.client.url}")
        body = {"model_path": str(out), "load_format": self.load_format, "weight_version": str(version)}
        resp = self.client.post_json(
            "/update_weights_from_disk", body, idempotent=False, timeout_s=self.timeout_s
        )
        _check_ok(resp, "/update_weights_from_disk", self.client.url)
        self.written.append(out)
        while len(self.written) > self.keep_last:
            shutil.rmtree(self.written.pop(0), ignore_errors=True)
        return stamp


_ADAPTER_SEGMENT = re.compile(r"\.(" + "|".join(LORA_MARKERS) + r")\.([A-Za-z0-9_-]+)(?=\.|$)")


def peft_key(name: str, adapter_name: str = "default") -> str:
    """A trainer parameter name as PEFT saves it: ``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``."""

    def drop(m: re.Match[str]) -> str:
        return f".{m.group(1)}" if m.group(2) == adapter_name else m.group(0)

    return _ADAPTER_SEGMENT.sub(drop, name)


class LoraRoute:
    """``load_lora_adapter`` of a PEFT adapter directory written per version; the previous one is unloaded.

    The server must run with LoRA enabled (``--enable-lora`` and a ``--max-lora-rank`` /
    ``--lora-target-modules`` covering this adapter). ``active`` is the adapter name requests use.
    """

    def __init__(
        self,
        client: EngineHTTPClient,
        *,
        directory: str | Path,
        rank: int,
        alpha: float,
        target_modules: list[str],
        adapter_name: str = "default",
        base_model: str | None = None,
        prefix: str = "unirl",
        timeout_s: float = 600.0,
    ) -> None:
        if rank < 1 or not target_modules:
            raise ValueError(f"LoRA rank={rank} must be >= 1 and target_modules={target_modules} non-empty")
        self.client, self.directory = client, Path(directory)
        self.config = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": rank,
            "lora_alpha": alpha,
            "lora_dropout": 0.0,
            "bias": "none",
            "target_modules": list(target_modules),
            "base_model_name_or_path": base_model,
        }
        self.adapter_name, self.prefix, self.timeout_s = adapter_name, prefix, timeout_s
        self.active: str | None = None
        self.active_dir: Path | None = None

    def ship(self, named: Iterable[tuple[str, Tensor]], version: int) -> WeightStamp:
        from safetensors.torch import save_file

        stamper = _Stamper()
        tensors: dict[str, Tensor] = {}
        for name, t in named:
            if not is_adapter(name):
                raise ValueError(
                    f"LoRA weight sync got the non-adapter tensor {name!r}; pass only adapter tensors "
                    "(e.g. filter with unirl.distributed.weightsync.is_adapter), or sync the full model "
                    "with weight_sync.mode='distributed' / 'disk'"
                )
            cpu = t.detach().cpu().contiguous()
            stamper.add(name, cpu)
            tensors[peft_key(name, self.adapter_name)] = cpu
        stamp = stamper.stamp(version, f"SGLang {self.client.url} LoRA")
        lora_name = f"{self.prefix}-v{version}"
        out = self.directory / lora_name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        save_file(tensors, str(out / "adapter_model.safetensors"))
        (out / "adapter_config.json").write_text(json.dumps(self.config, indent=1))
        resp = self.client.post_json(
            "/load_lora_adapter",
            {"lora_name": lora_name, "lora_path": str(out)},
            idempotent=False,
            timeout_s=self.timeout_s,
        )
        _check_ok(resp, "/load_lora_adapter", self.client.url)
        loaded = resp.get("loaded_adapters")
        if isinstance(loaded, dict) and lora_name not in loaded:
            raise WeightSyncError(
                f"SGLang {self.client.url}: /load_lora_adapter answered success but {lora_name!r} is not among "
                f"the loaded adapters {sorted(loaded)}"
            )
        previous, previous_dir = self.active, self.active_dir
        self.active, self.active_dir = lora_name, out
        if previous is not None:
            resp = self.client.post_json(
                "/unload_lora_adapter", {"lora_name": previous}, idempotent=False, timeout_s=self.timeout_s
            )
            _check_ok(resp, "/unload_lora_adapter", self.client.url)
            if previous_dir is not None:
                shutil.rmtree(previous_dir, ignore_errors=True)
        return stamp
