"""Typed config of the SGLang LLM engine (``rollout.engine.kind: sglang_llm`` in a recipe) and
of its weight-sync modes, one per route of ``sglang_sync``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from unirl.rollout.engines.http import EngineHTTPClient, HTTPEngineConfig
from unirl.rollout.engines.sglang_sync import DiskRoute, DistributedRoute, LoraRoute
from unirl.types import ARSamplingParams

if TYPE_CHECKING:
    from unirl.rollout.engines.sglang_llm import PromptCodec, SGLangLLMEngine

__all__ = [
    "MemoryTag",
    "SGLangDiskSync",
    "SGLangDistributedSync",
    "SGLangLLMEngineConfig",
    "SGLangLoraSync",
]

MemoryTag = Literal["weights", "kv_cache", "cuda_graph"]


class _SyncConfig(BaseModel):
    """A weight-sync mode; its fields are the keyword arguments of its route (``route_cls``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    route_cls: ClassVar[type]

    def route(self, client: EngineHTTPClient) -> DistributedRoute | DiskRoute | LoraRoute:
        """The route of this mode over ``client``."""
        return self.route_cls(client, **self.model_dump(exclude={"mode"}))  # type: ignore[no-any-return]


class SGLangDistributedSync(_SyncConfig):
    """Weights by collective broadcast (``/init_weights_update_group`` + ``/update_weights_from_distributed``)."""

    route_cls: ClassVar[type] = DistributedRoute
    mode: Literal["distributed"] = "distributed"
    engine_world_size: int = Field(
        ge=1, description="server processes in the group: SGLang tp_size * dp_size"
    )
    master_address: str | None = Field(default=None, description="rendezvous host; None: this node's IP")
    master_port: int | None = Field(default=None, ge=1, le=65535, description="None: a free port")
    group_name: str = "unirl_weight_sync"
    backend: Literal["nccl", "gloo"] = "nccl"
    bucket_bytes: int = Field(default=512 * 1024**2, ge=1, description="bytes per update call")
    timeout_s: float = Field(default=600.0, gt=0, description="group formation and per-bucket bound")


class SGLangDiskSync(_SyncConfig):
    """Weights as safetensors shards in a directory shared with the server (``/update_weights_from_disk``)."""

    route_cls: ClassVar[type] = DiskRoute
    mode: Literal["disk"] = "disk"
    directory: str = Field(min_length=1, description="written here, read by the server under the same path")
    load_format: str | None = None
    keep_last: int = Field(default=1, ge=1, description="version directories kept")
    timeout_s: float = Field(default=600.0, gt=0)


class SGLangLoraSync(_SyncConfig):
    """LoRA adapters written per version and loaded with ``/load_lora_adapter`` under a fresh name."""

    route_cls: ClassVar[type] = LoraRoute
    mode: Literal["lora"] = "lora"
    directory: str = Field(min_length=1, description="adapter directories, readable by the server")
    rank: int = Field(ge=1)
    alpha: float = Field(gt=0)
    target_modules: list[str] = Field(min_length=1)
    adapter_name: str = Field(
        default="default", description="PEFT adapter name in the trainer's parameter names"
    )
    base_model: str | None = None
    timeout_s: float = Field(default=600.0, gt=0)


class SGLangLLMEngineConfig(HTTPEngineConfig):
    """A dedicated SGLang LLM engine (``rollout.engine.kind: sglang_llm``)."""

    kind: Literal["sglang_llm"] = "sglang_llm"
    sampling: ARSamplingParams
    stage: str = Field(default="ar", min_length=1)
    parent: str | None = None
    prompt_template: str = "{prompt}"
    stop_at_eos: bool = True
    weight_sync: SGLangDistributedSync | SGLangDiskSync | SGLangLoraSync | None = Field(
        default=None, discriminator="mode", description="None: never synced (a frozen policy)"
    )
    initial_weight_version: int = Field(default=0, ge=0)
    canary_prompt: str | None = Field(
        default="The quick brown fox jumps over the lazy dog.",
        description="scored after every sync (its log-probs must move); None disables (not with LoRA)",
    )
    canary_bound: float = Field(default=0.05, gt=0, description="max |engine - trainer| canary log-prob")
    sleep_tags: list[MemoryTag] | None = Field(default=None, description="memory sleep() releases; None: all")
    weights_survive_sleep: bool = False
    max_batch_size: int | None = Field(default=None, ge=1)
    health_timeout_s: float = Field(
        default=0.0, ge=0, description="wait this long for /health at build; 0: skip"
    )

    def build(
        self,
        codec: PromptCodec,
        *,
        canary_reference: Callable[[list[int]], Tensor] | None = None,
        transport: Any = None,
    ) -> SGLangLLMEngine:
        """The engine, encoding prompts with ``codec`` (the trainer's ``CausalLMBundle``)."""
        from unirl.rollout.engines.sglang_llm import SGLangLLMEngine

        client = self.client(transport)
        if self.health_timeout_s > 0:
            client.wait_healthy(timeout_s=self.health_timeout_s)
        route = self.weight_sync.route(client) if self.weight_sync is not None else None
        canary = codec.encode_prompt(self.canary_prompt) if self.canary_prompt else None
        return SGLangLLMEngine(
            client,
            codec,
            self.sampling,
            stage=self.stage,
            parent=self.parent,
            prompt_template=self.prompt_template,
            stop_at_eos=self.stop_at_eos,
            route=route,
            initial_weight_version=self.initial_weight_version,
            canary_ids=canary,
            canary_reference=canary_reference,
            canary_bound=self.canary_bound,
            sleep_tags=self.sleep_tags,
            weights_survive_sleep=self.weights_survive_sleep,
            max_batch_size=self.max_batch_size,
        )
