"""MegatronConfig: the `backend.kind: megatron` section of a recipe (no megatron-core import here).

The parallel layout follows megatron-core's names: the world is split into TP groups, then PP
stages (``tensor_model_parallel_size x pipeline_model_parallel_size`` must divide the world size;
the rest is data parallel), and the model's layers evenly over the ``pipeline_model_parallel_size
x (virtual_pipeline_model_parallel_size or 1)`` stages (checked when the backend is built, where
the world and the model are known). Under pipeline parallelism the TrainStack hands the
micro-batches of a step to megatron-core's 1F1B schedule (interleaved with virtual stages, which
needs at least ``pipeline_model_parallel_size`` micro-batches per step, a multiple of it).

What megatron-core offers but this backend does not run yet is refused with the field, the
value and what works instead, rather than accepted and ignored: context and expert parallelism,
and megatron-core's distributed optimizer (its optimizer classes allocate on CUDA only; this
backend steps the same torch AdamW as FSDPBackend).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from unirl.train.ema import EMAConfig
from unirl.train.lora import LoRAConfig
from unirl.train.optim import AdamWConfig, ConstantSchedule, ScheduleConfig
from unirl.train.precision import PrecisionConfig


def _unsupported(field: str, value: object, fix: str) -> ValueError:
    return ValueError(f"backend.{field}={value!r} is not supported by the megatron backend yet; {fix}")


class MegatronConfig(BaseModel):
    """Configuration of `MegatronBackend` (megatron-core GPTModel built from a Hugging Face model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["megatron"] = "megatron"
    optimizer: AdamWConfig
    scheduler: ScheduleConfig = Field(default_factory=ConstantSchedule)
    precision: PrecisionConfig = Field(
        default_factory=PrecisionConfig,
        description="param_dtype is the compute dtype (autocast); master weights and moments stay fp32.",
    )
    grad_clip: float | None = Field(
        default=1.0, gt=0, description="Clip the total grad norm to this; None = no clipping."
    )
    ema: EMAConfig | None = Field(default=None, description="EMA of the trainable params; None = off.")
    lora: LoRAConfig | None = Field(default=None, description="Must stay None: no LoRA on megatron yet.")
    reference: Literal["none", "frozen_copy"] = Field(
        default="none", description="Reference policy for KL: a frozen copy of the initial weights."
    )
    tensor_model_parallel_size: int = Field(default=1, ge=1, description="TP ranks a layer is split over.")
    sequence_parallel: bool = Field(
        default=False, description="Shard LayerNorm/dropout activations over the TP ranks (needs TP > 1)."
    )
    pipeline_model_parallel_size: int = Field(
        default=1,
        ge=1,
        description="Pipeline stages the layers are split over (1F1B schedule); > 1 supports one "
        "model forward per micro-batch, so no KL reference forward inside the loss (kl_coef: 0).",
    )
    virtual_pipeline_model_parallel_size: int | None = Field(
        default=None,
        ge=2,
        description="Model chunks per pipeline rank (interleaved 1F1B); None = one. Needs "
        "pipeline_model_parallel_size > 1.",
    )
    context_parallel_size: int = Field(default=1, ge=1)
    expert_model_parallel_size: int = Field(default=1, ge=1)
    distributed_optimizer: bool = False
    recompute: Literal["none", "selective", "full"] = Field(
        default="none",
        description="Activation recomputation: 'selective' recomputes core attention, 'full' each layer.",
    )
    attention: Literal["sdpa", "unfused"] = Field(
        default="sdpa",
        description="Core attention of the local spec: torch SDPA (fused kernels on CUDA) or megatron-core's "
        "unfused DotProductAttention. Transformer Engine's spec uses its own fused attention.",
    )
    transformer_impl: Literal["auto", "local", "transformer_engine"] = Field(
        default="auto",
        description="megatron-core layer spec: Transformer Engine when importable ('auto'), else the "
        "local (pure torch) spec.",
    )

    @model_validator(mode="after")
    def _check(self) -> MegatronConfig:
        if self.virtual_pipeline_model_parallel_size is not None and self.pipeline_model_parallel_size == 1:
            raise ValueError(
                f"backend.virtual_pipeline_model_parallel_size={self.virtual_pipeline_model_parallel_size} "
                "needs backend.pipeline_model_parallel_size > 1 (got 1); leave it unset or raise "
                "pipeline_model_parallel_size"
            )
        if self.context_parallel_size != 1:
            raise _unsupported("context_parallel_size", self.context_parallel_size, "use 1")
        if self.expert_model_parallel_size != 1:
            raise _unsupported(
                "expert_model_parallel_size", self.expert_model_parallel_size, "use 1 (dense models)"
            )
        if self.lora is not None:
            raise _unsupported("lora", self.lora.model_dump(), "drop it (full fine-tuning) or use kind: fsdp")
        if self.distributed_optimizer:
            raise _unsupported(
                "distributed_optimizer", True, "use false (AdamW state is sharded over TP ranks only)"
            )
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ValueError(
                "backend.sequence_parallel=True needs backend.tensor_model_parallel_size > 1 "
                "(got 1); set sequence_parallel: false"
            )
        return self

    def build(self, module: torch.nn.Module, device: torch.device | str | None = None):  # -> MegatronBackend
        """A MegatronBackend whose GPTModel is converted from the Hugging Face causal LM `module`
        (which stays as the rollout copy the backend keeps in step with the trained weights), or,
        for a diffusers SD3Transformer2DModel or FluxTransformer2DModel, a MegatronMMDiTBackend
        (its blocks on megatron-core; the built module replaces the diffusers one)."""
        from unirl.train.backends.megatron.mmdit import mmdit_family

        if mmdit_family(module) is not None:  # a diffusers SD3 / FLUX MMDiT: its blocks on megatron-core
            from unirl.train.backends.megatron.dit_backend import MegatronMMDiTBackend

            return MegatronMMDiTBackend(module, self, device=device)
        from unirl.train.backends.megatron.backend import MegatronBackend

        return MegatronBackend(module, self, device=device)
