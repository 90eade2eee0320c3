"""A fused one-token forward for Llama-family causal LMs (Qwen3, Qwen2, Llama, Mistral without
sliding windows): the decode step of ``decode_static(fused=True)``.

Batch decoding of a small model is bound by the number of kernels per token, not by arithmetic.
Transformers' layer runs its projections as separate GEMMs (q, k, v; gate, up) with unfused
element-wise work between them. This forward reads the same parameters but:

- concatenates each layer's q/k/v and gate/up weights once per decode call (two GEMMs instead of
  five per layer; the weights do not change during a rollout);
- writes the new key/value straight into the ``StaticCache`` tensors the prefill filled, at the
  slot held in a device tensor (no host-side cache bookkeeping);
- attends grouped-query style without copying KV heads; on CUDA with flex attention, whose
  compiled kernel reads only the cache blocks filled so far, not the whole pre-allocated cache
  (apps/benchmarks/gpu_decode_attention.py measured the kernels); elsewhere with SDPA;
- is meant to run under ``torch.compile`` (norms, RoPE and residuals fuse) and a CUDA graph.

It computes what the model's own forward computes (same RMSNorm, RoPE from the model's rotary
module, scaling and activation; tests/test_ar_decode_static.py checks the tokens and log-probs
in fp32). Models
it cannot represent exactly are refused by ``fusable`` with the reason, never approximated:
adapters (a peft LoRA layer is not a plain ``nn.Linear``), non-SiLU MLPs, sliding windows,
attention soft-capping, logit scaling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

__all__ = ["FusedLM", "fusable", "require_gathered"]

_ATTN_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")


def _base(model: nn.Module) -> nn.Module:
    """The ``...ForCausalLM`` module itself (unwraps peft's model wrapper if any)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def fusable(model: nn.Module) -> str | None:
    """None when ``FusedLM`` represents ``model`` exactly; otherwise the reason it cannot."""
    base = _base(model)
    cfg = getattr(base, "config", None)
    body = getattr(base, "model", None)
    layers = getattr(body, "layers", None)
    if cfg is None or layers is None or not isinstance(getattr(base, "lm_head", None), nn.Linear):
        return f"{type(base).__name__} is not a Llama-style ForCausalLM (model.layers, lm_head)"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"hidden_act={getattr(cfg, 'hidden_act', None)!r}: the fused MLP is SiLU-gated"
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(cfg, "use_sliding_window", False):
        return f"layer types {sorted(kinds)}: only full attention is fused"
    for attr in ("attn_logit_softcapping", "final_logit_softcapping", "logit_scale"):
        if getattr(cfg, attr, None):
            return f"config.{attr}={getattr(cfg, attr)}: not represented by the fused forward"
    for i, layer in enumerate(layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        mods = [getattr(attn, n, None) for n in _ATTN_LINEARS] + [getattr(mlp, n, None) for n in _MLP_LINEARS]
        if any(type(m) is not nn.Linear for m in mods):
            kinds_i = sorted({type(m).__name__ for m in mods})
            return f"layer {i} projections are {kinds_i}, not plain nn.Linear (adapters are not fused)"
        if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm")):
            return f"layer {i} has no input/post-attention RMSNorm"
    return None


def require_gathered(model: nn.Module, caller: str) -> None:
    """Raise when ``model`` holds sharded (FSDP2 ``DTensor``) parameters: the fused and compiled
    decode steps read whole weights, as inside ``backend.gathered()``."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise RuntimeError(
            f"{caller} on a sharded FSDP model: gather its weights first (run the rollout inside "
            "backend.gathered())"
        )


@dataclass
class _Layer:
    in_norm: Tensor
    qkv: Tensor
    qkv_bias: Tensor | None
    q_norm: Tensor | None
    k_norm: Tensor | None
    o: Tensor
    o_bias: Tensor | None
    post_norm: Tensor
    gate_up: Tensor
    down: Tensor


@dataclass
class FusedLM:
    """One model's decode-step weights (q/k/v and gate/up concatenated) and static sizes."""

    layers: list[_Layer]
    embed: Tensor
    norm: Tensor
    lm_head: Tensor
    rotary: nn.Module
    eps: float
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    scaling: float

    @classmethod
    def of(cls, model: nn.Module) -> FusedLM:
        """Gather the (unsharded) weights of ``model``; raises ``ValueError`` when not ``fusable``."""
        reason = fusable(model)
        if reason is not None:
            raise ValueError(f"decode_static(fused=True): {reason}; use fused=False")
        base = _base(model)
        require_gathered(base, "decode_static(fused=True)")
        cfg, body = base.config, base.model
        attn0 = body.layers[0].self_attn
        layers = []
        for layer in body.layers:
            a, m = layer.self_attn, layer.mlp
            biases = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
            layers.append(
                _Layer(
                    in_norm=layer.input_layernorm.weight,
                    qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                    qkv_bias=torch.cat(biases) if biases[0] is not None else None,  # type: ignore[arg-type]
                    q_norm=a.q_norm.weight if hasattr(a, "q_norm") else None,
                    k_norm=a.k_norm.weight if hasattr(a, "k_norm") else None,
                    o=a.o_proj.weight,
                    o_bias=a.o_proj.bias,
                    post_norm=layer.post_attention_layernorm.weight,
                    gate_up=torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                    down=m.down_proj.weight,
                )
            )
        head_dim = int(getattr(attn0, "head_dim", cfg.hidden_size // cfg.num_attention_heads))
        return cls(
            layers=layers,
            embed=body.embed_tokens.weight,
            norm=body.norm.weight,
            lm_head=base.lm_head.weight,
            rotary=body.rotary_emb,
            eps=float(cfg.rms_norm_eps),
            heads=int(cfg.num_attention_heads),
            kv_heads=int(cfg.num_key_value_heads),
            head_dim=head_dim,
            intermediate=int(layers[0].down.shape[1]),
            scaling=float(getattr(attn0, "scaling", head_dim**-0.5)),
        )

    def step(
        self,
        tok_B: Tensor,
        pos_B: Tensor,
        slot: Tensor,
        mask_BT: Tensor,
        keys: list[Tensor],
        values: list[Tensor],
    ) -> Tensor:
        """Logits ``[B, V]`` of the next token after ``tok_B`` at positions ``pos_B``; writes its
        keys/values at cache slot ``slot`` (a one-element long tensor) of every layer's ``[B, KV, T, D]``
        cache. ``mask_BT`` says which cache slots each row attends (False past ``slot``)."""
        B, H, KV, D = tok_B.shape[0], self.heads, self.kv_heads, self.head_dim
        x = F.embedding(tok_B, self.embed)  # [B, hidden]
        cos, sin = self.rotary(x, pos_B[:, None])  # [B, 1, D]
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, D], broadcast over heads
        flex = keys[0].is_cuda or FLEX_OFF_CUDA
        block_mask = _filled_blocks(mask_BT, slot) if flex else None
        mask_B11T = mask_BT[:, None, None, :]
        at = slot.reshape(1)
        for lw, k_cache, v_cache in zip(self.layers, keys, values):
            qkv = F.linear(_rms(x, lw.in_norm, self.eps), lw.qkv, lw.qkv_bias)
            q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
            q, k, v = q.view(B, 1, H, D), k.view(B, 1, KV, D), v.view(B, KV, 1, D)
            if lw.q_norm is not None and lw.k_norm is not None:
                q, k = _rms(q, lw.q_norm, self.eps), _rms(k, lw.k_norm, self.eps)
            q = _rope(q.transpose(1, 2), cos, sin)  # [B, H, 1, D]
            k = _rope(k.transpose(1, 2), cos, sin)  # [B, KV, 1, D]
            k_cache.index_copy_(2, at, k)
            v_cache.index_copy_(2, at, v)
            if block_mask is not None:
                out = flex_attention(
                    q, k_cache, v_cache, block_mask=block_mask, scale=self.scaling, enable_gqa=True
                )
            else:  # the same attention as SDPA: the query heads of each KV head as its query rows
                out = F.scaled_dot_product_attention(
                    q.reshape(B, KV, H // KV, D), k_cache, v_cache, attn_mask=mask_B11T, scale=self.scaling
                )
            x = x + F.linear(out.reshape(B, H * D), lw.o, lw.o_bias)  # type: ignore[union-attr]
            gate, up = F.linear(_rms(x, lw.post_norm, self.eps), lw.gate_up).split(self.intermediate, dim=-1)
            x = x + F.linear(F.silu(gate) * up, lw.down)
        return F.linear(_rms(x, self.norm, self.eps), self.lm_head)


# Flex attention on CUDA only (inductor's CPU flex kernel refuses small heads); tests flip this.
FLEX_OFF_CUDA = False
KV_BLOCK = 128  # cache slots per flex-attention block: blocks past the filled slots are not read


def _filled_blocks(mask_BT: Tensor, slot: Tensor) -> BlockMask:
    """The block mask of one decode step: each row attends the slots ``mask_BT`` keeps, and the
    compiled kernel reads only the ``slot // KV_BLOCK + 1`` blocks that hold keys so far (the
    growing part of the cache is never read ahead of time; eager flex attention applies the
    element mask alone, with the same result)."""
    B, T = mask_BT.shape
    n_blocks = -(-T // KV_BLOCK)
    filled_B11 = (slot // KV_BLOCK + 1).to(torch.int32).expand(B, 1, 1)
    order_B11N = torch.arange(n_blocks, device=mask_BT.device, dtype=torch.int32).expand(B, 1, 1, n_blocks)

    def keep(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return mask_BT[b, kv_idx]

    return BlockMask.from_kv_blocks(
        filled_B11, order_B11N, BLOCK_SIZE=KV_BLOCK, mask_mod=keep, seq_lengths=(1, T)
    )


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Transformers' Llama/Qwen RMSNorm: normalise in fp32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
