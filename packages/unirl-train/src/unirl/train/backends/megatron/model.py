"""A megatron-core GPTModel behind the Hugging Face causal-LM call the pipelines make.

The AR pipeline's replay calls ``model(input_ids=, attention_mask=, position_ids=, use_cache=False,
logits_to_keep=)`` and reads ``.logits``; `MegatronCausalLM` turns the 2-D padding mask into
megatron-core's boolean ``[B, 1, S, S]`` mask (True = not attended: the future and the padding),
runs the GPTModel under the configured compute dtype and returns the logits the same way.

Hugging Face embeddings built with ``padding_idx`` (Llama, Qwen2, Qwen3) give the padding token's
row no gradient from its lookups; megatron-core's embedding has no such notion, so the lookups of
that token are detached here (its row still learns through a tied output layer, as in HF).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast


class MegatronCausalLM(torch.nn.Module):
    """`gpt` (a megatron-core GPTModel, full-vocab output) with a Hugging Face forward."""

    def __init__(
        self, gpt: torch.nn.Module, hf_config: Any, compute_dtype: torch.dtype, padding_idx: int | None = None
    ) -> None:
        super().__init__()
        self.gpt = gpt
        self.config = hf_config
        self.compute_dtype = compute_dtype
        self.padding_idx = padding_idx

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        **unused: Any,
    ) -> CausalLMOutputWithPast:
        if unused.get("past_key_values") is not None or unused.get("use_cache"):
            raise ValueError("MegatronCausalLM has no KV cache: decode runs on the rollout copy")
        S = input_ids.shape[1]
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        future = torch.ones(S, S, dtype=torch.bool, device=input_ids.device).triu(1)
        mask = future[None, None] | (attention_mask[:, None, None, :] == 0)
        dtype = self.compute_dtype
        ctx = (
            torch.autocast(input_ids.device.type, dtype=dtype)
            if dtype != torch.float32
            else contextlib.nullcontext()
        )
        with ctx:
            embedded = self.gpt.embedding(input_ids=input_ids, position_ids=position_ids)  # [S, B, H]
            if self.padding_idx is not None:
                is_pad = (input_ids == self.padding_idx).t()[..., None]
                if embedded.shape[0] != S:  # sequence parallel: this TP rank's slice of the sequence
                    from megatron.core import parallel_state as mpu

                    is_pad = is_pad.chunk(mpu.get_tensor_model_parallel_world_size())[
                        mpu.get_tensor_model_parallel_rank()
                    ]
                embedded = torch.where(is_pad, embedded.detach(), embedded)
            logits = self.gpt(
                input_ids=input_ids, position_ids=position_ids, attention_mask=mask, decoder_input=embedded
            )
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return CausalLMOutputWithPast(logits=logits)
