"""Diffusers-named weights in and out of the megatron-core MMDiT (`mmdit.build_mmdit`).

Every megatron parameter has a `Rule`: the diffusers weights it is made of and how it is split
over the tensor-parallel ranks: column-parallel layers split their rows (a fused q/k/v holds
``[q_r; k_r; v_r]`` of rank r's heads), row-parallel ones their columns (FLUX's single-block
projection over ``[attention D; MLP 4D]`` splits each segment), replicated ones (norms, row
biases, everything around the blocks) are whole on every rank. `MMDiTBridge` has the interface
MegatronBackend uses of an mbridge bridge (``load_weights``, ``export_weights``, local-to-global
names), so the backend's state, checkpoints and weight sync are diffusers-named at any TP size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from unirl.train.backends.megatron.mmdit import MegatronJointBlock, MegatronSingleBlock, MMDiTBlock

_COL, _ROW, _REP = "column", "row", "replicated"


class Rule(NamedTuple):
    """How one megatron parameter is made of diffusers weights: ``sources`` (stacked along dim 0
    per TP rank for a column split), the TP ``split``, and for a row split over a packed input the
    ``segments`` (input widths, each split over the ranks)."""

    sources: tuple[str, ...]
    split: str
    segments: tuple[int, ...] = ()


def _joint_map(i: int, block: MegatronJointBlock) -> dict[str, Rule]:
    """Megatron parameter name (within the model) -> its `Rule`, for joint block ``i``."""
    p = f"transformer_blocks.{i}."
    out: dict[str, Rule] = {}
    for w in ("weight", "bias"):
        row = _ROW if w == "weight" else _REP
        out[f"{p}adaln.{w}"] = Rule((f"{p}norm1.linear.{w}",), _COL)
        out[f"{p}adaln_context.{w}"] = Rule((f"{p}norm1_context.linear.{w}",), _COL)
        out[f"{p}linear_qkv.{w}"] = Rule(tuple(f"{p}attn.to_{x}.{w}" for x in "qkv"), _COL)
        out[f"{p}added_linear_qkv.{w}"] = Rule(tuple(f"{p}attn.add_{x}_proj.{w}" for x in "qkv"), _COL)
        out[f"{p}mlp.linear_fc1.{w}"] = Rule((f"{p}ff.net.0.proj.{w}",), _COL)
        out[f"{p}linear_proj.{w}"] = Rule((f"{p}attn.to_out.0.{w}",), row)
        out[f"{p}mlp.linear_fc2.{w}"] = Rule((f"{p}ff.net.2.{w}",), row)
        if not block.context_pre_only:
            out[f"{p}added_linear_proj.{w}"] = Rule((f"{p}attn.to_add_out.{w}",), row)
            out[f"{p}mlp_context.linear_fc1.{w}"] = Rule((f"{p}ff_context.net.0.proj.{w}",), _COL)
            out[f"{p}mlp_context.linear_fc2.{w}"] = Rule((f"{p}ff_context.net.2.{w}",), row)
    out |= _norm_rules(p, block)
    return out


def _single_map(i: int, block: MegatronSingleBlock) -> dict[str, Rule]:
    p = f"single_transformer_blocks.{i}."
    d, ffn = block.config.hidden_size, block.config.ffn_hidden_size
    out: dict[str, Rule] = {}
    for w in ("weight", "bias"):
        out[f"{p}adaln.{w}"] = Rule((f"{p}norm.linear.{w}",), _COL)
        out[f"{p}linear_qkv.{w}"] = Rule(tuple(f"{p}attn.to_{x}.{w}" for x in "qkv"), _COL)
        out[f"{p}linear_mlp.{w}"] = Rule((f"{p}proj_mlp.{w}",), _COL)
    out[f"{p}linear_out.weight"] = Rule((f"{p}proj_out.weight",), _ROW, (d, ffn))
    out[f"{p}linear_out.bias"] = Rule((f"{p}proj_out.bias",), _REP)
    return out | _norm_rules(p, block)


def _norm_rules(p: str, block: MMDiTBlock) -> dict[str, Rule]:
    theirs = {
        "q_layernorm": "norm_q",
        "k_layernorm": "norm_k",
        "added_q_layernorm": "norm_added_q",
        "added_k_layernorm": "norm_added_k",
    }
    return {f"{p}norms.{m}.weight": Rule((f"{p}attn.{theirs[m]}.weight",), _REP) for m in block.norms}


class MMDiTBridge:
    """Diffusers-named weights in and out of `build_mmdit`'s model, split / gathered over the
    tensor-parallel ranks (the interface MegatronBackend uses of an mbridge bridge)."""

    def __init__(self, model: nn.Module, hf_names: Sequence[str]) -> None:
        self.hf_names = list(hf_names)
        """The diffusers model's parameter names, in its order."""
        self.mapping: dict[str, Rule] = {}
        for i, block in enumerate(model.transformer_blocks):
            self.mapping |= _joint_map(i, block)
        for i, block in enumerate(getattr(model, "single_transformer_blocks", ())):
            self.mapping |= _single_map(i, block)
        for name, _ in model.named_parameters():
            if not name.startswith(("transformer_blocks.", "single_transformer_blocks.")):
                self.mapping[name] = Rule((name,), _REP)  # the diffusers code around the blocks
        covered = {n for rule in self.mapping.values() for n in rule.sources}
        if covered != set(self.hf_names):
            raise ValueError(
                f"megatron MMDiT weight map does not cover the diffusers model: missing "
                f"{sorted(set(self.hf_names) - covered)[:3]}, unexpected {sorted(covered - set(self.hf_names))[:3]}"
            )

    @staticmethod
    def _tp() -> tuple[int, int, Any]:
        from megatron.core import parallel_state as mpu

        return (
            mpu.get_tensor_model_parallel_rank(),
            mpu.get_tensor_model_parallel_world_size(),
            mpu.get_tensor_model_parallel_group(),
        )

    @staticmethod
    def _shard(rule: Rule, state: Mapping[str, torch.Tensor], rank: int, tp: int) -> torch.Tensor:
        """This rank's part of the diffusers weights of ``rule``."""
        if rule.split == _COL:
            return torch.cat([state[s].chunk(tp, dim=0)[rank] for s in rule.sources], dim=0)
        if rule.split == _REP:
            return state[rule.sources[0]]
        w = state[rule.sources[0]]
        pieces = w.split(list(rule.segments), dim=1) if rule.segments else (w,)
        return torch.cat([piece.chunk(tp, dim=1)[rank] for piece in pieces], dim=1)

    def load_weights(self, chunks: Sequence[nn.Module], state: Mapping[str, torch.Tensor]) -> None:
        """Copy diffusers-named ``state`` into the model (this rank's TP shard of each weight)."""
        rank, tp, _ = self._tp()
        (model,) = chunks
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, rule in self.mapping.items():
                missing = [s for s in rule.sources if s not in state]
                if missing:
                    raise KeyError(f"diffusers weight {missing[0]!r} is not in the state dict")
                value, p = self._shard(rule, state, rank, tp), params[name]
                if value.shape != p.shape:
                    raise ValueError(
                        f"{rule.sources} -> {name}: shape {tuple(value.shape)} != {tuple(p.shape)}"
                    )
                p.copy_(value.to(p.device, p.dtype))

    def export_weights(self, chunks: Sequence[nn.Module]) -> Iterator[tuple[str, torch.Tensor]]:
        """``(diffusers name, full tensor)`` of every weight, in the diffusers model's order,
        TP-gathered (collective over the TP group: every rank iterates in step)."""
        import torch.distributed as dist

        _, tp, group = self._tp()
        (model,) = chunks
        params = dict(model.named_parameters())
        owner = {s: (name, k) for name, rule in self.mapping.items() for k, s in enumerate(rule.sources)}
        for hf in self.hf_names:
            name, k = owner[hf]
            rule = self.mapping[name]
            local = params[name].detach()
            if rule.split == _REP:
                yield hf, local
                continue
            parts = [local]
            if tp > 1:
                parts = [torch.empty_like(local) for _ in range(tp)]
                dist.all_gather(parts, local.contiguous(), group=group)
            if rule.split == _COL:  # each rank's rows: [source 0 shard; source 1 shard; ...]
                yield hf, torch.cat([p.chunk(len(rule.sources), dim=0)[k] for p in parts], dim=0)
            elif not rule.segments:
                yield hf, torch.cat(parts, dim=1)
            else:  # each rank's columns: [segment 0 shard, segment 1 shard, ...]
                widths = [w // tp for w in rule.segments]
                split = [p.split(widths, dim=1) for p in parts]
                yield (
                    hf,
                    torch.cat([torch.cat([s[j] for s in split], dim=1) for j in range(len(widths))], dim=1),
                )

    def _weight_name_mapping_mcore_local_to_global(
        self, chunk: nn.Module, consider_ep: bool = False
    ) -> dict[str, str]:
        """Every parameter's name in the whole model (one pipeline stage: the same names)."""
        return {n: n for n, _ in chunk.named_parameters()}
