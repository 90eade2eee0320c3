"""Hugging Face <-> megatron-core weights through mbridge (the bridge verl and slime use).

mbridge maps a Hugging Face config to a megatron-core `TransformerConfig` and GPTModel provider,
and converts weights both ways, splitting and gathering over tensor-parallel ranks. Three
things are added here, each small:

- the local (pure torch) layer spec when Transformer Engine is not installed: mbridge always
  asks for the TE spec, whose fused LayerNorm+linear parameters are named differently, so the
  two norm names of the local spec are mapped too; its core attention optionally through torch
  SDPA (`attention.SDPACoreAttention`);
- RoPE's base read from ``rope_parameters`` (transformers >= 5 keeps it there) and full-vocab
  logits (``parallel_output=False``) so the pipelines' log-prob code sees the whole vocabulary;
- weights from an in-memory state dict (the trainer hands over a built module, not a directory).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch


def has_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


class _StateDictIO:
    """mbridge's SafeTensorIO interface over a state dict held in memory."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        self.state = state

    def load_some_hf_weight(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        return {n: self.load_one_hf_weight(n) for n in names}

    def load_one_hf_weight(self, name: str) -> torch.Tensor:
        if name not in self.state:
            raise KeyError(f"Hugging Face weight {name!r} is not in the model's state dict")
        return self.state[name]


class _UnirlBridge:
    """Mixed in before mbridge's per-family bridge class."""

    local_spec: bool = False
    sdpa_attention: bool = False  # the local spec's core attention through torch SDPA

    def _get_safetensor_io(self, weights_path: Any) -> Any:
        if isinstance(weights_path, Mapping):
            return _StateDictIO(weights_path)
        return super()._get_safetensor_io(weights_path)  # type: ignore[misc]

    def _get_gptmodel_args(self) -> dict[str, Any]:
        hf = self.hf_config  # type: ignore[attr-defined]
        rope = getattr(hf, "rope_theta", None)
        if rope is None:
            rope = (getattr(hf, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
            hf.rope_theta = rope  # mbridge's own code reads the attribute
        args = super()._get_gptmodel_args()  # type: ignore[misc]
        return {**args, "rotary_base": rope, "parallel_output": False}

    def _get_transformer_layer_spec(self, vp_stage: int | None = None) -> Any:
        if not self.local_spec:
            return super()._get_transformer_layer_spec(vp_stage)  # type: ignore[misc]
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

        self.has_vp_stage = True
        spec = get_gpt_decoder_block_spec(self.config, use_transformer_engine=False, vp_stage=vp_stage)  # type: ignore[attr-defined]
        if self.sdpa_attention:
            from unirl.train.backends.megatron.attention import SDPACoreAttention

            for layer in spec.layer_specs:
                layer.submodules.self_attention.submodules.core_attention = SDPACoreAttention
        return spec

    def _weight_name_mapping_mlp(self, name: str) -> list[str]:
        if "pre_mlp_layernorm" in name:  # local spec; TE fuses it into linear_fc1
            return [f"model.layers.{name.split('.')[2]}.post_attention_layernorm.weight"]
        return super()._weight_name_mapping_mlp(name)  # type: ignore[misc]

    def _weight_name_mapping_other(self, name: str) -> list[str]:
        if name.endswith("input_layernorm.weight"):  # local spec; TE fuses it into linear_qkv
            return [f"model.layers.{name.split('.')[2]}.input_layernorm.weight"]
        return super()._weight_name_mapping_other(name)  # type: ignore[misc]


def make_bridge(
    hf_config: Any, *, local_spec: bool, overrides: Mapping[str, Any], sdpa_attention: bool = False
) -> Any:
    """An mbridge bridge for `hf_config`'s family (fp32 parameters), TransformerConfig `overrides`
    applied; raises with the supported families when mbridge has none for this model type."""
    from mbridge.core.bridge import _MODEL_REGISTRY

    model_type = getattr(hf_config, "model_type", None)
    family = _MODEL_REGISTRY.get(model_type)
    if family is None:
        raise ValueError(
            f"backend.kind=megatron: mbridge has no bridge for model_type={model_type!r}; "
            f"supported: {sorted(_MODEL_REGISTRY)}"
        )
    attrs = {"local_spec": local_spec, "sdpa_attention": sdpa_attention}
    cls = type(f"Unirl{family.__name__}", (_UnirlBridge, family), attrs)
    bridge = cls(hf_config, dtype=torch.float32)
    bridge.set_extra_args(**overrides)
    return bridge


def build_gpt_models(bridge: Any, device: torch.device) -> list[torch.nn.Module]:
    """This rank's GPTModel chunks in pipeline order: one pipeline stage, or one chunk per virtual
    stage (megatron-core places the layers: `get_transformer_layer_offset`), each with the
    embedding only on the first stage (``pre_process``) and the output layer only on the last
    (``post_process``). Collective over the embedding group when a tied output layer lives on a
    later stage. Their random initialisation (overwritten by the loaded weights) leaves torch's
    RNG streams as they were."""
    from megatron.core import parallel_state as mpu

    from unirl.train.backends.megatron import cpu

    vpp = mpu.get_virtual_pipeline_model_parallel_world_size()
    stages: list[int | None] = list(range(vpp)) if vpp is not None else [None]
    provider = bridge._model_provider([])
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    chunks = []
    with torch.random.fork_rng(devices=devices), cpu.cuda_as_cpu():
        for vp in stages:
            pre = mpu.is_pipeline_first_stage(ignore_virtual=vp is None, vp_stage=vp)
            post = mpu.is_pipeline_last_stage(ignore_virtual=vp is None, vp_stage=vp)
            kw = {} if vp is None else {"vp_stage": vp}
            chunks.append(provider(pre_process=pre, post_process=post, **kw).to(device))
    return chunks


def load_hf_weights(
    bridge: Any, chunks: Sequence[torch.nn.Module], state: Mapping[str, torch.Tensor]
) -> None:
    """Copy Hugging Face-named weights into this rank's chunks (its TP shard of each weight of its
    pipeline stage)."""
    with torch.no_grad():
        bridge.load_weights(list(chunks), state)


def iter_hf_weights(
    bridge: Any, chunks: Sequence[torch.nn.Module], skip: Collection[str] = ()
) -> Iterator[tuple[str, torch.Tensor]]:
    """`(Hugging Face name, CPU copy)` of every weight of the model, one at a time, broadcast
    over the pipeline stages and TP-gathered (collective over the pipeline and TP groups: every
    rank iterates in step and gets every weight); at most one gathered weight is alive at a time
    beyond what the consumer keeps. Names in `skip` (a tied output layer's second copy on the
    last stage) are not yielded."""
    with torch.no_grad():
        for name, t in bridge.export_weights(list(chunks)):
            if name not in skip:
                yield name, t.detach().to("cpu", copy=True)
