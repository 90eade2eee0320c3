"""``DiskRoute``: weights as safetensors shards on a filesystem shared with the SGLang server."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from torch import Tensor

from unirl.rollout.engines.http import EngineHTTPClient
from unirl.rollout.engines.sglang_sync.common import Stamper, buckets, check_ok
from unirl.types import WeightStamp


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
        stamper = Stamper()
        for i, bucket in enumerate(buckets(named, self.shard_bytes)):
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
        check_ok(resp, "/update_weights_from_disk", self.client.url)
        self.written.append(out)
        while len(self.written) > self.keep_last:
            shutil.rmtree(self.written.pop(0), ignore_errors=True)
        return stamp
