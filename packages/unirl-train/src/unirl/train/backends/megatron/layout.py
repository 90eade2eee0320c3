"""The parallel layout of `MegatronBackend`: megatron-core's parallel state (TP groups, then PP
stages, the rest data parallel), the layer split over the stages, and the global names that make
per-stage state (AdamW's step counts) mean the same at every layout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from unirl.train.backends.megatron.config import MegatronConfig


def init_parallel_state(config: MegatronConfig, device: torch.device) -> None:
    """Initialise megatron-core's parallel state for `config`'s layout (or check the one this
    process already has)."""
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    tp, pp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size
    vpp = config.virtual_pipeline_model_parallel_size
    world = dist.get_world_size()
    if world % tp:
        raise ValueError(
            f"backend.tensor_model_parallel_size={tp} does not divide the world size {world}; "
            f"use a divisor of {world}"
        )
    if world % (tp * pp):
        raise ValueError(
            f"backend.tensor_model_parallel_size={tp} x backend.pipeline_model_parallel_size={pp} "
            f"= {tp * pp} does not divide the world size {world}; choose sizes whose product divides it"
        )
    if not mpu.model_parallel_is_initialized():
        mpu.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp,
        )
    else:
        have = (
            mpu.get_tensor_model_parallel_world_size(),
            mpu.get_pipeline_model_parallel_world_size(),
            mpu.get_virtual_pipeline_model_parallel_world_size(),
        )
        if have != (tp, pp, vpp):
            raise ValueError(
                f"megatron-core is already initialised with (TP, PP, VPP)={have} in this process, but "
                f"backend asks for {(tp, pp, vpp)}; call megatron.core.parallel_state."
                "destroy_model_parallel() first or use the same layout"
            )
    if device.type == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(int(torch.initial_seed() % 2**31))


def check_layers(config: MegatronConfig, hf_config: Any) -> None:
    """The model's layers split evenly over the pipeline (and virtual pipeline) stages."""
    pp, vpp = config.pipeline_model_parallel_size, config.virtual_pipeline_model_parallel_size
    stages = pp * (vpp or 1)
    layers = getattr(hf_config, "num_hidden_layers", None)
    if stages > 1 and (not isinstance(layers, int) or layers % stages):
        what = f"backend.pipeline_model_parallel_size={pp}" + (
            f" x backend.virtual_pipeline_model_parallel_size={vpp}" if vpp else ""
        )
        raise ValueError(
            f"{what} = {stages} stages do not divide the model's num_hidden_layers={layers}; "
            "choose sizes whose product divides the layer count"
        )


def global_param_names(bridge: Any, chunks: Sequence[torch.nn.Module]) -> dict[str, str]:
    """Trainable name (in `MegatronCausalLM`) -> the name it has in the whole, unsplit model: the
    layer numbering of this rank's pipeline stage mapped to the global one, and a tied output
    layer's copy on the last stage named as the embedding (one AdamW state); the same names at
    PP = 1."""
    out = {}
    for i, chunk in enumerate(chunks):
        prefix = "gpt." if i == 0 else f"vp_chunks.{i - 1}."
        mapping = bridge._weight_name_mapping_mcore_local_to_global(chunk, consider_ep=False)
        for name, p in chunk.named_parameters():
            shared = getattr(p, "shared", False)
            out[prefix + name] = "gpt." + ("embedding.word_embeddings.weight" if shared else mapping[name])
    return out


def gather_steps(mine: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-parameter AdamW step counts (keyed by global name) of every pipeline stage, on every
    rank (collective over the pipeline group)."""
    from megatron.core import parallel_state as mpu

    if mpu.get_pipeline_model_parallel_world_size() == 1:
        return dict(mine)
    stages: list[Any] = [None] * mpu.get_pipeline_model_parallel_world_size()
    dist.all_gather_object(stages, dict(mine), group=mpu.get_pipeline_model_parallel_group())
    return {k: v for stage in stages for k, v in stage.items()}
