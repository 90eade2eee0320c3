"""Core attention for megatron-core's local layer spec through torch's fused SDPA kernels.

Without Transformer Engine, the local spec's `DotProductAttention` materialises the full
``[B, heads, S, S]`` score and probability tensors (baddbmm + masked softmax + bmm) and keeps them
for backward; on an H200 that cost the megatron backend 1.3x FSDP2's train time and 1.5x its
memory (docs/benchmarks.md, issue 18). `SDPACoreAttention` computes the same attention with
`torch.nn.functional.scaled_dot_product_attention` (flash / memory-efficient kernels on CUDA,
grouped-query heads without repeating K and V). Same constructor, same tensors in and out.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention


class SDPACoreAttention(DotProductAttention):
    """`DotProductAttention` whose forward is one `scaled_dot_product_attention` call."""

    def forward(  # type: ignore[override]
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None or self.softmax_offset is not None:
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
            )
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [S, B, h, d] -> [B, h, S, d]
        sq, sk = q.shape[2], k.shape[2]
        allowed = None
        if attention_mask is not None:  # megatron-core's mask: True = not attended
            # every query keeps its own key: a fully masked row (a left-padding query) would be NaN
            # here, and NaN values at padding positions leak into the real tokens' weighted sums
            own = torch.eye(sq, sk, dtype=torch.bool, device=q.device)
            allowed = ~attention_mask | own
        dropout = self.attention_dropout.p if self.training else 0.0
        grouped = self.num_attention_heads_per_partition != self.num_query_groups_per_partition

        def attend() -> torch.Tensor:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, dropout_p=dropout, is_causal=allowed is None and sq == sk,
                scale=self.softmax_scale, enable_gqa=grouped,
            )  # fmt: skip

        if dropout and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                out = attend()
        else:
            out = attend()
        return out.permute(2, 0, 1, 3).reshape(sq, out.shape[0], self.hidden_size_per_partition)
