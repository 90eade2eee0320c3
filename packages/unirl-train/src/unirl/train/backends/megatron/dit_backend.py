"""MegatronMMDiTBackend: a diffusers SD3 / SD3.5 or FLUX.1 MMDiT trained with its blocks on megatron-core.

The model (`mmdit.build_mmdit`) keeps the diffusers call, so it replaces the bundle's
transformer: rollout (trainside sampling), replay and every loss run through the same
megatron-core blocks (a diffusion model needs no KV-cached decode, so no separate rollout copy).
Its tensor-parallel layers split each block's heads and MLP over the TP ranks; the rest of the
world is data parallel. Weights, state and checkpoints are diffusers-named and TP-gathered
(`mmdit_bridge.MMDiTBridge`), so the weight planes, the Ray rollout workers' diffusers copies, the sharded
checkpoint format and the diffusers export take them unchanged, at any TP size.

Pipeline parallelism, sequence parallelism and 'selective' recompute are refused when built
(what each needs is said in the error); ``recompute: full`` recomputes each joint block in the
backward pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from unirl.train.backends.megatron import mmdit, mmdit_bridge
from unirl.train.backends.megatron.backend import MegatronBase
from unirl.train.backends.megatron.config import MegatronConfig


def _refuse(field: str, value: object, why: str) -> ValueError:
    return ValueError(f"backend.{field}={value!r} is not supported for an MMDiT on megatron-core: {why}")


class MegatronMMDiTBackend(MegatronBase):
    """Owns the MMDiT on megatron-core blocks, its optimizer, LR schedule, EMA and reference."""

    def _check_config(self, config: MegatronConfig) -> None:
        if config.pipeline_model_parallel_size > 1:
            raise _refuse(
                "pipeline_model_parallel_size",
                config.pipeline_model_parallel_size,
                "a joint block hands two streams (image, text) and the timestep embedding to the next, "
                "megatron-core's schedule sends one tensor between stages; use 1 (tensor / data parallel)",
            )
        if config.sequence_parallel:
            raise _refuse("sequence_parallel", True, "its blocks run batch-first [B, S, H]; use false")
        if config.recompute == "selective":
            raise _refuse("recompute", "selective", "use 'full' (each joint block) or 'none'")

    def _build(self, module: torch.nn.Module, config: MegatronConfig) -> dict[str, torch.nn.Parameter]:
        param_dtype, _ = config.precision.resolve(self.device)
        tcfg = mmdit.transformer_config(
            module.config,
            {
                "tensor_model_parallel_size": config.tensor_model_parallel_size,
                # megatron-core marks the TP-split weights (tensor_model_parallel) in its initialisation
                "use_cpu_initialization": self.device.type == "cpu",
                "perform_initialization": True,
            },
            family=str(mmdit.mmdit_family(module)),
        )
        model = mmdit.build_mmdit(module, tcfg, param_dtype, self.device)
        self.bridge = mmdit_bridge.MMDiTBridge(model, [n for n, _ in module.named_parameters()])
        self.chunks = [model]
        self.bridge.load_weights(self.chunks, dict(module.named_parameters()))
        for block in [*model.transformer_blocks, *getattr(model, "single_transformer_blocks", ())]:
            block.recompute = config.recompute == "full"
        self.module = model
        self._tied = {}
        self._hf_keys = set(self.bridge.hf_names)
        self._rollout_version = 0
        self._qk_layernorm = bool(tcfg.qk_layernorm)
        trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self._global_names = {n: n for n in trainable}  # one stage: the names are global
        return trainable

    def hf_param_names(self) -> list[str]:
        return list(self.bridge.hf_names)

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Trainside sampling runs on the trained module itself (nothing to gather)."""
        yield

    def full_state_dict(self, merge_lora: bool = True) -> dict[str, torch.Tensor]:
        """The diffusers model's state dict (every weight TP-gathered, and its persistent buffers,
        e.g. the patch embedding's positions), on CPU (collective over TP)."""
        out = super().full_state_dict(merge_lora)
        params = {n for n, _ in self.module.named_parameters()}
        for n, v in self.module.state_dict().items():
            if n not in params and not n.startswith(("transformer_blocks.", "single_transformer_blocks.")):
                out[n] = v.detach().cpu()
        return out
