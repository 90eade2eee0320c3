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

`mmdit_bridge.MMDiTBridge` maps the weights: diffusers names in, diffusers names out (TP-gathered), the fused
qkv of TP rank r holding rows ``[q_r; k_r; v_r]`` of its heads. Not supported (refused when built):
SD3.5's dual-attention blocks (``dual_attention_layers``), pipeline parallelism (a joint block
hands two streams and the embedding to the next one; megatron-core's schedule sends one tensor).
The TP-packed FLUX single-block projection (columns ``[attention D; MLP 4D]``) splits each segment.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

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
        **overrides,
    }
    return TransformerConfig(**fields)


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


class MMDiTBlock(nn.Module):
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


class MegatronJointBlock(MMDiTBlock):
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


class MegatronSingleBlock(MMDiTBlock):
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
    `mmdit_bridge.MMDiTBridge.load_weights`. The rest of the model is copied from ``module`` (its weights
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
