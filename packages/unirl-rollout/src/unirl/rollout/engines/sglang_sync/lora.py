"""``LoraRoute``: LoRA adapters written as PEFT directories and loaded by the SGLang server."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from torch import Tensor

from unirl.distributed.errors import WeightSyncError
from unirl.distributed.weightsync.lora import LORA_MARKERS, is_adapter
from unirl.rollout.engines.http import EngineHTTPClient
from unirl.rollout.engines.sglang_sync.common import Stamper, check_ok
from unirl.types import WeightStamp

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

        stamper = Stamper()
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
        check_ok(resp, "/load_lora_adapter", self.client.url)
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
            check_ok(resp, "/unload_lora_adapter", self.client.url)
            if previous_dir is not None:
                shutil.rmtree(previous_dir, ignore_errors=True)
        return stamp
