"""A megatron-core GPTModel behind the Hugging Face causal-LM call the pipelines make.

The AR pipeline's replay calls ``model(input_ids=, attention_mask=, position_ids=, use_cache=False,
logits_to_keep=)`` and reads ``.logits``; `MegatronCausalLM` turns the 2-D padding mask into
megatron-core's boolean ``[B, 1, S, S]`` mask (True = not attended: the future and the padding),
runs the GPTModel under the configured compute dtype and returns the logits the same way.

Hugging Face embeddings built with ``padding_idx`` (Llama, Qwen2, Qwen3) give the padding token's
row no gradient from its lookups; megatron-core's embedding has no such notion, so the lookups of
that token are detached here (its row still learns through a tied output layer, as in HF).

Under pipeline parallelism this rank holds one stage (or, with virtual pipeline stages, several
model chunks) of the GPTModel. Inside megatron-core's schedule (`schedule.run_micro_batches`)
the schedule picks the chunk (`active`) and hands it its input activations; a chunk that is not
the last stage ends the micro-batch's loss code by raising `StageOutput` with the activations
it sends on. Outside the schedule (no-grad use: recomputed old log-probs, evaluation) a call
runs a forward-only pass of the whole pipeline and every stage returns the last stage's logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast


class StageOutput(BaseException):
    """Raised by a non-last pipeline stage's forward inside the schedule: `tensor` is what it sends
    to the next stage. A BaseException so that an algorithm's ``except Exception`` cannot swallow it."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__("pipeline stage output")
        self.tensor = tensor


class MegatronCausalLM(torch.nn.Module):
    """`gpt` (a megatron-core GPTModel, full-vocab output) with a Hugging Face forward; `vp_chunks`
    are the further model chunks of this rank under virtual pipeline parallelism."""

    def __init__(
        self,
        gpt: torch.nn.Module,
        hf_config: Any,
        compute_dtype: torch.dtype,
        padding_idx: int | None = None,
        vp_chunks: Sequence[torch.nn.Module] = (),
    ) -> None:
        super().__init__()
        self.gpt = gpt
        if vp_chunks:
            self.vp_chunks = torch.nn.ModuleList(vp_chunks)
        self.config = hf_config
        self.compute_dtype = compute_dtype
        self.padding_idx = padding_idx
        self.active: torch.nn.Module | None = None  # set by the schedule around each stage forward
        self.calls = 0  # forwards of the active chunk in the current micro-batch
        self.pipelined_forward: Any = None  # set by the backend when PP > 1 (forward-only pipeline)

    @property
    def chunks(self) -> list[torch.nn.Module]:
        """This rank's model chunks in pipeline order (one unless virtual pipeline stages)."""
        return [self.gpt, *getattr(self, "vp_chunks", [])]

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
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        if self.active is None and self.pipelined_forward is not None:
            if torch.is_grad_enabled():
                raise RuntimeError(
                    "under pipeline_model_parallel_size > 1 the model trains only inside the backend's "
                    "schedule (TrainStack calls backend.run_micro_batches); call it under torch.no_grad() "
                    "for a forward-only pass"
                )
            logits = self.pipelined_forward(input_ids, attention_mask, position_ids, logits_to_keep)
        else:
            if self.active is not None and self.pipelined_forward is not None:
                self.calls += 1
                if self.calls > 1:
                    raise ValueError(
                        "pipeline parallelism runs one model forward per micro-batch; this loss calls the "
                        "model twice (e.g. a KL reference forward inside the loss: kl_coef > 0). Use "
                        "backend.pipeline_model_parallel_size: 1 for it"
                    )
            logits = self.stage_forward(self.active or self.gpt, input_ids, attention_mask, position_ids)
            if logits_to_keep:
                logits = logits[:, -logits_to_keep:]
        return CausalLMOutputWithPast(logits=logits)

    def stage_forward(
        self, gpt: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """One chunk's forward: the logits ``[B, S, V]`` on the last stage; on another, raises
        `StageOutput` with the hidden states ``[S, B, H]`` (in the pipeline's p2p dtype)."""
        S = input_ids.shape[1]
        future = torch.ones(S, S, dtype=torch.bool, device=input_ids.device).triu(1)
        mask = future[None, None] | (attention_mask[:, None, None, :] == 0)
        dtype = self.compute_dtype
        ctx = (
            torch.autocast(input_ids.device.type, dtype=dtype)
            if dtype != torch.float32
            else contextlib.nullcontext()
        )
        with ctx:
            embedded = self._embed(gpt, input_ids, position_ids) if gpt.pre_process else None
            out = gpt(
                input_ids=input_ids, position_ids=position_ids, attention_mask=mask, decoder_input=embedded
            )
        if not gpt.post_process:
            raise StageOutput(out.to(gpt.config.pipeline_dtype).contiguous())
        return out

    def _embed(self, gpt: Any, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        S = input_ids.shape[1]
        embedded = gpt.embedding(input_ids=input_ids, position_ids=position_ids)  # [S, B, H]
        if self.padding_idx is None:
            return embedded
        is_pad = (input_ids == self.padding_idx).t()[..., None]
        if embedded.shape[0] != S:  # sequence parallel: this TP rank's slice of the sequence
            from megatron.core import parallel_state as mpu

            is_pad = is_pad.chunk(mpu.get_tensor_model_parallel_world_size())[
                mpu.get_tensor_model_parallel_rank()
            ]
        return torch.where(is_pad, embedded.detach(), embedded)
