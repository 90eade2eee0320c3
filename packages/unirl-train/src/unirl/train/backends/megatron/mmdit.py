"""The SD3 / SD3.5 MMDiT (diffusers ``SD3Transformer2DModel``) with its joint transformer blocks
built from megatron-core's tensor-parallel building blocks.

Each joint block (two streams, image and text, attending jointly; adaLN-Zero modulation from the
timestep + pooled-text embedding) becomes a `MegatronJointBlock`:

- the adaLN modulation of each stream: a `ColumnParallelLinear` with its output gathered;
- q / k / v of each stream: one fused `ColumnParallelLinear` (this rank's heads), optional
  per-head RMS norms (``qk_norm: rms_norm``, SD3.5), then one attention over the concatenated
  ``[image; text]`` sequence of this rank's heads (torch SDPA: fused kernels on CUDA);
- the attention output projection of each stream: a `RowParallelLinear` (the TP all-reduce);
- the feed-forward of each stream: megatron-core's `MLP` (column- then row-parallel, tanh GELU).

The last block's text stream is "context pre only" as in diffusers: its modulation has (scale,
shift) only and it has no output projection or MLP. What surrounds the blocks (patch embedding,
timestep / text embedders, the output norm and projection: ~1% of the weights) stays the
diffusers code and weights, replicated on every TP rank, so the model keeps the diffusers call
(``hidden_states, encoder_hidden_states, pooled_projections, timestep, return_dict``) the bundles
and pipelines make.

`MMDiTBridge` maps the weights: diffusers names in, diffusers names out (TP-gathered), the fused
qkv of TP rank r holding rows ``[q_r; k_r; v_r]`` of its heads. Not supported (refused when built):
SD3.5's dual-attention blocks (``dual_attention_layers``), pipeline parallelism (a joint block
hands two streams and the embedding to the next one; megatron-core's schedule sends one tensor).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

_EPS = 1e-6


def is_mmdit(module: nn.Module) -> bool:
    """True for a diffusers SD3Transformer2DModel (the MMDiT this backend builds on megatron-core)."""
    try:
        from diffusers import SD3Transformer2DModel
    except ImportError:  # pragma: no cover - diffusers is a dependency of every diffusion recipe
        return False
    return isinstance(module, SD3Transformer2DModel)


def transformer_config(hf: Mapping[str, Any], overrides: Mapping[str, Any]) -> Any:
    """megatron-core's TransformerConfig of the diffusers config ``hf`` (fp32 parameters)."""
    from megatron.core.transformer import TransformerConfig

    heads, head_dim = int(hf["num_attention_heads"]), int(hf["attention_head_dim"])
    if hf.get("dual_attention_layers"):
        raise ValueError(
            f"backend.kind=megatron: SD3.5's dual-attention blocks (dual_attention_layers="
            f"{tuple(hf['dual_attention_layers'])}) are not built on megatron-core yet; use kind: fsdp"
        )
    qk = hf.get("qk_norm")
    if qk not in (None, "rms_norm"):
        raise ValueError(f"backend.kind=megatron: qk_norm={qk!r} is not supported (None or 'rms_norm')")
    hidden = heads * head_dim
    fields: dict[str, Any] = {
        "num_layers": int(hf["num_layers"]),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "kv_channels": head_dim,
        "ffn_hidden_size": 4 * hidden,
        "add_bias_linear": True,
        "gated_linear_unit": False,
        "activation_func": functools.partial(F.gelu, approximate="tanh"),
        "qk_layernorm": qk == "rms_norm",
        "layernorm_epsilon": _EPS,
        "params_dtype": torch.float32,
        "bias_activation_fusion": False,
        "gradient_accumulation_fusion": False,
        **{k: v for k, v in overrides.items() if k in _TRANSFORMER_FIELDS},
    }
    return TransformerConfig(**fields)


# the TransformerConfig fields the backend's overrides may set for the MMDiT
_TRANSFORMER_FIELDS = frozenset(
    {"tensor_model_parallel_size", "use_cpu_initialization", "perform_initialization", "sequence_parallel"}
)


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: the affine-free LayerNorm of ``x`` scaled by ``1 + scale`` and shifted (per sample)."""
    x = F.layer_norm(x, (x.shape[-1],), eps=_EPS)
    return x * (1 + scale[:, None]) + shift[:, None]


def _mlp(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out, bias = mlp(x)
    return out if bias is None else out + bias


class MegatronJointBlock(nn.Module):
    """One MMDiT joint block (diffusers ``JointTransformerBlock``) on megatron-core layers; holds
    this tensor-parallel rank's heads. Called as diffusers calls its blocks; returns
    ``(encoder_hidden_states, hidden_states)`` (``None`` text for the context-pre-only block)."""

    def __init__(self, config: Any, *, context_pre_only: bool, compute_dtype: torch.dtype) -> None:
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
        from megatron.core.transformer.mlp import MLP, MLPSubmodules

        super().__init__()
        d, tp = config.hidden_size, config.tensor_model_parallel_size
        if config.num_attention_heads % tp:
            raise ValueError(
                f"backend.tensor_model_parallel_size={tp} does not divide the model's "
                f"num_attention_heads={config.num_attention_heads}; choose a divisor"
            )
        self.config, self.context_pre_only, self.compute_dtype = config, context_pre_only, compute_dtype
        self.recompute = False
        """Recompute the block's activations in the backward pass (``backend.recompute: full``)."""
        self.heads, self.head_dim = config.num_attention_heads // tp, config.kv_channels
        col = functools.partial(
            ColumnParallelLinear, config=config, init_method=config.init_method, bias=True
        )
        row = functools.partial(
            RowParallelLinear,
            config=config,
            init_method=config.output_layer_init_method,
            bias=True,
            input_is_parallel=True,
            skip_bias_add=False,
        )
        self.adaln = col(d, 6 * d, gather_output=True)
        self.adaln_context = col(d, (2 if context_pre_only else 6) * d, gather_output=True)
        self.linear_qkv = col(d, 3 * d, gather_output=False)
        self.added_linear_qkv = col(d, 3 * d, gather_output=False)
        self.linear_proj = row(d, d)
        self.added_linear_proj = None if context_pre_only else row(d, d)
        mlp = functools.partial(
            MLP,
            config,
            MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
            ffn_hidden_size=config.ffn_hidden_size,
        )
        self.mlp = mlp()
        self.mlp_context = None if context_pre_only else mlp()
        self.norms = nn.ModuleDict()
        if config.qk_layernorm:  # per-head RMS norms; each TP rank applies them to its own heads
            for name in ("q_layernorm", "k_layernorm", "added_q_layernorm", "added_k_layernorm"):
                self.norms[name] = nn.RMSNorm(self.head_dim, eps=_EPS)

    def _heads(self, qkv: torch.Tensor, prefix: str) -> list[torch.Tensor]:
        """``[B, S, 3 * local]`` -> q, k, v as ``[B, heads, S, head_dim]`` (q, k normed)."""
        b = qkv.shape[0]
        out = [t.view(b, -1, self.heads, self.head_dim).transpose(1, 2) for t in qkv.chunk(3, dim=-1)]
        if self.norms:
            out[0] = self.norms[f"{prefix}q_layernorm"](out[0])
            out[1] = self.norms[f"{prefix}k_layernorm"](out[1])
        return out

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        temb: torch.Tensor,
        joint_attention_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        if joint_attention_kwargs:
            raise ValueError(
                f"the megatron MMDiT takes no joint_attention_kwargs (got {sorted(joint_attention_kwargs)})"
            )
        dtype = self.compute_dtype
        cast = (
            torch.autocast(hidden_states.device.type, dtype=dtype)
            if dtype != torch.float32
            else torch.autocast(hidden_states.device.type, enabled=False)
        )
        with cast:
            if self.recompute and torch.is_grad_enabled():
                out: tuple[torch.Tensor | None, torch.Tensor] = checkpoint(
                    self._forward, hidden_states, encoder_hidden_states, temb, use_reentrant=False
                )
                return out
            return self._forward(hidden_states, encoder_hidden_states, temb)

    def _forward(
        self, h: torch.Tensor, c: torch.Tensor, temb: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        emb = F.silu(temb)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaln(emb)[0].chunk(6, dim=1)
        c_mod = self.adaln_context(emb)[0]
        if self.context_pre_only:  # diffusers' AdaLayerNormContinuous: (scale, shift)
            c_scale, c_shift = c_mod.chunk(2, dim=1)
            c_norm = _modulate(c, c_shift, c_scale)
        else:
            c_shift_msa, c_scale_msa, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = c_mod.chunk(6, dim=1)
            c_norm = _modulate(c, c_shift_msa, c_scale_msa)
        q, k, v = self._heads(self.linear_qkv(_modulate(h, shift_msa, scale_msa))[0], "")
        cq, ck, cv = self._heads(self.added_linear_qkv(c_norm)[0], "added_")
        att = F.scaled_dot_product_attention(
            torch.cat([q, cq], dim=2), torch.cat([k, ck], dim=2), torch.cat([v, cv], dim=2)
        )
        att = att.transpose(1, 2).reshape(h.shape[0], -1, self.heads * self.head_dim).to(q.dtype)
        n = h.shape[1]
        h = h + gate_msa[:, None] * self.linear_proj(att[:, :n])[0]
        h = h + gate_mlp[:, None] * _mlp(self.mlp, _modulate(h, shift_mlp, scale_mlp))
        if self.context_pre_only:
            return None, h
        assert self.added_linear_proj is not None and self.mlp_context is not None
        c = c + c_gate_msa[:, None] * self.added_linear_proj(att[:, n:])[0]
        c = c + c_gate_mlp[:, None] * _mlp(self.mlp_context, _modulate(c, c_shift_mlp, c_scale_mlp))
        return c, h


def build_mmdit(
    module: nn.Module, config: Any, compute_dtype: torch.dtype, device: torch.device
) -> nn.Module:
    """A copy of the SD3Transformer2DModel ``module`` whose joint blocks are `MegatronJointBlock`s
    (randomly initialised: load the weights with `MMDiTBridge.load_weights`). The rest of the
    model is copied from ``module`` (its weights included); ``module`` is left as it was. Its
    random initialisation leaves torch's RNG streams as they were."""
    from unirl.train.backends.megatron import cpu

    blocks = module.transformer_blocks
    module.transformer_blocks = nn.ModuleList()  # copy the rest of the model without them
    try:
        out = copy.deepcopy(module)
    finally:
        module.transformer_blocks = blocks
    n = len(blocks)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), cpu.cuda_as_cpu():
        new = [
            MegatronJointBlock(config, context_pre_only=i == n - 1, compute_dtype=compute_dtype)
            for i in range(n)
        ]
    for b, old in zip(new, blocks):
        if old.context_pre_only != b.context_pre_only:
            raise ValueError("megatron MMDiT: only the last joint block may be context_pre_only")
    out.transformer_blocks = nn.ModuleList(new)
    return out.to(device)


# ---- weights: diffusers names <-> this rank's megatron-core shards ---------------------------------
_COL, _ROW, _REP = "column", "row", "replicated"


def _block_map(i: int, block: MegatronJointBlock) -> dict[str, tuple[tuple[str, ...], str]]:
    """Megatron parameter name (within the model) -> (diffusers names it is made of, how it is
    split over the TP ranks), for joint block ``i``."""
    src, dst = f"transformer_blocks.{i}.", f"transformer_blocks.{i}."
    out: dict[str, tuple[tuple[str, ...], str]] = {}
    for w in ("weight", "bias"):
        out[f"{dst}adaln.{w}"] = ((f"{src}norm1.linear.{w}",), _COL)
        out[f"{dst}adaln_context.{w}"] = ((f"{src}norm1_context.linear.{w}",), _COL)
        out[f"{dst}linear_qkv.{w}"] = (tuple(f"{src}attn.to_{x}.{w}" for x in "qkv"), _COL)
        out[f"{dst}added_linear_qkv.{w}"] = (tuple(f"{src}attn.add_{x}_proj.{w}" for x in "qkv"), _COL)
        out[f"{dst}mlp.linear_fc1.{w}"] = ((f"{src}ff.net.0.proj.{w}",), _COL)
        out[f"{dst}linear_proj.{w}"] = ((f"{src}attn.to_out.0.{w}",), _ROW if w == "weight" else _REP)
        out[f"{dst}mlp.linear_fc2.{w}"] = ((f"{src}ff.net.2.{w}",), _ROW if w == "weight" else _REP)
        if not block.context_pre_only:
            out[f"{dst}added_linear_proj.{w}"] = (
                (f"{src}attn.to_add_out.{w}",),
                _ROW if w == "weight" else _REP,
            )
            out[f"{dst}mlp_context.linear_fc1.{w}"] = ((f"{src}ff_context.net.0.proj.{w}",), _COL)
            out[f"{dst}mlp_context.linear_fc2.{w}"] = (
                (f"{src}ff_context.net.2.{w}",),
                _ROW if w == "weight" else _REP,
            )
    for mine, theirs in (
        ("q_layernorm", "norm_q"),
        ("k_layernorm", "norm_k"),
        ("added_q_layernorm", "norm_added_q"),
        ("added_k_layernorm", "norm_added_k"),
    ):
        if mine in block.norms:
            out[f"{dst}norms.{mine}.weight"] = ((f"{src}attn.{theirs}.weight",), _REP)
    return out


class MMDiTBridge:
    """Diffusers-named weights in and out of `build_mmdit`'s model, split / gathered over the
    tensor-parallel ranks (the interface MegatronBackend uses of an mbridge bridge)."""

    def __init__(self, model: nn.Module, hf_names: Sequence[str]) -> None:
        self.hf_names = list(hf_names)
        """The diffusers model's parameter names, in its order."""
        self.mapping: dict[str, tuple[tuple[str, ...], str]] = {}
        for i, block in enumerate(model.transformer_blocks):
            self.mapping |= _block_map(i, block)
        for name, _ in model.named_parameters():
            if not name.startswith("transformer_blocks."):
                self.mapping[name] = ((name,), _REP)  # the diffusers code around the blocks
        covered = {n for names, _ in self.mapping.values() for n in names}
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

    def load_weights(self, chunks: Sequence[nn.Module], state: Mapping[str, torch.Tensor]) -> None:
        """Copy diffusers-named ``state`` into the model (this rank's TP shard of each weight)."""
        rank, tp, _ = self._tp()
        (model,) = chunks
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, (sources, split) in self.mapping.items():
                missing = [s for s in sources if s not in state]
                if missing:
                    raise KeyError(f"diffusers weight {missing[0]!r} is not in the state dict")
                if split == _COL:
                    value = torch.cat([state[s].chunk(tp, dim=0)[rank] for s in sources], dim=0)
                elif split == _ROW:
                    value = state[sources[0]].chunk(tp, dim=1)[rank]
                else:
                    value = state[sources[0]]
                p = params[name]
                if value.shape != p.shape:
                    raise ValueError(f"{sources} -> {name}: shape {tuple(value.shape)} != {tuple(p.shape)}")
                p.copy_(value.to(p.device, p.dtype))

    def export_weights(self, chunks: Sequence[nn.Module]) -> Iterator[tuple[str, torch.Tensor]]:
        """``(diffusers name, full tensor)`` of every weight, in the diffusers model's order,
        TP-gathered (collective over the TP group: every rank iterates in step)."""
        import torch.distributed as dist

        _, tp, group = self._tp()
        (model,) = chunks
        params = dict(model.named_parameters())
        owner = {s: (name, k) for name, (sources, _) in self.mapping.items() for k, s in enumerate(sources)}
        for hf in self.hf_names:
            name, k = owner[hf]
            sources, split = self.mapping[name]
            local = params[name].detach()
            if split == _REP or tp == 1:
                full = local.chunk(len(sources), dim=0)[k] if split == _COL else local
                yield hf, full
                continue
            parts = [torch.empty_like(local) for _ in range(tp)]
            dist.all_gather(parts, local.contiguous(), group=group)
            if split == _ROW:
                yield hf, torch.cat(parts, dim=1)
            else:  # each rank's rows: [source 0 shard; source 1 shard; ...]
                yield hf, torch.cat([p.chunk(len(sources), dim=0)[k] for p in parts], dim=0)

    def _weight_name_mapping_mcore_local_to_global(
        self, chunk: nn.Module, consider_ep: bool = False
    ) -> dict[str, str]:
        """Every parameter's name in the whole model (one pipeline stage: the same names)."""
        return {n: n for n, _ in chunk.named_parameters()}
