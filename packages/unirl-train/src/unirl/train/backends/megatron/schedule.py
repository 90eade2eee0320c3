"""Micro-batches through megatron-core's forward-backward schedule (pipeline parallelism).

`run_micro_batches` hands megatron-core's `get_forward_backward_func()` (no pipelining at PP = 1,
1F1B at PP > 1, interleaved 1F1B with virtual pipeline stages) one forward step per micro-batch.
The forward step runs the project's loss code (``loss_fn(micro_batch)``: the StageAlgorithm's
loss, which calls the pipeline's replay, which calls `MegatronCausalLM`) on every stage:

- on the last stage the model returns logits and the loss completes; the loss function megatron
  calls returns ``(loss, 1, record)`` with ``calculate_per_token_loss`` on, the one form that
  megatron-core 0.16 neither divides by the number of micro-batches nor by a token count
  (`forward_step_calc_loss`): the loss is already divided by the mini-batch's global totals;
- on any other stage the model raises `StageOutput` once its chunk has run, and that activation
  is what the schedule sends on. The loss code before the model call (packing the micro-batch)
  is cheap and deterministic, so every stage builds the same input.

Sequence lengths differ between micro-batches (each is packed to its own longest prompt and
response): the TransformerConfig has ``variable_seq_lengths`` on (mbridge's default), so the
schedule sends each activation's shape before it. The per-micro-batch loss value and metrics
exist on the last stage; they are broadcast over the pipeline group so every rank returns them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from unirl.train.backends.megatron.model import MegatronCausalLM, StageOutput

LossFn = Callable[[Any], tuple[torch.Tensor, dict[str, float]]]


def _cpu_context(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """On CPU: megatron-core's schedule code with its ``cuda`` allocations mapped to the CPU."""
    if device.type != "cpu":
        return contextlib.nullcontext()
    from unirl.train.backends.megatron import cpu

    return cpu.cuda_as_cpu()


def _compute_context(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """On CPU: the model's compute inside the schedule, without that mapping (it costs per op)."""
    if device.type != "cpu":
        return contextlib.nullcontext()
    from unirl.train.backends.megatron import cpu

    return cpu.compute_outside_cuda_as_cpu()


def run_micro_batches(
    module: MegatronCausalLM, micro: Sequence[Any], loss_fn: LossFn, device: torch.device
) -> list[tuple[float, dict[str, float]]]:
    """Forward and backward of every micro-batch through megatron-core's schedule (gradients
    accumulate in ``.grad``); ``(loss value, metrics)`` of each micro-batch, on every rank."""
    from megatron.core import parallel_state as mpu
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data_iterator: Iterator[Any], model: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        mb = next(data_iterator)
        module.active, module.calls = model, 0
        try:
            with _compute_context(device):
                loss, metrics = loss_fn(mb)
        except StageOutput as out:
            return out.tensor, None
        finally:
            module.active = None
        record = {"loss": float(loss.detach()), "metrics": {k: float(v) for k, v in metrics.items()}}

        def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            return output, torch.ones((), dtype=torch.int), record

        return loss, loss_func

    chunks = module.chunks
    pp = mpu.get_pipeline_model_parallel_world_size()
    if len(chunks) > 1 and (len(micro) < pp or len(micro) % pp):
        raise ValueError(
            f"backend.virtual_pipeline_model_parallel_size={len(chunks)} (interleaved schedule) needs a "
            f"multiple of pipeline_model_parallel_size={pp} micro-batches per optimizer step, got "
            f"{len(micro)}; change the micro-batch size (or the mini-batch) so it is one"
        )
    data: Any = [iter(micro) for _ in chunks] if len(chunks) > 1 else iter(micro)
    with _cpu_context(device):
        store = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=data,
            model=chunks,
            num_microbatches=len(micro),
            seq_length=1,  # unused: variable_seq_lengths sends each activation's shape
            micro_batch_size=1,
            forward_only=False,
        )
    if pp > 1:
        store = broadcast_from_last_stage(store)
    if len(store) != len(micro):
        raise RuntimeError(f"the schedule returned {len(store)} losses for {len(micro)} micro-batches")
    return [(r["loss"], r["metrics"]) for r in store]


def broadcast_from_last_stage(obj: Any) -> Any:
    """`obj` of the last pipeline stage, on every rank of this pipeline group (pickled: a few floats)."""
    from megatron.core import parallel_state as mpu

    box = [obj]
    dist.broadcast_object_list(
        box, src=mpu.get_pipeline_model_parallel_last_rank(), group=mpu.get_pipeline_model_parallel_group()
    )
    return box[0]


def pipelined_forward(
    module: MegatronCausalLM, device: torch.device
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]:
    """A forward-only pass of the whole pipeline (no grad): each chunk of this rank in pipeline
    order receives its input from the previous stage (megatron-core's P2PCommunicator) and sends
    its output on; the last stage's logits (the last `keep` positions, all when 0) are broadcast
    over the pipeline group (collective)."""

    def forward(
        input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, keep: int
    ) -> torch.Tensor:
        from megatron.core import parallel_state as mpu
        from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

        chunks = module.chunks
        comm = P2PCommunicator(pp_group=mpu.get_pipeline_model_parallel_group(), config=chunks[0].config)
        logits = None
        with _cpu_context(device):
            for chunk in chunks:
                if not chunk.pre_process:
                    chunk.set_input_tensor(comm.recv_forward((1, 1, 1), is_first_stage=False))
                try:
                    with _compute_context(device):
                        logits = module.stage_forward(chunk, input_ids, attention_mask, position_ids)
                    logits = (logits[:, -keep:] if keep else logits).contiguous()
                except StageOutput as out:
                    comm.send_forward(out.tensor, is_last_stage=False)
        meta = broadcast_from_last_stage(None if logits is None else (tuple(logits.shape), logits.dtype))
        if logits is None:
            logits = torch.empty(meta[0], dtype=meta[1], device=device)
        group = mpu.get_pipeline_model_parallel_group()
        dist.broadcast(logits, src=mpu.get_pipeline_model_parallel_last_rank(), group=group)
        return logits

    return forward
