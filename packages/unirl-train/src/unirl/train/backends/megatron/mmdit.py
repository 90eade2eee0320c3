"""The MMDiTs of SD3 / SD3.5 (diffusers ``SD3Transformer2DModel``) and FLUX.1 (``FluxTransformer2DModel``)
with their transformer blocks built from megatron-core's tensor-parallel building blocks.

Each joint block (two streams, image and text, attending jointly; adaLN-Zero modulation from the
timestep + pooled-text embedding) becomes a `MegatronJointBlock`:

- the adaLN modulation of each stream: a `ColumnParallelLinear` with its output gathered;
- q / k / v of each stream: one fused `ColumnParallelLinear` (this rank's heads), optional
  per-head RMS norms (``qk_norm: rms_norm``, SD3.5), then one attention over the concatenated
  ``[image; text]`` sequence of this rank's heads (torch SDPA: fused kernels on CUDA);
- the attention output projection of each stream: a `RowParallelLinear` (the TP all-reduce);
- the feed-forward of each stream: megatron-core's `MLP` (column- then row-parallel, tanh GELU).

The last SD3 block's text stream is "context pre only" as in diffusers: its modulation has (scale,
shift) only and it has no output projection or MLP. FLUX's double-stream blocks are the same
joint blocks with the text first in the joint sequence and RoPE on q / k (the model's own
``image_rotary_emb``); its single-stream blocks become `MegatronSingleBlock`: one adaLN (shift,
scale, gate), fused q / k / v and the MLP's first layer column-parallel, and the output projection
over ``[attention; MLP]`` row-parallel, each rank's input being its own heads and MLP columns. What surrounds the blocks (patch embedding,
timestep / text embedders, the output norm and projection: ~1% of the weights) stays the
diffusers code and weights, replicated on every TP rank, so the model keeps the diffusers call
(``hidden_states, encoder_hidden_states, pooled_projections, timestep, return_dict``) the bundles
and pipelines make.

`MMDiTBridge` maps the weights: diffusers names in, diffusers names out (TP-gathered), the fused
qkv of TP rank r holding rows ``[q_r; k_r; v_r]`` of its heads. Not supported (refused when built):
SD3.5's dual-attention blocks (``dual_attention_layers``), pipeline parallelism (a joint block
hands two streams and the embedding to the next one; megatron-core's schedule sends one tensor).
The TP-packed FLUX single-block projection (columns ``[attention D; MLP 4D]``) splits each segment.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

_EPS = 1e-6


def mmdit_family(module: nn.Module) -> str | None:
    """``"sd3"`` for a diffusers SD3Transformer2DModel, ``"flux"`` for a FluxTransformer2DModel (the
    MMDiTs this backend builds on megatron-core), else None."""
    try:
        from diffusers import FluxTransformer2DModel, SD3Transformer2DModel
    except ImportError:  # pragma: no cover - diffusers is a dependency of every diffusion recipe
        return None
    if isinstance(module, SD3Transformer2DModel):
        return "sd3"
    if isinstance(module, FluxTransformer2DModel):
        return "flux"
    return None


def transformer_config(hf: Mapping[str, Any], overrides: Mapping[str, Any], family: str = "sd3") -> Any:
    """megatron-core's TransformerConfig of the diffusers config ``hf`` of an ``family`` MMDiT
    (fp32 parameters)."""
    from megatron.core.transformer import TransformerConfig

    heads, head_dim = int(hf["num_attention_heads"]), int(hf["attention_head_dim"])
    if hf.get("dual_attention_layers"):
        raise ValueError(
            f"backend.kind=megatron: SD3.5's dual-attention blocks (dual_attention_layers="
            f"{tuple(hf['dual_attention_layers'])}) are not built on megatron-core yet; use kind: fsdp"
        )
    if family == "flux":  # RMS QK norms in every block; double- and single-stream blocks
        qk, layers = "rms_norm", int(hf["num_layers"]) + int(hf["num_single_layers"])
    else:
        qk, layers = hf.get("qk_norm"), int(hf["num_layers"])
    if qk not in (None, "rms_norm"):
        raise ValueError(f"backend.kind=megatron: qk_norm={qk!r} is not supported (None or 'rms_norm')")
    hidden = heads * head_dim
    fields: dict[str, Any] = {
        "num_layers": layers,
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


def _linears(config: Any) -> tuple[Any, Any]:
    """(column-parallel, row-parallel) linear builders of ``config``, biases on."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    col = functools.partial(ColumnParallelLinear, config=config, init_method=config.init_method, bias=True)
    row = functools.partial(
        RowParallelLinear,
        config=config,
        init_method=config.output_layer_init_method,
        bias=True,
        input_is_parallel=True,
        skip_bias_add=False,
    )
    return col, row


class _Block(nn.Module):
    """What both block kinds share: this TP rank's heads, per-head QK norms, attention, autocast
    and recomputation around the block's own ``_forward``."""

    norm_names: tuple[str, ...] = ()

    def __init__(self, config: Any, compute_dtype: torch.dtype) -> None:
        super().__init__()
        tp = config.tensor_model_parallel_size
        if config.num_attention_heads % tp:
            raise ValueError(
                f"backend.tensor_model_parallel_size={tp} does not divide the model's "
                f"num_attention_heads={config.num_attention_heads}; choose a divisor"
            )
        self.config, self.compute_dtype = config, compute_dtype
        self.heads, self.head_dim = config.num_attention_heads // tp, config.kv_channels
        self.recompute = False
        """Recompute the block's activations in the backward pass (``backend.recompute: full``)."""
        self.norms = nn.ModuleDict()
        if config.qk_layernorm:  # per-head RMS norms; each TP rank applies them to its own heads
            for name in self.norm_names:
                self.norms[name] = nn.RMSNorm(self.head_dim, eps=_EPS)

    def _heads(self, qkv: torch.Tensor, prefix: str) -> list[torch.Tensor]:
        """``[B, S, 3 * local]`` -> q, k, v as ``[B, heads, S, head_dim]`` (q, k normed)."""
        b = qkv.shape[0]
        out = [t.view(b, -1, self.heads, self.head_dim).transpose(1, 2) for t in qkv.chunk(3, dim=-1)]
        if self.norms:
            out[0] = self.norms[f"{prefix}q_layernorm"](out[0])
            out[1] = self.norms[f"{prefix}k_layernorm"](out[1])
        return out

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: Any) -> torch.Tensor:
        """SDPA over the joint sequence (RoPE on q, k when given) -> ``[B, S, local]``."""
        if rope is not None:
            from diffusers.models.embeddings import apply_rotary_emb

            q, k = apply_rotary_emb(q, rope), apply_rotary_emb(k, rope)
        att = F.scaled_dot_product_attention(q, k, v)
        return att.transpose(1, 2).reshape(q.shape[0], -1, self.heads * self.head_dim).to(q.dtype)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        temb: torch.Tensor,
        image_rotary_emb: Any = None,
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
        args = (hidden_states, encoder_hidden_states, temb, image_rotary_emb)
        with cast:
            if self.recompute and torch.is_grad_enabled():
                out: tuple[torch.Tensor | None, torch.Tensor] = checkpoint(
                    self._forward, *args, use_reentrant=False
                )
                return out
            return self._forward(*args)

    def _forward(
        self, h: torch.Tensor, c: torch.Tensor, temb: torch.Tensor, rope: Any
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        raise NotImplementedError


class MegatronJointBlock(_Block):
    """One MMDiT joint (double-stream) block: diffusers' SD3 ``JointTransformerBlock`` or FLUX's
    ``FluxTransformerBlock`` (``text_first``: the text leads the joint sequence; RoPE when the
    model passes ``image_rotary_emb``), on megatron-core layers, holding this tensor-parallel
    rank's heads. Called as diffusers calls its blocks; returns ``(encoder_hidden_states,
    hidden_states)`` (``None`` text for SD3's context-pre-only last block)."""

    norm_names = ("q_layernorm", "k_layernorm", "added_q_layernorm", "added_k_layernorm")

    def __init__(
        self, config: Any, *, context_pre_only: bool, compute_dtype: torch.dtype, text_first: bool = False
    ) -> None:
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
        from megatron.core.transformer.mlp import MLP, MLPSubmodules

        super().__init__(config, compute_dtype)
        self.context_pre_only, self.text_first = context_pre_only, text_first
        d = config.hidden_size
        col, row = _linears(config)
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

    def _forward(
        self, h: torch.Tensor, c: torch.Tensor, temb: torch.Tensor, rope: Any
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
        img = self._heads(self.linear_qkv(_modulate(h, shift_msa, scale_msa))[0], "")
        txt = self._heads(self.added_linear_qkv(c_norm)[0], "added_")
        first, second = (txt, img) if self.text_first else (img, txt)
        att = self._attend(*(torch.cat([a, b], dim=2) for a, b in zip(first, second)), rope)
        n, t = h.shape[1], c.shape[1]
        img_att, txt_att = (att[:, t:], att[:, :t]) if self.text_first else (att[:, :n], att[:, n:])
        h = h + gate_msa[:, None] * self.linear_proj(img_att)[0]
        h = h + gate_mlp[:, None] * _mlp(self.mlp, _modulate(h, shift_mlp, scale_mlp))
        if self.context_pre_only:
            return None, h
        assert self.added_linear_proj is not None and self.mlp_context is not None
        c = c + c_gate_msa[:, None] * self.added_linear_proj(txt_att)[0]
        c = c + c_gate_mlp[:, None] * _mlp(self.mlp_context, _modulate(c, c_shift_mlp, c_scale_mlp))
        return c, h


class MegatronSingleBlock(_Block):
    """FLUX's single-stream block (diffusers ``FluxSingleTransformerBlock``) on megatron-core
    layers: ``[text; image]`` through one adaLN (shift, scale, gate), attention and a parallel
    MLP, whose outputs the row-parallel ``linear_out`` projects together."""

    norm_names = ("q_layernorm", "k_layernorm")

    def __init__(self, config: Any, *, compute_dtype: torch.dtype) -> None:
        super().__init__(config, compute_dtype)
        d = config.hidden_size
        col, row = _linears(config)
        self.adaln = col(d, 3 * d, gather_output=True)
        self.linear_qkv = col(d, 3 * d, gather_output=False)
        self.linear_mlp = col(d, config.ffn_hidden_size, gather_output=False)
        self.linear_out = row(d + config.ffn_hidden_size, d)

    def _forward(
        self, h: torch.Tensor, c: torch.Tensor, temb: torch.Tensor, rope: Any
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        t = c.shape[1]
        x = torch.cat([c, h], dim=1)
        shift, scale, gate = self.adaln(F.silu(temb))[0].chunk(3, dim=1)
        n = _modulate(x, shift, scale)
        mlp = self.config.activation_func(self.linear_mlp(n)[0])
        att = self._attend(*self._heads(self.linear_qkv(n)[0], ""), rope)
        x = x + gate[:, None] * self.linear_out(torch.cat([att, mlp], dim=2))[0]
        return x[:, :t], x[:, t:]


_BLOCK_LISTS = {"sd3": ("transformer_blocks",), "flux": ("transformer_blocks", "single_transformer_blocks")}


def build_mmdit(
    module: nn.Module, config: Any, compute_dtype: torch.dtype, device: torch.device
) -> nn.Module:
    """A copy of the SD3 / FLUX MMDiT ``module`` whose blocks are `MegatronJointBlock`s (and, for
    FLUX, `MegatronSingleBlock`s), randomly initialised: load the weights with
    `MMDiTBridge.load_weights`. The rest of the model is copied from ``module`` (its weights
    included); ``module`` is left as it was. The random initialisation leaves torch's RNG
    streams as they were."""
    from unirl.train.backends.megatron import cpu

    family = mmdit_family(module)
    if family is None:
        raise TypeError(
            f"build_mmdit needs an SD3 or FLUX diffusers transformer, got {type(module).__name__}"
        )
    lists = {name: getattr(module, name) for name in _BLOCK_LISTS[family]}
    for name in lists:  # copy the rest of the model without them
        setattr(module, name, nn.ModuleList())
    try:
        out = copy.deepcopy(module)
    finally:
        for name, blocks in lists.items():
            setattr(module, name, blocks)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), cpu.cuda_as_cpu():
        n = len(lists["transformer_blocks"])
        joint: list[nn.Module] = [
            MegatronJointBlock(
                config,
                context_pre_only=family == "sd3" and i == n - 1,
                compute_dtype=compute_dtype,
                text_first=family == "flux",
            )
            for i in range(n)
        ]
        out.transformer_blocks = nn.ModuleList(joint)
        if family == "flux":
            single = [
                MegatronSingleBlock(config, compute_dtype=compute_dtype)
                for _ in lists["single_transformer_blocks"]
            ]
            out.single_transformer_blocks = nn.ModuleList(single)
    for b, old in zip(out.transformer_blocks, lists["transformer_blocks"]):
        if bool(getattr(old, "context_pre_only", False)) != b.context_pre_only:
            raise ValueError("megatron MMDiT: only SD3's last joint block may be context_pre_only")
    return out.to(device)


# ---- weights: diffusers names <-> this rank's megatron-core shards ---------------------------------
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


def _norm_rules(p: str, block: _Block) -> dict[str, Rule]:
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
